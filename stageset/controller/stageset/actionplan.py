"""Actions around a stage: every decision, as pure functions of what was read.  No I/O, no clock,
no identity (nothing here makes a request).

Time comes in as ``now`` (the reconciler's injected clock), so each rule is a table test.

**What "a revision" of a stage is.**  ``pre`` and ``post`` actions run once per revision, and the
ledger (``status.stages[].actions``, :class:`~stageset.api.actions.ActionLedger`) remembers which
ran for which.  A stage's revision is its **source revision** (``main@sha1:…``, an artifact's
revision) **and** :func:`inputs_digest` of what else the stage builds from: ``path``, ``patches``,
and the ``postBuild`` variables — except values that came from Secrets, which count by name only
(a digest of a short Secret value in status could be guessed back).  So a new commit, a new
artifact, a changed patch or a changed ``substituteFrom`` ConfigMap runs the actions again; a
rotated Secret, or a new revision of a source only an action names (a ``job``'s), does not.

- :func:`ledger_for` — the ledger for the stage's current revision (a new revision starts a new one);
- :func:`pending` — the actions of a list not run yet for it;
- :func:`started`, :func:`completed`, :func:`attempt_failed`, :func:`retry_wait`, :func:`expired` —
  one action's attempts, which span reconciles (its ``timeout`` counts from its first attempt);
- :func:`failure_due`, :func:`failure_handled`, :func:`recovered` — ``onFailure`` runs once per failure;
- :func:`host_allowed`, :func:`http_retryable` — the ``http`` rules (``--allowed-action-hosts``);
- :func:`job_name`, :func:`action_label` — what names the Jobs of a ``job`` action;
- :func:`preview` — what ``stageset diff`` says each action would do.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from stageset.api import THIS_CLUSTER, duration_seconds, format_time, parse_time
from stageset.api.actions import Action, ActionLedger, ActionRun, Hook, StageActions
from stageset.controller.render.digests import inputs_digest as inputs_digest  # the ledger's key

BACKOFF_BASE, BACKOFF_CAP = 2.0, 30.0
"""Seconds before the retry after a failed attempt: doubling from the base, at most the cap."""
HTTP_ATTEMPT_CAP = 10.0
"""Seconds one HTTP request may take at most (a slower endpoint fails the attempt): no worker is held
longer."""
MAX_ERROR = 1024
def ledger_for(before: ActionLedger | None, *, revision: str, inputs: str, target: str
               ) -> ActionLedger:
    """The ledger of this revision on this target (a cluster id, :data:`THIS_CLUSTER` here):
    ``before`` if it is for the same ones, else a new, empty one — so a stage moved to another
    cluster runs its ``pre`` and ``post`` actions there once."""
    if before is not None and before.key() == (revision, inputs, target):
        return before
    return ActionLedger(revision=revision, inputs=inputs, target=None if target == THIS_CLUSTER else target)


def pending(actions: Sequence[Action], ledger: ActionLedger) -> list[Action]:
    """The actions of a ``pre`` or ``post`` list that have not run for the ledger's revision, in order."""
    done = set(ledger.executed)
    return [action for action in actions if action.name not in done]


def started(ledger: ActionLedger, hook: Hook, action: Action, *, now: datetime.datetime) -> ActionLedger:
    """The ledger with ``action`` in progress: kept when it already is, else its first attempt now."""
    running = ledger.running
    if running is not None and running.hook == hook.value and running.name == action.name:
        return ledger
    return ledger.model_copy(update={"running": ActionRun(hook=hook.value, name=action.name,
                                                         since=format_time(now))})


def marked(ledger: ActionLedger, run: int | None) -> ActionLedger:
    """The ledger with how far the action in progress got (:attr:`ActionRun.run`)."""
    if ledger.running is None or ledger.running.run == run:
        return ledger
    return ledger.model_copy(update={"running": ledger.running.model_copy(update={"run": run})})


def completed(ledger: ActionLedger, action: Action) -> ActionLedger:
    """``action`` ran for this revision: recorded, nothing in progress."""
    executed = list(ledger.executed)
    if action.name not in executed:
        executed.append(action.name)
    return ledger.model_copy(update={"executed": executed, "running": None})


def timeout_seconds(action: Action, *, stage_timeout: float) -> float:
    """How long ``action`` may take in all (attempts and reconciles): its ``timeout``, else the
    stage's; an ``expr`` wait's own ``timeout`` when shorter."""
    limit = duration_seconds(action.timeout) if action.timeout else stage_timeout
    if action.wait is not None and action.wait.timeout:
        limit = min(limit, duration_seconds(action.wait.timeout))
    return limit


def elapsed(running: ActionRun, *, now: datetime.datetime) -> float:
    since = parse_time(running.since) or now
    return max(0.0, (now - since).total_seconds())


def expired(running: ActionRun, *, now: datetime.datetime, timeout: float) -> bool:
    return elapsed(running, now=now) >= timeout


def remaining(running: ActionRun, *, now: datetime.datetime, timeout: float) -> float:
    return max(0.0, timeout - elapsed(running, now=now))


def retry_wait(running: ActionRun, *, now: datetime.datetime) -> float:
    """Seconds until the next attempt may start (0: now)."""
    at = parse_time(running.retry_at)
    return 0.0 if at is None else max(0.0, (at - now).total_seconds())


def backoff(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1`` (``attempt`` attempts failed)."""
    return min(BACKOFF_CAP, BACKOFF_BASE ** max(0, attempt - 1))


def attempts(action: Action) -> int:
    return 1 + (action.retries or 0)


@dataclass(frozen=True)
class Failed:
    """An attempt failed: the ledger after it, and whether the action failed for good."""

    ledger: ActionLedger
    final: bool


def attempt_failed(ledger: ActionLedger, action: Action, *, now: datetime.datetime, timeout: float,
                   retryable: bool, error: str) -> Failed:
    """One attempt of the action in progress failed with ``error`` (Secret values already removed).
    Another follows after :func:`backoff` when the action has retries left, the failure is worth
    retrying and its timeout allows; else it failed, and nothing is in progress any more (the next
    reconcile that reaches it starts afresh)."""
    running = ledger.running
    assert running is not None
    assert running.name == action.name
    failed = running.attempt + 1
    wait = backoff(failed)
    if retryable and failed < attempts(action) and elapsed(running, now=now) + wait < timeout:
        retry_at = now + datetime.timedelta(seconds=wait)
        update = {"attempt": failed, "retry_at": format_time(retry_at), "error": error[:MAX_ERROR],
                  "run": None}
        return Failed(ledger.model_copy(update={"running": running.model_copy(update=update)}), final=False)
    return Failed(ledger.model_copy(update={"running": None}), final=True)


def failure_due(ledger: ActionLedger) -> bool:
    """Should ``onFailure`` run now?  Once per failure: again only after the stage was Ready (or a
    new revision)."""
    return not ledger.on_failure_ran


def failure_handled(ledger: ActionLedger) -> ActionLedger:
    return ledger.model_copy(update={"on_failure_ran": True, "running": None})


def recovered(ledger: ActionLedger) -> ActionLedger:
    """The stage is Ready: its next failure runs ``onFailure`` again."""
    return ledger if not ledger.on_failure_ran else ledger.model_copy(update={"on_failure_ran": None})


# -- http ------------------------------------------------------------------------------------------

def host_allowed(host: str, patterns: Sequence[str]) -> bool:
    """Is ``host`` (a URL's host name or IP literal, without port) one ``--allowed-action-hosts``
    lists?  Patterns are host names or IP literals with shell wildcards (``*.example.com`` — any
    subdomain; ``*`` — any host), compared without case.  No pattern allows nothing."""
    name = host.strip("[]").rstrip(".").lower()
    if not name:
        return False
    return any(fnmatch.fnmatchcase(name, pattern.strip("[]").rstrip(".").lower()) for pattern in patterns
               if pattern)


def http_retryable(status: int) -> bool:
    """A failed answer worth trying again: 5xx, 408, 429 (or an unexpected 1xx-3xx); not another 4xx,
    which the same request would get again."""
    return not (400 <= status < 500) or status in (408, 429)


# -- jobs ------------------------------------------------------------------------------------------

def _hash(*parts: str, length: int = 16) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:length]


def action_label(*, namespace: str, stageset: str, stage: str, hook: Hook, action: str) -> str:
    """The ``stages.metio.wtf/action`` label of the objects one action created (a label value may
    not hold the names themselves: they can be longer than 63)."""
    return _hash(namespace, stageset, stage, hook.value, action)


def revision_label(ledger: ActionLedger) -> str:
    """The ``stages.metio.wtf/action-revision`` label: which revision the objects were made for."""
    return _hash(ledger.revision, ledger.inputs)


def job_name(name: str, *, action: str, revision: str, run: int) -> str:
    """A Job's name for one run: its own name, shortened, and a suffix fixed by the action, the
    revision and the run, so a restart finds the Job it created instead of creating another."""
    suffix = _hash(action, revision, str(run), name, length=10)
    return f"{name[:52].rstrip('-.')}-{suffix}"


# -- what stageset diff says -----------------------------------------------------------------------

@dataclass(frozen=True)
class Planned:
    """What the next pass would do with one action."""

    hook: Hook
    name: str
    verb: str
    runs: bool
    why: str


def preview(actions: StageActions, before: ActionLedger | None, *, revision: str, inputs: str,
            target: str) -> list[Planned]:
    """Which actions the next pass would run, and which it would skip (already run for this revision)."""
    ledger = ledger_for(before, revision=revision, inputs=inputs, target=target)
    fresh = ledger is not before
    planned: list[Planned] = []
    for hook in (Hook.PRE, Hook.POST):
        for action in actions.of(hook):
            if action.name in ledger.executed:
                planned.append(Planned(hook, action.name, action.verb, False, f"ran for {revision}"))
            elif ledger.running is not None and ledger.running.name == action.name:
                planned.append(Planned(hook, action.name, action.verb, True,
                                       f"in progress since {ledger.running.since}"))
            else:
                moved = before is not None and (before.target or THIS_CLUSTER) != target
                why = "moved to another cluster" if moved else \
                    "new revision" if fresh and before is not None else \
                    "never ran" if before is None else "not run for this revision yet"
                planned.append(Planned(hook, action.name, action.verb, True, why))
    planned.extend(Planned(Hook.ON_FAILURE, action.name, action.verb, False, "runs only if the stage fails")
                   for action in actions.on_failure)
    return planned
