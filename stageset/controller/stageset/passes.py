"""One pass over a prepared StageSet, as named steps whose results are values.

render every stage -> refuse two stages rendering one object -> recover a lost inventory and
grow the record -> apply stages as the graph allows (each returns an immutable outcome) ->
the verdict (:func:`plan.verdict`) -> prune when it says so -> the status the pass ends with
(:func:`progress.concluded`) -> one conclusion.  Every write goes through the pass's
:class:`~stageset.controller.stageset.writer.PassWriter`; the pass's state is one
:class:`~stageset.controller.stageset.progress.Progress` value, replaced on the reconcile's
thread as stages tell and finish.

Identity, per request (the rules: :mod:`stageset.controller.identity`): a stage's source,
``substituteFrom`` objects and its objects' dry-run, apply, readiness reads and prune as the
stage's identity (derived once, carried by :class:`Rendered`); status, the record and events
as the controller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import networkx as nx

from stageset.api import StageSet
from stageset.api.vocabulary import Reason, StagePhase
from stageset.apply.engine import StageResult
from stageset.apply.errors import StageError
from stageset.apply.inventory import Stale, duplicates, stage_inventory
from stageset.apply.prune import Owner, candidates, prune
from stageset.controller import logs
from stageset.controller.identity import IdentityPolicy
from stageset.controller.redact import Redactor
from stageset.controller.result import Result
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset import plan, records
from stageset.controller.stageset.changes import Changes
from stageset.controller.stageset.progress import Progress, concluded, shown
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.rendering import Rendered, Renderer
from stageset.controller.stageset.scheduler import StageScheduler, Tell
from stageset.controller.stageset.stage import StageRun, StageWork
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


class PassRunner:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, renderer: Renderer,
                 records: Records, stages: StageWork, changes: Changes, settings: ControllerSettings):
        self._clients = clients
        self._identities = identities
        self._renderer = renderer
        self._records = records
        self._stages = stages
        self._changes = changes
        self._settings = settings

    def run(self, writer: PassWriter, stageset: StageSet, graph: nx.DiGraph, target: Target, *,
            redactor: Redactor, retry: float) -> Result:
        previous = plan.Previous.from_status(writer.status, generation=writer.generation)
        one = _Pass(writer=writer, stageset=stageset, target=target, redactor=redactor, retry=retry,
                    progress=Progress.start(stageset, previous))
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
        clash = plan.clash_message(duplicates({n: r.ids for n, r in rendered.items()}))
        if clash:
            one.writer.conclude(ready=False, reason=Reason.INVALID_SPEC, message=clash, stalled=True,
                                status=shown(one.writer.status, one.progress))
            return Result()
        self._recover(one, rendered)
        previous, stages = one.progress.previous, len(one.stageset.spec.stages)
        revisions = {n: r.revision for n, r in rendered.items()}
        one.writer.quiet = plan.quiet(previous, revisions, stages=stages)
        rechecks = plan.rechecks(previous, revisions)
        one.progress = one.progress.rechecked(rechecks)
        if plan.announce(previous, is_quiet=one.writer.quiet,
                         only_rechecks=rechecks == set(rendered) and len(rendered) == stages):
            one.writer.announce(one.progress, "applying stages")
        self._apply_all(one, graph, rendered, rechecks=rechecks)
        verdict = plan.verdict([one.progress.outcomes[n] for n in one.progress.order],
                               interval=one.stageset.spec.requeue_when_ready(self._settings.default_interval),
                               retry=one.retry,
                               readiness_requeue=self._settings.readiness_requeue)
        if one.partial:
            verdict = plan.without_prune(verdict, one.partial, retry=one.retry)
        return self._conclude(one, verdict)

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
                        redactor=one.redactor)
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
        one.writer.record(records.grown(one.writer.obj, wanted))

    def _apply_all(self, one: _Pass, graph: nx.DiGraph, rendered: dict[str, Rendered], *,
                   rechecks: set[str]) -> None:
        previous = one.progress.previous.inventories
        starting: dict[str, plan.StageOutcome] = {}

        def started(name: str) -> None:
            if name not in rechecks:
                one.progress = one.progress.applying(name)
            starting[name] = one.progress.outcomes[name]

        def work(name: str, tell: Tell) -> Done:
            # On a pool thread: reads only what was decided before it was submitted.
            return self._stages.run(StageRun(
                stageset=one.stageset, rendered=rendered[name], before=starting[name],
                previous=previous.get(name), recheck=name in rechecks, waiting=tell, redactor=one.redactor))

        def heard(name: str, outcome: plan.StageOutcome) -> None:
            was = one.progress.outcomes[name]
            one.progress = one.progress.with_outcome(outcome)
            one.writer.waiting(was, one.progress)

        def finished(name: str, done: Done) -> bool:
            outcome, result = done
            inventory = None if result is None else stage_inventory(
                name, rendered[name].account, (o.entry() for o in result.objects))
            one.progress = one.progress.applied(outcome, inventory)
            if result is not None:
                self._changes.applied(one.writer.obj, name, result, one.redactor)
            return outcome.phase is StagePhase.READY

        def progress(done: int) -> None:
            del done
            one.writer.show(one.progress)

        name = str(one.stageset.metadata["name"])
        scheduler: StageScheduler[Done] = StageScheduler(graph=graph, name=name,
                                                         parallelism=self._settings.stage_parallelism)
        scheduler.run(skip=[n for n in one.progress.order if n not in rendered], work=work, started=started,
                      finished=finished, heard=heard, progress=progress)

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

    def _conclude(self, one: _Pass, verdict: plan.Verdict) -> Result:
        kept, pruned = self._prune(one) if verdict.prune else ([], 0)
        status = concluded(one.writer.status, one.progress, verdict, kept=kept)
        if verdict.prune:
            one.writer.record(records.settled(status.inventory))
            self._changes.succeeded(one.writer.obj, was_ready=one.progress.previous.ready,
                                    stages=len(one.progress.order), pruned=pruned,
                                    revision=verdict.revision or "", redactor=one.redactor)
        one.writer.conclude(ready=verdict.ready, reason=verdict.reason, message=verdict.message,
                            status=status)
        return Result(requeue_after=verdict.requeue_after)
