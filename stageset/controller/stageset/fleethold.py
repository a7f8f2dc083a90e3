"""A member's side of a FleetRollout: which new revisions its rollout holds back.  Pure: no I/O.

What a member may apply is what its rollout's **status** records for it
(:attr:`~stageset.api.fleet.FleetRolloutStatus.releases`, written by the controller on a subresource
no tenant may write), as the controller's own watch of FleetRollouts shows it
(:class:`~stageset.api.fleet.FleetView`: no request, so a StageSet no rollout selects costs nothing
more).  A pass holds, as a closed update window does (pinned to what it applied, or not applied at
all), every new revision that is not exactly the one released for its source.  So a member never
applies an intermediate revision it was never released, and never one its wave was not released.

The release annotation the controller also writes on the member
(:data:`~stageset.api.fleet.ANNOTATION_FLEET_RELEASE`) is a **hint** its tenant can edit: it may
narrow what the member applies, never widen it.  While a rollout holds the member, the annotation
must say exactly what the rollout's status records — a forged, edited or removed one holds every new
revision until the controller writes it back (at its next decision); without any rollout, an
annotation left behind only holds what it does not release.

Fail closed: a StageSet a rollout selects holds every new revision until that rollout's status
records a release for it (its first decision has not reached it yet); one two rollouts hold is held
entirely (contested); one a refused rollout (``InvalidSpec``) selects, or whose namespace's labels
are not known yet, is held entirely.

Composition: the windows' hold and this one both apply (a stage is held when either holds it);
``stages.metio.wtf/update-now`` lets through what the windows hold, never what a rollout holds
(the rollout's order is the platform's).  Promotion gates and rollback act on what is applied,
as without a rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stageset.api.fleet import ANNOTATION_FLEET_RELEASE, FleetRelease, FleetView


@dataclass(frozen=True)
class FleetHold:
    """What a member's rollout holds back in this pass."""

    held: Mapping[str, str]
    """Stages whose new revision is held, and that revision."""
    rollout: str
    wave: str
    why: str
    """The words for it (``held by FleetRollout …``)."""


def hold(release: FleetRelease | None, *, new: Mapping[str, str], sources: Mapping[str, str],
         selected_by: Sequence[str]) -> FleetHold | None:
    """The hold of one ``release`` (what the rollout released to this StageSet), ``new``: each
    stage's revision its source offers that it has not applied; ``sources``: each stage's source
    (``namespace/name``; a stage without one is keyed by its own name); ``selected_by``: the rollouts
    that select this StageSet.

    Fail closed: a StageSet a rollout selects holds every new revision until that rollout's release
    reaches it."""
    if release is None or (selected_by and release.rollout not in selected_by):
        if not selected_by or not new:
            return None
        rollout = selected_by[0]
        return FleetHold(held=dict(new), rollout=rollout, wave="",
                         why=f"held by FleetRollout {rollout} until it releases a revision to this StageSet")
    held = {stage: revision for stage, revision in new.items()
            if release.hold or release.revisions.get(sources.get(stage, stage)) != revision}
    if not held:
        return None
    why = f"held by FleetRollout {release.rollout}: {release.hold}" if release.hold else \
        f"held by FleetRollout {release.rollout} until wave {release.wave} opens for it"
    return FleetHold(held=held, rollout=release.rollout, wave=release.wave, why=why)


def _all(new: Mapping[str, str], rollout: str, why: str, *, wave: str = "") -> FleetHold:
    # ``rollout`` names one rollout, or (contested) several: status keeps at most 253 characters of it.
    return FleetHold(held=dict(new), rollout=rollout[:253], wave=wave,
                     why=f"held by FleetRollout {rollout}: {why}")


def of_view(view: FleetView, *, annotation: FleetRelease | None, new: Mapping[str, str],
            sources: Mapping[str, str]) -> FleetHold | None:
    """The hold of a member's pass: ``view`` (the controller's watch of FleetRollouts),
    ``annotation`` (the release annotation on its own object, read: a hint), ``new`` and ``sources``
    as :func:`hold`."""
    if not new:
        return None
    rollouts = view.rollouts
    if not rollouts:
        # No rollout holds it: an annotation left behind may only narrow.
        return hold(annotation, new=new, sources=sources, selected_by=())
    if len(rollouts) > 1:
        named = ", ".join(rollouts)
        return _all(new, named, f"selected by the FleetRollouts {named}: no new revision is applied until "
                                "all but one let go")
    rollout = rollouts[0]
    if rollout in view.refused:
        return _all(new, rollout, f"it is refused ({view.refused[rollout]}): no new revision is applied "
                                  "until the platform fixes it")
    record = view.records.get(rollout)
    if record is None and rollout in view.unknown:
        return _all(new, rollout, "its namespace's labels are not known yet: no new revision is applied "
                                  "until they are")
    if record is None:
        return hold(None, new=new, sources=sources, selected_by=[rollout])
    if annotation != record:
        return _all(new, rollout, f"the {ANNOTATION_FLEET_RELEASE} annotation on this StageSet does not say "
                                  "what the rollout released to it (edited or removed): no new revision is "
                                  "applied until the controller writes it back", wave=record.wave)
    return hold(record, new=new, sources=sources, selected_by=[rollout])
