"""What a ``Warn`` StageSet says about drift: ``status.drifted``, the ``Drifted`` condition, and which
drift is new (one ``DriftDetected`` event per drift, not per pass).  Pure.

A pass knows, for every stage it applied, which objects it left as someone else changed them (the
engine's ``SKIPPED`` + drift changes, with the field paths that differ).  A stage it did not apply
this time (a failure before its apply, a dependency not ready) keeps what status said of it; a stage
no longer in the spec says nothing.  In ``Correct`` mode nothing is left drifted, so the list is
empty and the condition goes: switching back from ``Warn`` corrects and clears at once.

Identity: none (no I/O).  Messages name objects (``Kind namespace/name``, as the inventory does) and
field paths, never a value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from stageset.api import DriftedObject, DriftMode, StageSetStatus
from stageset.api.stageset import MAX_DRIFTED
from stageset.api.vocabulary import ConditionStatus, ConditionType, Reason
from stageset.apply.changeset import Action, Change
from stageset.apply.inventory import ObjectId
from stageset.controller.conditions import remove_condition, set_condition

LISTED = 10
"""Objects a message names before "and N more"."""
MAX_FIELDS_SHOWN = 4
"""Field paths a message names per object (``status.drifted`` keeps up to 16)."""


@dataclass(frozen=True)
class Report:
    status: StageSetStatus
    """The status with ``drifted`` and the ``Drifted`` condition as this pass found them."""
    new: tuple[DriftedObject, ...]
    """Drift status did not show before: what a ``DriftDetected`` event tells."""
    count: int
    """Objects left drifted in all (``status.drifted`` lists at most 64)."""


def describe(entry: DriftedObject) -> str:
    """``Deployment shop/web (spec.replicas, spec.template.spec.containers[app].image)``."""
    try:
        name = ObjectId.decode(entry.id).describe()
    except ValueError:
        name = entry.id
    if entry.deleted:
        return f"{name} (deleted, or its owner labels removed)"
    fields = list(entry.fields[:MAX_FIELDS_SHOWN])
    if len(entry.fields) > MAX_FIELDS_SHOWN:
        fields.append(f"{len(entry.fields) - MAX_FIELDS_SHOWN} more")
    return f"{name} ({', '.join(fields)})" if fields else name


def message(entries: Sequence[DriftedObject], *, count: int | None = None) -> str:
    """``2 objects differ from what was applied: Deployment shop/web (spec.replicas), ConfigMap shop/a
    (deleted, ...)`` — at most :data:`LISTED` named."""
    total = len(entries) if count is None else count
    named = "; ".join(describe(e) for e in entries[:LISTED])
    more = f"; and {total - min(len(entries), LISTED)} more" if total > min(len(entries), LISTED) else ""
    noun = "object differs" if total == 1 else "objects differ"
    return f"{total} {noun} from what was applied and {'was' if total == 1 else 'were'} left as found " \
           f"(driftDetection.mode Warn): {named}{more}"


def left(stage: str, changes: Sequence[Change]) -> list[DriftedObject]:
    """What one stage's apply left drifted."""
    return [DriftedObject(stage=stage, id=c.id.encode(), fields=list(c.fields),
                          deleted=True if c.gone else None)
            for c in changes if c.drift and c.action is Action.SKIPPED]


def reported(status: StageSetStatus, *, written: Mapping[str, Sequence[Change]], stages: Collection[str],
             mode: DriftMode, generation: int, now: str) -> Report:
    """``status`` with ``drifted`` and the ``Drifted`` condition after a pass that applied the stages in
    ``written`` (their changes), for a spec naming ``stages``, in ``mode``."""
    if mode is DriftMode.CORRECT:
        found: list[DriftedObject] = []
    else:
        found = [e for e in status.drifted if e.stage in stages and e.stage not in written]
        for stage in [s for s in stages if s in written]:
            found += left(stage, written[stage])
    known = {(e.stage, e.id, tuple(e.fields), e.deleted) for e in status.drifted}
    new = tuple(e for e in found if (e.stage, e.id, tuple(e.fields), e.deleted) not in known)
    count = len(found)
    shown = found[:MAX_DRIFTED]
    if found:
        conditions = set_condition(status.conditions, type_=ConditionType.DRIFTED,
                                   status=ConditionStatus.TRUE, reason=Reason.DRIFT_DETECTED,
                                   message=message(shown, count=count), generation=generation, now=now)
    else:
        conditions = remove_condition(status.conditions, ConditionType.DRIFTED)
    return Report(status=status.model_copy(update={"drifted": shown, "conditions": conditions}), new=new,
                  count=count)
