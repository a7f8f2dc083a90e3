"""The StageSet reconciler: orchestration only — each step is a named part of this package.

A reconcile: copy the object handed over (the watch cache's is read-only) -> read the spec
(teardown when deleted, stop when suspended) -> prepare (finalizer, stage graph, dependencies,
target cluster) -> one pass (:mod:`~stageset.controller.stageset.passes`).  Every write to the
StageSet goes through the reconcile's :class:`~stageset.controller.stageset.writer.PassWriter`.

Identity, per request (the rules: :mod:`stageset.controller.identity`):
- the StageSets and the objects of other kinds in ``spec.dependsOn`` (and the watch that wakes it
  while it waits for one: :mod:`~stageset.controller.stageset.objectdeps`) and the ``spec.kubeConfig``
  Secret: the StageSet's identity;
- a stage's source, variables and objects: the stage's identity (see the pass);
- discovery, status, finalizers and events: the controller's own identity.

Every collaborator is passed in; :mod:`stageset.controller.stageset.setup` builds them, once.  With
drift watches, each reconcile runs inside :meth:`~stageset.controller.stageset.drifting.DriftHooks.around`.

Invariant: a reconcile that fails for any reason concludes with ``Ready=False`` and a reason,
never leaving the last pass's ``Ready=True`` standing while new commits go unapplied: tenant
input is checked where it is parsed (``InvalidSpec`` naming the field: the spec by the models, the
durable record by :func:`~stageset.apply.record.problem_of`, a kubeconfig by
:mod:`stageset.kube.remote`), and anything a check missed ends the pass with
``ReconciliationFailed`` (the exception's type only: its text may quote tenant data) before the
manager retries it with backoff — except a moment's refusal of the controller's own write by the
apiserver (409, 429, 5xx), retried within seconds, which no tenant input causes.
"""

from __future__ import annotations

import copy
import logging

import networkx as nx
from pydantic import ValidationError

from stageset.api import StageSet, StageSetStatus
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.apply.health import ExpressionChecker
from stageset.apply.record import problem_of
from stageset.controller.clock import Clock
from stageset.controller.dependencies import DependencyIndex, spell_cycle
from stageset.controller.identity import IdentityPolicy
from stageset.controller.ordering import OrderingError, stage_graph
from stageset.controller.redact import REGISTRY, Redactor
from stageset.controller.render.reads import TenantReads
from stageset.controller.result import Result, TerminalError
from stageset.controller.stageset import floors, plan
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.drifting import DriftHooks
from stageset.controller.stageset.holding import Holding
from stageset.controller.stageset.objectdeps import ObjectDependencies
from stageset.controller.stageset.passes import PassRunner, log_denial
from stageset.controller.stageset.teardown import Teardown
from stageset.controller.stageset.writer import PassWriter, Ticks
from stageset.controller.status import StatusWriter, WriteListener, validation_message
from stageset.controller.targets.clusters import Target, Targets
from stageset.kube.client import ApiError, ClientPool, KubeClient, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)


class StageSetReconciler:
    def __init__(self, *, clients: ClientPool, resource: Resource, identities: IdentityPolicy,
                 reads: TenantReads, expressions: ExpressionChecker, objects: ObjectDependencies,
                 index: DependencyIndex, targets: Targets,
                 passes: PassRunner, teardown: Teardown, changes: Changes, clock: Clock,
                 runbook_base_url: str, ticks: Ticks, default_interval: float,
                 on_write: WriteListener | None = None, holding: Holding | None = None,
                 drift: DriftHooks | None = None):
        self._clients = clients
        self._drift = drift
        self._objects = objects
        self._holding = holding
        self._resource = resource
        self._identities = identities
        self._reads = reads
        self._expressions = expressions
        self._index = index
        self._targets = targets
        self._passes = passes
        self._teardown = teardown
        self._changes = changes
        self._clock = clock
        self._runbooks = runbook_base_url
        self._ticks = ticks
        self._on_write = on_write
        self._default_interval = default_interval

    @property
    def targets(self) -> Targets:
        """The clusters this reconciler applies to (the StageTarget reconciler connects the platform's)."""
        return self._targets

    def forget(self, namespace: str, name: str) -> None:
        """The StageSet is gone: drop what this reconciler remembers of it."""
        self._changes.forget(namespace, name)
        self._objects.forget(namespace, name)
        if self._holding is not None:
            self._holding.forget(namespace, name)
        if self._drift is not None:
            self._drift.forget(namespace, name)

    def reconcile(self, raw: KubeObject) -> Result:
        """Reconcile one StageSet (``raw``, from the watch cache: read, never changed)."""
        key = ("StageSet", str(raw["metadata"]["namespace"]), str(raw["metadata"]["name"]))
        # This StageSet's own Secret values (from earlier passes too); never another's.  New ones
        # reach the log filter as soon as they are read.
        redactor = Redactor(REGISTRY.of(key), on_add=lambda values: REGISTRY.set(key, values))
        try:
            with self._objects.passing((key[1], key[2])):  # a pass that waits for no object stops watching
                if self._drift is not None:  # the drift watches hold this StageSet's events meanwhile
                    return self._drift.around(raw, lambda: self._reconcile(copy.deepcopy(raw), redactor))
                return self._reconcile(copy.deepcopy(raw), redactor)
        finally:
            REGISTRY.set(key, redactor.added or REGISTRY.of(key))

    def _reconcile(self, raw: KubeObject, redactor: Redactor) -> Result:
        writer = self._writer(raw, redactor)
        try:
            # The status was read above; the spec is what is checked here.
            stageset = StageSet.model_validate({**raw, "status": None})
        except ValidationError as error:
            if raw["metadata"].get("deletionTimestamp"):
                return self._teardown.run(writer, None)
            writer.conclude(ready=False, reason=Reason.INVALID_SPEC, message=validation_message(error),
                            stalled=True)
            return Result()
        if raw["metadata"].get("deletionTimestamp"):
            return self._teardown.run(writer, stageset)
        if stageset.spec.suspend:
            writer.conclude(ready=False, reason=Reason.SUSPENDED, message="reconciliation is suspended")
            return Result()
        retry = stageset.spec.retry_seconds(self._default_interval)
        problem = problem_of(raw)
        if problem is not None:
            # Looked at again at retryInterval: removing the annotation is no spec change.
            writer.conclude(ready=False, reason=Reason.INVALID_SPEC, message=problem, stalled=True)
            return Result(requeue_after=retry)
        try:
            return self._attempt(writer, stageset, redactor=redactor, retry=retry)
        except (TerminalError, UnreachableError):
            raise  # nothing to write (an unreadable status; the apiserver itself unreachable)
        except ApiError as error:
            # The controller's own write refused for a moment (a conflict, throttling, the apiserver
            # failing): retried within seconds, no tenant input behind it.
            if not (error.status in (409, 429) or error.status >= 500):
                self._failed(writer, error)
            raise
        except Exception as error:
            self._failed(writer, error)
            raise

    def _failed(self, writer: PassWriter, error: Exception) -> None:
        """A pass raised: Ready=False before the manager's backoff, never a stale True."""
        try:
            writer.conclude(ready=False, reason=Reason.RECONCILIATION_FAILED,
                            message=f"the pass failed unexpectedly ({type(error).__name__}); nothing more "
                                    "is applied until it succeeds, retried with backoff (the controller's "
                                    "log has the details)")
        except Exception:  # the status cannot be written either: the manager logs the first failure
            log.debug("could not conclude a failed pass", exc_info=True)

    def _attempt(self, writer: PassWriter, stageset: StageSet, *, redactor: Redactor, retry: float) -> Result:
        try:
            graph, target = self._prepare(writer, stageset)
        except StageError as error:
            log_denial(error)
            if (held := writer.held(error.reason)) is not None:  # a dependency created with it, say
                return held
            failure = plan.before_stages(error.reason, retry=retry)
            writer.conclude(ready=False, reason=error.reason, message=error.message, stalled=failure.stalled)
            return Result(requeue_after=failure.requeue_after)
        return self._passes.run(writer, stageset, graph, target, redactor=redactor, retry=retry)

    def _writer(self, raw: KubeObject, redactor: Redactor) -> PassWriter:
        admin = self._clients.client()
        try:
            status = StatusWriter(client=admin, resource=self._resource, obj=raw, model=StageSetStatus,
                                  clock=self._clock, redact=redactor, runbook_base_url=self._runbooks,
                                  on_write=self._on_write)
        except ValidationError as error:
            # Never guess at an inventory: without it, prune and teardown could orphan objects.
            raise TerminalError(f"cannot read the StageSet's status ({validation_message(error)}); "
                                "nothing applied or deleted") from error
        return PassWriter(status=status, client=admin, resource=self._resource, ticks=self._ticks,
                          holding=self._holding)

    def _prepare(self, writer: PassWriter, stageset: StageSet) -> tuple[nx.DiGraph, Target]:
        """Finalizer, stage graph, dependencies and target cluster; raises :class:`StageError`.
        The finalizer is written with the first write of the pass (before anything is applied)."""
        writer.finalizer(present=True, deferred=True)
        try:
            graph = stage_graph(plan.stage_nodes(stageset))
        except OrderingError as error:
            reason = Reason.INVALID_SPEC if error.cycle is None else Reason.STALLED
            raise StageError(reason, str(error)) from error
        self._expressions.check(stageset)  # readyChecks.exprs compile and return bool: before any apply
        self._objects.check_spec(stageset)  # and spec.dependsOn[].readyExpr
        self._reads.refuse_cross_namespace(stageset)
        client = self._stageset_client(stageset, what="reading spec.dependsOn") \
            if stageset.spec.depends_on else None
        dependencies = self._reads.dependencies(client, stageset) if client is not None else []
        namespace, name = str(stageset.metadata["namespace"]), str(stageset.metadata["name"])
        # Only after the tenant's own reads: the index sees namespaces the tenant cannot.
        cycle = self._index.cycle_through((namespace, name))
        if cycle:
            raise StageError(Reason.STALLED,
                             f"StageSets form a cycle: {spell_cycle(cycle, namespace=namespace)}")
        self._reads.require_ready(dependencies)
        stagesets = [ref for ref in stageset.spec.depends_on if ref.names_stageset]
        for ref, other in zip(stagesets, dependencies, strict=True):
            # Read as the tenant above; only what it may read is named.
            why = floors.version_floor(other.get("status"), ref.min_version,
                                       name=f"{ref.namespace or namespace}/{ref.name}")
            if why is not None:
                raise StageError(Reason.DEPENDENCY_NOT_READY, why)
        if client is not None:
            self._objects.require_ready(client, stageset)  # objects of other kinds, after the StageSets
        if stageset.spec.target_ref is not None:
            return graph, self._targets.for_target_ref(stageset)  # read as the controller, never the tenant
        if stageset.spec.kube_config is None:
            return graph, self._targets.local
        return graph, self._targets.resolve(self._stageset_client(stageset, what="reading spec.kubeConfig"),
                                            stageset)

    def _stageset_client(self, stageset: StageSet, *, what: str) -> KubeClient:
        return self._clients.client(self._identities.for_stageset(stageset, what=what))

