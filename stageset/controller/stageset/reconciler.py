"""The StageSet reconciler: orchestration only — each step is a named part of this package.

A reconcile: read the spec (teardown when deleted, stop when suspended) -> prepare (finalizer,
stage graph, dependencies, target cluster) -> one pass.  A pass: render every stage; refuse
two stages rendering one object; apply stages as the graph allows, recording old+new
inventory as they finish; conclude from the stage outcomes (the pass plan's verdict) and,
only when every stage is Ready, prune what no stage renders any more.

Identity, per request (the rules: :mod:`stageset.controller.identity`):
- the GitRepository and ``substituteFrom`` objects a stage names, and its objects' dry-run,
  apply, readiness reads, prune and teardown: the stage's identity (the tenant);
- the StageSets in ``spec.dependsOn`` and the ``spec.kubeConfig`` Secret: the StageSet's identity;
- discovery, status, finalizers and events: the controller's own identity.

What a pass tells (each one call here): the stages' phases as they change, throttled while
they only wait (:class:`~stageset.controller.stageset.progress.Pass`); per stage, what its
apply did (metrics), drift, prune and a ``ReconciliationSucceeded`` event naming every change
since the StageSet was last Ready (:mod:`stageset.controller.stageset.changes`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import networkx as nx
from pydantic import ValidationError

from stageset.api import StageSet, StageSetStatus, duration_seconds
from stageset.api.vocabulary import Reason, StagePhase
from stageset.apply.cel import CelSandbox
from stageset.apply.engine import StageApplier, StageResult
from stageset.apply.errors import StageError
from stageset.apply.health import ExpressionChecker
from stageset.apply.inventory import (
    duplicates,
    merged,
    ordered,
    stage_inventory,
    with_kept,
)
from stageset.controller import logs
from stageset.controller.clock import Clock, system_clock
from stageset.controller.dependencies import DependencyIndex, spell_cycle
from stageset.controller.events import EventRecorder
from stageset.controller.finalizers import set_finalizer
from stageset.controller.identity import IdentityPolicy
from stageset.controller.metrics import Metrics
from stageset.controller.ordering import OrderingError, stage_graph
from stageset.controller.redact import REGISTRY, Redactor
from stageset.controller.result import Result, TerminalError
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset import plan
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.decryption import for_pass
from stageset.controller.stageset.progress import Pass, Report
from stageset.controller.stageset.reads import AccountCheck, TenantReads
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.rendering import Rendered, Renderer, SourceTrees
from stageset.controller.stageset.scheduler import StageScheduler
from stageset.controller.stageset.stage import StageApply, StageRun
from stageset.controller.stageset.targets import Target, Targets
from stageset.controller.stageset.teardown import Teardown
from stageset.controller.status import StatusReport, validation_message
from stageset.kube.client import ApiError, ClientPool, KubeClient, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)



def log_denial(error: StageError) -> None:
    """Every RBACDenied is logged (the message names the identity and what it may not do)."""
    if error.reason is Reason.RBAC_DENIED:
        log.warning("denied: %s", error.message)


def unreachable(target: Target, error: UnreachableError | ApiError) -> str:
    """What to say about a remote cluster that fails: where, and how — never what it sent."""
    if isinstance(error, UnreachableError):
        how = error.why
    else:
        how = f"answered HTTP {error.status}" + (f" {error.reason}" if error.reason else "")
    return f"spec.kubeConfig: the cluster at {target.server} cannot be used: {how}; retrying with backoff"


class StageSetReconciler:
    def __init__(self, *, clients: ClientPool, store: SourceTrees, applier: StageApplier, resource: Resource,
                 source_resource: Resource, settings: ControllerSettings, events: EventRecorder,
                 index: DependencyIndex, stop: threading.Event, clock: Clock = system_clock,
                 metrics: Metrics | None = None):
        self._clients = clients
        self._resource = resource
        self._settings = settings
        self._events = events
        self._index = index
        self._clock = clock
        self._metrics = metrics or Metrics()
        # Per StageSet: what its passes changed since it was last Ready (for the success event).
        self._identities = IdentityPolicy(cluster_admin=settings.cluster_admin)
        self._reads = TenantReads(stagesets=resource, sources=source_resource,
                                  no_cross_namespace_refs=settings.no_cross_namespace_refs,
                                  accounts=AccountCheck(clients=clients,
                                                        controller_reads_accounts=settings.cluster_admin))
        self._cel = CelSandbox(settings.apply.cel)
        self._expressions = ExpressionChecker(self._cel)
        self._targets = Targets(clients=clients, settings=settings.apply, local=applier,
                                accounts=self._reads.accounts)
        self._renderer = Renderer(clients=clients, store=store, reads=self._reads,
                                  limits=settings.build_limits)
        self._stages = StageApply(clients=clients, clock=clock, readiness_slice=settings.readiness_slice,
                                  stop=stop, sandbox=self._cel, accounts=self._reads.accounts)
        self._records = Records(clients=clients, identities=self._identities, resource=resource)
        self._teardown = Teardown(clients=clients, identities=self._identities, targets=self._targets,
                                  events=events, resource=resource, clock=clock,
                                  max_wait=settings.max_teardown_wait, records=self._records)
        self._changes = Changes(clients=clients, identities=self._identities, events=events,
                                metrics=self._metrics)

    def forget(self, namespace: str, name: str) -> None:
        """The StageSet is gone: drop what this reconciler remembers of it."""
        self._changes.forget(namespace, name)

    def reconcile(self, raw: KubeObject) -> Result:
        """Reconcile one StageSet (``raw``, from the watch cache)."""
        key = ("StageSet", str(raw["metadata"]["namespace"]), str(raw["metadata"]["name"]))
        # This StageSet's own Secret values (from earlier passes too); never another's.  New ones
        # reach the log filter as soon as they are read.
        redactor = Redactor(REGISTRY.of(key), on_add=lambda values: REGISTRY.set(key, values))
        try:
            return self._reconcile(raw, redactor)
        finally:
            REGISTRY.set(key, redactor.added or REGISTRY.of(key))

    def _reconcile(self, raw: KubeObject, redactor: Redactor) -> Result:
        report = self._report(raw, redactor)
        try:
            # The status was read above; the spec is what is checked here.
            stageset = StageSet.model_validate({**raw, "status": None})
        except ValidationError as error:
            if raw["metadata"].get("deletionTimestamp"):
                return self._teardown.run(report, None)
            report.conclude(ready=False, reason=Reason.INVALID_SPEC, message=validation_message(error),
                            stalled=True)
            return Result()
        if raw["metadata"].get("deletionTimestamp"):
            return self._teardown.run(report, stageset)
        if stageset.spec.suspend:
            report.conclude(ready=False, reason=Reason.SUSPENDED, message="reconciliation is suspended")
            return Result()
        retry = duration_seconds(stageset.spec.retry_interval or stageset.spec.interval)
        try:
            graph, target = self._prepare(raw, stageset)
        except StageError as error:
            log_denial(error)
            failure = plan.before_stages(error.reason, retry=retry)
            report.conclude(ready=False, reason=error.reason, message=error.message, stalled=failure.stalled)
            return Result(requeue_after=failure.requeue_after)
        return self._pass(report, stageset, graph, target, redactor=redactor, retry=retry)

    def _report(self, raw: KubeObject, redactor: Redactor) -> Report:
        try:
            return StatusReport(client=self._clients.client(), resource=self._resource, obj=raw,
                                model=StageSetStatus, clock=self._clock, redact=redactor,
                                runbook_base_url=self._settings.runbook_base_url)
        except ValidationError as error:
            # Never guess at an inventory: without it, prune and teardown could orphan objects.
            raise TerminalError(f"cannot read the StageSet's status ({validation_message(error)}); "
                                "nothing applied or deleted") from error

    def _prepare(self, raw: KubeObject, stageset: StageSet) -> tuple[nx.DiGraph, Target]:
        """Finalizer, stage graph, dependencies and target cluster; raises :class:`StageError`."""
        set_finalizer(self._clients.client(), resource=self._resource, obj=raw, present=True)
        try:
            graph = stage_graph(plan.stage_nodes(stageset))
        except OrderingError as error:
            reason = Reason.INVALID_SPEC if error.cycle is None else Reason.STALLED
            raise StageError(reason, str(error)) from error
        self._expressions.check(stageset)  # readyChecks.exprs compile and return bool: before any apply
        self._reads.refuse_cross_namespace(stageset)
        client = self._stageset_client(stageset, what="reading spec.dependsOn") \
            if stageset.spec.depends_on else None
        dependencies = self._reads.dependencies(client, stageset) if client is not None else []
        namespace, name = str(raw["metadata"]["namespace"]), str(raw["metadata"]["name"])
        # Only after the tenant's own reads: the index sees namespaces the tenant cannot.
        cycle = self._index.cycle_through((namespace, name))
        if cycle:
            raise StageError(Reason.STALLED,
                             f"StageSets form a cycle: {spell_cycle(cycle, namespace=namespace)}")
        self._reads.require_ready(dependencies)
        if stageset.spec.kube_config is None:
            return graph, self._targets.local
        return graph, self._targets.resolve(self._stageset_client(stageset, what="reading spec.kubeConfig"),
                                            stageset)

    def _stageset_client(self, stageset: StageSet, *, what: str) -> KubeClient:
        return self._clients.client(self._identities.for_stageset(stageset, what=what))

    def _pass(self, report: Report, stageset: StageSet, graph: nx.DiGraph, target: Target, *,
              redactor: Redactor, retry: float) -> Result:
        previous = plan.Previous.from_status(report.status, generation=report.generation)
        state = Pass(stageset=stageset, previous=previous, current=dict(previous.inventories),
                     outcomes={s.name: plan.StageOutcome.carried(s.name, previous.stages.get(s.name))
                               for s in stageset.spec.stages})
        try:
            return self._run(report, state, graph, target, redactor=redactor, retry=retry)
        except (UnreachableError, ApiError) as error:
            if not target.remote:
                raise
            # A tenant's remote cluster that fails: a short condition (nothing the remote sent),
            # the inventory kept, and the key's backoff — never a traceback per retry.
            state.record(report)
            report.conclude(ready=False, reason=Reason.CLUSTER_UNREACHABLE,
                            message=unreachable(target, error))
            return Result(backoff=True)

    def _run(self, report: Report, state: Pass, graph: nx.DiGraph, target: Target, *, redactor: Redactor,
             retry: float) -> Result:
        stageset = state.stageset
        rendered = self._render_all(state, target, redactor)
        clash = plan.clash_message(duplicates({n: r.ids for n, r in rendered.items()}))
        if clash:
            state.record(report)
            report.conclude(ready=False, reason=Reason.INVALID_SPEC, message=clash, stalled=True)
            return Result()
        # Before anything is written or pruned: an inventory status lost is rebuilt from the
        # cluster, and the durable record covers whatever is about to be applied.
        wanted = self._records.wanted(stageset, rendered)
        inventories, state.partial = self._records.recover(
            report.obj, inventories=state.previous.inventories, wanted=wanted, target=target)
        state.previous = replace(state.previous, inventories=inventories)
        state.current = {**inventories, **state.current}
        self._records.grow(report.obj, wanted)
        previous = state.previous
        revisions = {n: r.revision for n, r in rendered.items()}
        state.quiet = plan.quiet(previous, revisions, stages=len(stageset.spec.stages))
        rechecks = plan.rechecks(previous, revisions)
        for name in rechecks:
            # Applied already, waiting or held: it keeps its phase (re-checked, not applied again).
            outcome, before = state.outcomes[name], previous.stages[name]
            outcome.phase, outcome.message = before.phase, before.message or ""
        if plan.announce(previous, is_quiet=state.quiet, only_rechecks=rechecks == set(rendered)
                         and len(rendered) == len(stageset.spec.stages)):
            state.announce(report, "applying stages")
        self._apply_all(report, state, graph, rendered, rechecks=rechecks, redactor=redactor)
        verdict = plan.verdict(list(state.outcomes.values()),
                               interval=stageset.spec.requeue_when_ready(), retry=retry,
                               readiness_requeue=self._settings.readiness_requeue)
        if state.partial:
            verdict = plan.without_prune(verdict, state.partial, retry=retry)
        return self._conclude(report, state, verdict, target, redactor=redactor)

    def _render_all(self, state: Pass, target: Target, redactor: Redactor) -> dict[str, Rendered]:
        rendered: dict[str, Rendered] = {}
        namespace = str(state.stageset.metadata["namespace"])
        # spec.decryption: the key Secret is read as the StageSet's ServiceAccount, at most once a pass.
        decryption = for_pass(state.stageset, policy=self._identities, clients=self._clients,
                              accounts=self._reads.accounts, redactor=redactor)
        for stage in state.stageset.spec.stages:
            kind = "tenant" if self._identities.stage_account(state.stageset, stage) else "controller"
            with logs.bind(stage=stage.name, identity=kind):
                try:
                    identity = self._identities.for_stage(state.stageset, stage)
                    rendered[stage.name] = self._renderer.render(
                        stage=stage, identity=identity, namespace=namespace, target=target, redactor=redactor,
                        decryption=decryption)
                except StageError as error:
                    log_denial(error)
                    outcome = state.outcomes[stage.name]
                    state.outcomes[stage.name] = outcome.failed(error.reason, error.message)
        return rendered

    def _apply_all(self, report: Report, state: Pass, graph: nx.DiGraph, rendered: dict[str, Rendered], *,
                   rechecks: set[str], redactor: Redactor) -> None:
        stageset = state.stageset
        stages = {s.name: s for s in stageset.spec.stages}

        def started(name: str) -> None:
            if name not in rechecks:
                with state.lock:
                    outcome = state.outcomes[name]
                    outcome.phase, outcome.message = StagePhase.APPLYING, ""

        def work(name: str) -> tuple[plan.StageOutcome, StageResult | None]:
            return self._stages.run(StageRun(
                stageset=stageset, rendered=rendered[name], before=state.outcomes[name],
                previous=state.previous.inventories.get(name), recheck=name in rechecks,
                waiting=lambda outcome: state.waiting(report, outcome)))

        def finished(name: str, done: tuple[plan.StageOutcome, StageResult | None]) -> bool:
            outcome, result = done
            with state.lock:
                state.outcomes[name] = outcome
                if result is not None:
                    account = self._identities.stage_account(stageset, stages[name])
                    state.fresh[name] = stage_inventory(name, account, (o.entry() for o in result.objects))
                    state.current[name] = merged(state.previous.inventories.get(name), state.fresh[name])
            if result is not None:
                self._changes.applied(report.obj, name, result, redactor)
            return outcome.phase is StagePhase.READY

        scheduler: StageScheduler[tuple[plan.StageOutcome, StageResult | None]] = StageScheduler(
            graph=graph, parallelism=self._settings.stage_parallelism, name=str(stageset.metadata["name"]))

        def progress(done: int) -> None:
            del done
            state.publish(report)

        scheduler.run(skip=[n for n in state.outcomes if n not in rendered], work=work, started=started,
                      finished=finished, progress=progress)

    def _conclude(self, report: Report, state: Pass, verdict: plan.Verdict, target: Target, *,
                  redactor: Redactor) -> Result:
        state.record(report)
        if verdict.prune:
            kept, pruned = self._changes.prune(report, state, target, redactor)
            report.status.inventory = ordered(with_kept(state.fresh, kept))
            report.status.last_applied_revision = verdict.revision
            self._records.settle(report.obj, report.status.inventory)
            self._changes.succeeded(report, state, pruned=pruned, revision=verdict.revision or "",
                                   redactor=redactor)
        report.conclude(ready=verdict.ready, reason=verdict.reason, message=verdict.message)
        return Result(requeue_after=verdict.requeue_after)
