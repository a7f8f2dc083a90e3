"""The last change each stage made, as far as the controller's events tell it.  Pure.

The controller records no field-level diff.  What it does record, as Events on the StageSet:

- ``ReconciliationSucceeded`` when the StageSet turns Ready after a change, naming each object
  written since it was last Ready with its action (``ConfigMap/shop/settings configured,
  Service/shop/web created, and 3 more, 2 pruned``; at most ten objects are named), annotated
  with the revision applied (``stages.metio.wtf/revision``);
- ``DriftCorrected`` when a stage restored objects someone else changed (``stage 'backend':
  restored Service shop/web``).

An object named there belongs to the stage whose inventory holds it.  So a stage's last change
is *known* when such an event is still kept by the apiserver (Events live for its
``--event-ttl``, one hour by default), the user may list Events in the StageSet's namespace, and
the change is among the objects the event names.  Anything else is shown as not known, never
guessed.  (What applying would change *now* is ``stageset diff``'s job.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from stageset.api.vocabulary import EVENT_REVISION_ANNOTATION, EventReason
from stageset.apply.changeset import WRITES
from stageset.apply.inventory import ObjectId

REVISION_ANNOTATION = EVENT_REVISION_ANNOTATION
_ACTIONS = {action.value.lower() for action in WRITES}
_MORE = re.compile(r"^and (\d+) more$")
_PRUNED = re.compile(r"^(\d+) pruned$")
_DRIFT = re.compile(r"^stage '([a-z0-9-]{1,63})': restored (.*)$", re.DOTALL)
_DRIFT_MORE = re.compile(r"^(.*) and (\d+) more$", re.DOTALL)


@dataclass(frozen=True)
class EventRow:
    """One Event, as the dashboard keeps it (the fields it shows and reads)."""

    uid: str
    namespace: str
    kind: str
    """Of the object the event is about."""
    name: str
    type: str
    reason: str
    message: str
    last_seen: str | None
    count: int
    revision: str | None = None
    """The ``stages.metio.wtf/revision`` annotation, when the controller set one."""

    @property
    def subject(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class StageChange:
    """What one stage last changed, from one event."""

    when: str | None
    revision: str | None
    objects: list[tuple[str, str]] = field(default_factory=list)
    """(object, action), e.g. ``("ConfigMap/shop/settings", "configured")``."""
    drift: bool = False
    """Restoring drift rather than applying a new revision or spec."""
    more: bool = False
    """The event named only some of the objects written: this stage may have changed more."""


def subject(oid: ObjectId) -> str:
    """``Kind/namespace/name`` (``Kind/name`` cluster-scoped): as ``ReconciliationSucceeded`` names
    objects (:func:`stageset.controller.events.subject`)."""
    return "/".join(part for part in (oid.kind, oid.namespace, oid.name) if part)


@dataclass(frozen=True)
class Summary:
    objects: list[tuple[str, str]]
    more: int
    pruned: int


def parse_summary(message: str) -> Summary:
    """Read a ``ReconciliationSucceeded`` message back into (object, action) pairs."""
    objects: list[tuple[str, str]] = []
    more = pruned = 0
    for part in message.split(", "):
        if (found := _MORE.match(part)) is not None:
            more = int(found.group(1))
        elif (found := _PRUNED.match(part)) is not None:
            pruned = int(found.group(1))
        else:
            name, _, action = part.rpartition(" ")
            if name and action in _ACTIONS and " " not in name:
                objects.append((name, action))
    return Summary(objects=objects, more=more, pruned=pruned)


def last_changes(events: Iterable[EventRow], inventories: Mapping[str, Sequence[ObjectId]]
                 ) -> dict[str, StageChange]:
    """Each stage's newest known change, from the StageSet's own events (any order)."""
    by_subject = {subject(oid): stage for stage, oids in inventories.items() for oid in oids}
    found: dict[str, StageChange] = {}
    for event in sorted(events, key=lambda e: e.last_seen or "", reverse=True):
        if event.reason == EventReason.RECONCILIATION_SUCCEEDED:
            summary = parse_summary(event.message)
            stages: dict[str, list[tuple[str, str]]] = {}
            for name, action in summary.objects:
                if (stage := by_subject.get(name)) is not None:
                    stages.setdefault(stage, []).append((name, action))
            for stage, objects in stages.items():
                found.setdefault(stage, StageChange(when=event.last_seen, revision=event.revision,
                                                    objects=objects, more=summary.more > 0))
        elif event.reason == EventReason.DRIFT_CORRECTED:
            drift = _DRIFT.match(event.message)
            if drift is None:
                continue
            stage, listed = drift.group(1), drift.group(2)
            more = _DRIFT_MORE.match(listed)
            names = (more.group(1) if more else listed).split(", ")
            found.setdefault(stage, StageChange(
                when=event.last_seen, revision=None, drift=True, more=more is not None,
                objects=[(_as_subject(name), "restored") for name in names if name]))
    return found


def _as_subject(name: str) -> str:
    """``Service shop/web`` (a drift message's spelling) as ``Service/shop/web``."""
    kind, _, where = name.partition(" ")
    return f"{kind}/{where}" if where else name
