"""kstatus-compatible conditions: Ready, Reconciling, Stalled with observedGeneration.  Pure.

``lastTransitionTime`` only moves when a condition's status changes, so status
writes that only restate the same facts stay no-ops.  Conditions are the
:class:`stageset.api.Condition` model; raw objects (other StageSets, benchmarks) are
read with :func:`find_condition` / :func:`ready_at_generation`.

The status values a reconcile writes are made here too, as new values (nothing is changed in
place): :func:`concluded` (the conditions of an outcome, each non-ready message ending with its
runbook link: :func:`with_runbook`) and :func:`redacted` (every message redacted and bounded).
The one writer is :class:`stageset.controller.status.StatusWriter`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from stageset.api import Condition, GitRepositoryStatus, StageSetStatus, StageTargetStatus
from stageset.api.fleet import FleetRolloutStatus
from stageset.api.vocabulary import ConditionStatus, ConditionType, Reason
from stageset.kube.types import ConditionDict, KubeObject, conditions, metadata

S = TypeVar("S", StageSetStatus, GitRepositoryStatus, StageTargetStatus, FleetRolloutStatus)
Redact = Callable[[str], str]

READY = ConditionType.READY
RECONCILING = ConditionType.RECONCILING
STALLED = ConditionType.STALLED

MAX_MESSAGE = 32768
KSTATUS = frozenset({READY, RECONCILING, STALLED})


def set_condition(existing: Sequence[Condition], *, type_: ConditionType, status: ConditionStatus,
                  reason: Reason, message: str, generation: int, now: str) -> list[Condition]:
    """A new list with ``type_`` set; the transition time is kept unless the status changed."""
    previous = next((c for c in existing if c.type == type_), None)
    changed_at = previous.last_transition_time if previous is not None and previous.status == status \
        and previous.last_transition_time else now
    updated = Condition(type=type_, status=status, reason=reason, message=message[:MAX_MESSAGE],
                        observed_generation=generation, last_transition_time=changed_at)
    rest = [c for c in existing if c.type != type_]
    return sorted([*rest, updated], key=lambda c: c.type)


def remove_condition(existing: Sequence[Condition], type_: ConditionType) -> list[Condition]:
    return [c for c in existing if c.type != type_]


def summarize(existing: Sequence[Condition], *, ready: bool | None, reason: Reason, message: str,
              generation: int, now: str, stalled: bool = False) -> list[Condition]:
    """Set the three kstatus conditions consistently for one outcome.

    ``ready=None`` means still working (Ready=Unknown with Reconciling=True); ``stalled``
    means retrying will not help until the spec changes.
    """
    def put(found: Sequence[Condition], type_: ConditionType, status: ConditionStatus) -> list[Condition]:
        return set_condition(found, type_=type_, status=status, reason=reason, message=message,
                             generation=generation, now=now)

    if ready is True:
        return remove_condition(remove_condition(put(existing, READY, ConditionStatus.TRUE), RECONCILING),
                                STALLED)
    if ready is None:
        working = put(put(existing, READY, ConditionStatus.UNKNOWN), RECONCILING, ConditionStatus.TRUE)
        return remove_condition(working, STALLED)
    failed = remove_condition(put(existing, READY, ConditionStatus.FALSE), RECONCILING)
    return put(failed, STALLED, ConditionStatus.TRUE) if stalled else remove_condition(failed, STALLED)


def find(existing: Sequence[Condition], type_: ConditionType) -> Condition | None:
    return next((c for c in existing if c.type == type_), None)


def holds_at(condition: Condition | None, status: ConditionStatus, generation: int) -> bool:
    """Does ``condition`` say ``status`` about ``generation``?"""
    return condition is not None and condition.status == status and \
        condition.observed_generation == generation


# -- raw objects ---------------------------------------------------------------------------

def find_condition(found: Sequence[ConditionDict] | None, type_: str) -> ConditionDict:
    """The raw condition of ``type_`` (an empty dict when there is none)."""
    empty: ConditionDict = {}
    return next((c for c in found or [] if c.get("type") == type_), empty)


def ready_at_generation(obj: KubeObject) -> bool:
    """kstatus: Ready=True, and said about the object's current generation."""
    ready = find_condition(conditions(obj), READY)
    return ready.get("status") == ConditionStatus.TRUE and \
        ready.get("observedGeneration") == metadata(obj).get("generation")


# -- the status values a reconcile writes ---------------------------------------------------

def runbook_url(base: str, reason: Reason) -> str:
    """The runbook page of ``reason`` under ``base`` (``https://…/runbooks/`` -> ``…/rbacdenied/``)."""
    return f"{base.rstrip('/')}/{reason.value.lower()}/"


def with_runbook(message: str, reason: Reason, base: str) -> str:
    """``message`` ending with its runbook link (cut first, so the link always survives the bound)."""
    if not base:
        return message[:MAX_MESSAGE]
    link = f"runbook: {runbook_url(base, reason)}"
    if not message:
        return link
    suffix = f"; {link}"
    return message[:MAX_MESSAGE - len(suffix)] + suffix


def concluded(status: S, *, start: Sequence[Condition], generation: int, ready: bool | None, reason: Reason,
              message: str, now: str, redact: Redact, runbook_base_url: str, stalled: bool = False) -> S:
    """``status`` with the conditions of this outcome, summarized from ``start`` (the conditions
    the reconcile began with, so a transition time moves only when the status really changed)."""
    # Redacted before it is cut to length: a cut must never leave half a Secret value.
    text = redact(message)
    if ready is not True:
        text = with_runbook(text, reason, runbook_base_url)
    # The kstatus three come from ``start``; any other type (a StageSet's ``Drifted``) is what
    # ``status`` says: the pass that built it set or removed it.
    kept = [c for c in start if c.type in KSTATUS] + [c for c in status.conditions if c.type not in KSTATUS]
    return status.model_copy(update={
        "observed_generation": generation,
        "conditions": summarize(kept, ready=ready, reason=reason, message=text, generation=generation,
                                now=now, stalled=stalled)})


def redacted(status: S, redact: Redact) -> S:
    """``status`` with every message (conditions, stages) redacted and bounded: what may leave."""
    update: dict[str, object] = {"conditions": [
        c.model_copy(update={"message": redact(c.message)[:MAX_MESSAGE]}) for c in status.conditions]}
    if isinstance(status, StageSetStatus):
        update["stages"] = [s.model_copy(update={"message": redact(s.message)[:MAX_MESSAGE]}) if s.message
                            else s for s in status.stages]
    return status.model_copy(update=update)
