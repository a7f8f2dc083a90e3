"""What applying a stage did, one action per object (as Flux's ``ssa.ChangeSet``).

The engine reports a :class:`ChangeSet`; status, events (drift), the benchmarks and
a future ``diff`` command all read it rather than re-deriving what happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from stageset.apply.inventory import ObjectId


class Action(StrEnum):
    CREATED = "Created"
    CONFIGURED = "Configured"
    UNCHANGED = "Unchanged"
    RECREATED = "Recreated"
    DELETED = "Deleted"
    SKIPPED = "Skipped"


WRITES = frozenset({Action.CREATED, Action.CONFIGURED, Action.RECREATED, Action.DELETED})


@dataclass(frozen=True)
class Change:
    id: ObjectId
    action: Action
    # Someone else changed (or deleted) an object we had applied from this same manifest: this
    # apply restored it (a write), or left it as it is (SKIPPED: driftDetection.mode Warn).
    drift: bool = False
    fields: tuple[str, ...] = ()
    """Left drifted: the field paths that differ from what was applied."""
    gone: bool = False
    """Left drifted: it was deleted (or lost its owner labels)."""

    def describe(self) -> str:
        return f"{self.id.describe()} {self.action.value.lower()}"


@dataclass
class ChangeSet:
    changes: list[Change] = field(default_factory=list)

    def add(self, change: Change) -> None:
        self.changes.append(change)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    @property
    def writes(self) -> int:
        return sum(1 for c in self.changes if c.action in WRITES)

    @property
    def drifted(self) -> list[Change]:
        """Objects someone else changed that this apply restored."""
        return [c for c in self.changes if c.drift and c.action in WRITES]

    @property
    def left_drifted(self) -> list[Change]:
        """Objects someone else changed that this apply left as they are (``Warn``)."""
        return [c for c in self.changes if c.drift and c.action not in WRITES]

    def count(self, action: Action) -> int:
        return sum(1 for c in self.changes if c.action is action)

    def summary(self) -> str:
        """``2 created, 1 configured, 5 unchanged`` (actions that occurred, in a fixed order)."""
        counts = [(action, self.count(action)) for action in Action]
        return ", ".join(f"{n} {action.value.lower()}" for action, n in counts if n) or "no objects"
