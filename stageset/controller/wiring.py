"""The one place that wires the controller: every collaborator of both reconcilers, built once, and
what the manager runs (:func:`wire` returns the :class:`~stageset.controller.setup.Setup`).

The reconcilers build nothing themselves; the manager (and the in-process tests, so they run
the controller as wired) call :func:`wire` / :func:`stageset_reconciler`.  Built here:

- the Git mirror (unless one is given) and one :class:`~stageset.controller.identity.IdentityPolicy`
  for both kinds (who acts as whom);
- the tenant reads and the ServiceAccount check after a denial (one :class:`AccountCheck`);
- the target clusters (this one, and a bounded cache of remote ones, ``--max-remote-targets``:
  :class:`Targets`); with ``--target-namespaces``, the platform's StageTargets
  (:class:`~stageset.controller.stageset.platform.PlatformTargets`), their reconciler (``For``
  StageTargets in those namespaces only, one worker) and the metadata-only watch of the Secrets
  there (a runnable counted as a cache: no worker starts before it has listed), and the StageSets'
  watch of StageTargets;
- the renderer and its cache (reading old revisions through the mirror's kept commits), the CEL
  sandbox, the stage applier and the actions around it (their ``--allowed-action-hosts`` and
  address guard), the records, the change reports, the release steering (gates, windows,
  rollback), the pass runner and the teardown of the StageSet reconciler;
- the event sources outside the manager's own watches: Flux source watches (discovery) and
  artifact downloads (jobs in the GitRepository pool), both waking StageSets through the
  StageSet reconciler's source index (:mod:`stageset.controller.stageset.watches`);
- with ``--shard-keys`` on a label shard, the main shard's report of objects no shard serves
  (:mod:`stageset.controller.unserved`; its reports run in the StageSet pool);
- on a label shard, the hand-off (:class:`~stageset.controller.handoff.ShardHandoff`), declared as
  the guard of every controller (each kind is watched under the shard's selector);
- for a cluster-wide release, the metadata-only Namespace watch behind the metrics' ``tenant``
  label (:mod:`stageset.controller.tenants`) and the teardown's knowledge of terminating namespaces
  (:mod:`stageset.controller.terminating`), a runnable: a report only, not part of "synced";
- for a cluster-wide release without label shards, the FleetRollout reconciler
  (:mod:`stageset.controller.fleet`): its index is told every StageSet event (chained to the
  StageSet controller's hook), its jobs take release annotations back.

Which kind each pool and job belongs to is said here and in the reconcilers' declarations
(:meth:`StageSetWatches.controller`, :meth:`GitRepositoryReconciler.controller`); the manager
knows no kind by name.

Identity: nothing here makes a request; each collaborator's docstring says whose identity its
requests use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from sources import MirrorStore, UrlPolicy
from sources.addresses import AddressGuard
from sources.artifacts import ArtifactStore
from stageset.apply.cel import CelSandbox
from stageset.apply.engine import StageApplier, WatchSource
from stageset.apply.health import ExpressionChecker
from stageset.apply.rights import ShownRights
from stageset.controller.artifacts import JOB_KIND, ArtifactFetcher
from stageset.controller.clock import Clock
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.events import EventRecorder
from stageset.controller.fleet.index import FleetIndex
from stageset.controller.fleet.reconciler import FleetRolloutReconciler
from stageset.controller.fleet.watches import FleetWatches, Sweep
from stageset.controller.fluxwatch import FluxWatches
from stageset.controller.gitrepository import Fetcher, GitRepositoryReconciler
from stageset.controller.handoff import ShardHandoff
from stageset.controller.identity import IdentityPolicy
from stageset.controller.keys import JobKey, ObjectKey
from stageset.controller.kinds import FLEETROLLOUTS, GITREPOSITORIES, STAGESETS, STAGETARGETS
from stageset.controller.metrics import Metrics
from stageset.controller.rendercache import RenderCache
from stageset.controller.settings import ControllerSettings
from stageset.controller.setup import Controller, Enqueue, Jobs, Reports, Setup
from stageset.controller.stageset.actions import ActionStage
from stageset.controller.stageset.actionsteps import ActionRunner, StepSettings
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.holding import Holding
from stageset.controller.stageset.moves import Moves
from stageset.controller.stageset.passes import PassRunner
from stageset.controller.stageset.platform import PlatformTargets
from stageset.controller.stageset.reads import AccountCheck, TenantReads
from stageset.controller.stageset.reconciler import StageSetReconciler
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.release import Release, SelectedBy, no_rollouts
from stageset.controller.stageset.rendering import ArtifactTrees, Renderer, SourceTrees
from stageset.controller.stageset.revisions import GitRevisions, Keeper
from stageset.controller.stageset.stage import StageApply, Wake
from stageset.controller.stageset.targets import Targets
from stageset.controller.stageset.teardown import Teardown
from stageset.controller.stageset.watches import SourceIndex, StageSetWatches
from stageset.controller.stagetarget import StageTargetReconciler
from stageset.controller.status import WriteListener
from stageset.controller.tenants import NAMESPACES
from stageset.controller.terminating import TerminatingNamespaces
from stageset.controller.unserved import Unserved
from stageset.kube.client import ClientPool, KubeClient
from stageset.kube.mapping import Resource, RestMapper
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector


class Store(Fetcher, SourceTrees, Protocol):
    """The Git mirror as the reconcilers use it (:class:`sources.MirrorStore`)."""


@dataclass(frozen=True)
class Shared:
    """What the manager owns and both reconcilers use."""

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
    """Readiness watches (bounded), as each stage's identity; ``None``: stages poll."""
    enqueue: Enqueue | None = None
    """The manager's work queues (``None``: nothing is queued, as in tests that run one reconciler)."""
    synced: Callable[[], bool] = lambda: True
    """Whether the manager's watch caches have synced (their first lists are in)."""
    leading: Callable[[], bool] = lambda: True
    """Whether this process may reconcile now (with leader election: while it leads)."""
    terminating: TerminatingNamespaces = field(default_factory=TerminatingNamespaces)
    """The namespaces being deleted, from the Namespace watch (none known without it)."""


@dataclass(frozen=True)
class Wired:
    """What :func:`wire` built: the manager's :class:`Setup`, and the parts tests look into."""

    setup: Setup
    flux: FluxWatches
    artifacts: ArtifactFetcher


def mirror_store(settings: ControllerSettings) -> MirrorStore:
    policy = UrlPolicy(allow_http=settings.allow_insecure_sources, allow_file=settings.allow_local_sources)
    return MirrorStore(root=settings.mirror_dir, policy=policy, limits=settings.source_limits,
                       max_bytes=settings.mirror_max_bytes)


def wire(shared: Shared, *, enqueue: Enqueue, stop: threading.Event, store: Store | None = None) -> Wired:
    """Both reconcilers (sharing one identity policy), their declarations and the event sources
    that wake StageSets; ``enqueue`` is the manager's."""
    settings, admin = shared.settings, shared.clients.client()
    shared = replace(shared, enqueue=enqueue)
    if store is None:
        store = mirror_store(settings)
    if isinstance(store, MirrorStore):
        shared.metrics.mirror(store.disk_usage)
    identities = IdentityPolicy(cluster_admin=settings.cluster_admin,
                                default_service_account=settings.default_service_account)
    index, sources = DependencyIndex(), SourceIndex(enqueue=enqueue)
    artifacts = ArtifactFetcher(
        store=ArtifactStore(root=settings.artifacts.directory, limits=settings.artifacts.limits,
                            guard=AddressGuard(allow_insecure=settings.allow_insecure_sources),
                            max_bytes=settings.artifacts.max_bytes,
                            max_tenant_bytes=settings.artifacts.max_tenant_bytes),
        timeout=settings.artifacts.timeout, wake=sources.wake, stop=stop,
        schedule=lambda namespace, job: enqueue(JobKey(JOB_KIND, namespace, job)))
    flux = FluxWatches(client=admin, namespaces=settings.watch_namespaces, stop=stop, on_change=sources.wake,
                       resync=settings.resync_period, interval=settings.artifacts.discovery_interval)
    platform = PlatformTargets(admin=admin, namespaces=settings.target_namespaces) \
        if settings.target_namespaces else None
    fleet_index = _fleet_index(shared)
    selected_by = no_rollouts if fleet_index is None else fleet_index.view
    reconciler = stageset_reconciler(shared, identities=identities, store=store, resource=STAGESETS,
                                     source_resource=GITREPOSITORIES, index=index, stop=stop,
                                     artifacts=artifacts, platform=platform,
                                     selected_by=selected_by)
    stagesets = StageSetWatches(
        reconciler=reconciler,
        resource=STAGESETS, source_kind=GITREPOSITORIES.kind, index=index, sources=sources,
        poke=flux.poke, default_source_kind=settings.default_source_kind,
        no_cross_namespace_refs=settings.no_cross_namespace_refs,
        target_kind=None if platform is None else STAGETARGETS.kind)
    git = GitRepositoryReconciler(clients=shared.clients, store=store, resource=GITREPOSITORIES,
                                  on_revision=stagesets.revised, identities=identities, clock=shared.clock,
                                  events=shared.events, metrics=shared.metrics,
                                  runbook_base_url=settings.runbook_base_url, on_write=shared.on_write)
    fleet = None if fleet_index is None else _fleet(shared, index=fleet_index, enqueue=enqueue)
    stageset_controller = stagesets.controller(workers=settings.workers)
    fleet_parts: tuple[Controller, ...] = ()
    if fleet is not None:
        stageset_controller = fleet.chained(stageset_controller)
        fleet_parts = (fleet.controller(workers=1),)
    controllers = _sharded((stageset_controller, git.controller(workers=settings.source_workers),
                            *fleet_parts), shared, admin=admin, stop=stop)
    secrets: tuple[Reflector, ...] = ()
    if platform is not None:
        # Watched unselected: every shard needs every target; its status is written by one shard
        # (the one its shard label names). One worker: a target's connect is short.
        targets = StageTargetReconciler(clients=shared.clients, targets=reconciler.targets,
                                        resource=STAGETARGETS, namespaces=settings.target_namespaces,
                                        interval=settings.default_interval, clock=shared.clock,
                                        runbook_base_url=settings.runbook_base_url, on_write=shared.on_write,
                                        shard=settings.watch_label_selector)
        controllers = (*controllers, targets.controller(workers=1))
        secrets = targets.secrets(enqueue=enqueue, stop=stop, resync=settings.resync_period)
    # Artifact downloads share the source pool (and its per-namespace cap) with Git fetches.
    setup = Setup(controllers=controllers,
                  jobs=(Jobs(runner=JOB_KIND, pool=GITREPOSITORIES.kind, run=artifacts.job),
                        *((fleet.jobs(),) if fleet is not None else ())),
                  reports=_unserved(shared, admin=admin),
                  runnables=(flux, *_tenant_labels(shared, admin=admin, stop=stop), *secrets,
                             *((Sweep(enqueue=enqueue, synced=shared.synced, stop=stop),) if fleet else ())),
                  # A StageSet's pass compares the target Secret's watched version with the one its
                  # connection read: not before the watch has listed them.
                  synced=secrets)
    return Wired(setup=setup, flux=flux, artifacts=artifacts)


def _fleet_index(shared: Shared) -> FleetIndex | None:
    """What the FleetRollout reconciler and the members' passes know of rollouts, on a cluster-wide
    release without label shards only: a rollout must see every StageSet it may select (and
    FleetRollouts are cluster-scoped)."""
    settings = shared.settings
    if settings.watch_namespaces is not None or settings.watch_label_selector is not None:
        return None
    return FleetIndex(namespace_labels=shared.metrics.tenants.labels_of)


def _fleet(shared: Shared, *, index: FleetIndex, enqueue: Enqueue) -> FleetWatches:
    """The FleetRollout reconciler over ``index``."""
    settings = shared.settings
    reconciler = FleetRolloutReconciler(clients=shared.clients, resource=FLEETROLLOUTS, stagesets=STAGESETS,
                                        index=index, clock=shared.clock, events=shared.events,
                                        metrics=shared.metrics, runbook_base_url=settings.runbook_base_url,
                                        on_write=shared.on_write)
    return FleetWatches(reconciler=reconciler, resource=FLEETROLLOUTS, stageset_kind=STAGESETS.kind,
                        index=index, enqueue=enqueue)


def _sharded(controllers: tuple[Controller, ...], shared: Shared, *, admin: KubeClient,
             stop: threading.Event) -> tuple[Controller, ...]:
    """On a label shard, every controller guarded by one hand-off (one writer per object across
    shards, :mod:`stageset.controller.handoff`): the manager watches each kind under the selector,
    so any of their passes may see its object leave."""
    settings = shared.settings
    selector = settings.watch_label_selector
    if selector is None:
        return controllers
    handoff = ShardHandoff(client=admin, selector=selector, namespace=settings.shard_handoff_namespace,
                           timeout=settings.shard_handoff_timeout, metrics=shared.metrics, stop=stop,
                           synced=shared.synced, leading=shared.leading)
    return tuple(replace(controller, guard=handoff) for controller in controllers)


def _tenant_labels(shared: Shared, *, admin: KubeClient, stop: threading.Event) -> tuple[Reflector, ...]:
    """The metrics' ``tenant`` label and the terminating namespaces a teardown leaves alone:
    Namespaces, metadata only, for a cluster-wide release (one bound per namespace may not list
    Namespaces: no tenant label, and teardowns as before).  A report only, like the unserved
    watches: not cached, not part of "synced"."""
    settings = shared.settings
    if settings.watch_namespaces is not None:
        return ()
    tenants, terminating = shared.metrics.tenants, shared.terminating

    def handle(event: str, obj: KubeObject) -> None:
        tenants.handle(event, obj)
        terminating.handle(event, obj)

    return (Reflector(client=admin, resource=NAMESPACES, namespace=None, stop=stop,
                      handler=handle, resync=settings.resync_period, metadata_only=True),)


def _unserved(shared: Shared, *, admin: KubeClient) -> Reports | None:
    """The main shard's report of objects no shard serves (``--shard-keys`` on a label shard);
    its reports run in the StageSet pool."""
    settings = shared.settings
    selector, shard_keys = settings.watch_label_selector, settings.shard_keys
    if shard_keys is None or selector is None:
        return None
    resources = (STAGESETS, GITREPOSITORIES)
    unserved = Unserved(client=admin, shard_keys=shard_keys, resources={r.kind: r for r in resources},
                        clock=shared.clock, metrics=shared.metrics,
                        runbook_base_url=settings.runbook_base_url)
    return Reports(resources=resources, label_selector=str(selector.unserved(shard_keys)),
                   handle=unserved.handle, run=unserved.run, pool=STAGESETS.kind)


def stageset_reconciler(shared: Shared, *, identities: IdentityPolicy, store: SourceTrees, resource: Resource,
                        source_resource: Resource, index: DependencyIndex, stop: threading.Event,
                        selected_by: SelectedBy, artifacts: ArtifactTrees | None = None,
                        platform: PlatformTargets | None = None) -> StageSetReconciler:
    """The StageSet reconciler and everything it works with (``platform``: the StageTargets'
    registry, with ``--target-namespaces``)."""
    clients, settings = shared.clients, shared.settings
    accounts = AccountCheck(clients=clients, controller_reads_accounts=settings.cluster_admin)
    reads = TenantReads(stagesets=resource, sources=source_resource,
                        no_cross_namespace_refs=settings.no_cross_namespace_refs, accounts=accounts,
                        default_source_kind=settings.default_source_kind, shard=settings.watch_label_selector)
    cel = CelSandbox(settings.apply.cel)
    clock = shared.clock
    # Shown rights age by the injected clock (a periodic pass trusts them for rights_max_age).
    rights = ShownRights(max_age=settings.apply.rights_max_age, clock=lambda: clock().timestamp())
    local = StageApplier(mapper=RestMapper(clients.client()), settings=settings.apply, rights=rights)
    targets = Targets(clients=clients, settings=settings.apply, local=local, accounts=accounts,
                      capacity=settings.max_remote_targets, platform=platform)
    records = Records(clients=clients, identities=identities)
    changes = Changes(events=shared.events, metrics=shared.metrics)
    keeper = store if isinstance(store, Keeper) else None
    # At most one kustomize build per worker at once: the pod's memory is sized for that.
    renderer = Renderer(clients=clients, store=store, reads=reads, limits=settings.build_limits,
                        cache=RenderCache(max_builds=settings.workers), artifacts=artifacts,
                        revisions=GitRevisions(keeper))
    enqueue = shared.enqueue
    wake: Wake | None = None if enqueue is None else \
        (lambda namespace, name: enqueue(ObjectKey(resource.kind, namespace, name)))
    applier = StageApply(clients=clients, clock=shared.clock, readiness_slice=settings.readiness_slice,
                         stop=stop, sandbox=cel, accounts=accounts, watches=shared.watches,
                         wake=wake, watched_requeue=settings.watched_requeue)
    guard = AddressGuard(allow_insecure=settings.allow_insecure_sources, purpose="actions", verb="call")
    runner = ActionRunner(renderer=renderer, sandbox=cel, clock=shared.clock, stop=stop,
                          settings=StepSettings(allowed_hosts=settings.allowed_action_hosts, guard=guard,
                                                poll_interval=settings.apply.poll_interval))
    stages = ActionStage(inner=applier, runner=runner, clients=clients, events=shared.events,
                         clock=shared.clock, slice_seconds=settings.readiness_slice, stop=stop)
    release = Release(clients=clients, identities=identities, renderer=renderer, stages=stages,
                      changes=changes, events=shared.events, metrics=shared.metrics, clock=shared.clock,
                      selected_by=selected_by)
    teardown = Teardown(clients=clients, identities=identities, targets=targets, events=shared.events,
                        clock=shared.clock, max_wait=settings.max_teardown_wait, records=records,
                        terminating=shared.terminating)
    moves = Moves(clients=clients, identities=identities, targets=targets, teardown=teardown,
                  events=shared.events, clock=shared.clock, max_wait=settings.max_teardown_wait)
    passes = PassRunner(clients=clients, identities=identities, records=records, changes=changes,
                        settings=settings, renderer=renderer, stages=stages, release=release,
                        accounts=accounts, moves=moves, clock=shared.clock)
    return StageSetReconciler(clients=clients, resource=resource, identities=identities, reads=reads,
                              expressions=ExpressionChecker(cel), index=index, targets=targets, passes=passes,
                              teardown=teardown, changes=changes, clock=shared.clock,
                              runbook_base_url=settings.runbook_base_url, ticks=shared.ticks,
                              default_interval=settings.default_interval, on_write=shared.on_write,
                              holding=Holding(ticks=shared.ticks, grace=settings.first_wait_grace,
                                              patience=settings.first_fetch_wait)
                              if settings.first_wait_grace > 0 else None)
