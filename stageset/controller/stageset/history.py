"""``status.history``: each stage's last applied releases, as a pass's conclusion records them.  Pure.

Written by the controller in the pass's own concluding status write (no request of its own):
:func:`recorded` returns the history the pass ends with, and an unchanged history leaves the
status unchanged, so a quiet pass still writes nothing.

Rules, per stage:

- a release is a (revision, generation) pair: a stage applying a revision its newest release does
  not name starts a new release, newest first, the oldest dropped beyond
  :func:`~stageset.api.history.per_stage`; its time is the pass's own (``now``), also when the pass
  wrote nothing (a commit that changed nothing this stage renders is still released then);
- a new spec generation at the same revision is a release only when the pass wrote or pruned
  something: a spec change that changed nothing here (a suspend, a resume, a new interval) adds no
  row, so it never pushes real releases out;
- a pass at the newest release's revision and generation updates it: the phase the stage ended
  in, and what it wrote then (a stage applied once more after a failure at the same revision);
- what a release wrote counts objects created, configured (or recreated) and pruned — restoring
  drift is not a release and is not counted (``DriftCorrected`` events tell it);
- a stage that failed without applying anything (refused, denied, not buildable) adds a failed
  attempt (``attempt``, its ``reason``, the revision it tried when known); the same failure again
  (revision, generation, reason) is the same entry, so a stage retrying its failure writes nothing
  new, and a fix then starts a release above it;
- a stage no longer in the spec keeps no history.

Only object names, actions and counts are kept; never content (a Secret's name is no secret, its
data never reaches here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from stageset.api.history import NAMED, Release, StageHistory, per_stage
from stageset.api.vocabulary import StagePhase
from stageset.apply.changeset import Action, Change
from stageset.controller.stageset.plan import StageOutcome

_CONFIGURED = frozenset({Action.CONFIGURED, Action.RECREATED})


def _named(change: Change) -> str:
    oid = change.id
    where = "/".join(part for part in (oid.kind, oid.namespace, oid.name) if part)
    return f"{where} {change.action.value.lower()}"


def _release(outcome: StageOutcome, *, generation: int | None, written: Sequence[Change], pruned: int,
             before: Release | None, now: str) -> Release:
    base = before or Release(revision=outcome.revision, generation=generation, applied_at=now,
                             phase=outcome.phase)
    named = [*base.objects, *(_named(c) for c in written)]
    return base.model_copy(update={
        "phase": outcome.phase,
        "reason": outcome.reason.value if outcome.phase is StagePhase.FAILED and outcome.reason else None,
        "created": base.created + sum(1 for c in written if c.action is Action.CREATED),
        "configured": base.configured + sum(1 for c in written if c.action in _CONFIGURED),
        "deleted": base.deleted + pruned,
        "objects": list(dict.fromkeys(named))[:NAMED],
    })


def _written(changes: Sequence[Change]) -> list[Change]:
    wrote = (c for c in changes if not c.drift and (c.action is Action.CREATED or c.action in _CONFIGURED))
    return sorted(wrote, key=lambda c: (c.id.kind, c.id.namespace, c.id.name))


def _applied(releases: list[Release], outcome: StageOutcome, *, generation: int | None,
             changes: Sequence[Change], pruned: int, now: str) -> list[Release]:
    """The releases after a pass that applied (or re-checked) the stage at ``outcome.revision``."""
    written = _written(changes)
    newest = next((r for r in releases if not r.attempt), None)
    same_revision = newest is not None and newest.revision == outcome.revision
    quiet = not written and not pruned
    if same_revision and newest is not None and newest.generation != generation and quiet:
        # A spec change that changed nothing this stage applied: no release of its own.
        index = releases.index(newest)
        return [*releases[:index], newest.model_copy(update={"phase": outcome.phase}), *releases[index + 1:]]
    if releases and not releases[0].attempt and same_revision and newest is not None \
            and newest.generation == generation:
        return [_release(outcome, generation=generation, written=written, pruned=pruned, before=newest,
                         now=now), *releases[1:]]
    return [_release(outcome, generation=generation, written=written, pruned=pruned, before=None, now=now),
            *releases]


def _attempted(releases: list[Release], outcome: StageOutcome, *, revision: str | None,
               generation: int | None, now: str) -> list[Release]:
    """The releases after a pass in which the stage failed without applying anything."""
    reason = outcome.reason.value if outcome.reason else None
    newest = releases[0] if releases else None
    if newest is not None and newest.attempt and (newest.revision, newest.generation, newest.reason) == (
            revision, generation, reason):
        return releases  # the same failure again: nothing new to tell
    return [Release(revision=revision, generation=generation, applied_at=now, phase=StagePhase.FAILED,
                    reason=reason, attempt=True), *releases]


def recorded(previous: Iterable[StageHistory], *, order: Sequence[str], outcomes: Mapping[str, StageOutcome],
             applied: Iterable[str], changes: Mapping[str, Sequence[Change]], pruned: Mapping[str, int],
             generation: int | None, now: str, tried: Mapping[str, str | None] | None = None
             ) -> list[StageHistory]:
    """The history a pass ends with.  ``order``: the stages in spec order; ``applied``: the stages
    this pass applied, re-checked or restored; ``changes``: what each wrote; ``pruned``: how many
    objects of each the pass's prune deleted; ``generation``: the StageSet's generation; ``now``:
    the pass's time; ``tried``: the stages this pass attempted (rendered, or failed to) and the
    revision each tried (``None``: not known), so a failure there is a failed attempt."""
    known = {h.stage: list(h.releases) for h in previous}
    done = set(applied)
    attempts = tried or {}
    keep = per_stage(len(order))
    result: list[StageHistory] = []
    for name in order:
        releases = known.get(name, [])
        outcome = outcomes.get(name)
        if outcome is not None and name in done and outcome.revision is None and attempts.get(name):
            # Applied, then failed (its objects not ready in time, a health check): the revision tried.
            outcome = replace(outcome, revision=attempts[name])
        if outcome is None:
            pass
        elif name in done and outcome.revision is not None:
            releases = _applied(releases, outcome, generation=generation, changes=changes.get(name, ()),
                                pruned=pruned.get(name, 0), now=now)
        elif name not in done and name in attempts and outcome.phase is StagePhase.FAILED:
            releases = _attempted(releases, outcome, revision=attempts[name], generation=generation, now=now)
        if releases:
            result.append(StageHistory(stage=name, releases=releases[:keep]))
    return result
