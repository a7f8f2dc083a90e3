"""What the manager hands every feature's ``setup``: the parts they share, built once.

As controller-runtime hands a manager to each ``SetupWithManager``: the client pool, the settings,
the event recorder, the metrics, the clock, the manager's hooks (its work queues, its cache's view
of our own writes, whether its caches synced, whether this process leads) — and the parts the
composition root (:mod:`stageset.controller.wiring`) builds once for every feature that needs them:
the readiness watch pool (each watch as the identity that opened it; stages wait on it, and so may
any feature that watches what a StageSet applied or depends on) and the terminating namespaces.

Identity: none; this is a value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stageset.apply.engine import WatchSource
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder
from stageset.controller.metrics import Metrics
from stageset.controller.settings import ControllerSettings
from stageset.controller.setup import Enqueue
from stageset.controller.status import WriteListener
from stageset.controller.terminating import TerminatingNamespaces
from stageset.kube.client import ClientPool


@dataclass(frozen=True)
class Shared:
    """What the manager owns and every feature uses."""

    clients: ClientPool
    settings: ControllerSettings
    events: EventRecorder
    metrics: Metrics
    clock: Clock
    on_write: WriteListener | None = None
    """Told every object a reconcile's own writes made (the manager's view until the watch catches up)."""
    ticks: Callable[[], float] = time.monotonic
    """The monotonic clock of the throttle of waiting messages (seconds)."""
    watches: WatchSource | None = None
    """The readiness watch pool (bounded; each watch as the identity that opened it); ``None``: poll."""
    enqueue: Enqueue | None = None
    """The manager's work queues (``None``: nothing is queued, as in tests that run one reconciler)."""
    synced: Callable[[], bool] = lambda: True
    """Whether the manager's watch caches have synced (their first lists are in)."""
    leading: Callable[[], bool] = lambda: True
    """Whether this process may reconcile now (with leader election: while it leads)."""
    terminating: TerminatingNamespaces = field(default_factory=TerminatingNamespaces)
    """The namespaces being deleted, from the Namespace watch (none known without it)."""
