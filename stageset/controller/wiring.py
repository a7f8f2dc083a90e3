"""The one place that wires the controller: every collaborator of both reconcilers, built once.

The reconcilers build nothing themselves; the manager (and the in-process tests, so they run
the controller as wired) call :func:`reconcilers` / :func:`stageset_reconciler`.  Built here:

- one :class:`~stageset.controller.identity.IdentityPolicy` for both kinds (who acts as whom);
- the tenant reads and the ServiceAccount check after a denial (one :class:`AccountCheck`);
- the target clusters (this one, and a bounded cache of remote ones: :class:`Targets`);
- the renderer and its cache (reading old revisions through the mirror's kept commits), the CEL
  sandbox, the stage applier and the actions around it (their ``--allowed-action-hosts`` and
  address guard), the records, the change reports, the release steering (gates, windows,
  rollback), the pass runner and the teardown of the StageSet reconciler.

Identity: nothing here makes a request; each collaborator's docstring says whose identity its
requests use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sources.addresses import AddressGuard
from stageset.apply.cel import CelSandbox
from stageset.apply.engine import StageApplier, WatchSource
from stageset.apply.health import ExpressionChecker
from stageset.apply.rights import ShownRights
from stageset.controller.clock import Clock
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.events import EventRecorder
from stageset.controller.gitrepository import Fetcher, GitRepositoryReconciler, RevisionListener
from stageset.controller.identity import IdentityPolicy
from stageset.controller.metrics import Metrics
from stageset.controller.rendercache import RenderCache
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset.actions import ActionStage
from stageset.controller.stageset.actionsteps import ActionRunner, StepSettings
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.passes import PassRunner
from stageset.controller.stageset.reads import AccountCheck, TenantReads
from stageset.controller.stageset.reconciler import StageSetReconciler
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.release import Release
from stageset.controller.stageset.rendering import ArtifactTrees, Renderer, SourceTrees
from stageset.controller.stageset.revisions import GitRevisions, Keeper
from stageset.controller.stageset.stage import StageApply, Wake
from stageset.controller.stageset.targets import Targets
from stageset.controller.stageset.teardown import Teardown
from stageset.controller.status import WriteListener
from stageset.kube.client import ClientPool
from stageset.kube.mapping import Resource, RestMapper


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
    wake: Wake | None = None
    """Queue a reconcile of a StageSet (a watched object it waits for changed)."""


@dataclass(frozen=True)
class Reconcilers:
    stagesets: StageSetReconciler
    gitrepositories: GitRepositoryReconciler


def reconcilers(shared: Shared, *, store: Store, stagesets: Resource, gitrepositories: Resource,
                index: DependencyIndex, stop: threading.Event, on_revision: RevisionListener,
                artifacts: ArtifactTrees | None = None) -> Reconcilers:
    """Both reconcilers, sharing one identity policy."""
    identities = IdentityPolicy(cluster_admin=shared.settings.cluster_admin,
                                default_service_account=shared.settings.default_service_account)
    git = GitRepositoryReconciler(clients=shared.clients, store=store, resource=gitrepositories,
                                  on_revision=on_revision, identities=identities, clock=shared.clock,
                                  events=shared.events, metrics=shared.metrics,
                                  runbook_base_url=shared.settings.runbook_base_url, on_write=shared.on_write)
    return Reconcilers(stagesets=stageset_reconciler(shared, identities=identities, store=store,
                                                     resource=stagesets, source_resource=gitrepositories,
                                                     index=index, stop=stop, artifacts=artifacts),
                       gitrepositories=git)


def stageset_reconciler(shared: Shared, *, identities: IdentityPolicy, store: SourceTrees, resource: Resource,
                        source_resource: Resource, index: DependencyIndex, stop: threading.Event,
                        artifacts: ArtifactTrees | None = None) -> StageSetReconciler:
    """The StageSet reconciler and everything it works with."""
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
    targets = Targets(clients=clients, settings=settings.apply, local=local, accounts=accounts)
    records = Records(clients=clients, identities=identities)
    changes = Changes(events=shared.events, metrics=shared.metrics)
    keeper = store if isinstance(store, Keeper) else None
    # At most one kustomize build per worker at once: the pod's memory is sized for that.
    renderer = Renderer(clients=clients, store=store, reads=reads, limits=settings.build_limits,
                        cache=RenderCache(max_builds=settings.workers), artifacts=artifacts,
                        revisions=GitRevisions(keeper))
    applier = StageApply(clients=clients, clock=shared.clock, readiness_slice=settings.readiness_slice,
                         stop=stop, sandbox=cel, accounts=accounts, watches=shared.watches,
                         wake=shared.wake, watched_requeue=settings.watched_requeue)
    guard = AddressGuard(allow_insecure=settings.allow_insecure_sources, purpose="actions", verb="call")
    runner = ActionRunner(renderer=renderer, sandbox=cel, clock=shared.clock, stop=stop,
                          settings=StepSettings(allowed_hosts=settings.allowed_action_hosts, guard=guard,
                                                poll_interval=settings.apply.poll_interval))
    stages = ActionStage(inner=applier, runner=runner, clients=clients, events=shared.events,
                         clock=shared.clock, slice_seconds=settings.readiness_slice, stop=stop)
    release = Release(clients=clients, identities=identities, renderer=renderer, stages=stages,
                      changes=changes, events=shared.events, metrics=shared.metrics, clock=shared.clock)
    passes = PassRunner(clients=clients, identities=identities, records=records, changes=changes,
                        settings=settings, renderer=renderer, stages=stages, release=release,
                        accounts=accounts)
    teardown = Teardown(clients=clients, identities=identities, targets=targets, events=shared.events,
                        clock=shared.clock, max_wait=settings.max_teardown_wait, records=records)
    return StageSetReconciler(clients=clients, resource=resource, identities=identities, reads=reads,
                              expressions=ExpressionChecker(cel), index=index, targets=targets, passes=passes,
                              teardown=teardown, changes=changes, clock=shared.clock,
                              runbook_base_url=settings.runbook_base_url, ticks=shared.ticks,
                              default_interval=settings.default_interval, on_write=shared.on_write)
