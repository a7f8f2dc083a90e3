"""A member's side of a FleetRollout: which new revisions its rollout holds back.  Pure: no I/O.

The rollout (:mod:`stageset.controller.fleet`) writes, as the controller, one annotation on each
member (:data:`~stageset.api.fleet.ANNOTATION_FLEET_RELEASE`): the revisions, by source, its wave
released to it, or a hold (unassigned, contested).  A pass reads it from its own object — no
request, so a StageSet no rollout selects costs nothing more — and holds, as a closed update
window does (pinned to what it applied, or not applied at all), every new revision that is not
exactly the one released for its source.  So a member never applies an intermediate revision it
was never released.

Composition: the windows' hold and this one both apply (a stage is held when either holds it);
``stages.metio.wtf/update-now`` lets through what the windows hold, never what a rollout holds
(the rollout's order is the platform's).  Promotion gates and rollback act on what is applied,
as without a rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stageset.api.fleet import FleetRelease


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
    """``new``: each stage's revision its source offers that it has not applied; ``sources``: each
    stage's source (``namespace/name``; a stage without one is keyed by its own name);
    ``selected_by``: the rollouts that select this StageSet, as the controller's watch of them shows.

    Fail closed: a StageSet a rollout selects holds every new revision until that rollout's release
    is written on it — before the rollout's first decision reached it, and when the annotation was
    removed by hand (the next rollout pass writes it back)."""
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
