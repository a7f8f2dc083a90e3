"""A StageSet's dependencies on objects of other kinds: read as the tenant, judged, waited for by watch.

``spec.dependsOn`` entries with ``apiVersion`` and ``kind`` (an operator's CustomResourceDefinition,
a database claim, a Flux HelmRelease) are checked after the StageSet dependencies, in spec order,
before anything is applied; the first that is not ready stops the pass with ``DependencyNotReady``
naming it and what is missing (:mod:`~stageset.controller.stageset.awaited` decides and says it).
An entry without ``kind`` is a StageSet and never reaches this module: it costs what it cost.

- **Where.** On the cluster the StageSet lives in (where its StageSet dependencies live), whatever
  cluster its stages apply to.
- **Kind.** Resolved by discovery (``/apis/<group>/<version>``, as the controller: it tells only
  which kinds exist); a kind the cluster does not serve (its CRD not installed or not established
  yet) is ``DependencyNotReady`` saying so, looked at again at ``retryInterval``.  A cluster-scoped
  kind is read without a namespace.
- **Ready.** ``readyExpr`` evaluated in the CEL sandbox (:class:`~stageset.apply.cel.CelSandbox`,
  its time and memory bounds, the variables of ``readyChecks.exprs``), compile-checked before any
  read (``InvalidSpec``); without it the kstatus rules of stage readiness.
- **Woken.** A pass that ends waiting for an object registers it with
  :class:`~stageset.controller.stageset.dependencywatches.DependencyWatches` (a held watch per
  identity, kind and namespace); every other pass — ready, failed elsewhere, suspended, deleted —
  stops waiting (:meth:`ObjectDependencies.passing`), which releases the watch when nobody else
  needs it.

Identity: each object is read with the client the reconciler hands in — the StageSet's identity
(``spec.serviceAccountName``, impersonated; the controller itself only in cluster-admin mode without
one) — and watched as the same; a 403 is ``RBACDenied`` naming the object as the user wrote it (and
whether the ServiceAccount exists, :class:`~stageset.controller.accounts.AccountCheck`).  The
controller never reads the object as itself.  Discovery is the controller's own.
``--no-cross-namespace-refs`` is enforced before this (:meth:`TenantReads.refuse_cross_namespace
<stageset.controller.render.reads.TenantReads.refuse_cross_namespace>`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from stageset.api import StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.cel import CelSandbox, CelUnavailableError, LimitExceededError
from stageset.apply.errors import StageError
from stageset.apply.health import ExpressionChecker, variables
from stageset.controller.accounts import AccountCheck, read_optional
from stageset.controller.stageset.awaited import (
    Awaited,
    ExprAnswer,
    Verdict,
    absent,
    awaited_of,
    by_expression,
    by_kstatus,
    early,
    expression_problems,
    unserved,
)
from stageset.controller.stageset.dependencywatches import DependencyWatches, Ref
from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource, RestMapper, UnknownKindError
from stageset.kube.types import KubeObject


class ObjectDependencies:
    """Checks a StageSet's dependencies on objects of other kinds, as its identity."""

    def __init__(self, *, mapper: RestMapper, sandbox: CelSandbox, expressions: ExpressionChecker,
                 accounts: AccountCheck, watches: DependencyWatches | None = None,
                 ticks: Callable[[], float] = time.monotonic):
        self._mapper = mapper
        self._sandbox = sandbox
        self._expressions = expressions
        self._accounts = accounts
        self._watches = watches
        self._ticks = ticks
        self._checked = threading.local()

    @contextlib.contextmanager
    def passing(self, ref: Ref) -> Iterator[None]:
        """Around one pass of StageSet ``ref``: unless :meth:`require_ready` left it waiting for an
        object in this pass, it waits for none afterwards (its watch released)."""
        self._checked.waits = False
        try:
            yield
        finally:
            if not getattr(self._checked, "waits", False) and self._watches is not None:
                self._watches.stop(ref)
            self._checked.waits = False

    def forget(self, namespace: str, name: str) -> None:
        if self._watches is not None:
            self._watches.forget(namespace, name)

    def check_spec(self, stageset: StageSet) -> None:
        """Every ``readyExpr`` compiles and returns a bool; else ``InvalidSpec`` naming the first."""
        awaited = [a for a in awaited_of(stageset) if a.ready_expr is not None]
        if not awaited:
            return
        try:
            known = self._expressions.answers(str(a.ready_expr) for a in awaited)
        except LimitExceededError as error:
            raise StageError(Reason.INVALID_SPEC, "spec.dependsOn[].readyExpr: checking the expressions "
                             "exceeded their limit; shorten them") from error
        except CelUnavailableError as error:
            raise StageError(Reason.STAGE_FAILED, f"spec.dependsOn[].readyExpr cannot be checked: {error}") \
                from error
        answers = [known[str(a.ready_expr)] for a in awaited]
        problems = expression_problems(awaited, [ExprAnswer(a.value, a.type, a.error) for a in answers])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StageError(Reason.INVALID_SPEC, problems[0] + more)

    def require_ready(self, client: KubeClient, stageset: StageSet) -> None:
        """Raise :class:`StageError` for the first object of another kind that is not ready (read as
        ``client``'s identity), after registering the wait for it; nothing when all are ready."""
        ref = (str(stageset.metadata["namespace"]), str(stageset.metadata["name"]))
        for awaited in awaited_of(stageset):
            try:
                resource = self._mapper.resolve(awaited.api_version, awaited.kind)
            except UnknownKindError as error:
                raise StageError(Reason.DEPENDENCY_NOT_READY, unserved(awaited)) from error
            namespace = awaited.namespace if resource.namespaced else None
            asked = self._ticks()
            found = read_optional(client, resource.object_path(name=awaited.name, namespace=namespace),
                                  what=f"{awaited.what(namespaced=resource.namespaced)} ({awaited.field})",
                                  accounts=self._accounts)
            verdict = self._judge(awaited, found, namespaced=resource.namespaced)
            if verdict.ready:
                continue
            seen = None if found is None else str((found.get("metadata") or {}).get("resourceVersion", ""))
            raise StageError(Reason.DEPENDENCY_NOT_READY,
                             verdict.message + self._wait(ref, client, resource, namespace, awaited,
                                                          seen=seen, asked=asked))

    def _wait(self, ref: Ref, client: KubeClient, resource: Resource, namespace: str | None,
              awaited: Awaited, *, seen: str | None, asked: float) -> str:
        """Register the wait; what to add to the message (a watch its identity may not open)."""
        if self._watches is None:
            return ""
        self._checked.waits = self._watches.wait(ref, client, resource, namespace, awaited.name,
                                                 seen=seen, asked=asked)
        if self._checked.waits and self._watches.watched(ref) is False:
            where = f" in namespace {namespace}" if namespace else ""
            return (f"; not watched: {client.identity.describe()} may not list and watch "
                    f"{resource.plural}{where}, so it is looked at again at retryInterval")
        return ""

    def _judge(self, awaited: Awaited, found: KubeObject | None, *, namespaced: bool) -> Verdict:
        if found is None:
            return absent(awaited, namespaced=namespaced)
        first = early(awaited, found, namespaced=namespaced)
        if first is not None:
            return first
        if awaited.ready_expr is None:
            return by_kstatus(awaited, found, namespaced=namespaced)
        try:
            (answer,) = self._sandbox.evaluate([awaited.ready_expr], variables(found))
        except LimitExceededError as error:
            limits = self._sandbox.limits
            raise StageError(Reason.INVALID_SPEC, f"{awaited.field}.readyExpr exceeded the evaluation limit "
                             f"({limits.timeout:g}s, {limits.memory_bytes // (1024 * 1024)} MiB) on "
                             f"{awaited.what(namespaced=namespaced)}; simplify the expression") from error
        except CelUnavailableError as error:
            raise StageError(Reason.STAGE_FAILED, f"cannot evaluate {awaited.field}.readyExpr: {error}") \
                from error
        judged = by_expression(awaited, ExprAnswer(answer.value, answer.type, answer.error),
                               namespaced=namespaced)
        if isinstance(judged, str):
            raise StageError(Reason.INVALID_SPEC, judged)
        return judged
