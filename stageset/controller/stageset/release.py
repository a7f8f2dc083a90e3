"""Steering a release within a pass: where stages render, promotion gates, rollback, the last good
snapshot.  The decisions are pure (:mod:`.steering`, :mod:`.gates`, :mod:`.windows`,
:mod:`.rollback`); this module does what they decide and tells it.

- :meth:`Release.steer` — after the stages rendered at their current revisions: re-render the
  stages steering pins to a recorded revision (a parked rollback, a held update), drop the ones it
  holds back entirely;
- :meth:`Release.gate` — a stage finished: judge its promotion gate (and a promote request); only
  a released stage lets its dependents start;
- :meth:`Release.roll_back` / :meth:`Release.resume` — restore the moved stages at their last good
  revisions, dependents first, deleting what the new revision added; the record in status is
  written before the first stage and after each, so a controller that stops mid-way resumes with
  the stages still to restore and re-applies nothing it already restored;
- :meth:`Release.concluded` — the status fields steering owns (``pendingUpdate``,
  ``lastAppliedSnapshot``, ``rollback``, ``lastHandledUpdateOverride``, ``overrideRevisions``), and
  keeping each stage's last good and applied commits readable in the Git mirror.

Identity: every re-render reads the stage's source and variables as the stage's identity; every
apply and delete of a rollback is made as the stage's identity (the deletions as the identity the
inventory recorded), on the StageSet's target cluster — exactly as a pass does; status, the record
and events as the controller.  Nothing here widens what a tenant's pass could do: a rollback
applies content the same stage applied before, read from commits the mirror served to its own
GitRepository.

Tells: ``Promoted`` / ``PromotionIgnored`` events and ``stageset_stage_promotions_total``;
``UpdateDeferred`` (Normal, once per new held set) and ``stageset_update_deferred_total``;
``UpdateOverridden``; ``RolledBack`` (Warning) and ``stageset_rollbacks_total``.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import networkx as nx

from stageset.api import StageSet, StageSetStatus, format_time
from stageset.api.release import PromotionPhase, PromotionState, Rollback, StageSnapshot
from stageset.api.vocabulary import EventReason, EventType, Reason, StagePhase
from stageset.apply.errors import StageError
from stageset.apply.inventory import stage_inventory, with_kept
from stageset.apply.prune import Owner, candidates, prune
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder
from stageset.controller.identity import IdentityPolicy
from stageset.controller.metrics import Metrics
from stageset.controller.redact import Redactor
from stageset.controller.rendercache import StageDecryption
from stageset.controller.stageset import gates, records, rollback, steering
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.plan import StageOutcome, Verdict
from stageset.controller.stageset.progress import Progress
from stageset.controller.stageset.rendering import Rendered, Renderer
from stageset.controller.stageset.stage import StageRun, StageWork
from stageset.controller.stageset.steering import Steering
from stageset.controller.stageset.targets import Target, inventory_clients
from stageset.controller.stageset.writer import PassWriter
from stageset.kube.client import ClientPool

log = logging.getLogger(__name__)


class PassState(Protocol):
    """What steering needs of a pass (:class:`~stageset.controller.stageset.passes.PassRunner`'s)."""

    writer: PassWriter
    stageset: StageSet
    target: Target
    redactor: Redactor
    retry: float
    progress: Progress
    decryption: StageDecryption | None


def _ref(stageset: StageSet) -> tuple[str, str]:
    return str(stageset.metadata["namespace"]), str(stageset.metadata["name"])


@dataclass(frozen=True)
class Request:
    """A promote request that is new for its stage."""

    stage: str
    token: str


class Release:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, renderer: Renderer,
                 stages: StageWork, changes: Changes, events: EventRecorder, metrics: Metrics, clock: Clock):
        self._clients = clients
        self._identities = identities
        self._renderer = renderer
        self._stages = stages
        self._changes = changes
        self._events = events
        self._metrics = metrics
        self._clock = clock

    def now(self) -> datetime.datetime:
        return self._clock()

    # -- where stages render --------------------------------------------------------------

    def _render_at(self, one: PassState, name: str, revision: str) -> Rendered:
        stage = next(s for s in one.stageset.spec.stages if s.name == name)
        return self._renderer.render(stage=stage, identity=self._identities.for_stage(one.stageset, stage),
                                     namespace=_ref(one.stageset)[0], target=one.target,
                                     redactor=one.redactor, decryption=one.decryption, revision=revision,
                                     salt=str(one.stageset.metadata.get("uid", "")))

    def steer(self, one: PassState, rendered: dict[str, Rendered]) -> tuple[Steering, dict[str, Rendered]]:
        """Steering for this pass, and the stages to apply (pinned ones re-rendered, held ones out)."""
        status = one.writer.status
        sources = {n: r.source.name for n, r in rendered.items() if r.source is not None}
        decided = steering.steer(one.stageset, status, current={n: r.revision for n, r in rendered.items()},
                                 sources=sources, now=self._clock(), generation=one.writer.generation)
        if decided.resume or decided.frozen:
            # Nothing is applied now: every stage shows what the last pass left.
            one.progress = one.progress.rechecked([n for n in one.progress.order
                                                   if n in one.progress.previous.stages])
            return decided, rendered
        chosen = {n: r for n, r in rendered.items() if n not in decided.skip}
        skip = dict(decided.skip)
        for name, revision in decided.pins.items():
            if name not in chosen or chosen[name].revision == revision:
                continue
            try:
                chosen[name] = self._render_at(one, name, revision)
            except StageError as error:
                # The recorded revision is gone: the stage is left as it is (not applied).
                chosen.pop(name)
                skip[name] = f"{error.message}; the stage is left as it is"
        for name, why in skip.items():
            outcome = one.progress.outcomes[name]
            one.progress = one.progress.with_outcome(replace(outcome, phase=StagePhase.PENDING, reason=None,
                                                             message=why))
        return replace(decided, skip=skip), chosen

    # -- promotion gates --------------------------------------------------------------------

    @staticmethod
    def request(one: PassState) -> Request | None:
        handled = {n: o.promotion_token for n, o in one.progress.outcomes.items()}
        found = gates.promote_request(one.stageset.metadata.get("annotations"), handled=handled)
        return Request(*found) if found else None

    def gate(self, one: PassState, outcome: StageOutcome, request: Request | None
             ) -> tuple[StageOutcome, bool]:
        """``outcome`` with its promotion gate judged; whether its dependents may start."""
        name = outcome.name
        stage = next((s for s in one.stageset.spec.stages if s.name == name), None)
        before = one.progress.previous.stages.get(name)
        state = before.promotion_state if before is not None else None
        token = before.last_handled_promotion if before is not None else None
        asked = request is not None and request.stage == name
        # A promotion acts only on what the user saw waiting: held before this pass, at this revision.
        honoured = asked and gates.held(state) and state is not None and state.revision == outcome.revision
        decided = gates.judge(stage.promotion if stage else None, state, revision=outcome.revision,
                              ready=outcome.phase is StagePhase.READY, now=self._clock(), promote=honoured)
        if asked and request is not None:
            token = request.token
            if not honoured:
                self._ignored(one, name, state, outcome)
        if decided.promoted:
            self._promoted(one, name, decided.promoted, outcome.revision or "")
        return replace(outcome, promotion=decided.state, promotion_token=token), decided.released

    def unheard(self, one: PassState, request: Request | None) -> None:
        """A promote request for a stage this pass did not reach: acted on (ignored) all the same,
        so it can never promote a revision its sender did not see waiting."""
        if request is None:
            return
        outcome = one.progress.outcomes.get(request.stage)
        if outcome is None or outcome.promotion_token == request.token:
            return
        self._ignored(one, request.stage, outcome.promotion, outcome)
        one.progress = one.progress.with_outcome(replace(outcome, promotion_token=request.token))

    def _promoted(self, one: PassState, stage: str, how: str, revision: str) -> None:
        self._metrics.promoted(_ref(one.stageset), stage, how=how)
        what = "its soak ended" if how == gates.HOW_SOAK else "promoted by request"
        self._events.emit(one.writer.obj, type_=EventType.NORMAL, reason=EventReason.PROMOTED,
                          action="Promote", redact=one.redactor,
                          message=f"stage {stage!r} promoted at {revision} ({what}); "
                                  "the stages after it go on")

    def _ignored(self, one: PassState, stage: str, state: PromotionState | None,
                 outcome: StageOutcome) -> None:
        where = f"phase {outcome.phase.value}" if not gates.held(state) or state is None else \
            f"it waited at {state.revision}, and this pass applied {outcome.revision}"
        self._events.emit(one.writer.obj, type_=EventType.NORMAL, reason=EventReason.PROMOTION_IGNORED,
                          action="Promote", redact=one.redactor,
                          message=f"stage {stage!r} was not waiting for a promotion ({where}); "
                                  "nothing promoted")

    # -- rollback ---------------------------------------------------------------------------

    def should_roll_back(self, one: PassState, rendered: Mapping[str, Rendered], steered: Steering
                         ) -> tuple[StageOutcome, list[str]] | None:
        """The failure that fails the release and the stages that moved in it (``None``: no rollback)."""
        if not one.stageset.spec.rollback_on_failure or steered.parked:
            return None
        outcomes = [one.progress.outcomes[n] for n in one.progress.order]
        failed = rollback.trigger(outcomes)
        if failed is None:
            return None
        good = rollback.good_of(one.writer.status.last_applied_snapshot)
        attempted = {n: rollback.Applied(r.revision, r.inputs) for n, r in rendered.items()
                     if one.progress.outcomes[n].phase is not StagePhase.PENDING}
        moved = rollback.moved(one.progress.order, good=good, attempted=attempted,
                               applied={o.name: o.revision for o in outcomes})
        return (failed, moved) if moved else None

    def roll_back(self, one: PassState, graph: nx.DiGraph, failed: StageOutcome, moved: list[str],
                  current: Mapping[str, str], *, interval: float) -> Verdict:
        """Restore ``moved`` at their last good revisions (or say why that cannot be done)."""
        good = rollback.good_of(one.writer.status.last_applied_snapshot)
        plan = rollback.order(graph, [m for m in moved if m in good])
        restores, problems = self._restores(one, plan, good)
        if problems:
            self._metrics.rolled_back(_ref(one.stageset), result="unavailable")
            return Verdict(False, Reason.PREVIOUS_REVISION_UNAVAILABLE,
                           rollback.unavailable_message(failed, problems), requeue_after=one.retry)
        record = rollback.started(failed=failed, moved_stages=moved, rollback_order=plan, current=current,
                                  generation=one.writer.generation, now=self._clock())
        log.warning("rolling back: %s", record.message)
        one.writer.release(one.progress, rollback=record)
        return self._restore(one, record, restores, interval=interval)

    def resume(self, one: PassState, record: Rollback, *, interval: float) -> Verdict:
        """Finish a rollback a stopped controller left mid-way (only the stages still to restore)."""
        good = rollback.good_of(one.writer.status.last_applied_snapshot)
        restores, problems = self._restores(one, [s for s in record.remaining if s in good], good)
        if problems:
            return Verdict(False, Reason.PREVIOUS_REVISION_UNAVAILABLE,
                           f"{record.message}; resuming the rollback: {'; '.join(problems)}",
                           requeue_after=one.retry)
        log.info("resuming a rollback: %s still to restore", ", ".join(record.remaining) or "nothing")
        return self._restore(one, record, restores, interval=interval)

    def _restores(self, one: PassState, plan: list[str], good: Mapping[str, StageSnapshot]
                  ) -> tuple[dict[str, Rendered], list[str]]:
        """Every stage to restore, rendered at its last good revision, before anything is touched."""
        restores: dict[str, Rendered] = {}
        problems: list[str] = []
        for name in plan:
            snap = good[name]
            try:
                item = self._render_at(one, name, snap.revision)
            except StageError as error:
                problems.append(error.message)
                continue
            if snap.substitution_digest != item.inputs:
                problems.append(f"stage {name!r}: its postBuild variables changed since its last good apply, "
                                f"so {snap.revision} would not render as it was")
                continue
            restores[name] = item
        return restores, problems

    def _restore(self, one: PassState, record: Rollback, restores: Mapping[str, Rendered], *,
                 interval: float) -> Verdict:
        namespace, name = _ref(one.stageset)
        clients = inventory_clients(clients=self._clients, identities=self._identities, namespace=namespace,
                                    target=one.target)
        for stage in list(record.remaining):
            item = restores.get(stage)
            if item is None:  # left the spec meanwhile
                record = rollback.restored(record, stage, "")
                continue
            one.writer.record(records.grown(one.writer.obj, records.wanted(one.stageset, {stage: item})))
            before = replace(one.progress.outcomes[stage], waiting_since=None)
            existing = one.progress.current.get(stage)
            outcome, result = self._stages.run(StageRun(stageset=one.stageset, rendered=item, before=before,
                                                        previous=existing, recheck=False))
            if result is None:
                self._metrics.rolled_back((namespace, name), result="failed")
                one.writer.release(one.progress, rollback=record)
                return Verdict(False, Reason.STAGE_FAILED, f"{record.message}; restoring stage {stage!r} "
                               f"failed: {outcome.message}; retrying", requeue_after=one.retry)
            self._changes.applied(one.writer.obj, stage, result, one.redactor)
            back = stage_inventory(stage, item.account, (o.entry() for o in result.objects))
            stale = candidates(old={stage: existing} if existing else {}, new={stage: back},
                               stageset=one.stageset)
            pruned = prune(stale=stale, client_for=clients, applier=one.target.applier,
                           owner=Owner(namespace, name))
            self._changes.pruned(one.writer.obj, pruned, one.redactor)
            kept = with_kept({stage: back}, pruned.kept)[stage]
            # A last good revision passed its gates: the stages after it are not held again by it.
            gated = item.stage.promotion is not None and item.stage.promotion.gated
            passed = PromotionState(phase=PromotionPhase.PROMOTED, revision=item.revision,
                                    since=format_time(self._clock()), promoted_by=gates.HOW_ROLLBACK)
            restored = replace(outcome, message=f"rolled back to {item.revision}",
                               promotion=passed if gated else None, promotion_token=before.promotion_token)
            one.progress = replace(one.progress.with_outcome(restored),
                                   current={**one.progress.current, stage: kept},
                                   fresh={**one.progress.fresh, stage: kept})
            record = rollback.restored(record, stage, item.revision)
            one.writer.release(one.progress, rollback=record)
        record = rollback.finished(record)
        one.writer.release(one.progress, rollback=record)
        self._metrics.rolled_back((namespace, name), result="rolled_back")
        self._events.emit(one.writer.obj, type_=EventType.WARNING, reason=EventReason.ROLLED_BACK,
                          action="Rollback", message=record.message, redact=one.redactor)
        return Verdict(False, Reason.ROLLED_BACK, record.message, requeue_after=interval)

    # -- the end of a pass --------------------------------------------------------------------

    def told(self, one: PassState, steered: Steering) -> None:
        """What steering decided that is told once: a new held set, an update-now acted on."""
        ref = _ref(one.stageset)
        if steered.override:
            shipped = ", ".join(f"{s} to {r}" for s, r in sorted(steered.override_revisions.items())) \
                or "nothing held"
            self._events.emit(one.writer.obj, type_=EventType.NORMAL, reason=EventReason.UPDATE_OVERRIDDEN,
                              action="UpdateNow", redact=one.redactor,
                              message=f"stages.metio.wtf/update-now={steered.override}: shipping {shipped} "
                                      "despite the update windows")
        if steered.newly_deferred(one.writer.status.pending_update):
            self._metrics.deferred(ref)
            self._events.emit(one.writer.obj, type_=EventType.NORMAL, reason=EventReason.UPDATE_DEFERRED,
                              action="Apply", message=steering.deferral(steered), redact=one.redactor)

    def concluded(self, one: PassState, status: StageSetStatus, steered: Steering, verdict: Verdict,
                  rendered: Mapping[str, Rendered], *, rolled: Rollback | None = None,
                  rolling: bool = False) -> StageSetStatus:
        """``status`` with the fields steering owns, as this pass leaves them (``rolling``: the pass
        rolled back, and ``rolled`` is the record it left)."""
        applied = {stage.name: stage.revision for stage in status.stages}
        update: dict[str, object] = {
            "pending_update": steered.pending,
            # What update-now let through stays let through until its stage has applied it.
            "override_revisions": {s: r for s, r in steered.override_revisions.items()
                                   if applied.get(s) != r},
            "rollback": rolled if rolling else steered.rollback,
        }
        if steered.override:
            update["last_handled_update_override"] = steered.override
        if steering.succeeded(verdict, steered):
            update["last_applied_snapshot"] = rollback.snapshot(
                one.progress.order, {n: rollback.Applied(r.revision, r.inputs) for n, r in rendered.items()})
        ended = status.model_copy(update=update)
        self._keep(one, ended, rendered)
        return ended

    def _keep(self, one: PassState, status: StageSetStatus, rendered: Mapping[str, Rendered]) -> None:
        """Each stage's last good and applied commits stay readable in the mirror (refreshed by every
        pass; local disk, no request)."""
        namespace, name = _ref(one.stageset)
        good = rollback.good_of(status.last_applied_snapshot)
        applied = {s.name: s.revision for s in status.stages}
        for stage, item in rendered.items():
            if item.source is None:
                continue
            wanted = [r for r in (good[stage].revision if stage in good else None, applied.get(stage)) if r]
            try:
                self._renderer.revisions.keep(item.source, holder=f"{namespace}/{name}/{stage}",
                                              revisions=wanted)
            except OSError as error:
                log.warning("could not keep stage %s's revisions in the Git mirror: %s", stage, error)

