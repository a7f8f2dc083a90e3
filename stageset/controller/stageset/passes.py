"""One pass over a prepared StageSet, as named steps whose results are values.

render every stage -> steer (:mod:`~stageset.controller.stageset.release`: finish a rollback
left mid-way, freeze, re-render stages pinned to a recorded revision, hold stages back) -> refuse
two stages rendering one object -> recover a lost inventory and grow the record -> apply stages as
the graph allows (each returns an immutable outcome; a stage's promotion gate decides whether its
dependents start) -> the verdict (:func:`plan.verdict`, then :func:`steering.verdict`) -> roll back
when a failed release says so -> prune when the verdict says so -> the status the pass ends with
(:func:`progress.concluded`, then the fields steering owns) -> one conclusion.  Every write goes
through the pass's :class:`~stageset.controller.stageset.writer.PassWriter`; the pass's state is one
:class:`~stageset.controller.stageset.progress.Progress` value, replaced on the reconcile's
thread as stages tell and finish.

Identity, per request (the rules: :mod:`stageset.controller.identity`): a stage's source,
``substituteFrom`` objects and its objects' dry-run, apply, readiness reads and prune as the
stage's identity (derived once, carried by :class:`Rendered`); status, the record and events
as the controller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import networkx as nx

from stageset.api import StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.engine import StageResult
from stageset.apply.errors import StageError
from stageset.apply.inventory import Stale, duplicates, stage_inventory
from stageset.apply.prune import Owner, candidates, prune
from stageset.controller import logs
from stageset.controller.identity import IdentityPolicy
from stageset.controller.redact import Redactor
from stageset.controller.rendercache import StageDecryption
from stageset.controller.result import Result
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset import plan, records, steering
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.decryption import for_pass
from stageset.controller.stageset.progress import Progress, concluded, shown
from stageset.controller.stageset.reads import AccountCheck
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.release import Release, Request
from stageset.controller.stageset.rendering import Rendered, Renderer
from stageset.controller.stageset.scheduler import StageScheduler, Tell
from stageset.controller.stageset.stage import StageRun, StageWork
from stageset.controller.stageset.steering import Steering
from stageset.controller.stageset.targets import Target, inventory_clients
from stageset.controller.stageset.writer import PassWriter
from stageset.kube.client import ApiError, ClientPool, UnreachableError

log = logging.getLogger(__name__)

Done = tuple[plan.StageOutcome, StageResult | None]


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


@dataclass
class _Pass:
    """One pass: what it works on, and its :class:`Progress` (a value, replaced as it goes)."""

    writer: PassWriter
    stageset: StageSet
    target: Target
    redactor: Redactor
    retry: float
    progress: Progress
    partial: str | None = None
    """Status had lost the inventory and the cluster could not be searched completely: why."""
    steering: Steering = field(default_factory=Steering)
    decryption: StageDecryption | None = None
    """``spec.decryption`` for this pass (the key Secret read at most once, as the StageSet)."""


class PassRunner:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, renderer: Renderer,
                 records: Records, stages: StageWork, changes: Changes, settings: ControllerSettings,
                 accounts: AccountCheck, release: Release):
        self._clients = clients
        self._accounts = accounts
        self._identities = identities
        self._renderer = renderer
        self._records = records
        self._stages = stages
        self._changes = changes
        self._settings = settings
        self._release = release

    def run(self, writer: PassWriter, stageset: StageSet, graph: nx.DiGraph, target: Target, *,
            redactor: Redactor, retry: float) -> Result:
        previous = plan.Previous.from_status(writer.status, generation=writer.generation)
        # spec.decryption: the key Secret is read as the StageSet's ServiceAccount, at most once a pass.
        decryption = for_pass(stageset, policy=self._identities, clients=self._clients,
                              accounts=self._accounts, redactor=redactor)
        one = _Pass(writer=writer, stageset=stageset, target=target, redactor=redactor, retry=retry,
                    progress=Progress.start(stageset, previous), decryption=decryption)
        try:
            return self._run(one, graph)
        except (UnreachableError, ApiError) as error:
            if not target.remote:
                raise
            # A tenant's remote cluster that fails: a short condition (nothing the remote sent),
            # the inventory kept, and the key's backoff — never a traceback per retry.
            writer.conclude(ready=False, reason=Reason.CLUSTER_UNREACHABLE,
                            message=unreachable(target, error), status=shown(writer.status, one.progress))
            return Result(backoff=True)

    def _run(self, one: _Pass, graph: nx.DiGraph) -> Result:
        rendered = self._render_all(one)
        current = {n: r.revision for n, r in rendered.items()}
        interval = one.stageset.spec.requeue_when_ready(self._settings.default_interval)
        one.steering, rendered = self._release.steer(one, rendered)
        if one.steering.resume and one.steering.rollback is not None:
            return self._conclude_steered(one, rendered, self._release.resume(
                one, one.steering.rollback, interval=interval), rolled=True)
        if one.steering.frozen:
            return self._conclude_steered(one, rendered, steering.frozen_verdict(
                one.steering, was_ready=one.progress.previous.ready, interval=interval), rolled=False)
        clash = plan.clash_message(duplicates({n: r.ids for n, r in rendered.items()}))
        if clash:
            one.writer.conclude(ready=False, reason=Reason.INVALID_SPEC, message=clash, stalled=True,
                                status=shown(one.writer.status, one.progress))
            return Result()
        try:
            self._recover(one, rendered)
        except StageError as error:  # the finalizer could not be added: the object changed
            failure = plan.before_stages(error.reason, retry=one.retry)
            one.writer.conclude(ready=False, reason=error.reason, message=error.message,
                                stalled=failure.stalled, status=shown(one.writer.status, one.progress))
            return Result(requeue_after=failure.requeue_after)
        previous, stages = one.progress.previous, len(one.stageset.spec.stages)
        revisions = {n: r.revision for n, r in rendered.items()}
        one.writer.quiet = plan.quiet(previous, revisions, stages=stages)
        rechecks = plan.rechecks(previous, revisions)
        one.progress = one.progress.rechecked(rechecks)
        if plan.announce(previous, is_quiet=one.writer.quiet,
                         only_rechecks=rechecks == set(rendered) and len(rendered) == stages):
            one.writer.announce(one.progress, "applying stages")
        self._apply_all(one, graph, rendered, rechecks=rechecks)
        outcomes = [one.progress.outcomes[n] for n in one.progress.order]
        base = plan.verdict(outcomes, interval=interval, retry=one.retry,
                            readiness_requeue=self._settings.readiness_requeue,
                            watched_requeue=self._settings.watched_requeue)
        verdict = steering.verdict(base, outcomes, steering=one.steering, now=self._release.now(),
                                   interval=interval)
        if one.partial:
            verdict = plan.without_prune(verdict, one.partial, retry=one.retry)
        failed = self._release.should_roll_back(one, rendered, one.steering) if not verdict.ready else None
        if failed is not None:
            return self._conclude_steered(one, rendered, self._release.roll_back(
                one, graph, *failed, current=current, interval=interval), rolled=True)
        return self._conclude(one, verdict, rendered)

    def _render_all(self, one: _Pass) -> dict[str, Rendered]:
        rendered: dict[str, Rendered] = {}
        namespace = str(one.stageset.metadata["namespace"])
        for stage in one.stageset.spec.stages:
            kind = "tenant" if self._identities.stage_account(one.stageset, stage) else "controller"
            with logs.bind(stage=stage.name, identity=kind):
                try:
                    identity = self._identities.for_stage(one.stageset, stage)
                    rendered[stage.name] = self._renderer.render(
                        stage=stage, identity=identity, namespace=namespace, target=one.target,
                        redactor=one.redactor, decryption=one.decryption,
                        salt=str(one.stageset.metadata.get("uid", "")))
                except StageError as error:
                    log_denial(error)
                    failed = one.progress.outcomes[stage.name].failed(error.reason, error.message)
                    one.progress = one.progress.with_outcome(failed)
        return rendered

    def _recover(self, one: _Pass, rendered: dict[str, Rendered]) -> None:
        """Before anything is written or pruned: an inventory status lost is rebuilt from the
        cluster, and the durable record covers whatever is about to be applied."""
        wanted = records.wanted(one.stageset, rendered)
        found = self._records.recover(one.writer.obj, inventories=one.progress.previous.inventories,
                                      wanted=wanted, target=one.target)
        one.writer.record(found.record)
        one.partial = found.problem
        one.progress = one.progress.recovered(found.inventories)
        one.writer.record(records.grown(one.writer.obj, wanted), before_apply=True)

    def _apply_all(self, one: _Pass, graph: nx.DiGraph, rendered: dict[str, Rendered], *,
                   rechecks: set[str]) -> None:
        previous = one.progress.previous.inventories
        # A routine pass over a Ready StageSet may trust rights its identities showed recently; one
        # that was asked for, or follows a change or a failure, checks them (stageset/apply/rights.py).
        recheck_rights = one.writer.requested or not one.progress.previous.ready
        starting: dict[str, plan.StageOutcome] = {}
        request: Request | None = self._release.request(one)

        def started(name: str) -> None:
            if name not in rechecks:
                one.progress = one.progress.applying(name)
            starting[name] = one.progress.outcomes[name]

        def work(name: str, tell: Tell) -> Done:
            # On a pool thread: reads only what was decided before it was submitted.
            return self._stages.run(StageRun(
                stageset=one.stageset, rendered=rendered[name], before=starting[name],
                previous=previous.get(name), recheck=name in rechecks, waiting=tell, redactor=one.redactor,
                recheck_rights=recheck_rights))

        def heard(name: str, outcome: plan.StageOutcome) -> None:
            was = one.progress.outcomes[name]
            one.progress = one.progress.with_outcome(outcome)
            one.writer.waiting(was, one.progress)

        def finished(name: str, done: Done) -> bool:
            outcome, result = done
            inventory = None if result is None else stage_inventory(
                name, rendered[name].account, (o.entry() for o in result.objects))
            outcome, released = self._release.gate(one, outcome, request)
            one.progress = one.progress.applied(outcome, inventory)
            if result is not None:
                self._changes.applied(one.writer.obj, name, result, one.redactor)
            return released

        def progress(done: int) -> None:
            del done
            one.writer.show(one.progress)

        name = str(one.stageset.metadata["name"])
        scheduler: StageScheduler[Done] = StageScheduler(graph=graph, name=name,
                                                         parallelism=self._settings.stage_parallelism)
        scheduler.run(skip=[n for n in one.progress.order if n not in rendered], work=work, started=started,
                      finished=finished, heard=heard, progress=progress)
        self._release.unheard(one, request)

    def _prune(self, one: _Pass) -> tuple[list[Stale], int]:
        """Delete what no stage renders any more, as each inventory's identity; returns what could
        not be deleted (still tracked) and how many objects were."""
        namespace, name = str(one.stageset.metadata["namespace"]), str(one.stageset.metadata["name"])
        result = prune(stale=candidates(old=one.progress.previous.inventories, new=one.progress.fresh,
                                        stageset=one.stageset),
                       client_for=inventory_clients(clients=self._clients, identities=self._identities,
                                                    namespace=namespace, target=one.target),
                       applier=one.target.applier, owner=Owner(namespace, name))
        return result.kept, self._changes.pruned(one.writer.obj, result, one.redactor)

    def _conclude(self, one: _Pass, verdict: plan.Verdict, rendered: dict[str, Rendered]) -> Result:
        kept, pruned = self._prune(one) if verdict.prune else ([], 0)
        status = self._release.concluded(one, concluded(one.writer.status, one.progress, verdict, kept=kept),
                                         one.steering, verdict, rendered)
        self._release.told(one, one.steering)
        if verdict.prune:
            one.writer.record(records.settled(status.inventory))
            self._changes.succeeded(one.writer.obj, was_ready=one.progress.previous.ready,
                                    stages=len(one.progress.order), pruned=pruned,
                                    revision=verdict.revision or "", redactor=one.redactor)
        one.writer.conclude(ready=verdict.ready, reason=verdict.reason, message=verdict.message,
                            status=status, stalled=verdict.reason is Reason.ROLLED_BACK)
        return Result(requeue_after=verdict.requeue_after)

    def _conclude_steered(self, one: _Pass, rendered: dict[str, Rendered], verdict: plan.Verdict, *,
                          rolled: bool) -> Result:
        """A pass that rolled back (``rolled``: the record is the one the rollback wrote), resumed a
        rollback, or applied nothing (a freeze): no prune."""
        status = self._release.concluded(one, concluded(one.writer.status, one.progress, verdict),
                                         one.steering, verdict, rendered,
                                         rolled=one.writer.status.rollback if rolled else None,
                                         rolling=rolled)
        self._release.told(one, one.steering)
        one.writer.conclude(ready=verdict.ready, reason=verdict.reason, message=verdict.message,
                            status=status, stalled=verdict.reason is Reason.ROLLED_BACK)
        return Result(requeue_after=verdict.requeue_after)
