"""The composition root: each feature's own ``setup``, joined into what the manager runs.

:func:`wire` builds the few parts several features share, once — the Git mirror (unless one is
given), one :class:`~stageset.controller.identity.IdentityPolicy` (who acts as whom, for every
kind), the watch pool (each watch as the identity that opened it: readiness waits, bounded by
``--max-readiness-watches``, and held watches) and the drift watches over it (bounded by
``--max-drift-watches``: :mod:`stageset.controller.drift`) — hands them to each feature's ``setup``
in the order their parts depend on each other, and joins what they declare
(:func:`~stageset.controller.setup.merged`):

- :mod:`stageset.controller.targets.setup` — the clusters StageSets apply to, and with
  ``--target-namespaces`` the StageTarget reconciler and its Secret watch;
- :mod:`stageset.controller.fluxsources` — Flux source watches and artifact downloads, waking
  StageSets through the StageSet feature's source index;
- :mod:`stageset.controller.fleet.setup` — the FleetRollout reconciler (cluster-wide releases
  without label shards), which tells the StageSets' passes which rollouts select them;
- :mod:`stageset.controller.stageset.setup` — the StageSet reconciler and its declaration, telling
  the drift watches what each pass applied;
- :mod:`stageset.controller.gitrepository` — the GitRepository reconciler, waking StageSets when
  it stores a revision;
- :mod:`stageset.controller.notifications.setup` — the notifier, a listener of the event recorder;
- :mod:`stageset.controller.namespaces` — the tenant watches (one Namespace watch);
- :mod:`stageset.controller.handoff` — on a label shard, the hand-off guarding every controller;
- :mod:`stageset.controller.unserved` — the main shard's report of objects no shard serves.

Each feature names its own kinds, pools and rules; this module names features, never a kind, and
the manager (:mod:`stageset.controller.manager`) names neither.

Identity: nothing here makes a request; each feature's docstring says whose identity its requests use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Protocol

from sources import MirrorStore, UrlPolicy
from stageset.controller import fluxsources, gitrepository, handoff, namespaces, unserved
from stageset.controller.artifacts import ArtifactFetcher
from stageset.controller.drift import setup as drift
from stageset.controller.drift.registry import DriftWatches
from stageset.controller.fleet import setup as fleet
from stageset.controller.fluxwatch import FluxWatches
from stageset.controller.gitrepository import Fetcher
from stageset.controller.identity import IdentityPolicy
from stageset.controller.notifications import setup as notifications
from stageset.controller.render.stores import SourceTrees
from stageset.controller.settings import ControllerSettings
from stageset.controller.setup import Enqueue, Setup, merged
from stageset.controller.shared import Shared
from stageset.controller.stageset import setup as stagesets
from stageset.controller.stageset.watches import SourceIndex
from stageset.controller.targets import setup as targets
from stageset.kube.watches import WatchPool


class Store(Fetcher, SourceTrees, Protocol):
    """The Git mirror as the reconcilers use it (:class:`sources.MirrorStore`)."""


@dataclass(frozen=True)
class Wired:
    """What :func:`wire` built: the manager's :class:`Setup`, and the parts tests look into."""

    setup: Setup
    flux: FluxWatches
    artifacts: ArtifactFetcher
    watches: WatchPool | None
    """The readiness watch pool the features share (``None``: ``--max-readiness-watches 0``: stages poll)."""
    drift: DriftWatches | None = None
    """The drift watches (``None``: ``--max-drift-watches 0``: drift is noticed at each interval)."""


def mirror_store(settings: ControllerSettings) -> MirrorStore:
    policy = UrlPolicy(allow_http=settings.allow_insecure_sources, allow_file=settings.allow_local_sources)
    return MirrorStore(root=settings.mirror_dir, policy=policy, limits=settings.source_limits,
                       max_bytes=settings.mirror_max_bytes)


def watch_pool(shared: Shared) -> WatchPool:
    """The one pool of selected watches, each as the identity that opened it: readiness waits
    (bounded by ``--max-readiness-watches``, counted in the metrics) and held watches."""
    settings, metrics = shared.settings, shared.metrics
    pool = WatchPool(capacity=max(settings.max_readiness_watches, 0),
                     on_refused=metrics.readiness_watches_refused.inc)
    metrics.readiness_watches.set_function(pool.__len__)
    return pool


def wire(shared: Shared, *, enqueue: Enqueue, stop: threading.Event, store: Store | None = None) -> Wired:
    """Every feature, set up with the shared parts; ``enqueue`` and ``stop`` are the manager's."""
    settings = shared.settings
    pool = watch_pool(shared)
    # Stages wait by watch unless --max-readiness-watches 0 (then they poll, never asking the pool).
    watches = pool if settings.max_readiness_watches > 0 else None
    shared = replace(shared, enqueue=enqueue, watches=watches)
    drifts = drift.setup(shared, pool=pool)
    if store is None:
        store = mirror_store(settings)
    if isinstance(store, MirrorStore):
        shared.metrics.mirror(store.disk_usage)
    identities = IdentityPolicy(cluster_admin=settings.cluster_admin,
                                default_service_account=settings.default_service_account)
    clusters = targets.setup(shared, stop=stop)
    # The StageSets a source's change wakes, by the sources they name (the StageSet feature's index).
    sources = SourceIndex(enqueue=enqueue)
    flux = fluxsources.setup(shared, wake=sources.wake, stop=stop)
    rollouts = fleet.setup(shared, stop=stop)
    stageset = stagesets.setup(shared, identities=identities, store=store, targets=clusters.clusters,
                               sources=sources, poke=flux.watches.poke, stop=stop, artifacts=flux.artifacts,
                               selected_by=None if rollouts is None else rollouts.selected_by, drift=drifts)
    git = gitrepository.setup(shared, store=store, identities=identities,
                              on_revision=stageset.watches.revised)
    setup = merged(
        stageset.setup, git, *(() if rollouts is None else (rollouts.setup,)), clusters.setup, flux.setup,
        namespaces.setup(shared, stop=stop),
        notifications.setup(admin=shared.clients.client(), settings=settings.notifications,
                            counters=shared.metrics, allow_insecure=settings.allow_insecure_sources,
                            clients=shared.clients),
        handoff.setup(shared, stop=stop),
        unserved.setup(shared),
        Setup(closers=(lambda _: pool.close(),)))
    return Wired(setup=setup, flux=flux.watches, artifacts=flux.artifacts, watches=watches, drift=drifts)
