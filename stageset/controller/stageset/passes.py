"""One pass over a prepared StageSet, as named steps whose results are values.

render every stage (placed where ``spec.targetNamespace`` says) -> steer
(:mod:`~stageset.controller.stageset.release`: finish a rollback left mid-way, freeze, re-render
stages pinned to a recorded revision, hold stages back) -> refuse two stages rendering one object ->
recover a lost inventory, split off what a move left on a previous cluster
(:mod:`~stageset.controller.stageset.moves`) and grow the record -> apply stages as the graph allows
(each returns an immutable outcome; a stage's promotion gate decides whether its dependents start)
-> the verdict (:func:`plan.verdict`, then :func:`steering.verdict`) -> roll back when a failed
release says so -> prune as the pass's one prune permission allows (:func:`pruning.permission`,
asked once on whichever way the pass goes; ``Scope.MOVED`` also cleans up the clusters a move
left) -> the status the pass ends with (:func:`progress.concluded`, then the fields steering owns)
-> one conclusion (none, for a new StageSet that has only waited for its source for less than
:data:`~stageset.controller.stageset.holding.GRACE`: :mod:`~stageset.controller.stageset.holding`).

What the pass works on is one :class:`~stageset.controller.stageset.context.PassContext`, fixed;
where it stands is one :class:`~stageset.controller.stageset.progress.Progress` value, a local
value of the runner: each step (and release steering, gates and rollback) takes it and returns a
new one, on the reconcile's thread as stages tell and finish.  Whether the pass is quiet
(:func:`plan.quiet`) is decided once and passed to every write that shows progress.  Every write
goes through the pass's :class:`~stageset.controller.stageset.writer.PassWriter`.

Identity, per request (the rules: :mod:`stageset.controller.identity`): a stage's source,
``substituteFrom`` objects and its objects' dry-run, apply, readiness reads and prune as the
stage's identity (derived once, carried by :class:`Rendered`); status, the record and events
as the controller.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import networkx as nx

from stageset.api import DriftMode, StageSet, format_time
from stageset.api.vocabulary import Reason, StagePhase
from stageset.apply.changeset import WRITES
from stageset.apply.engine import StageResult
from stageset.apply.errors import StageError
from stageset.apply.handover import released
from stageset.apply.inventory import Stale, duplicates, entry_id, stage_inventory
from stageset.apply.orphan import release_stale
from stageset.apply.prune import Owner, candidates, unpruned_stages
from stageset.apply.prune import prune as prune_stale
from stageset.apply.record import StageRecord
from stageset.controller import logs
from stageset.controller.accounts import AccountCheck
from stageset.controller.clock import Clock
from stageset.controller.drift import report as drift_report
from stageset.controller.identity import IdentityPolicy
from stageset.controller.redact import Redactor
from stageset.controller.render.decryption import for_pass
from stageset.controller.render.reads import NothingSaidYet
from stageset.controller.result import Result
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset import history, plan, pruning, records, steering, succession
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.context import Interrupted, PassContext, interruptible
from stageset.controller.stageset.moves import Moves
from stageset.controller.stageset.placement import placed
from stageset.controller.stageset.progress import Progress, concluded, shown
from stageset.controller.stageset.pruning import PrunePermission, Scope
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.release import Release, Request
from stageset.controller.stageset.rendering import Rendered, Renderer, identify
from stageset.controller.stageset.scheduler import StageScheduler, Tell
from stageset.controller.stageset.stage import StageRun, StageWork
from stageset.controller.stageset.steering import Steering
from stageset.controller.stageset.supersedes import Letting, Supersedes, Taking
from stageset.controller.stageset.writer import PassWriter
from stageset.controller.targets.clusters import Target, inventory_clients
from stageset.kube.client import ApiError, ClientPool, UnreachableError, how_failed

log = logging.getLogger(__name__)

Done = tuple[plan.StageOutcome, StageResult | None]


def log_denial(error: StageError) -> None:
    """Every RBACDenied is logged (the message names the identity and what it may not do)."""
    if error.reason is Reason.RBAC_DENIED:
        log.warning("denied: %s", error.message)


def unreachable(target: Target, error: UnreachableError | ApiError) -> str:
    """What to say about a remote cluster that fails: where, and how — never what it sent."""
    return f"{target.where} cannot be used: {how_failed(error)}; retrying with backoff"


class PassRunner:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, renderer: Renderer,
                 records: Records, stages: StageWork, changes: Changes, settings: ControllerSettings,
                 accounts: AccountCheck, release: Release, moves: Moves, clock: Clock,
                 supersedes: Supersedes):
        self._clients = clients
        self._supersedes = supersedes
        self._accounts = accounts
        self._identities = identities
        self._renderer = renderer
        self._records = records
        self._stages = stages
        self._changes = changes
        self._settings = settings
        self._release = release
        self._moves = moves
        self._clock = clock

    def run(self, writer: PassWriter, stageset: StageSet, graph: nx.DiGraph, target: Target, *,
            redactor: Redactor, retry: float) -> Result:
        previous = plan.Previous.from_status(writer.status, generation=writer.generation)
        # spec.supersedes, both sides: what this StageSet handed over (never applied, listed or pruned
        # again), and what it may take over (refused: nothing of the pass is applied).
        letting = self._supersedes.letting(writer.obj)
        previous = self._let_go(writer, letting, previous)
        try:
            taking = self._supersedes.taking(stageset, obj=writer.obj, target=target.id,
                                             now=format_time(self._clock()))
        except StageError as error:
            taking = Taking(refusal=succession.Refusal(error.reason, error.message))
        if taking.refusal is not None:
            log_denial(StageError(taking.refusal.reason, taking.refusal.message))
            failure = plan.before_stages(taking.refusal.reason, retry=retry)
            status = shown(writer.status, Progress.start(stageset, previous))
            writer.conclude(ready=False, reason=taking.refusal.reason, message=taking.refusal.message,
                            stalled=failure.stalled, status=status)
            return Result(requeue_after=failure.requeue_after)
        # spec.decryption: the key Secret is read as the StageSet's ServiceAccount, at most once a pass.
        decryption = for_pass(stageset, policy=self._identities, clients=self._clients,
                              accounts=self._accounts, redactor=redactor)
        ctx = PassContext(writer=writer, stageset=stageset, target=target, redactor=redactor, retry=retry,
                          decryption=decryption, taking=taking, letting=letting)
        try:
            return self._run(ctx, Progress.start(stageset, previous), graph)
        except Interrupted as stopped:
            # A tenant's remote cluster that fails: a short condition (nothing the remote sent),
            # the inventory kept (as the pass stood), and the key's backoff — never a traceback
            # per retry.
            writer.conclude(ready=False, reason=Reason.CLUSTER_UNREACHABLE,
                            message=unreachable(target, stopped.error),
                            status=shown(writer.status, stopped.progress))
            return Result(backoff=True)

    def _run(self, ctx: PassContext, progress: Progress, graph: nx.DiGraph) -> Result:
        with interruptible(ctx, lambda: progress):
            rendered, progress, unspoken = self._render_all(ctx, progress)
            # Every stage that did not render waits for a GitRepository's first fetch (holding.py).
            patient = bool(unspoken) and set(progress.order) - set(rendered) <= unspoken
            current = {n: r.revision for n, r in rendered.items()}
            interval = ctx.stageset.spec.requeue_when_ready(self._settings.default_interval)
            steered = self._release.steer(ctx, progress, rendered)
            steer, rendered, progress = steered.steering, steered.rendered, steered.progress
            rendered = self._handed(ctx, rendered)
            progress = self._carried(ctx, progress, rendered)
            # What a failure event names (status keeps only the revisions applied).
            self._changes.attempting(ctx.writer.obj, {n: r.revision for n, r in rendered.items()})
            if steer.resume and steer.rollback is not None:
                prune = pruning.permission(pruning.RollingBack())
                resumed = self._release.resume(ctx, progress, steer.rollback, prune=prune, interval=interval)
                progress = resumed.progress
                return self._conclude(ctx, progress, steer, resumed.verdict, rendered, prune=prune,
                                      rolled=True)
            if steer.frozen:
                prune = pruning.permission(pruning.Frozen())
                verdict = steering.frozen_verdict(steer, was_ready=progress.previous.ready, interval=interval)
                return self._conclude(ctx, progress, steer, verdict, rendered, prune=prune, rolled=False)
            clash = plan.clash_message(duplicates({n: r.ids for n, r in rendered.items()}))
            if clash:
                ctx.writer.conclude(ready=False, reason=Reason.INVALID_SPEC, message=clash, stalled=True,
                                    status=shown(ctx.writer.status, progress))
                return Result()
            wanted = records.wanted(ctx.stageset, rendered)
            progress, partial = self._recover(ctx, progress, wanted)
            progress = self._moves.start(ctx, progress)
            try:
                # The finalizer goes with the record only when a stage will apply (a pass that
                # renders nothing writes it with its conclusion, if it concludes: holding.py).
                ctx.writer.record(records.grown(ctx.writer.obj, wanted, target=ctx.target.id,
                                                now=format_time(self._clock())), before_apply=bool(rendered))
            except StageError as error:  # the finalizer could not be added: the object changed
                failure = plan.before_stages(error.reason, retry=ctx.retry)
                ctx.writer.conclude(ready=False, reason=error.reason, message=error.message,
                                    stalled=failure.stalled, status=shown(ctx.writer.status, progress))
                return Result(requeue_after=failure.requeue_after)
        return self._apply(ctx, progress, graph, rendered, steer=steer, partial=partial, current=current,
                           interval=interval, patient=patient)

    def _apply(self, ctx: PassContext, progress: Progress, graph: nx.DiGraph, rendered: dict[str, Rendered],
               *, steer: Steering, partial: str | None, current: dict[str, str], interval: float,
               patient: bool = False) -> Result:
        """Apply the stages, judge the pass, roll back or prune, conclude."""
        with interruptible(ctx, lambda: progress):
            previous, stages = progress.previous, len(ctx.stageset.spec.stages)
            revisions = {n: r.revision for n, r in rendered.items()}
            quiet = plan.quiet(previous, revisions, stages=stages)
            rechecks = plan.rechecks(previous, revisions)
            progress = progress.rechecked(rechecks)
            if plan.announce(previous, is_quiet=quiet,
                             only_rechecks=rechecks == set(rendered) and len(rendered) == stages):
                ctx.writer.announce(progress, "applying stages")
            progress = self._apply_all(ctx, progress, graph, rendered, rechecks=rechecks, quiet=quiet)
            outcomes = [progress.outcomes[n] for n in progress.order]
            base = plan.verdict(outcomes, interval=interval, retry=ctx.retry,
                                readiness_requeue=self._settings.readiness_requeue,
                                watched_requeue=self._settings.watched_requeue)
            verdict = steering.verdict(base, outcomes, steering=steer, now=self._release.now(),
                                       interval=interval)
            failed = None if verdict.ready else self._release.should_roll_back(ctx, progress, rendered, steer)
            if failed is not None:
                prune = pruning.permission(pruning.RollingBack())
                rolled = self._release.roll_back(ctx, progress, graph, *failed, current=current, prune=prune,
                                                 interval=interval)
                progress = rolled.progress
                return self._conclude(ctx, progress, steer, rolled.verdict, rendered, prune=prune,
                                      rolled=True)
            prune = pruning.permission(pruning.Applied(
                outcomes=outcomes, held_back=tuple(steer.skip), parked=steer.parked, partial=partial,
                moving=progress.moving is not None or bool(progress.unlisted)))
            if partial is not None and prune.reason is pruning.PruneReason.INVENTORY_INCOMPLETE:
                verdict = plan.inventory_incomplete(partial, retry=ctx.retry)
            return self._conclude(ctx, progress, steer, verdict, rendered, prune=prune, rolled=False,
                                  patient=patient)

    def _render_all(self, ctx: PassContext, progress: Progress
                    ) -> tuple[dict[str, Rendered], Progress, set[str]]:
        """Every stage rendered (or failed), and the stages whose GitRepository has not said
        anything yet (:class:`~stageset.controller.render.reads.NothingSaidYet`)."""
        rendered: dict[str, Rendered] = {}
        unspoken: set[str] = set()
        namespace = ctx.ref[0]
        with interruptible(ctx, lambda: progress):
            for stage in ctx.stageset.spec.stages:
                kind = "tenant" if self._identities.stage_account(ctx.stageset, stage) else "controller"
                with logs.bind(stage=stage.name, identity=kind):
                    try:
                        identity = self._identities.for_stage(ctx.stageset, stage)
                        rendered[stage.name] = placed(self._renderer.render(
                            stage=stage, identity=identity, namespace=namespace, target=ctx.target,
                            redactor=ctx.redactor, decryption=ctx.decryption,
                            salt=str(ctx.stageset.metadata.get("uid", ""))), ctx.stageset)
                    except StageError as error:
                        log_denial(error)
                        if isinstance(error, NothingSaidYet):
                            unspoken.add(stage.name)
                        failed = progress.outcomes[stage.name].failed(error.reason, error.message)
                        progress = progress.with_outcome(failed)
        return rendered, progress, unspoken

    def _recover(self, ctx: PassContext, progress: Progress, wanted: dict[str, StageRecord]
                 ) -> tuple[Progress, str | None]:
        """Before anything is written or pruned: an inventory status lost is rebuilt from the
        cluster (the record it found written).  Returns the progress with the inventories found,
        and why they are incomplete (``None``: complete).  The record is then grown to cover
        ``wanted``, what is about to be applied (by the caller, before the first apply)."""
        found = self._records.recover(ctx.writer.obj, inventories=progress.previous.inventories,
                                      wanted=wanted, target=ctx.target, now=format_time(self._clock()))
        ctx.writer.record(found.record)
        return progress.recovered(released(found.inventories, ctx.letting.gone)), found.problem

    def _apply_all(self, ctx: PassContext, start: Progress, graph: nx.DiGraph, rendered: dict[str, Rendered],
                   *, rechecks: set[str], quiet: bool) -> Progress:
        """Run the stages as the graph allows; returns the progress they leave.  The scheduler calls
        back on this (the reconcile's) thread only, so ``progress`` is this method's local value,
        replaced as stages start, tell and finish."""
        progress = start
        previous = start.previous.inventories
        # A routine pass over a Ready StageSet may trust rights its identities showed recently; one
        # that was asked for, or follows a change or a failure, checks them (stageset/apply/rights.py).
        recheck_rights = ctx.writer.requested or not start.previous.ready
        starting: dict[str, plan.StageOutcome] = {}
        request: Request | None = self._release.request(ctx, start)

        def started(name: str) -> None:
            nonlocal progress
            if name not in rechecks:
                progress = progress.applying(name)
            starting[name] = progress.outcomes[name]

        def work(name: str, tell: Tell) -> Done:
            # On a pool thread: reads only what was decided before it was submitted.
            return self._stages.run(StageRun(
                stageset=ctx.stageset, rendered=rendered[name], before=starting[name],
                previous=previous.get(name), recheck=name in rechecks, waiting=tell, redactor=ctx.redactor,
                recheck_rights=recheck_rights, handover=ctx.taking.handover))

        def heard(name: str, outcome: plan.StageOutcome) -> None:
            nonlocal progress
            was = progress.outcomes[name]
            progress = progress.with_outcome(outcome)
            ctx.writer.waiting(was, progress, quiet=quiet)

        def finished(name: str, done: Done) -> bool:
            nonlocal progress
            outcome, result = done
            inventory = None if result is None else records.on_target(stage_inventory(
                name, rendered[name].account, (o.entry() for o in result.objects)), ctx.target,
                stageset=ctx.stageset, recorded=None)
            outcome, released = self._release.gate(ctx, progress, outcome, request)
            progress = progress.applied(outcome, inventory, () if result is None else result.changes)
            if result is not None:
                self._changes.applied(ctx.writer.obj, name, result, ctx.redactor)
            return released

        def shown(done: int) -> None:
            del done
            ctx.writer.show(progress, quiet=quiet)

        scheduler: StageScheduler[Done] = StageScheduler(graph=graph, name=ctx.ref[1],
                                                         parallelism=self._settings.stage_parallelism)
        with interruptible(ctx, lambda: progress):
            scheduler.run(skip=[n for n in start.order if n not in rendered], work=work, started=started,
                          finished=finished, heard=heard, progress=shown)
            return self._release.unheard(ctx, progress, request)

    # -- spec.supersedes -------------------------------------------------------------------------

    def _let_go(self, writer: PassWriter, letting: Letting, previous: plan.Previous) -> plan.Previous:
        """Before anything: what this StageSet handed over leaves its inventories (so it is neither
        listed nor pruned), its record drops the entries that no longer hold, and the first pass that
        lets objects go says so (``HandedOver``)."""
        if letting.void:
            writer.handed_over(letting.record.without(letting.void).encode())
        gone = letting.gone
        if not gone:
            return previous
        listed = sum(1 for inv in previous.inventories.values() for entry in inv.entries
                     if entry_id(entry) in gone.get(inv.target_id, frozenset()))
        self._supersedes.handed(writer.obj, letting, listed=listed)
        return replace(previous, inventories=released(previous.inventories, gone))

    def _handed(self, ctx: PassContext, rendered: dict[str, Rendered]) -> dict[str, Rendered]:
        """The stages without the objects this StageSet handed over on its target: never written again."""
        gone = ctx.letting.gone.get(ctx.target.id)
        if not gone:
            return rendered
        namespace = ctx.ref[0]
        kept: dict[str, Rendered] = {}
        for name, item in rendered.items():
            if not item.ids & gone:
                kept[name] = item
                continue
            objects = [obj for obj in item.objects if identify(obj, namespace, item.target) not in gone]
            kept[name] = replace(item, objects=objects, ids=item.ids - gone)
        return kept

    def _carried(self, ctx: PassContext, progress: Progress, rendered: dict[str, Rendered]) -> Progress:
        """Each stage starts with its predecessors' action ledger for this revision on this target
        when it has none of its own for it (the ledger travels with the hand-over)."""
        if not ctx.taking.ledgers:
            return progress
        for name, item in rendered.items():
            theirs = ctx.taking.ledgers.get(name)
            if not theirs:
                continue
            outcome = progress.outcomes[name]
            ledger = succession.carried(outcome.actions, theirs,
                                        key=(item.revision, item.action_inputs, item.target.id))
            if ledger is not outcome.actions:
                progress = progress.with_outcome(replace(outcome, actions=ledger))
        return progress

    def _prune(self, ctx: PassContext, progress: Progress) -> tuple[list[Stale], dict[str, int]]:
        """Delete what no stage renders any more, as each inventory's identity; returns what could
        not be deleted (still tracked) and how many objects of each stage were."""
        namespace, name = ctx.ref
        stale = candidates(old=progress.previous.inventories, new=progress.fresh, stageset=ctx.stageset)
        clients = inventory_clients(clients=self._clients, identities=self._identities, namespace=namespace,
                                    target=ctx.target)
        result = prune_stale(stale=stale, client_for=clients, applier=ctx.target.applier,
                             owner=Owner(namespace, name))
        self._changes.pruned(ctx.writer.obj, result, ctx.redactor)
        stage_of = {item.id: item.stage for item in stale}
        deleted: dict[str, int] = {}
        for change in result.changes:
            if change.action in WRITES and (stage := stage_of.get(change.id)) is not None:
                deleted[stage] = deleted.get(stage, 0) + 1
        # prune: false stages are never deleted from; what they no longer render (a targetNamespace
        # change) is released there, not left labelled.
        released, unreleased = release_stale(old=progress.previous.inventories, new=progress.fresh,
                                             stages=unpruned_stages(ctx.stageset), client_for=clients,
                                             applier=ctx.target.applier, owner=Owner(namespace, name))
        for oid in released:
            log.info("released %s: its prune: false stage no longer renders it", oid.describe())
        return [*result.kept, *unreleased], deleted

    def _conclude(self, ctx: PassContext, progress: Progress, steer: Steering, verdict: plan.Verdict,
                  rendered: dict[str, Rendered], *, prune: PrunePermission, rolled: bool,
                  patient: bool = False) -> Result:
        """The one conclusion of a pass that got past its stages' rendering: prune what ``prune``
        allows (a rollback pruned as it restored), the status it ends with, one write.  ``rolled``:
        the pass rolled back or resumed a rollback, and the record is the one the rollback wrote."""
        stale = pruning.prunes_stale(prune.scope)
        # A new StageSet whose source is still being fetched: its first word waits (holding.py).
        if not rolled and not stale and verdict.ready is False and (held := ctx.writer.held(
                verdict.reason, changed_elsewhere=bool(progress.fresh), patient=patient)) is not None:
            return held
        kept, pruned = self._prune(ctx, progress) if stale else ([], {})
        status = self._release.concluded(
            ctx, progress, concluded(ctx.writer.status, progress, verdict, prune=prune, kept=kept), steer,
            rendered, prune=prune, rolled=ctx.writer.status.rollback if rolled else None, rolling=rolled)
        # The releases each stage applied: in this same (concluding) write, never one of their own.
        status = status.model_copy(update={"history": history.recorded(
            ctx.writer.status.history, order=progress.order, outcomes=progress.outcomes,
            applied=progress.fresh, changes=progress.written, pruned=pruned,
            generation=ctx.stageset.metadata.get("generation"), now=format_time(self._clock()),
            tried={name: rendered[name].revision if name in rendered else None for name in progress.order})})
        # Drift left as found (driftDetection.mode Warn): status.drifted, the Drifted condition, and
        # one DriftDetected event for what is new; in Correct mode both are cleared.
        drift = drift_report.reported(status, written=progress.written, stages=progress.order,
                                      mode=ctx.stageset.spec.drift_mode, generation=ctx.writer.generation,
                                      now=format_time(self._clock()))
        status = drift.status
        self._changes.drift_found(ctx.writer.obj, drift.new, count=drift.count,
                                  warn=ctx.stageset.spec.drift_mode is DriftMode.WARN, redactor=ctx.redactor)
        self._release.told(ctx, steer)
        requeue = verdict.requeue_after
        unlisted = progress.unlisted
        if prune.scope is Scope.MOVED:
            # Every stage is Ready on the new target: now the previous one is cleaned up.
            cleaned = self._moves.clean(ctx, progress)
            status = status.model_copy(update={"previous_targets": cleaned.moving})
            unlisted = cleaned.unlisted
            if cleaned.requeue_after is not None:
                requeue = cleaned.requeue_after if requeue is None else min(requeue, cleaned.requeue_after)
        if stale:
            ctx.writer.record(records.settled(status.inventory, previous=status.previous_targets,
                                              unlisted=unlisted))
            self._changes.succeeded(ctx.writer.obj, was_ready=progress.previous.ready,
                                    stages=len(progress.order), pruned=sum(pruned.values()),
                                    revision=verdict.revision or "", redactor=ctx.redactor)
        unready = {n for n, o in progress.outcomes.items() if o.phase is not StagePhase.READY}
        self._supersedes.told(ctx.writer.obj, ctx.taking.handover, failed=unready)
        note = succession.note(ctx.letting.kept)
        message = f"{verdict.message}; {note}" if note and verdict.message else (note or verdict.message)
        ctx.writer.conclude(ready=verdict.ready, reason=verdict.reason, message=message,
                            status=status, stalled=verdict.reason is Reason.ROLLED_BACK)
        return Result(requeue_after=requeue)
