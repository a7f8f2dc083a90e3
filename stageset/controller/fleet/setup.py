"""FleetRollouts, set up: the reconciler, its declarations, and what the StageSets' passes ask of it.

Only on a cluster-wide release without label shards: a rollout must see every StageSet it may
select, and FleetRollouts are cluster-scoped.  Otherwise :func:`setup` returns ``None`` and a
StageSet is selected by no rollout.

What it declares (:class:`~stageset.controller.fleet.watches.FleetWatches`): ``For`` FleetRollouts
(one worker), the watches of rollouts and StageSets, its index told every StageSet event (an
:class:`~stageset.controller.setup.Index` on the StageSet kind), the ``fleet-release`` jobs, and the
:class:`~stageset.controller.fleet.watches.Sweep` that takes back annotations of rollouts deleted
while the controller was down.  What it hands the StageSet feature: what the rollouts say of a
StageSet — which select it, and what their statuses released to it (:attr:`Fleet.selected_by`, a
:class:`~stageset.api.fleet.FleetView`).

Identity: none here; the reconciler's docstring says whose identity its requests use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from stageset.api.fleet import FleetView
from stageset.controller.fleet.index import FleetIndex
from stageset.controller.fleet.reconciler import FleetRolloutReconciler
from stageset.controller.fleet.watches import FleetWatches, Sweep
from stageset.controller.kinds import FLEETROLLOUTS, STAGESETS
from stageset.controller.setup import Index, Setup
from stageset.controller.shared import Shared


@dataclass(frozen=True)
class Fleet:
    setup: Setup
    selected_by: Callable[[str, str], FleetView]
    """What the FleetRollouts say of a StageSet ``(namespace, name)``, as the index knows them: which
    select it, and what their statuses released to it."""


def setup(shared: Shared, *, stop: threading.Event) -> Fleet | None:
    """The FleetRollout feature, or ``None`` on a release bound to namespaces or a label shard."""
    settings = shared.settings
    if settings.watch_namespaces is not None or settings.watch_label_selector is not None:
        return None
    assert shared.enqueue is not None, "the fleet's jobs and index are queued through the manager"
    index = FleetIndex(namespace_labels=shared.metrics.tenants.labels_of)
    reconciler = FleetRolloutReconciler(clients=shared.clients, resource=FLEETROLLOUTS, stagesets=STAGESETS,
                                        index=index, clock=shared.clock, events=shared.events,
                                        metrics=shared.metrics, runbook_base_url=settings.runbook_base_url,
                                        on_write=shared.on_write)
    watches = FleetWatches(reconciler=reconciler, resource=FLEETROLLOUTS, stageset_kind=STAGESETS.kind,
                           index=index, enqueue=shared.enqueue, events=shared.events)
    declared = Setup(controllers=(watches.controller(workers=1),), jobs=(watches.jobs(),),
                     indexes=(Index(kind=STAGESETS.kind, indexed=index.stageset),),
                     runnables=(Sweep(enqueue=shared.enqueue, synced=shared.synced, stop=stop),))
    return Fleet(setup=declared, selected_by=index.view)
