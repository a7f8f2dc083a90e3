"""What one pass knows so far, and how it shows in status while the pass runs.

Identity: status writes go through the :class:`~stageset.controller.status.StatusReport`,
which writes as the controller's own identity.

Invariants: a quiet pass (a routine pass over a Ready StageSet, :func:`plan.quiet`) writes
nothing until its conclusion; stages publish from their own threads, one status write at a
time; a waiting stage's phase shows at once, a new message at most every
:data:`PROGRESS_INTERVAL` seconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from stageset.api import StageInventory, StageSet, StageSetStatus
from stageset.api.vocabulary import Reason
from stageset.apply.inventory import ordered
from stageset.controller.stageset import plan
from stageset.controller.status import StatusReport

Report = StatusReport[StageSetStatus]

# A stage that only waits updates its message in status at most this often (its phase at once).
PROGRESS_INTERVAL = 5.0


@dataclass
class Pass:
    """What one pass knows so far: stage outcomes and inventories (old, merged, fresh)."""

    stageset: StageSet
    previous: plan.Previous
    outcomes: dict[str, plan.StageOutcome]
    current: dict[str, StageInventory]
    fresh: dict[str, StageInventory] = field(default_factory=dict)
    quiet: bool = False
    # Stages publish from their own threads (waiting); one status write at a time.
    lock: threading.Lock = field(default_factory=threading.Lock)
    published: float = 0.0
    partial: str | None = None
    """Status had lost the inventory and the cluster could not be searched completely: why."""

    def announce(self, report: Report, message: str) -> None:
        """A pass begins: Ready=Unknown with ``message`` (never in a quiet pass)."""
        if self.quiet:
            return
        with self.lock:
            self.record(report)
            report.conclude(ready=None, reason=Reason.PROGRESSING, message=message)
            self.published = time.monotonic()

    def publish(self, report: Report) -> None:
        """Show the stages as they stand now (and the merged inventory so far) — never in a quiet
        pass.  Conditions are left to :meth:`announce` and the conclusion, so a re-check pass
        whose stages did not change writes nothing."""
        if self.quiet:
            return
        with self.lock:
            self.record(report)
            if report.write():
                self.published = time.monotonic()

    def waiting(self, report: Report, outcome: plan.StageOutcome) -> None:
        """A stage waits for readiness: its phase shows at once, a new message at most every
        :data:`PROGRESS_INTERVAL` seconds."""
        with self.lock:
            before = self.outcomes[outcome.name]
            self.outcomes[outcome.name] = outcome
            if before.phase is outcome.phase and (before.message == outcome.message or
                                                  time.monotonic() - self.published < PROGRESS_INTERVAL):
                return
        self.publish(report)

    def record(self, report: Report) -> None:
        report.status.stages = [self.outcomes[s.name].status() for s in self.stageset.spec.stages]
        report.status.inventory = ordered(self.current)
