"""StageSets, set up: the reconciler and everything it works with, built once, and its declaration.

:func:`stageset_reconciler` builds the reconciler's collaborators (the reconcilers build nothing
themselves; the in-process tests call it too, so they run the reconciler as wired): the tenant
reads and the ServiceAccount check after a denial (one :class:`~stageset.controller.accounts.AccountCheck`),
the renderer over the shared mirror and the artifact store (reading old revisions through the
mirror's kept commits) and its cache, the CEL sandbox, the dependencies on objects of other kinds
(and the watches that wake a StageSet waiting for one, over the shared pool), the stage applier and
the actions around it (their ``--allowed-action-hosts`` and address guard), the records, the change
reports, the release steering (gates, windows, rollback), the pass runner, the teardown and a move's
cleanup.  The clusters it applies to are the targets' registry, handed in
(:func:`stageset.controller.targets.setup.clusters`); the drift watches too, when on: each stage's
apply and each reconcile tell them what was applied (:mod:`~stageset.controller.stageset.drifting`).

:func:`setup` adds its declaration to the manager
(:class:`~stageset.controller.stageset.watches.StageSetWatches`): ``For`` StageSets, the watches of
StageSets, GitRepositories and (with ``--target-namespaces``) StageTargets, and the Ready→False
event policy.

Identity: nothing here makes a request; each collaborator's docstring says whose identity its
requests use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from sources.addresses import AddressGuard
from stageset.apply.cel import CelSandbox
from stageset.apply.health import ExpressionChecker
from stageset.controller.accounts import AccountCheck
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.drift.registry import DriftWatches
from stageset.controller.identity import IdentityPolicy
from stageset.controller.keys import ObjectKey
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS, STAGETARGETS
from stageset.controller.render.cache import RenderCache
from stageset.controller.render.reads import TenantReads
from stageset.controller.render.revisions import GitRevisions, Keeper
from stageset.controller.render.stores import ArtifactTrees, SourceTrees
from stageset.controller.setup import Setup
from stageset.controller.shared import Shared
from stageset.controller.stageset.actions import ActionStage
from stageset.controller.stageset.actionsteps import ActionRunner, StepSettings
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.dependencywatches import DependencyWatches
from stageset.controller.stageset.drifting import DriftHooks, DriftRecorded
from stageset.controller.stageset.holding import Holding
from stageset.controller.stageset.moves import Moves
from stageset.controller.stageset.objectdeps import ObjectDependencies
from stageset.controller.stageset.passes import PassRunner
from stageset.controller.stageset.reconciler import StageSetReconciler
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.release import Release, SelectedBy, no_rollouts
from stageset.controller.stageset.rendering import Renderer
from stageset.controller.stageset.stage import StageApply, StageWork, Wake
from stageset.controller.stageset.supersedes import Supersedes
from stageset.controller.stageset.teardown import Teardown
from stageset.controller.stageset.watches import SourceIndex, StageSetWatches
from stageset.controller.targets.clusters import Targets
from stageset.kube.mapping import Resource
from stageset.kube.watches import WatchPool


@dataclass(frozen=True)
class StageSets:
    setup: Setup
    watches: StageSetWatches
    """Its declaration, and the hook a GitRepository's new revision wakes its StageSets through."""


def setup(shared: Shared, *, identities: IdentityPolicy, store: SourceTrees, targets: Targets,
          sources: SourceIndex, poke: Callable[[str], None], stop: threading.Event,
          artifacts: ArtifactTrees | None = None, selected_by: SelectedBy | None = None,
          drift: DriftWatches | None = None) -> StageSets:
    """The StageSet feature: its reconciler (:func:`stageset_reconciler`) and its declaration.
    ``sources``: its source index, which the Flux watches and artifact downloads wake it through;
    ``poke``: ask discovery for a Flux kind no watch covers yet; ``selected_by``: which FleetRollouts
    select a StageSet (none without the fleet feature); ``drift``: the drift watches each pass tells
    what it applied (none: drift is noticed at each interval)."""
    settings, index = shared.settings, DependencyIndex()
    reconciler = stageset_reconciler(shared, identities=identities, store=store, resource=STAGESETS,
                                     source_resource=GITREPOSITORIES, index=index, stop=stop, targets=targets,
                                     artifacts=artifacts, selected_by=selected_by or no_rollouts, drift=drift)
    watches = StageSetWatches(
        reconciler=reconciler, resource=STAGESETS, source_kind=GITREPOSITORIES.kind, index=index,
        sources=sources, poke=poke, default_source_kind=settings.default_source_kind,
        no_cross_namespace_refs=settings.no_cross_namespace_refs,
        target_kind=None if targets.platform is None else STAGETARGETS.kind, events=shared.events)
    controller = watches.controller(workers=settings.workers)
    return StageSets(setup=Setup(controllers=(controller,)), watches=watches)


def stageset_reconciler(shared: Shared, *, identities: IdentityPolicy, store: SourceTrees, resource: Resource,
                        source_resource: Resource, index: DependencyIndex, stop: threading.Event,
                        selected_by: SelectedBy, targets: Targets,
                        artifacts: ArtifactTrees | None = None, drift: DriftWatches | None = None
                        ) -> StageSetReconciler:
    """The StageSet reconciler and everything it works with, applying to the clusters ``targets``
    knows (this one; remote ones; with ``--target-namespaces`` the platform's StageTargets)."""
    clients, settings = shared.clients, shared.settings
    accounts = AccountCheck(clients=clients, controller_reads_accounts=settings.cluster_admin)
    reads = TenantReads(stagesets=resource, sources=source_resource,
                        no_cross_namespace_refs=settings.no_cross_namespace_refs, accounts=accounts,
                        default_source_kind=settings.default_source_kind, shard=settings.watch_label_selector)
    cel = CelSandbox(settings.apply.cel)
    expressions = ExpressionChecker(cel)
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
    actions = ActionStage(inner=applier, runner=runner, clients=clients, events=shared.events,
                          clock=shared.clock, slice_seconds=settings.readiness_slice, stop=stop)
    hooks = None if drift is None else DriftHooks(drift=drift, clients=clients, identities=identities,
                                                  targets=targets)
    stages: StageWork = actions if hooks is None else DriftRecorded(actions, hooks)
    release = Release(clients=clients, identities=identities, renderer=renderer, stages=stages,
                      changes=changes, events=shared.events, metrics=shared.metrics, clock=shared.clock,
                      selected_by=selected_by)
    supersedes = Supersedes(clients=clients, identities=identities, events=shared.events)
    teardown = Teardown(clients=clients, identities=identities, targets=targets, events=shared.events,
                        clock=shared.clock, max_wait=settings.max_teardown_wait, records=records,
                        terminating=shared.terminating, supersedes=supersedes)
    moves = Moves(clients=clients, identities=identities, targets=targets, teardown=teardown,
                  events=shared.events, clock=shared.clock, max_wait=settings.max_teardown_wait)
    # A StageSet waiting for an object of another kind is woken through the shared pool's held watches.
    pool = shared.watches
    waits = None if wake is None or not isinstance(pool, WatchPool) or settings.max_dependency_watches <= 0 \
        else DependencyWatches(pool=pool, capacity=settings.max_dependency_watches, wake=wake)
    objects = ObjectDependencies(mapper=targets.local.applier.mapper, sandbox=cel, expressions=expressions,
                                 accounts=accounts, watches=waits)
    passes = PassRunner(clients=clients, identities=identities, records=records, changes=changes,
                        settings=settings, renderer=renderer, stages=stages, release=release,
                        accounts=accounts, moves=moves, clock=shared.clock, supersedes=supersedes)
    return StageSetReconciler(clients=clients, resource=resource, identities=identities, reads=reads,
                              expressions=expressions, objects=objects, index=index, targets=targets,
                              passes=passes,
                              teardown=teardown, changes=changes, clock=shared.clock,
                              runbook_base_url=settings.runbook_base_url, ticks=shared.ticks,
                              default_interval=settings.default_interval, on_write=shared.on_write,
                              holding=Holding(ticks=shared.ticks, grace=settings.first_wait_grace,
                                              patience=settings.first_fetch_wait)
                              if settings.first_wait_grace > 0 else None, drift=hooks)
