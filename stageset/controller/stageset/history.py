"""``status.history``: each stage's last applied releases, as a pass's conclusion records them.  Pure.

Written by the controller in the pass's own concluding status write (no request of its own):
:func:`recorded` returns the history the pass ends with, and an unchanged history leaves the
status unchanged, so a quiet pass still writes nothing.

Rules, per stage the pass applied (or re-checked, or a rollback restored):

- a release is a (revision, generation) pair: a stage applying a revision or spec its newest
  release does not name starts a new release, newest first, the oldest dropped beyond
  :func:`~stageset.api.history.per_stage`;
- a pass at the newest release's revision and generation updates it: the phase the stage ended
  in, and what it wrote then (a stage applied once more after a failure at the same revision);
- what a release wrote counts objects created, configured (or recreated) and pruned — restoring
  drift is not a release and is not counted (``DriftCorrected`` events tell it);
- a stage no longer in the spec keeps no history.

Only object names, actions and counts are kept; never content (a Secret's name is no secret, its
data never reaches here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from stageset.api.history import NAMED, Release, StageHistory, per_stage
from stageset.apply.changeset import Action, Change
from stageset.controller.stageset.plan import StageOutcome

_CONFIGURED = frozenset({Action.CONFIGURED, Action.RECREATED})


def _named(change: Change) -> str:
    oid = change.id
    where = "/".join(part for part in (oid.kind, oid.namespace, oid.name) if part)
    return f"{where} {change.action.value.lower()}"


def _release(outcome: StageOutcome, *, generation: int | None, changes: Sequence[Change], pruned: int,
             before: Release | None) -> Release:
    written = sorted((c for c in changes if not c.drift and (c.action is Action.CREATED
                                                             or c.action in _CONFIGURED)),
                     key=lambda c: (c.id.kind, c.id.namespace, c.id.name))
    base = before or Release(revision=outcome.revision, generation=generation, applied_at=outcome.applied_at,
                             phase=outcome.phase)
    named = [*base.objects, *(_named(c) for c in written)]
    return base.model_copy(update={
        "phase": outcome.phase,
        "created": base.created + sum(1 for c in written if c.action is Action.CREATED),
        "configured": base.configured + sum(1 for c in written if c.action in _CONFIGURED),
        "deleted": base.deleted + pruned,
        "objects": list(dict.fromkeys(named))[:NAMED],
    })


def recorded(previous: Iterable[StageHistory], *, order: Sequence[str], outcomes: Mapping[str, StageOutcome],
             applied: Iterable[str], changes: Mapping[str, Sequence[Change]], pruned: Mapping[str, int],
             generation: int | None) -> list[StageHistory]:
    """The history a pass ends with.  ``order``: the stages in spec order; ``applied``: the stages
    this pass applied, re-checked or restored; ``changes``: what each wrote; ``pruned``: how many
    objects of each the pass's prune deleted; ``generation``: the StageSet's generation."""
    known = {h.stage: list(h.releases) for h in previous}
    done = set(applied)
    keep = per_stage(len(order))
    result: list[StageHistory] = []
    for name in order:
        releases = known.get(name, [])
        outcome = outcomes.get(name)
        if name in done and outcome is not None and outcome.revision is not None:
            newest = releases[0] if releases else None
            same = newest is not None and (newest.revision, newest.generation) == (outcome.revision,
                                                                                   generation)
            release = _release(outcome, generation=generation, changes=changes.get(name, ()),
                               pruned=pruned.get(name, 0), before=newest if same else None)
            releases = [release, *(releases[1:] if same else releases)]
        if releases:
            result.append(StageHistory(stage=name, releases=releases[:keep]))
    return result
