"""The pass plan: every decision of a StageSet pass, as pure functions of what was read.  No I/O.

Time comes in as ``now`` (the reconciler's injected clock), so each rule is a table test:

- :class:`Previous` — what the last pass left in status;
- :func:`rechecks` — stages only re-checked for readiness (no dry-run, no write);
- :func:`quiet` — the no-flap rule: a routine pass over a Ready StageSet shows no progress;
- :func:`readiness_window` / :func:`judge_readiness` — how long a stage may wait now, and
  what the wait means against its timeout (which spans reconciles through ``waitingSince``);
- :func:`verdict` — the StageSet's Ready condition and when to run again, from the stage
  outcomes (which failure wins the reason); :func:`inventory_incomplete` — the verdict of a pass
  that may not prune because its inventory is incomplete.  *Whether* a pass prunes is not a
  verdict's: :func:`~stageset.controller.stageset.pruning.permission` decides it;
- :func:`teardown_order` and :func:`teardown_expired` — deleting a StageSet.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from stageset.api import (
    PreviousTargets,
    Stage,
    StageInventory,
    StageSet,
    StageSetStatus,
    StageStatus,
    format_time,
    parse_time,
)
from stageset.api.actions import ActionLedger
from stageset.api.release import PromotionState
from stageset.api.stageset import OnTimeout
from stageset.api.vocabulary import ConditionStatus, ConditionType, Reason, StagePhase
from stageset.apply.inventory import ObjectId, by_stage
from stageset.apply.readiness import Readiness, Status
from stageset.apply.record import Record
from stageset.controller.conditions import find, holds_at
from stageset.controller.ordering import OrderingError, StageNode, stage_graph

# Which failure wins the StageSet's Ready reason when several stages fail.
REASON_PRIORITY = [Reason.RBAC_DENIED, Reason.INVALID_SPEC, Reason.RESOLVE_FAILED, Reason.CLUSTER_UNREACHABLE,
                   Reason.OWNERSHIP_CONFLICT, Reason.STAGE_FAILED, Reason.ACTION_FAILED,
                   Reason.DEPENDENCY_NOT_READY, Reason.SOURCE_NOT_READY,
                   Reason.ARTIFACT_NOT_FOUND, Reason.STAGE_PROGRESSING]
# Reasons that clear up by themselves soon (a source being fetched, a stage still rolling
# out): retried within this many seconds even when ``retryInterval`` is longer.
SOON = 30.0
_SOON_REASONS = {Reason.SOURCE_NOT_READY, Reason.ARTIFACT_NOT_FOUND, Reason.STAGE_PROGRESSING}
# Ready reasons of a release held as asked: passes continue it without announcing themselves.
STEERED = {Reason.SOAKING, Reason.AWAITING_PROMOTION, Reason.UPDATE_DEFERRED, Reason.ROLLED_BACK}
# Reasons under which a stage that could not render is not started, rather than failed.
WAITING_FOR_SOURCE = {Reason.SOURCE_NOT_READY, Reason.ARTIFACT_NOT_FOUND}


def stage_nodes(stageset: StageSet) -> list[StageNode]:
    return [StageNode(s.name, None if s.depends_on is None else tuple(s.depends_on))
            for s in stageset.spec.stages]


@dataclass(frozen=True)
class StageOutcome:
    """Where one stage stands after (this part of) a pass; becomes ``status.stages[]``.  A value:
    a stage's work returns a new one, nothing changes one in place."""

    name: str
    phase: StagePhase
    reason: Reason | None = None
    message: str = ""
    revision: str | None = None
    objects: int | None = None
    applied_at: str | None = None
    waiting_since: str | None = None
    promotion: PromotionState | None = None
    """The stage's promotion gate (:mod:`~stageset.controller.stageset.gates`)."""
    promotion_token: str | None = None
    """The promote token last acted on for this stage (kept whatever else changes)."""
    watched: bool = False
    """Waiting, and every object it waits for is watched: a change wakes the StageSet (not shown)."""
    actions: ActionLedger | None = None
    """The ledger of the stage's actions (kept through every outcome: a lost ledger runs them again)."""

    @classmethod
    def carried(cls, name: str, before: StageStatus | None) -> StageOutcome:
        """Pending, keeping what the last pass knew (revision, objects, timestamps, gate)."""
        if before is None:
            return cls(name, StagePhase.PENDING)
        return cls(name, StagePhase.PENDING, revision=before.revision, objects=before.objects,
                   applied_at=before.last_applied_time, waiting_since=before.waiting_since,
                   promotion=before.promotion_state, promotion_token=before.last_handled_promotion,
                   actions=before.actions)

    def failed(self, reason: Reason, message: str) -> StageOutcome:
        phase = StagePhase.PENDING if reason in WAITING_FOR_SOURCE else StagePhase.FAILED
        return StageOutcome(self.name, phase, reason, message, self.revision, promotion=self.promotion,
                            promotion_token=self.promotion_token, actions=self.actions)

    def status(self) -> StageStatus:
        return StageStatus(name=self.name, phase=self.phase, revision=self.revision,
                           message=self.message or None, objects=self.objects,
                           last_applied_time=self.applied_at, waiting_since=self.waiting_since,
                           promotion_state=self.promotion, last_handled_promotion=self.promotion_token,
                           actions=self.actions)


@dataclass(frozen=True)
class Previous:
    """What the last pass left in status, as this pass needs it."""

    stages: Mapping[str, StageStatus]
    inventories: Mapping[str, StageInventory]
    ready: bool
    """Ready=True at the current generation."""
    in_progress: bool
    """Ready=Unknown at the current generation: a pass already announced itself."""
    observed: bool
    """``status.observedGeneration`` is the current generation."""
    steered: bool = False
    """The release is held as asked at the current generation (soaking, awaiting a promotion,
    deferred, parked after a rollback): a pass continues it and has nothing new to announce."""
    moving: PreviousTargets | None = None
    """A move to another cluster in flight: what is still on the previous ones."""

    @classmethod
    def from_status(cls, status: StageSetStatus, *, generation: int) -> Previous:
        ready = find(status.conditions, ConditionType.READY)
        steered = ready is not None and ready.observed_generation == generation and ready.reason in STEERED
        return cls(stages={s.name: s for s in status.stages}, inventories=by_stage(status.inventory),
                    ready=holds_at(ready, ConditionStatus.TRUE, generation),
                    in_progress=holds_at(ready, ConditionStatus.UNKNOWN, generation),
                    observed=status.observed_generation == generation, steered=steered,
                    moving=status.previous_targets)


# Phases of a stage applied at its revision and not ready yet: waiting, or held past its timeout.
_UNSETTLED = {StagePhase.WAITING, StagePhase.PROGRESSING}


def rechecks(previous: Previous, revisions: Mapping[str, str]) -> set[str]:
    """Stages already applied at this revision and generation, waiting for readiness or held
    past their timeout: only re-checked (one read per object, no dry-runs, no writes), and
    shown in the phase they had until the re-check says otherwise."""
    return {name for name, revision in revisions.items()
            if previous.observed and (before := previous.stages.get(name)) is not None
            and before.phase in _UNSETTLED and before.revision == revision}


def quiet(previous: Previous, revisions: Mapping[str, str], *, stages: int) -> bool:
    """A routine pass over a Ready StageSet at the same revisions shows no progress: Ready must
    not flap to Unknown every interval (kubectl wait, dependents), and costs no status write."""
    return previous.ready and len(revisions) == stages and all(
        (before := previous.stages.get(name)) is not None and before.revision == revision
        for name, revision in revisions.items())


def announce(previous: Previous, *, is_quiet: bool, only_rechecks: bool = False) -> bool:
    """Whether to say "applying stages" first: status writes are the costliest requests of a
    pass, and one already visibly in progress, one that continues a release held as asked (a soak
    checked every 30 seconds must not flap Ready), or one that only re-checks stages (applies
    nothing), has nothing new to say."""
    return not is_quiet and not previous.in_progress and not previous.steered and not only_rechecks


def clash_message(clashes: Mapping[ObjectId, Sequence[str]]) -> str | None:
    """Two stages rendering one object: the InvalidSpec message (first clash), or ``None``."""
    if not clashes:
        return None
    oid, stages = sorted(clashes.items())[0]
    return (f"{oid.describe()} is rendered by more than one stage ({', '.join(stages)}); "
            "each object must belong to exactly one stage")


# -- readiness ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """How long a stage may wait for readiness in this pass."""

    started: datetime.datetime
    """Since when the stage waits (its timeout counts from here)."""
    wait: float
    """Seconds to wait now (at most one slice), before freeing the worker."""
    timeout: float


def readiness_window(*, now: datetime.datetime, waiting_since: str | None, wrote: bool, timeout: float,
                     slice_seconds: float) -> Window:
    """A stage that wrote nothing keeps waiting from ``waitingSince``; a write starts afresh."""
    started = (parse_time(waiting_since) if waiting_since and not wrote else None) or now
    waited = (now - started).total_seconds()
    return Window(started=started, wait=max(0.0, min(timeout - waited, slice_seconds)), timeout=timeout)


def on_timeout(stageset: StageSet, stage: Stage) -> OnTimeout:
    """The stage's ``onTimeout``, else the StageSet's (``Hold``)."""
    return stage.on_timeout or stageset.spec.on_timeout


def judge_readiness(outcome: StageOutcome, *, window: Window, now: datetime.datetime,
                    readiness: Readiness | None, on_timeout: OnTimeout = OnTimeout.HOLD) -> StageOutcome:
    """``outcome`` (applied, Ready) adjusted by what the wait found (``None``: not waited for).

    Past its timeout a stage still in progress **holds** under ``onTimeout: Hold``: phase
    Progressing, reason StageProgressing, objects as applied, dependents waiting.  Under
    ``onTimeout: Rollback`` it **fails** (phase Failed, reason StageFailed), so a StageSet with
    ``rollbackOnFailure`` rolls the release back.  A terminal failure fails the stage whatever
    ``onTimeout`` says."""
    if readiness is None or readiness.status is Status.CURRENT:
        return outcome
    if readiness.status is Status.FAILED:
        return replace(outcome, phase=StagePhase.FAILED, reason=Reason.STAGE_FAILED,
                       message=readiness.message)
    since = format_time(window.started)
    if (now - window.started).total_seconds() < window.timeout:
        return replace(outcome, phase=StagePhase.WAITING, reason=Reason.PROGRESSING,
                       message=readiness.message, waiting_since=since)
    late = f"not ready after {window.timeout:.0f}s: {readiness.message}"
    if on_timeout is OnTimeout.ROLLBACK:
        return replace(outcome, phase=StagePhase.FAILED, reason=Reason.STAGE_FAILED,
                       message=f"{late} (onTimeout: Rollback)", waiting_since=since)
    return replace(outcome, phase=StagePhase.PROGRESSING, reason=Reason.STAGE_PROGRESSING, message=late,
                   waiting_since=since)


# -- the verdict -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """The StageSet's Ready condition after a pass, and when to run again."""

    ready: bool | None
    reason: Reason
    message: str
    requeue_after: float | None
    revision: str | None = None
    """``status.lastAppliedRevision`` when every stage is Ready."""


def applied_revision(outcomes: Iterable[StageOutcome]) -> str:
    revisions = sorted({o.revision for o in outcomes if o.revision})
    return revisions[0] if len(revisions) == 1 else ", ".join(revisions)


def verdict(outcomes: Sequence[StageOutcome], *, interval: float, retry: float,
            readiness_requeue: float, watched_requeue: float | None = None) -> Verdict:
    """``watched_requeue``: when every waiting stage is watched (woken by the next change), look
    again only this often instead of every ``readiness_requeue``."""
    if all(o.phase is StagePhase.READY for o in outcomes):
        revision = applied_revision(outcomes)
        return Verdict(True, Reason.SUCCEEDED, f"applied {len(outcomes)} stage(s) at {revision}",
                       requeue_after=interval, revision=revision)
    waiting = [o for o in outcomes if o.phase is StagePhase.WAITING]
    failures = [o for o in outcomes if o.reason and o.phase not in (StagePhase.READY, StagePhase.WAITING)]
    if waiting and not failures:
        # Not a failure: stages are within their timeout.  Look again shortly.
        message = "; ".join(f"stage {o.name!r}: {o.message}" for o in waiting)
        watched = watched_requeue is not None and all(o.watched for o in waiting)
        return Verdict(None, Reason.PROGRESSING, f"waiting for readiness: {message}",
                       requeue_after=watched_requeue if watched else readiness_requeue)
    failures.sort(key=lambda o: REASON_PRIORITY.index(o.reason) if o.reason in REASON_PRIORITY
                  else len(REASON_PRIORITY))
    worst = failures[0] if failures else StageOutcome("", StagePhase.PENDING, Reason.STAGE_FAILED,
                                                      "stages blocked")
    reason = worst.reason or Reason.STAGE_FAILED
    again = min(retry, SOON) if reason in _SOON_REASONS else retry
    return Verdict(False, reason, worst.message, requeue_after=again)


@dataclass(frozen=True)
class Failure:
    """How a failure before any stage ran (spec, dependencies, target) is reported."""

    stalled: bool
    requeue_after: float | None


def before_stages(reason: Reason, *, retry: float) -> Failure:
    """InvalidSpec (and a dependency cycle, Stalled) wait until the spec changes; a finalizer race
    retries at once; the rest at ``retryInterval``."""
    if reason in (Reason.INVALID_SPEC, Reason.STALLED):
        return Failure(stalled=True, requeue_after=None)
    return Failure(stalled=False, requeue_after=1.0 if reason is Reason.PROGRESSING else retry)


# -- a lost inventory -------------------------------------------------------------------------

def needs_rebuild(inventories: Mapping[str, StageInventory], record: Record, *, status_lost: bool) -> bool:
    """Status was lost (restored from a backup without it, re-created: no inventory, no condition
    at all) though the durable record names stages, or the last rebuild could not see everything.

    A status that has conditions but no inventory is a StageSet that never applied anything (its
    first stage was denied, say): nothing to look for."""
    return record.rebuild or (status_lost and not inventories and bool(record.stages))


def status_lost(status: Mapping[str, object] | None) -> bool:
    """No trace of any pass in status: neither a condition nor an observed generation."""
    return not status or not (status.get("conditions") or status.get("observedGeneration"))


def inventory_incomplete(problem: str, *, retry: float) -> Verdict:
    """A pass that would prune, over an inventory rebuilt from a partial view (its prune permission
    says ``InventoryIncomplete``): it pruned nothing; say why, and try again soon (the rebuild is
    retried on every pass until it is complete)."""
    return Verdict(False, Reason.INVENTORY_INCOMPLETE,
                   f"applied, but nothing is pruned until the lost inventory can be rebuilt: {problem}",
                   requeue_after=min(retry, SOON))


# -- teardown ----------------------------------------------------------------------------------

def teardown_order(nodes: Sequence[StageNode] | None, inventories: Iterable[str]) -> list[str]:
    """Stages with objects, dependents before their dependencies; removed stages first."""
    graph: nx.DiGraph = nx.DiGraph()
    if nodes is not None:
        try:
            graph = stage_graph(nodes)
        except OrderingError:
            graph = nx.DiGraph()
    present = set(inventories)
    in_spec = [n for n in reversed(list(nx.lexicographical_topological_sort(graph))) if n in present]
    removed = sorted(present - set(in_spec))
    return removed + in_spec


def teardown_expired(*, now: datetime.datetime, deleted_at: str | None, max_wait: float) -> bool:
    """Has a teardown that cannot finish waited long enough to be given up?"""
    started = parse_time(deleted_at) or now
    return (now - started).total_seconds() >= max_wait


# A teardown whose cluster fails is retried after a tenth of the time it has been failing,
# between these bounds, and never later than its expiry: it backs off, yet is released on time.
TEARDOWN_RETRY_MIN, TEARDOWN_RETRY_MAX = 1.0, 30.0


def teardown_retry(*, now: datetime.datetime, deleted_at: str | None, max_wait: float) -> float:
    """When to look again at a teardown whose cluster could not be used."""
    started = parse_time(deleted_at) or now
    waited = max(0.0, (now - started).total_seconds())
    delay = min(TEARDOWN_RETRY_MAX, max(TEARDOWN_RETRY_MIN, waited / 10))
    return max(TEARDOWN_RETRY_MIN / 10, min(delay, max_wait - waited + 0.1))
