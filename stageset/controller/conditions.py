"""kstatus-compatible conditions: Ready, Reconciling, Stalled with observedGeneration.

``lastTransitionTime`` only moves when a condition's status changes, so status
writes that only restate the same facts stay no-ops.
"""

from __future__ import annotations

import datetime
from typing import Any

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"

Condition = dict[str, Any]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[Condition], *, type_: str, status: str, reason: str,
                  message: str, generation: int) -> list[Condition]:
    """A new list with ``type_`` set; the transition time is kept unless the status changed."""
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed_at = previous["lastTransitionTime"] if previous and previous.get("status") == status \
        and previous.get("lastTransitionTime") else now()
    updated: Condition = {"type": type_, "status": status, "reason": reason,
                          "message": message[:32768], "observedGeneration": generation,
                          "lastTransitionTime": changed_at}
    rest = [c for c in conditions if c.get("type") != type_]
    return sorted([*rest, updated], key=lambda c: str(c.get("type")))


def find_condition(conditions: list[Condition] | None, type_: str) -> Condition:
    """The condition of ``type_`` (an empty dict when there is none)."""
    return next((c for c in conditions or [] if c.get("type") == type_), {})


def ready_at_generation(obj: dict[str, Any]) -> bool:
    """kstatus: Ready=True, and said about the object's current generation."""
    ready = find_condition((obj.get("status") or {}).get("conditions"), READY)
    return ready.get("status") == "True" and \
        ready.get("observedGeneration") == obj.get("metadata", {}).get("generation")


def remove_condition(conditions: list[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.get("type") != type_]


def summarize(conditions: list[Condition], *, ready: bool | None, reason: str, message: str,
              generation: int, stalled: bool = False) -> list[Condition]:
    """Set the three kstatus conditions consistently for one outcome.

    ``ready=None`` means still working (Ready=Unknown... reported as False with
    Reconciling=True); ``stalled`` means retrying will not help until the spec changes.
    """
    if ready is True:
        conditions = set_condition(conditions, type_=READY, status="True", reason=reason,
                                   message=message, generation=generation)
        conditions = remove_condition(conditions, RECONCILING)
        return remove_condition(conditions, STALLED)
    if ready is None:
        conditions = set_condition(conditions, type_=READY, status="Unknown", reason=reason,
                                   message=message, generation=generation)
        conditions = set_condition(conditions, type_=RECONCILING, status="True", reason=reason,
                                   message=message, generation=generation)
        return remove_condition(conditions, STALLED)
    conditions = set_condition(conditions, type_=READY, status="False", reason=reason,
                               message=message, generation=generation)
    conditions = remove_condition(conditions, RECONCILING)
    if stalled:
        return set_condition(conditions, type_=STALLED, status="True", reason=reason,
                             message=message, generation=generation)
    return remove_condition(conditions, STALLED)
