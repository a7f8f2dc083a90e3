"""Rollback to the last good revision: the plan, as pure functions.  No I/O; time comes in as ``now``.

The words:

- the **last good snapshot** (``status.lastAppliedSnapshot``): each stage's revision (and the
  digest of its ``postBuild`` variables) at the last fully successful pass — every stage Ready
  and promoted.  :func:`snapshot` makes it;
- a stage **moved** in this release when it was applied (or attempted) at a revision, or with
  variables, other than its last good ones (:func:`moved`);
- a release **fails** when a stage fails terminally: phase ``Failed`` with reason ``StageFailed``
  (its objects failed, its apply or build failed, or its wait ran out under ``onTimeout:
  Rollback``).  ``RBACDenied``, a source not ready yet, an unreachable cluster are not a bad
  release and never roll back (:func:`trigger`);
- a **rollback** re-applies every moved stage that has a last good revision at that revision,
  dependents first (:func:`order`), deleting the objects the new revision added; a stage
  without one (new in this release) is left as it is;
- afterwards the failed revisions are **parked** (:func:`parked`): while every stage's source
  still offers its failed revision and the spec is unchanged, stages render at their last good
  revision instead (drift keeps being corrected there), so the failing revision is not retried in
  a loop.  A new revision of any source, or a spec change, ends it (:func:`lifted`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from stageset.api import format_time
from stageset.api.release import Rollback, RollbackPhase, StageSnapshot
from stageset.api.vocabulary import Reason, StagePhase
from stageset.controller.render.digests import (
    substitution_digest as substitution_digest,  # its snapshots' key
)
from stageset.controller.stageset.plan import StageOutcome


@dataclass(frozen=True)
class Applied:
    """What a stage was applied at in this pass."""

    revision: str
    inputs: str | None
    """Its substitution digest."""


def snapshot(order: Sequence[str], applied: Mapping[str, Applied]) -> list[StageSnapshot]:
    """The last good snapshot of a fully successful pass."""
    return [StageSnapshot(stage=name, revision=applied[name].revision,
                          substitution_digest=applied[name].inputs) for name in order if name in applied]


def good_of(snapshots: Iterable[StageSnapshot]) -> dict[str, StageSnapshot]:
    return {s.stage: s for s in snapshots}


def moved(order: Sequence[str], *, good: Mapping[str, StageSnapshot], attempted: Mapping[str, Applied],
          applied: Mapping[str, str | None]) -> list[str]:
    """Stages that moved away from their last good revision in this release: attempted in this pass
    at other content, or applied (by an earlier pass of it) at another revision.  In spec order."""
    found = []
    for name in order:
        last = good.get(name)
        if last is None:
            continue
        tried = attempted.get(name)
        other_content = tried is not None and (tried.revision, tried.inputs) != (last.revision,
                                                                                 last.substitution_digest)
        revision = applied.get(name)
        if other_content or (revision is not None and revision != last.revision):
            found.append(name)
    return found


def trigger(outcomes: Iterable[StageOutcome]) -> StageOutcome | None:
    """The first stage whose failure fails the release (``None``: no such failure)."""
    failing = (o for o in outcomes if o.phase is StagePhase.FAILED and o.reason is Reason.STAGE_FAILED)
    return next(failing, None)


def order(graph: nx.DiGraph, stages: Iterable[str]) -> list[str]:
    """``stages`` in rollback order: dependents before the stages they depend on."""
    wanted = set(stages)
    return [n for n in reversed(list(nx.lexicographical_topological_sort(graph))) if n in wanted]


def started(*, failed: StageOutcome, moved_stages: Sequence[str], rollback_order: Sequence[str],
            current: Mapping[str, str], generation: int, now: datetime.datetime) -> Rollback:
    """The rollback record written before the first stage is restored (a restart resumes it)."""
    return Rollback(phase=RollbackPhase.ROLLING_BACK, failed=dict(current), remaining=list(rollback_order),
                    generation=generation, time=format_time(now),
                    message=f"stage {failed.name!r} failed: {failed.message}; restoring "
                            f"{', '.join(rollback_order) or 'nothing'} to the last good revision"
                            + (f" ({', '.join(sorted(set(moved_stages) - set(rollback_order)))} "
                               "left as they are: no last good revision)"
                               if set(moved_stages) - set(rollback_order) else ""))


def restored(record: Rollback, stage: str, revision: str) -> Rollback:
    """``record`` after ``stage`` was restored to ``revision``."""
    return record.model_copy(update={"remaining": [s for s in record.remaining if s != stage],
                                     "restored": {**record.restored, stage: revision}})


def finished(record: Rollback) -> Rollback:
    """Every stage restored: the record parks the failed revisions."""
    done = ", ".join(f"{stage} to {revision}" for stage, revision in record.restored.items()) or "nothing"
    first = record.message.split("; restoring", 1)[0]
    return record.model_copy(update={"phase": RollbackPhase.ROLLED_BACK, "remaining": [],
                                     "message": f"{first}; rolled back {done}; the failed revisions are "
                                                "not applied again until a source or the spec changes"})


def lifted(record: Rollback | None, *, current: Mapping[str, str], generation: int) -> bool:
    """Has the parked release moved on (a source offers a new revision, or the spec changed)?"""
    if record is None or record.phase is not RollbackPhase.ROLLED_BACK:
        return False
    if record.generation is not None and record.generation != generation:
        return True
    return any(current.get(stage, revision) != revision for stage, revision in record.failed.items())


def parked(record: Rollback | None, *, current: Mapping[str, str], good: Mapping[str, StageSnapshot],
           generation: int) -> tuple[dict[str, str], set[str]]:
    """While a rolled-back release is parked: the stages to render at their last good revision, and
    the stages of the failed release without one (not applied at all meanwhile)."""
    if record is None or record.phase is not RollbackPhase.ROLLED_BACK or \
            lifted(record, current=current, generation=generation):
        return {}, set()
    pins = {stage: good[stage].revision for stage in record.failed if stage in good}
    return pins, {stage for stage in record.failed if stage not in good}


def unavailable_message(failed: StageOutcome, problems: Sequence[str]) -> str:
    """``PreviousRevisionUnavailable``: what failed, and why nothing could be restored."""
    return (f"stage {failed.name!r} failed: {failed.message}; the last good revision cannot be restored, "
            f"so nothing was rolled back: {'; '.join(problems)}")
