"""Applying one rendered stage and judging its readiness, within one slice of its timeout.

Identity: every request goes through the client for the stage's identity on the stage's
target cluster (the tenant's ServiceAccount, impersonated; the controller itself only in
single-tenant mode).  Whether another StageSet still holds an object the stage renders is read
as the controller (:mod:`~stageset.controller.stageset.claims`).  ``readyChecks.checks`` are read
as the same identity, and so are the
watches a waiting stage opens (:mod:`stageset.kube.watches`, through the engine).  After a denial,
whether the ServiceAccount exists is asked as :class:`~stageset.controller.accounts.AccountCheck`
says.

The stage's settings used here: ``conflictPolicy`` (and ``force``) for immutable-field conflicts;
``spec.driftDetection.mode`` whether drift is restored or left and reported (``Warn``);
``preflight`` for what is asked before the first write (dry-runs, or access reviews);
``readyChecks.timeout`` > ``timeout`` > ``spec.timeout`` for the readiness wait,
``wait``/``disableWait`` whether to wait for the applied objects (``checks`` are always waited for),
``exprs`` for CEL health checks; every failure message starts with the stage's name.

While the stage waits for readiness its outcome is ``Waiting`` with what it waits for, told to
``StageRun.waiting`` as the wait goes (the reconciler publishes it).  Logged at info: every
apply that wrote (what it wrote); at warning every denial and failure.  The stage, its revision
and the identity kind are bound to every line logged meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from stageset.api import InventoryEntry, Stage, StageInventory, StageSet, duration_seconds, format_time
from stageset.api.stageset import DriftMode, Preflight
from stageset.api.vocabulary import Reason, StagePhase
from stageset.apply.cel import CelSandbox
from stageset.apply.conflicts import ConflictResolver
from stageset.apply.engine import StageResult, WatchSource
from stageset.apply.errors import StageError
from stageset.apply.health import HealthChecks, rules_of
from stageset.apply.inventory import ObjectId, by_id
from stageset.apply.ownership import StageOwner
from stageset.apply.readiness import Readiness
from stageset.controller import logs
from stageset.controller.accounts import AccountCheck
from stageset.controller.clock import Clock
from stageset.controller.events import change_summary
from stageset.controller.redact import Redactor
from stageset.controller.stageset.claims import LiveClaims
from stageset.controller.stageset.handover import Handover
from stageset.controller.stageset.plan import StageOutcome, judge_readiness, on_timeout, readiness_window
from stageset.controller.stageset.rendering import Rendered
from stageset.kube.client import ApiError, ClientPool, KubeClient
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

Wake = Callable[[str, str], None]
"""Queue a reconcile of the StageSet ``(namespace, name)``."""


@dataclass(frozen=True)
class StageRun:
    """One stage to apply in this pass."""

    stageset: StageSet
    rendered: Rendered
    before: StageOutcome
    """What the last pass knew of the stage (revision, timestamps)."""
    previous: StageInventory | None
    recheck: bool
    """Applied at this revision already and waiting: only re-check readiness."""
    waiting: Callable[[StageOutcome], None] | None = None
    """Hears the stage's ``Waiting`` outcome (what it waits for) while it waits."""
    redactor: Redactor | None = None
    """The StageSet's Secret values (an ``http`` action adds the ones it reads)."""
    recheck_rights: bool = True
    """Dry-run one unchanged object per kind and namespace even where the identity showed its
    rights recently (false only in a pass nobody asked for: :mod:`stageset.apply.rights`)."""
    handover: Handover | None = None
    """The predecessors this pass takes objects over from (``spec.supersedes``; ``None``: none)."""


class StageWork(Protocol):
    """What a pass runs for each stage: :class:`StageApply`, or the actions around it
    (:class:`~stageset.controller.stageset.actions.ActionStage`)."""

    def run(self, run: StageRun) -> tuple[StageOutcome, StageResult | None]: ...


class StageApply:
    def __init__(self, *, clients: ClientPool, clock: Clock, readiness_slice: float, stop: threading.Event,
                 sandbox: CelSandbox | None = None, accounts: AccountCheck | None = None,
                 watches: WatchSource | None = None, wake: Wake | None = None, watched_requeue: float = 30.0):
        self._clients = clients
        self._clock = clock
        self._slice = readiness_slice
        self._stop = stop
        self._sandbox = sandbox or CelSandbox()
        self._accounts = accounts
        self._watches = watches
        self._wake = wake
        self._watched_requeue = watched_requeue

    def _failed(self, stage: Stage, error: StageError, client: KubeClient) -> StageOutcome:
        """The stage failed: its name first, and for a denial whether the ServiceAccount exists."""
        message = error.message if error.message.startswith("stage ") \
            else f"stage {stage.name!r}: {error.message}"
        if error.reason is Reason.RBAC_DENIED and self._accounts is not None:
            message += self._accounts.explain(client)
        return StageOutcome(stage.name, StagePhase.FAILED, error.reason, message)

    def run(self, run: StageRun) -> tuple[StageOutcome, StageResult | None]:
        identity = "controller" if run.rendered.identity.user is None else "tenant"
        with logs.bind(stage=run.rendered.stage.name, revision=run.rendered.revision, identity=identity):
            return self._run(run)

    def _run(self, run: StageRun) -> tuple[StageOutcome, StageResult | None]:
        stage, rendered = run.rendered.stage, run.rendered
        namespace = str(run.stageset.metadata["namespace"])
        client = self._clients.client(rendered.identity, rendered.target.cluster)
        applier = rendered.target.applier
        owner = StageOwner(namespace, str(run.stageset.metadata["name"]), stage.name)
        try:
            result = applier.bind(owner=owner, objects=rendered.objects,
                                  default_namespace=namespace) if run.recheck else None
            if result is None:
                claims = LiveClaims(controller=self._clients.client(), ours=(owner.namespace, owner.name),
                                    tenant=self._clients.client(rendered.identity), target=rendered.target.id,
                                    handover=run.handover, stage=stage.name, now=self._clock())
                result = applier.apply(client=client, owner=owner, objects=rendered.objects,
                                       default_namespace=namespace, claims=claims,
                                       conflicts=ConflictResolver.of(stage),
                                       previous=_entries(run.previous), recheck_rights=run.recheck_rights,
                                       preflight=stage.preflight or Preflight.DRY_RUN,
                                       warn_drift=run.stageset.spec.drift_mode is DriftMode.WARN)
        except StageError as error:
            outcome = self._failed(stage, error, client)
            # One line per denial or failure, with the stage's fields; the message may echo
            # substituted values: the log filter redacts them (as status does).
            log.warning("%s: %s", "denied" if error.reason is Reason.RBAC_DENIED else "failed",
                        outcome.message)
            return outcome, None
        except ApiError as error:
            message = f"stage {stage.name!r}: apiserver error {error.status}: {error.message}"
            log.warning("failed: %s", message)
            return StageOutcome(stage.name, StagePhase.FAILED, Reason.STAGE_FAILED, message), None
        if result.writes:
            log.info("applied: %s (%s)", change_summary(result.changes), result.changes.summary())
        else:
            log.debug("%s: %s", "re-checked" if run.recheck else "applied", result.changes.summary())
        # The time the stage last changed the cluster: a pass that wrote nothing keeps it.
        now = self._clock()
        applied_at = format_time(now) if result.writes or run.before.applied_at is None \
            else run.before.applied_at
        applied = StageOutcome(stage.name, StagePhase.READY, Reason.SUCCEEDED, "", rendered.revision,
                               len(result.objects), applied_at)
        timeout = duration_seconds(stage.ready_timeout(run.stageset.spec.timeout))
        window = readiness_window(now=now, waiting_since=run.before.waiting_since, wrote=bool(result.writes),
                                  timeout=timeout, slice_seconds=self._slice)
        waiting = replace(applied, phase=StagePhase.WAITING, reason=Reason.PROGRESSING,
                          waiting_since=format_time(window.started))

        def progress(readiness: Readiness) -> None:
            if run.waiting is not None:
                run.waiting(replace(waiting, message=readiness.message))

        health = HealthChecks(rules=rules_of(stage), sandbox=self._sandbox, stage=stage.name)
        checks = references(stage, namespace)
        # disableWait drops the kstatus wait for the applied objects, not their expressions (as in
        # the reference); ``checks`` are always waited for.
        # An object Warn mode left deleted is not waited for: it is reported instead (Drifted).
        waited = [o for o in result.objects if (_waits_for_applied(stage) or health.gates(o.manifest))
                  and not (o.drifted and o.live is None)]
        name = str(run.stageset.metadata["name"])
        wake = self._wake
        # While it waits, a change to what it waits for wakes the StageSet (its next pass re-checks).
        woken = None if wake is None else \
            (("stage", namespace, name, stage.name), lambda: wake(namespace, name))
        try:
            readiness = applier.wait_ready(client=client, applied=waited, references=checks,
                                           default_namespace=namespace, timeout=window.wait,
                                           stop=self._stop, progress=progress, health=health,
                                           watches=self._watches, wake=woken) if waited or checks else None
        except StageError as error:
            return self._failed(stage, error, client), result
        judged = judge_readiness(applied, window=window, now=self._clock(), readiness=readiness,
                                 on_timeout=on_timeout(run.stageset, stage))
        # Woken by the watch, and looked at again after watched_requeue at the latest — unless the
        # timeout comes sooner: then as often as before, so a hold is reported on time.
        left = window.timeout - (self._clock() - window.started).total_seconds()
        if readiness is not None and readiness.watched and left > self._watched_requeue:
            judged = replace(judged, watched=True)
        return judged, result


def _waits_for_applied(stage: Stage) -> bool:
    return stage.ready_checks is None or stage.ready_checks.waits_for_applied


def _entries(inventory: StageInventory | None) -> dict[ObjectId, InventoryEntry] | None:
    return by_id(inventory) if inventory else None


def references(stage: Stage, namespace: str) -> list[KubeObject]:
    """``readyChecks.checks`` (or their old name ``objects``): more objects to wait for, as stubs.
    A namespaced one without a namespace is in the StageSet's; the engine drops the namespace of
    a cluster-scoped kind."""
    if stage.ready_checks is None:
        return []
    return [{"apiVersion": ref.api_version_or_core, "kind": ref.kind,
             "metadata": {"name": ref.name, "namespace": ref.namespace or namespace}}
            for ref in stage.ready_checks.references]
