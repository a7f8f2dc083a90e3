"""Drift watches, set up: the registry over the shared watch pool, counted in the metrics.

:func:`setup` builds one :class:`~stageset.controller.drift.registry.DriftWatches` (``None`` with
``--max-drift-watches 0``: drift is then noticed at each StageSet's interval only), which queues
StageSets through the manager and skips objects of terminating namespaces.  The StageSet feature is
handed it by the wiring.

Identity: none here (the registry's docstring says whose identity its watches use).
"""

from __future__ import annotations

from stageset.controller.drift.registry import DriftWatches, HeldWatches
from stageset.controller.keys import ObjectKey
from stageset.controller.kinds import STAGESETS
from stageset.controller.shared import Shared


def setup(shared: Shared, *, pool: HeldWatches) -> DriftWatches | None:
    """The drift registry over ``pool`` (the readiness watch pool's held watches)."""
    settings, metrics, enqueue = shared.settings, shared.metrics, shared.enqueue
    if settings.max_drift_watches <= 0 or enqueue is None:
        return None

    def queue(namespace: str, name: str) -> None:
        enqueue(ObjectKey(STAGESETS.kind, namespace, name))

    registry = DriftWatches(pool=pool, enqueue=queue, capacity=settings.max_drift_watches,
                            terminating=shared.terminating, on_refused=metrics.drift_watches_refused.inc,
                            on_trigger=metrics.drift_passes.inc)
    metrics.drift_watches.set_function(registry.watches)
    metrics.drift_unwatched.set_function(registry.unwatched)
    return registry
