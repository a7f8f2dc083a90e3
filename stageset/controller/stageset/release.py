"""Steering a release within a pass: where stages render, promotion gates, rollback, the last good
snapshot.  The decisions are pure (:mod:`.steering`, :mod:`.gates`, :mod:`.windows`,
:mod:`.rollback`); this module does what they decide and tells it.

- :meth:`Release.steer` — after the stages rendered at their current revisions: re-render the
  stages steering pins to a recorded revision (a parked rollback, a held update), drop the ones it
  holds back entirely;
- :meth:`Release.gate` — a stage finished: judge its promotion gate (and a promote request); only
  a released stage lets its dependents start;
- :meth:`Release.roll_back` / :meth:`Release.resume` — restore the moved stages at their last good
  revisions, dependents first, deleting what the new revision added (only under the pass's
  :class:`~stageset.controller.stageset.pruning.PrunePermission` of ``Scope.RESTORED``); the record
  in status is written before the first stage and after each, so a controller that stops mid-way
  resumes with the stages still to restore and re-applies nothing it already restored;
- :meth:`Release.concluded` — the status fields steering owns (``pendingUpdate``,
  ``lastAppliedSnapshot``, ``rollback``, ``lastHandledUpdateOverride``, ``overrideRevisions``), and
  keeping each stage's last good and applied commits readable in the Git mirror.

Every method takes what the pass works on (a :class:`~stageset.controller.stageset.context.PassContext`,
fixed) and where it stands (a :class:`~stageset.controller.stageset.progress.Progress` value), and
returns what changed as new values (:class:`Steered`, :class:`RolledBack`, a judged outcome, a
new progress): nothing here assigns into the pass.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from stageset.api import StageInventory, StageSetStatus, format_time
from stageset.api.fleet import NO_FLEET, FleetView
from stageset.api.release import PromotionPhase, PromotionState, Rollback, StageSnapshot
from stageset.api.vocabulary import EventReason, Reason, StagePhase
from stageset.apply.errors import StageError
from stageset.apply.inventory import stage_inventory, with_kept
from stageset.apply.prune import Owner, candidates
from stageset.apply.prune import prune as prune_stale
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder, normal, warning
from stageset.controller.identity import IdentityPolicy
from stageset.controller.metrics import Metrics
from stageset.controller.stageset import gates, records, rollback, steering
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.context import PassContext, interruptible
from stageset.controller.stageset.placement import placed
from stageset.controller.stageset.plan import StageOutcome, Verdict
from stageset.controller.stageset.progress import Progress
from stageset.controller.stageset.pruning import PrunePermission, Scope
from stageset.controller.stageset.rendering import Rendered, Renderer
from stageset.controller.stageset.stage import StageRun, StageWork
from stageset.controller.stageset.steering import Steering
from stageset.controller.targets.clusters import inventory_clients
from stageset.kube.client import ClientPool

log = logging.getLogger(__name__)


def _joined(revisions: Iterable[str]) -> str:
    return ", ".join(sorted({r for r in revisions if r}))


def _newly_awaiting(before: PromotionState | None, after: PromotionState | None) -> bool:
    """The gate began awaiting a promotion in this pass (not at this revision before)."""
    if after is None or after.phase is not PromotionPhase.AWAITING_MANUAL:
        return False
    return before is None or before.phase is not PromotionPhase.AWAITING_MANUAL \
        or before.revision != after.revision


@dataclass(frozen=True)
class Request:
    """A promote request that is new for its stage."""

    stage: str
    token: str


@dataclass(frozen=True)
class Steered:
    """What steering decided for a pass, the stages to apply, and the progress after it."""

    steering: Steering
    rendered: dict[str, Rendered]
    """The stages to apply: pinned ones re-rendered at their recorded revision, held ones out."""
    progress: Progress


@dataclass(frozen=True)
class RolledBack:
    """A rollback run (or resumed) in this pass: its verdict, and the progress after it."""

    verdict: Verdict
    progress: Progress


SelectedBy = Callable[[str, str], FleetView | Sequence[str]]
"""What the controller's watch of FleetRollouts says of StageSet ``(namespace, name)`` (no request):
a :class:`~stageset.api.fleet.FleetView` (or only the names of the rollouts selecting it, which
then record nothing for it); :func:`no_rollouts` where no rollout runs (a namespaced or
label-sharded release)."""


def no_rollouts(_namespace: str, _name: str) -> FleetView:
    """No StageSet is selected: the release runs no FleetRollout reconciler."""
    return NO_FLEET


def fleet_view(found: FleetView | Sequence[str]) -> FleetView:
    """What :data:`SelectedBy` answered, as a view."""
    return found if isinstance(found, FleetView) else FleetView(selected_by=tuple(found))


class Release:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, renderer: Renderer,
                 stages: StageWork, changes: Changes, events: EventRecorder, metrics: Metrics, clock: Clock,
                 selected_by: SelectedBy):
        self._clients = clients
        self._identities = identities
        self._renderer = renderer
        self._stages = stages
        self._changes = changes
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._selected_by = selected_by

    def now(self) -> datetime.datetime:
        return self._clock()

    # -- where stages render --------------------------------------------------------------

    def _render_at(self, ctx: PassContext, name: str, revision: str) -> Rendered:
        stage = next(s for s in ctx.stageset.spec.stages if s.name == name)
        identity = self._identities.for_stage(ctx.stageset, stage)
        rendered = self._renderer.render(stage=stage, identity=identity, namespace=ctx.ref[0],
                                         target=ctx.target, redactor=ctx.redactor, decryption=ctx.decryption,
                                         revision=revision, salt=str(ctx.stageset.metadata.get("uid", "")))
        return placed(rendered, ctx.stageset)

    def steer(self, ctx: PassContext, progress: Progress, rendered: dict[str, Rendered]) -> Steered:
        """Steering for this pass, and the stages to apply (pinned ones re-rendered, held ones out)."""
        status = ctx.writer.status
        sources = {n: r.source.name for n, r in rendered.items() if r.source is not None}
        decided = steering.steer(ctx.stageset, status, current={n: r.revision for n, r in rendered.items()},
                                 sources=sources, now=self._clock(), generation=ctx.writer.generation,
                                 fleet=fleet_view(self._selected_by(*ctx.ref)))
        if decided.resume or decided.frozen:
            # Nothing is applied now: every stage shows what the last pass left.
            shown = progress.rechecked([n for n in progress.order if n in progress.previous.stages])
            return Steered(decided, rendered, shown)
        chosen = {n: r for n, r in rendered.items() if n not in decided.skip}
        skip = dict(decided.skip)
        for name, revision in decided.pins.items():
            if name not in chosen or chosen[name].revision == revision:
                continue
            try:
                chosen[name] = self._render_at(ctx, name, revision)
            except StageError as error:
                # The recorded revision is gone: the stage is left as it is (not applied).
                chosen.pop(name)
                skip[name] = f"{error.message}; the stage is left as it is"
        for name, why in skip.items():
            outcome = progress.outcomes[name]
            progress = progress.with_outcome(replace(outcome, phase=StagePhase.PENDING, reason=None,
                                                     message=why))
        return Steered(replace(decided, skip=skip), chosen, progress)

    # -- promotion gates --------------------------------------------------------------------

    @staticmethod
    def request(ctx: PassContext, progress: Progress) -> Request | None:
        handled = {n: o.promotion_token for n, o in progress.outcomes.items()}
        found = gates.promote_request(ctx.stageset.metadata.get("annotations"), handled=handled)
        return Request(*found) if found else None

    def gate(self, ctx: PassContext, progress: Progress, outcome: StageOutcome, request: Request | None
             ) -> tuple[StageOutcome, bool]:
        """``outcome`` with its promotion gate judged (against what the last pass left in
        ``progress``); whether its dependents may start."""
        name = outcome.name
        stage = next((s for s in ctx.stageset.spec.stages if s.name == name), None)
        before = progress.previous.stages.get(name)
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
                self._ignored(ctx, name, state, outcome)
        if decided.promoted:
            self._promoted(ctx, name, decided.promoted, outcome.revision or "")
        if _newly_awaiting(state, decided.state):
            self._awaiting(ctx, name, outcome.revision or "")
        return replace(outcome, promotion=decided.state, promotion_token=token), decided.released

    def unheard(self, ctx: PassContext, progress: Progress, request: Request | None) -> Progress:
        """A promote request for a stage this pass did not reach: acted on (ignored) all the same,
        so it can never promote a revision its sender did not see waiting."""
        if request is None:
            return progress
        outcome = progress.outcomes.get(request.stage)
        if outcome is None or outcome.promotion_token == request.token:
            return progress
        self._ignored(ctx, request.stage, outcome.promotion, outcome)
        return progress.with_outcome(replace(outcome, promotion_token=request.token))

    def _promoted(self, ctx: PassContext, stage: str, how: str, revision: str) -> None:
        self._metrics.promoted(ctx.ref, stage, how=how)
        what = "its soak ended" if how == gates.HOW_SOAK else "promoted by request"
        self._events.emit(normal(ctx.writer.obj, EventReason.PROMOTED,
                                 f"stage {stage!r} promoted at {revision} ({what}); "
                                 "the stages after it go on",
                                 action="Promote", redact=ctx.redactor))

    def _awaiting(self, ctx: PassContext, stage: str, revision: str) -> None:
        """Told once per revision a stage waits at (a notification reaches whoever promotes)."""
        self._events.emit(normal(ctx.writer.obj, EventReason.AWAITING_PROMOTION,
                                 f"stage {stage!r} is Ready at {revision} and awaits promotion "
                                 f"(stageset promote NAME --stage {stage}); the stages after it wait",
                                 action="Promote", redact=ctx.redactor, revision=revision))

    def _ignored(self, ctx: PassContext, stage: str, state: PromotionState | None,
                 outcome: StageOutcome) -> None:
        where = f"phase {outcome.phase.value}" if not gates.held(state) or state is None else \
            f"it waited at {state.revision}, and this pass applied {outcome.revision}"
        self._events.emit(normal(ctx.writer.obj, EventReason.PROMOTION_IGNORED,
                                 f"stage {stage!r} was not waiting for a promotion ({where}); "
                                 "nothing promoted",
                                 action="Promote", redact=ctx.redactor))

    # -- rollback ---------------------------------------------------------------------------

    @staticmethod
    def should_roll_back(ctx: PassContext, progress: Progress, rendered: Mapping[str, Rendered],
                         steered: Steering) -> tuple[StageOutcome, list[str]] | None:
        """The failure that fails the release and the stages that moved in it (``None``: no rollback)."""
        if not ctx.stageset.spec.rollback_on_failure or steered.parked:
            return None
        outcomes = [progress.outcomes[n] for n in progress.order]
        failed = rollback.trigger(outcomes)
        if failed is None:
            return None
        good = rollback.good_of(ctx.writer.status.last_applied_snapshot)
        attempted = {n: rollback.Applied(r.revision, r.inputs) for n, r in rendered.items()
                     if progress.outcomes[n].phase is not StagePhase.PENDING}
        moved = rollback.moved(progress.order, good=good, attempted=attempted,
                               applied={o.name: o.revision for o in outcomes})
        return (failed, moved) if moved else None

    def roll_back(self, ctx: PassContext, progress: Progress, graph: nx.DiGraph, failed: StageOutcome,
                  moved: list[str], current: Mapping[str, str], *, prune: PrunePermission,
                  interval: float) -> RolledBack:
        """Restore ``moved`` at their last good revisions (or say why that cannot be done)."""
        good = rollback.good_of(ctx.writer.status.last_applied_snapshot)
        plan = rollback.order(graph, [m for m in moved if m in good])
        restores, problems = self._restores(ctx, plan, good)
        if problems:
            self._metrics.rolled_back(ctx.ref, result="unavailable")
            unavailable = rollback.unavailable_message(failed, problems)
            return RolledBack(Verdict(False, Reason.PREVIOUS_REVISION_UNAVAILABLE, unavailable,
                                      requeue_after=ctx.retry), progress)
        record = rollback.started(failed=failed, moved_stages=moved, rollback_order=plan, current=current,
                                  generation=ctx.writer.generation, now=self._clock())
        log.warning("rolling back: %s", record.message)
        ctx.writer.release(progress, rollback=record)
        return self._restore(ctx, progress, record, restores, prune=prune, interval=interval)

    def resume(self, ctx: PassContext, progress: Progress, record: Rollback, *, prune: PrunePermission,
               interval: float) -> RolledBack:
        """Finish a rollback a stopped controller left mid-way (only the stages still to restore)."""
        good = rollback.good_of(ctx.writer.status.last_applied_snapshot)
        restores, problems = self._restores(ctx, [s for s in record.remaining if s in good], good)
        if problems:
            return RolledBack(Verdict(False, Reason.PREVIOUS_REVISION_UNAVAILABLE,
                                      f"{record.message}; resuming the rollback: {'; '.join(problems)}",
                                      requeue_after=ctx.retry), progress)
        log.info("resuming a rollback: %s still to restore", ", ".join(record.remaining) or "nothing")
        return self._restore(ctx, progress, record, restores, prune=prune, interval=interval)

    def _restores(self, ctx: PassContext, plan: list[str], good: Mapping[str, StageSnapshot]
                  ) -> tuple[dict[str, Rendered], list[str]]:
        """Every stage to restore, rendered at its last good revision, before anything is touched."""
        restores: dict[str, Rendered] = {}
        problems: list[str] = []
        for name in plan:
            snap = good[name]
            try:
                item = self._render_at(ctx, name, snap.revision)
            except StageError as error:
                problems.append(error.message)
                continue
            if snap.substitution_digest != item.inputs:
                problems.append(f"stage {name!r}: its postBuild variables changed since its last good apply, "
                                f"so {snap.revision} would not render as it was")
                continue
            restores[name] = item
        return restores, problems

    def _restore(self, ctx: PassContext, progress: Progress, record: Rollback,
                 restores: Mapping[str, Rendered], *, prune: PrunePermission, interval: float) -> RolledBack:
        """Restore each stage still to restore, in the record's order (the record written after each)."""
        with interruptible(ctx, lambda: progress):
            for stage in list(record.remaining):
                item = restores.get(stage)
                if item is None:  # left the spec meanwhile
                    record = rollback.restored(record, stage, "")
                    continue
                outcome, inventory = self._restore_stage(ctx, progress, stage, item, prune=prune)
                if inventory is None:
                    self._metrics.rolled_back(ctx.ref, result="failed")
                    ctx.writer.release(progress, rollback=record)
                    message = f"{record.message}; restoring stage {stage!r} failed: {outcome.message}; " \
                              "retrying"
                    return RolledBack(Verdict(False, Reason.STAGE_FAILED, message, requeue_after=ctx.retry),
                                      progress)
                progress = progress.restored(outcome, inventory)
                record = rollback.restored(record, stage, item.revision)
                ctx.writer.release(progress, rollback=record)
            record = rollback.finished(record)
            ctx.writer.release(progress, rollback=record)
            self._metrics.rolled_back(ctx.ref, result="rolled_back")
            # Annotated with the revisions that failed (their commits' statuses fail).
            self._events.emit(warning(ctx.writer.obj, EventReason.ROLLED_BACK, record.message,
                                      action="Rollback", redact=ctx.redactor,
                                      revision=_joined(record.failed.values())))
            return RolledBack(Verdict(False, Reason.ROLLED_BACK, record.message, requeue_after=interval),
                              progress)

    def _restore_stage(self, ctx: PassContext, progress: Progress, stage: str, item: Rendered, *,
                       prune: PrunePermission) -> tuple[StageOutcome, StageInventory | None]:
        """Re-apply one stage at its last good revision and delete what the failed revision added
        (only under ``Scope.RESTORED``); its outcome and inventory (``None``: the apply failed)."""
        namespace, name = ctx.ref
        ctx.writer.record(records.grown(ctx.writer.obj, records.wanted(ctx.stageset, {stage: item}),
                                        target=ctx.target.id, now=format_time(self._clock())))
        before = replace(progress.outcomes[stage], waiting_since=None)
        existing = progress.current.get(stage)
        outcome, result = self._stages.run(StageRun(stageset=ctx.stageset, rendered=item, before=before,
                                                    previous=existing, recheck=False))
        if result is None:
            return outcome, None
        self._changes.applied(ctx.writer.obj, stage, result, ctx.redactor)
        back = records.on_target(stage_inventory(stage, item.account, (o.entry() for o in result.objects)),
                                 ctx.target, stageset=ctx.stageset, recorded=None)
        stale = candidates(old={stage: existing} if existing else {}, new={stage: back},
                           stageset=ctx.stageset)
        kept = stale  # not deleted: still tracked
        if prune.scope is Scope.RESTORED:
            clients = inventory_clients(clients=self._clients, identities=self._identities,
                                        namespace=namespace, target=ctx.target)
            pruned = prune_stale(stale=stale, client_for=clients, applier=ctx.target.applier,
                                 owner=Owner(namespace, name))
            self._changes.pruned(ctx.writer.obj, pruned, ctx.redactor)
            kept = pruned.kept
        # A last good revision passed its gates: the stages after it are not held again by it.
        gated = item.stage.promotion is not None and item.stage.promotion.gated
        passed = PromotionState(phase=PromotionPhase.PROMOTED, revision=item.revision,
                                since=format_time(self._clock()), promoted_by=gates.HOW_ROLLBACK)
        restored = replace(outcome, message=f"rolled back to {item.revision}",
                           promotion=passed if gated else None, promotion_token=before.promotion_token)
        return restored, with_kept({stage: back}, kept)[stage]

    # -- the end of a pass --------------------------------------------------------------------

    def told(self, ctx: PassContext, steered: Steering) -> None:
        """What steering decided that is told once: a new held set, an update-now acted on."""
        if steered.override:
            shipped = ", ".join(f"{s} to {r}" for s, r in sorted(steered.override_revisions.items())) \
                or "nothing held"
            self._events.emit(normal(ctx.writer.obj, EventReason.UPDATE_OVERRIDDEN,
                                     f"stages.metio.wtf/update-now={steered.override}: shipping {shipped} "
                                     "despite the update windows", action="UpdateNow", redact=ctx.redactor))
        if steered.newly_deferred(ctx.writer.status.pending_update):
            self._metrics.deferred(ctx.ref)
            held = steered.pending.revisions.values() if steered.pending is not None else ()
            self._events.emit(normal(ctx.writer.obj, EventReason.UPDATE_DEFERRED, steering.deferral(steered),
                                     action="Apply", redact=ctx.redactor, revision=_joined(held)))

    def concluded(self, ctx: PassContext, progress: Progress, status: StageSetStatus, steered: Steering,
                  rendered: Mapping[str, Rendered], *, prune: PrunePermission, rolled: Rollback | None,
                  rolling: bool) -> StageSetStatus:
        """``status`` with the fields steering owns, as this pass leaves them (``rolling``: the pass
        rolled back, and ``rolled`` is the record it left; ``prune``: the pass's permission — the
        revisions become the last good snapshot only in a pass that may prune what is stale)."""
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
        if steering.succeeded(prune, steered):
            update["last_applied_snapshot"] = rollback.snapshot(
                progress.order, {n: rollback.Applied(r.revision, r.inputs) for n, r in rendered.items()})
        ended = status.model_copy(update=update)
        self._keep(ctx, ended, rendered)
        return ended

    def _keep(self, ctx: PassContext, status: StageSetStatus, rendered: Mapping[str, Rendered]) -> None:
        """Each stage's last good and applied commits stay readable in the mirror (refreshed by every
        pass; local disk, no request)."""
        namespace, name = ctx.ref
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
