"""A stage with ``actions``: ``pre`` before it is built, ``post`` once it is ready, ``onFailure`` when it
fails — around the stage's own apply (:class:`~stageset.controller.stageset.stage.StageApply`, which
this wraps with the same ``run`` interface).

**Identity.**  Every action runs as the **stage's identity** — ``stage.serviceAccountName``, else
``spec.serviceAccountName``, impersonated; the controller itself only in single-tenant mode
(:mod:`stageset.controller.identity`; derived once per pass, carried by ``Rendered.identity``) — on
the stage's target cluster; Secrets of ``http`` actions and the sources of ``job``/``apply``
actions are read as that identity on this cluster (:mod:`~stageset.controller.stageset.actionsteps`).
Events are written as the controller, through the StageSet's redactor.

**Once per revision.**  ``pre`` and ``post`` actions run once per revision of the stage (what that
is: :mod:`~stageset.controller.stageset.actionplan`); the ledger in ``status.stages[].actions``
says which ran.  An action that completes while another of its list follows ends the stage's work
for this pass (``Waiting``, back after the readiness requeue), so its ledger entry is written
before the next side effect starts: a restart or a requeue never runs it again.  (The one gap —
the controller dying between an ``http`` call and that write — is at-least-once; a ``job``
action's Jobs are found again in the cluster, so a migration is not created twice.)

**Order and outcomes** (every outcome a value; the ledger travels in ``StageOutcome.actions``):

1. ``pre`` pending: each runs in order; ``Waiting`` while one is in progress (the stage keeps the
   revision it had applied), ``Failed`` with ``ActionFailed`` when one fails for good — nothing is
   applied and ``onFailure`` does not run;
2. the stage's apply and readiness, as without actions;
3. ``post`` pending once the stage is ready: ``Waiting`` while one is in progress, ``Failed``
   (``ActionFailed``) when one fails; ``Ready`` only after all of them;
4. a failure from the apply on — the apply, readiness (failed, or held past the timeout), a
   ``post`` action — runs ``onFailure`` once, best effort (one attempt each, within a slice; what
   it did is in events and logs); again only after the stage was Ready, or for a new revision.

A slow action holds only its own StageSet: each list gets one readiness slice per pass, and an
attempt's timeout (``timeout``, else the stage's) spans passes from its first start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from stageset.api import API_VERSION, duration_seconds
from stageset.api.actions import Action, ActionLedger, Hook
from stageset.api.vocabulary import EventReason, EventType, Reason, StagePhase
from stageset.apply.engine import StageResult
from stageset.controller import logs
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder, normal, warning
from stageset.controller.redact import Redactor
from stageset.controller.stageset import actionplan
from stageset.controller.stageset.actionsteps import ActionContext, ActionRunner, Kind, Step
from stageset.controller.stageset.claims import LiveClaims
from stageset.controller.stageset.plan import StageOutcome
from stageset.controller.stageset.stage import StageApply, StageRun
from stageset.kube.client import ClientPool, KubeClient

log = logging.getLogger(__name__)

Done = tuple[StageOutcome, StageResult | None]
_FAILED = {StagePhase.FAILED, StagePhase.PROGRESSING}


def _stage_timeout(run: StageRun) -> float:
    """The stage's ``timeout``, else ``spec.timeout`` (zero falls through, as for readiness)."""
    own = run.rendered.stage.timeout
    if own and duration_seconds(own) > 0:
        return duration_seconds(own)
    return duration_seconds(run.stageset.spec.timeout)


def _carrying(run: StageRun, ledger: ActionLedger) -> Callable[[StageOutcome], None] | None:
    """``run.waiting`` for the stage's own work: what it tells carries the ledger (status written
    while the stage waits must not lose it)."""
    told = run.waiting
    if told is None:
        return None

    def waiting(outcome: StageOutcome) -> None:
        told(replace(outcome, actions=ledger))

    return waiting


class ActionStage:
    """:class:`StageApply` with the stage's actions around it; a stage without actions is passed through."""

    def __init__(self, *, inner: StageApply, runner: ActionRunner, clients: ClientPool, events: EventRecorder,
                 clock: Clock, slice_seconds: float, stop: threading.Event):
        self._inner = inner
        self._runner = runner
        self._clients = clients
        self._events = events
        self._clock = clock
        self._slice = slice_seconds
        self._stop = stop

    def run(self, run: StageRun) -> Done:
        actions = run.rendered.stage.actions
        if not actions:
            return self._inner.run(run)
        identity = "controller" if run.rendered.identity.user is None else "tenant"
        with logs.bind(stage=run.rendered.stage.name, revision=run.rendered.revision, identity=identity):
            return self._run(run)

    def _run(self, run: StageRun) -> Done:
        stage, rendered = run.rendered.stage, run.rendered
        actions = stage.actions
        assert actions is not None
        ledger = actionplan.ledger_for(run.before.actions, revision=rendered.revision,
                                       inputs=rendered.action_inputs, target=rendered.target.id)
        if actionplan.pending(actions.pre, ledger):
            ledger, held = self._ladder(run, Hook.PRE, actions.pre, ledger)
            if held is not None:
                return held, None
            run = replace(run, recheck=False)  # pre actions ran for this revision: apply it in full
        outcome, result = self._inner.run(replace(run, waiting=_carrying(run, ledger)))
        outcome = replace(outcome, actions=ledger)
        if outcome.phase in _FAILED:
            return self._on_failure(run, outcome, ledger), result
        if outcome.phase is not StagePhase.READY:
            return outcome, result
        if actionplan.pending(actions.post, ledger):
            ledger, held = self._ladder(run, Hook.POST, actions.post, ledger, applied=outcome)
            if held is not None:
                if held.phase is StagePhase.FAILED:
                    return self._on_failure(run, held, ledger), result
                return held, result
        return replace(outcome, actions=actionplan.recovered(ledger)), result

    # -- pre and post ------------------------------------------------------------------------------

    def _held(self, run: StageRun, ledger: ActionLedger, message: str, *, applied: StageOutcome | None,
              phase: StagePhase = StagePhase.WAITING, reason: Reason = Reason.PROGRESSING) -> StageOutcome:
        """The stage's outcome while (or because) an action holds it: before ``post``, what it applied;
        before ``pre``, what it had applied before this revision."""
        name = run.rendered.stage.name
        text = f"stage {name!r}: {message}"
        if applied is not None:
            return replace(applied, phase=phase, reason=reason, message=text, actions=ledger,
                           waiting_since=None)
        # What it had before (its revision, objects, promotion gate), held by the action.
        return replace(run.before, phase=phase, reason=reason, message=text, actions=ledger,
                       waiting_since=None, watched=False)

    def _ladder(self, run: StageRun, hook: Hook, actions: Sequence[Action], ledger: ActionLedger, *,
                applied: StageOutcome | None = None) -> tuple[ActionLedger, StageOutcome | None]:
        """Run the pending actions of one list in order, within one slice; the ledger after, and the
        stage's outcome when an action holds or fails it (``None``: every action ran)."""
        ends = time.monotonic() + self._slice
        stage_timeout = _stage_timeout(run)
        while (todo := actionplan.pending(actions, ledger)):
            action = todo[0]
            label = f"{hook.value} action {action.name!r}"
            now = self._clock()
            ledger = actionplan.started(ledger, hook, action, now=now)
            running = ledger.running
            assert running is not None
            timeout = actionplan.timeout_seconds(action, stage_timeout=stage_timeout)
            if actionplan.expired(running, now=now, timeout=timeout):
                last = f" (last: {running.error})" if running.error else ""
                return self._failed_for_good(run, hook, action, ledger, applied=applied,
                                             message=f"did not complete within {timeout:.0f}s{last}")
            wait = actionplan.retry_wait(running, now=now)
            if wait > 0:
                if wait > ends - time.monotonic() or self._stop.wait(wait):
                    return ledger, self._held(run, ledger, f"{label}: attempt {running.attempt} of "
                                              f"{actionplan.attempts(action)} failed ({running.error}); "
                                              f"retrying in {wait:.0f}s", applied=applied)
                continue
            if run.waiting is not None:  # show (and keep) that it runs, and since when
                run.waiting(self._held(run, ledger, f"{label}: running", applied=applied))
            left = actionplan.remaining(running, now=now, timeout=timeout)
            step = self._runner.step(self._context(run, hook, action, ledger, timeout=timeout,
                                                   deadline=min(ends, time.monotonic() + left)))
            ledger = actionplan.marked(ledger, step.run)
            if step.kind is Kind.PENDING:
                return ledger, self._held(run, ledger, f"{label}: {step.message}", applied=applied)
            if step.kind is Kind.DONE:
                ledger = actionplan.completed(ledger, action)
                self._tell(run, EventType.NORMAL, EventReason.ACTION_SUCCEEDED, f"{label}: {step.message}")
                following = actionplan.pending(actions, ledger)
                if following:
                    # Recorded before the next side effect: this pass ends here, the next goes on.
                    return ledger, self._held(run, ledger, f"{label} done; next: {following[0].name!r}",
                                              applied=applied)
                continue
            error = self._redactor(run)(step.message)
            failed = actionplan.attempt_failed(ledger, action, now=self._clock(), timeout=timeout,
                                               retryable=step.retryable, error=error)
            if failed.final:
                attempts = running.attempt + 1
                suffix = f" (attempt {attempts} of {actionplan.attempts(action)})" if attempts > 1 else ""
                return self._failed_for_good(run, hook, action, failed.ledger, applied=applied,
                                             message=error + suffix, reason=step.reason)
            ledger = failed.ledger
            log.warning("%s: attempt failed, retrying: %s", label, error)
        return ledger, None

    def _failed_for_good(self, run: StageRun, hook: Hook, action: Action, ledger: ActionLedger, *,
                         applied: StageOutcome | None, message: str,
                         reason: Reason = Reason.ACTION_FAILED) -> tuple[ActionLedger, StageOutcome]:
        label = f"{hook.value} action {action.name!r}"
        ledger = ledger.model_copy(update={"running": None})
        self._tell(run, EventType.WARNING, EventReason.ACTION_FAILED, f"{label} failed: {message}")
        why = "nothing was applied" if hook is Hook.PRE else "the stage is not Ready"
        # A denial and an object another StageSet holds say so in Ready, as a stage's would.
        reason = reason if reason in (Reason.RBAC_DENIED, Reason.OWNERSHIP_CONFLICT) else Reason.ACTION_FAILED
        return ledger, self._held(run, ledger, f"{label} failed: {message}; {why}", applied=applied,
                                  phase=StagePhase.FAILED, reason=reason)

    # -- onFailure ---------------------------------------------------------------------------------

    def _on_failure(self, run: StageRun, outcome: StageOutcome, ledger: ActionLedger) -> StageOutcome:
        """Best effort, once per failure: one attempt per action (retries within the slice), never
        holding the stage; what happened is told in events and logs."""
        actions = run.rendered.stage.actions
        if actions is None or not actions.on_failure or not actionplan.failure_due(ledger):
            return replace(outcome, actions=ledger)
        ends = time.monotonic() + self._slice
        said: list[str] = []
        for action in actions.on_failure:
            label = f"onFailure action {action.name!r}"
            attempt = actionplan.started(ledger.model_copy(update={"running": None}), Hook.ON_FAILURE, action,
                                         now=self._clock())
            assert attempt.running is not None
            timeout = actionplan.timeout_seconds(action, stage_timeout=_stage_timeout(run))
            step: Step = Step.failed("not started")
            for _ in range(actionplan.attempts(action)):
                deadline = max(time.monotonic() + 1.0, ends)
                step = self._runner.step(self._context(run, Hook.ON_FAILURE, action, attempt,
                                                       deadline=deadline, timeout=timeout, fresh_runs=True))
                if step.kind is not Kind.FAILED or not step.retryable or time.monotonic() >= ends:
                    break
            redact = self._redactor(run)
            if step.kind is Kind.FAILED:
                said.append(f"{action.name} failed")
                self._tell(run, EventType.WARNING, EventReason.ACTION_FAILED,
                           f"{label} failed: {redact(step.message)}")
            else:
                verb = "started" if step.kind is Kind.PENDING else "ran"
                said.append(f"{action.name} {verb}")
                self._tell(run, EventType.NORMAL, EventReason.ACTION_SUCCEEDED,
                           f"{label} {verb}: {redact(step.message)}")
        ledger = actionplan.failure_handled(ledger)
        return replace(outcome, actions=ledger, message=f"{outcome.message} (onFailure: {', '.join(said)})")

    # -- plumbing ----------------------------------------------------------------------------------

    def _redactor(self, run: StageRun) -> Redactor:
        return run.redactor if run.redactor is not None else Redactor()

    def _context(self, run: StageRun, hook: Hook, action: Action, ledger: ActionLedger, *, deadline: float,
                 timeout: float, fresh_runs: bool = False) -> ActionContext:
        rendered = run.rendered
        assert ledger.running is not None
        client: KubeClient = self._clients.client(rendered.identity, rendered.target.cluster)
        namespace, name = str(run.stageset.metadata["namespace"]), str(run.stageset.metadata["name"])
        return ActionContext(
            namespace=namespace, stageset=name,
            stage=rendered.stage, hook=hook, action=action, ledger=ledger, running=ledger.running,
            identity=rendered.identity, client=client, local=self._clients.client(rendered.identity),
            target=rendered.target, redactor=self._redactor(run), deadline=deadline, timeout=timeout,
            fresh_runs=fresh_runs,
            # The holder read as the controller, named as the stage's identity may see it (as a stage's).
            claims=LiveClaims(controller=self._clients.client(), ours=(namespace, name),
                              tenant=self._clients.client(rendered.identity), target=rendered.target.id))

    def _tell(self, run: StageRun, type_: EventType, reason: EventReason, message: str) -> None:
        """An event on the StageSet (and a log line), Secret values removed."""
        text = f"stage {run.rendered.stage.name!r}: {message}"
        redact = self._redactor(run)
        if type_ is EventType.WARNING:
            log.warning("%s", redact(text))
        else:
            log.info("%s", redact(text))
        obj = {"apiVersion": API_VERSION, "kind": "StageSet", "metadata": run.stageset.metadata}
        told = warning if type_ is EventType.WARNING else normal
        self._events.emit(told(obj, reason, text, action="Action", redact=redact))
