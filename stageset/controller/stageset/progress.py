"""What one pass knows so far, as a value, and the status it shows.  Pure: no I/O, no clock.

- :class:`Progress` — every stage's outcome and the inventories (before the pass, shown, fresh);
  each change makes a new value;
- :func:`shown` — the status showing the stages and inventory as they stand (while a pass runs);
- :func:`concluded` — the status a pass ends with, before its conditions: after a prune of what
  is stale (its :class:`~stageset.controller.stageset.pruning.PrunePermission`) only what is
  still owned, and the revision applied;
- :func:`waiting_due` — the throttle: a waiting stage's phase shows at once, a new message at
  most every :data:`PROGRESS_INTERVAL` seconds.

What is written, and when, is :class:`~stageset.controller.stageset.writer.PassWriter`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from stageset.api import PreviousTargets, StageInventory, StageSet, StageSetStatus, StageStatus
from stageset.api.vocabulary import StagePhase
from stageset.apply import record
from stageset.apply.changeset import Change
from stageset.apply.inventory import Stale, merged, ordered, with_kept
from stageset.controller.stageset.plan import Previous, StageOutcome, Verdict
from stageset.controller.stageset.pruning import PrunePermission, prunes_stale

# A stage that only waits updates its message in status at most this often (its phase at once).
PROGRESS_INTERVAL = 5.0


@dataclass(frozen=True)
class Progress:
    """What one pass knows so far.  ``current`` is what status shows: the inventory before the
    pass merged with what this pass applied (``fresh``), so nothing is forgotten before prune."""

    order: tuple[str, ...]
    """The stages, in spec order."""
    previous: Previous
    outcomes: Mapping[str, StageOutcome]
    current: Mapping[str, StageInventory]
    fresh: Mapping[str, StageInventory] = field(default_factory=dict)
    written: Mapping[str, tuple[Change, ...]] = field(default_factory=dict)
    """What each stage's apply in this pass changed (for ``status.history``)."""
    moving: PreviousTargets | None = None
    """A move in flight: the objects still on clusters the stages moved away from (status shows them)."""
    unlisted: record.Previous = ()
    """Stages recorded on a previous cluster that could not be listed there (status was lost): kept
    in the record, looked for again next pass."""
    moving_since: str | None = None
    """When the move began, as the durable record says."""

    @classmethod
    def start(cls, stageset: StageSet, previous: Previous) -> Progress:
        """Every stage Pending, keeping what the last pass knew of it."""
        names = tuple(s.name for s in stageset.spec.stages)
        return cls(order=names, previous=previous, current=dict(previous.inventories),
                   outcomes={n: StageOutcome.carried(n, previous.stages.get(n)) for n in names},
                   moving=previous.moving)

    def moved(self, current: Mapping[str, StageInventory], moving: PreviousTargets | None,
              unlisted: record.Previous, *, since: str | None) -> Progress:
        """Before anything is applied: the inventories on the current target (what it prunes against),
        and what is left on previous ones (:func:`~stageset.controller.stageset.moves.split`)."""
        return replace(self, previous=replace(self.previous, inventories=dict(current)),
                       current=dict(current), moving=moving, unlisted=unlisted, moving_since=since)

    def recovered(self, inventories: Mapping[str, StageInventory]) -> Progress:
        """The inventories before the pass, as rebuilt from the cluster when status had lost them
        (what status still holds is shown as it was)."""
        return replace(self, previous=replace(self.previous, inventories=dict(inventories)),
                       current={**inventories, **self.current})

    def with_outcome(self, outcome: StageOutcome) -> Progress:
        return replace(self, outcomes={**self.outcomes, outcome.name: outcome})

    def applying(self, name: str) -> Progress:
        return self.with_outcome(replace(self.outcomes[name], phase=StagePhase.APPLYING, message=""))

    def rechecked(self, names: Iterable[str]) -> Progress:
        """Stages only re-checked keep the phase and message they had until the re-check says otherwise."""
        outcomes = dict(self.outcomes)
        for name in names:
            before = self.previous.stages[name]
            outcomes[name] = replace(outcomes[name], phase=before.phase, message=before.message or "")
        return replace(self, outcomes=outcomes)

    def applied(self, outcome: StageOutcome, inventory: StageInventory | None,
                changes: Iterable[Change] = ()) -> Progress:
        """A stage's work ended with ``outcome``; ``inventory``: what it applied (``None``: nothing),
        ``changes``: what that apply changed."""
        done = self.with_outcome(outcome)
        if inventory is None:
            return done
        name = outcome.name
        return replace(done, fresh={**self.fresh, name: inventory},
                       written={**self.written, name: tuple(changes)},
                       current={**self.current, name: merged(self.previous.inventories.get(name), inventory)})

    def restored(self, outcome: StageOutcome, inventory: StageInventory) -> Progress:
        """A rollback restored a stage: ``outcome``, and ``inventory`` is all it holds now (what the
        failed revision added was deleted, or is still listed if it could not be)."""
        return replace(self.with_outcome(outcome), current={**self.current, outcome.name: inventory},
                       fresh={**self.fresh, outcome.name: inventory})

    def stages(self) -> list[StageStatus]:
        return [self.outcomes[name].status() for name in self.order]


def shown(status: StageSetStatus, progress: Progress) -> StageSetStatus:
    """``status`` showing the stages and the merged inventory as they stand now."""
    return status.model_copy(update={"stages": progress.stages(), "inventory": ordered(progress.current),
                                     "previous_targets": progress.moving})


def concluded(status: StageSetStatus, progress: Progress, verdict: Verdict, *, prune: PrunePermission,
              kept: Sequence[Stale]) -> StageSetStatus:
    """The status a pass ends with (its conditions are the writer's to add).  After a prune of what
    is stale (``prune``: the pass's permission): only the new inventory and what could not be
    deleted (``kept``: still tracked, so a later pass tries again), and the revision applied."""
    ended = shown(status, progress)
    if not prunes_stale(prune.scope):
        return ended
    return ended.model_copy(update={"inventory": ordered(with_kept(progress.fresh, kept)),
                                    "last_applied_revision": verdict.revision})


def waiting_due(before: StageOutcome, after: StageOutcome, *, since_published: float) -> bool:
    """Should a stage that waits be shown now?  Its phase at once; a new message only when
    :data:`PROGRESS_INTERVAL` seconds have passed since status was last written."""
    return before.phase is not after.phase or (before.message != after.message
                                               and since_published >= PROGRESS_INTERVAL)
