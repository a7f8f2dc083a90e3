"""Tearing a deleted StageSet down: every stage's objects, dependents first, then let it go.

Identity: each stage's objects are deleted as the identity that applied them (recorded in
its inventory; see :mod:`stageset.controller.identity`), on the StageSet's target cluster
(the kubeConfig Secret read as the StageSet's identity).  Status, the finalizer and events
are written as the controller.

A stage with ``prune: false`` is not deleted: its objects are released instead — our owner
labels removed, so a later StageSet can adopt them in place — and an ``Orphaned`` event names what
was left behind (:mod:`stageset.apply.orphan`).  ``spec.deletionPolicy: Orphan`` releases every
stage so.

A stage's objects must be gone before the next stage's are deleted.  That a teardown deletes at
all is asked once of the one prune decision (:func:`~stageset.controller.stageset.pruning.permission`,
told the deletion policy: ``Scope.ALL`` for ``Delete``); refused (``Orphan``), every stage's objects
are released, never deleted.

Offboarding — the StageSet's own namespace is terminating (deleted with the StageSet in it, as the
namespace watch tells: :mod:`stageset.controller.terminating`): the prune decision then reaches
only outside that namespace (``Reach.OUTSIDE_OWN_NAMESPACE``).  Every object inside it, on this
cluster, is left to the namespace's own deletion — dropped from the inventory, no request made
for it — since the tenant's RoleBindings there are being deleted too: a delete as the tenant
would race the namespace controller, could be denied and would then only wait.  Objects elsewhere
(other namespaces, cluster-scoped, a remote cluster's) are deleted or released as before, as
before by the identity that applied them; if that identity is denied there (its rights came from
a binding in the terminating namespace), that counts toward the wait as any denial does.

Teardown always ends: whatever keeps objects from going — a finalizer that never clears, a
ServiceAccount that lost its rights, a remote cluster that refuses connections, fails TLS,
times out or answers 5xx, a kubeConfig Secret that is gone — counts toward
``--max-teardown-wait`` from the StageSet's ``deletionTimestamp``.  Meanwhile a cluster that
fails is retried with a growing delay (:func:`~stageset.controller.stageset.plan.teardown_retry`).
A StageSet deleted while a move is in flight is torn down on every cluster: its current target
first, then what the move left on previous ones (``status.previousTargets``; each reached again
through the kubeConfig Secret its inventory names, :meth:`Targets.previous
<stageset.controller.targets.clusters.Targets.previous>`), within the same wait.

Objects this StageSet handed over to a StageSet whose ``spec.supersedes`` names it (the entries of
its hand-over record in force, :mod:`~stageset.controller.stageset.supersedes`) are not its own any
more: they are left out of the teardown entirely — neither deleted nor released, even while they
still carry this StageSet's labels (the successor relabels them) — whatever ``deletionPolicy`` says.
What only this StageSet rendered follows its ``deletionPolicy`` as always.

Past the wait the finalizer is removed anyway, with a ``TeardownForced`` event that counts what
was left behind per kind and namespace (names the tenant's own manifests gave, nothing else);
those objects keep their owner labels, so they can be found (``-l stages.metio.wtf/name=…``)
and adopted or deleted later.
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import urllib3

from stageset.api import InventoryEntry, PreviousTargets, StageInventory, StageSet, format_time
from stageset.api.stageset import DeletionPolicy
from stageset.api.vocabulary import EventReason
from stageset.apply.errors import StageError
from stageset.apply.handover import released as handed_away
from stageset.apply.inventory import entry_id, left_behind, ordered, split_by_target, stage_inventory
from stageset.apply.orphan import release_stage
from stageset.apply.prune import Owner, TeardownProgress, teardown_stage, unpruned_stages
from stageset.apply.record import parse
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder, normal, warning
from stageset.controller.identity import IdentityPolicy
from stageset.controller.result import Result
from stageset.controller.stageset import pruning
from stageset.controller.stageset.plan import stage_nodes, teardown_expired, teardown_order, teardown_retry
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.supersedes import Supersedes
from stageset.controller.stageset.writer import PassWriter
from stageset.controller.targets.clusters import Target, Targets
from stageset.kube.client import ApiError, ClientPool, KubeClient, UnreachableError, how_failed
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

AGAIN = 1.0  # seconds between looks while objects are going

# What reaching a cluster can raise besides our own errors: broken connections, bodies that
# are not JSON.  All of it is a cluster failing, which counts toward the wait.
CLUSTER_ERRORS = (UnreachableError, ApiError, urllib3.exceptions.HTTPError, OSError, ValueError)


@dataclass(frozen=True)
class Cleared:
    """What :meth:`Teardown.clear` left of a cluster's stages (in teardown order), how many objects it
    deleted and released, and why the first stage not gone stopped (when a cluster failed)."""

    remaining: list[StageInventory]
    deleted: int
    released: int
    failure: str | None


@dataclass
class _Plan:
    """One teardown pass's plan (:meth:`Teardown._plan`); ``failure`` is the last one met so far."""

    owner: Owner
    stageset: StageSet | None
    target: Target | None
    inventories: dict[str, StageInventory]
    """On the current target, within reach; what is left as the pass goes."""
    moving: PreviousTargets | None
    unpruned: frozenset[str]
    leaving: DeletionPolicy
    """How objects are let go of: ``Delete`` only under the one permission's ``Scope.ALL``."""
    now: datetime.datetime
    deleted_at: str | None
    expired: bool
    failure: str | None


@dataclass(frozen=True)
class Attempt:
    """One stage's teardown attempt: what is left, and why the cluster failed (if it did)."""

    remaining: list[StageInventory]
    failure: str | None = None


class Teardown:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, targets: Targets,
                 events: EventRecorder, clock: Clock, max_wait: float, records: Records,
                 terminating: Callable[[str], bool], supersedes: Supersedes):
        self._clients = clients
        self._supersedes = supersedes
        self._terminating = terminating
        self._records = records
        self._identities = identities
        self._targets = targets
        self._events = events
        self._clock = clock
        self._max_wait = max_wait

    def _target(self, stageset: StageSet | None) -> tuple[Target | None, str | None]:
        if stageset is None:
            return self._targets.local, None
        try:
            if stageset.spec.target_ref is not None:
                return self._targets.for_target_ref(stageset), None
            identity = self._identities.for_stageset(stageset, what="reading spec.kubeConfig")
            return self._targets.resolve(self._clients.client(identity), stageset), None
        except StageError as error:
            return None, error.message
        except CLUSTER_ERRORS as error:
            return None, f"reading spec.kubeConfig failed: {how_failed(error)}"

    def attempt(self, inventory: StageInventory, *, target: Target | None, namespace: str,
               owner: Owner, release: Callable[[KubeClient, Target], list[InventoryEntry]] | None = None
               ) -> tuple[TeardownProgress, str | None]:
        """Try to delete one stage's objects on ``target`` as the identity its inventory records (or
        ``release`` them: ``prune: false``); never raises for a failing cluster.  A move's cleanup of
        the previous cluster uses it too (:mod:`~stageset.controller.stageset.moves`)."""
        identity = self._identities.for_inventory_of(inventory, namespace)
        if identity is None:
            return teardown_stage(inventory=inventory, client=None, applier=None, owner=owner), \
                "its objects were applied as the controller, which multi-tenant mode no longer allows"
        if target is None:
            return teardown_stage(inventory=inventory, client=None, applier=None, owner=owner), None
        client = self._clients.client(identity, target.cluster)
        try:
            if release is not None:
                left = release(client, target)
                progress = TeardownProgress(remaining=left, failed=len(left))
            else:
                progress = teardown_stage(inventory=inventory, client=client, owner=owner,
                                          applier=target.applier)
        except CLUSTER_ERRORS as error:
            where = target.where if target.remote else "the cluster"
            return TeardownProgress(remaining=list(inventory.entries), failed=len(inventory.entries)), \
                f"{where} cannot be used: {how_failed(error)}"
        if progress.failed:
            return progress, (f"{progress.failed} object(s) could not be read or deleted as "
                              f"{identity.describe()}")
        return progress, None

    def run(self, writer: PassWriter, stageset: StageSet | None) -> Result:
        """One teardown pass: the plan (:meth:`_plan`), the current target stage by stage
        (:meth:`_here`), then what a move left elsewhere (:meth:`_elsewhere`), then let go
        (:meth:`_finish`) — or look again while objects are going."""
        plan = self._plan(writer, stageset)
        if isinstance(plan, Result):
            return plan
        waiting = self._here(writer, plan)
        if waiting is not None:
            return waiting
        moving = plan.moving
        if moving is not None and stageset is not None and not plan.inventories:
            # Deleted mid-move: what is still on a previous cluster goes too (as a move would clean
            # it up), by the same rules and the same wait.
            moving, failed = self._elsewhere(writer, stageset, moving, plan)
            plan.failure = failed or plan.failure
            if moving is not None and not plan.expired:
                return self._again(failed, now=plan.now, deleted_at=plan.deleted_at)
        return self._finish(writer, plan, moving)

    def _plan(self, writer: PassWriter, stageset: StageSet | None) -> _Plan | Result:
        """What this teardown pass works on: the target, the inventories there (recovered when status
        lost them; within reach) and on previous clusters, and what the one permission lets go of
        how — or a :class:`Result` to wait while the inventory cannot be recovered."""
        meta = writer.obj["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        # What it handed over (spec.supersedes) is the successor's: never torn down here.
        gone = self._supersedes.letting(writer.obj).gone
        inventories = handed_away({inv.name: inv for inv in writer.status.inventory}, gone)
        now = self._clock()
        deleted_at = meta.get("deletionTimestamp")
        expired = teardown_expired(now=now, deleted_at=deleted_at, max_wait=self._max_wait)
        target, failure = self._target(stageset)
        if target is not None:
            inventories, problem = self._recover(writer, inventories, target)
            inventories = handed_away(inventories, gone)
            failure = problem or failure
            if problem and not expired:
                log.warning("teardown of StageSet %s/%s waits: %s", namespace, name, problem)
                return Result(requeue_after=teardown_retry(now=now, deleted_at=deleted_at,
                                                           max_wait=self._max_wait))
        inventories, moving = _here_and_elsewhere(writer, inventories, target, now=format_time(now))
        policy = stageset.spec.deletion_policy if stageset else DeletionPolicy.DELETE
        allowed = pruning.permission(pruning.TearingDown(
            policy=policy, namespace_terminating=self._terminating(namespace)))
        inventories = _within_reach(writer, inventories, reach=allowed.reach, target=target)
        unpruned = frozenset(unpruned_stages(stageset)) if stageset else frozenset()
        # Deleted only under the one decision's Scope.ALL; refused (Orphan), every stage is released.
        leaving = DeletionPolicy.DELETE if allowed.scope is pruning.Scope.ALL else DeletionPolicy.ORPHAN
        return _Plan(owner=Owner(namespace, name), stageset=stageset, target=target, inventories=inventories,
                     moving=moving, unpruned=unpruned, leaving=leaving, now=now, deleted_at=deleted_at,
                     expired=expired, failure=failure)

    def _here(self, writer: PassWriter, plan: _Plan) -> Result | None:
        """The current target, one stage at a time, dependents first, the inventory written after
        each; ``None`` when done (every stage gone, or the wait is over), else when to look again."""
        inventories = plan.inventories
        order = teardown_order(stage_nodes(plan.stageset) if plan.stageset else None, inventories)
        log.debug("tearing down stages in order: %s", ", ".join(order) or "none left")
        released = pruning.released_stages(inventories, unpruned=plan.unpruned, policy=plan.leaving)
        for stage in order:
            remaining = self._stage(writer, plan, stage, release=stage in released)
            if remaining is not None:
                inventories[stage] = remaining
            else:
                del inventories[stage]
            writer.inventory(ordered(inventories))
            if remaining is None:
                continue
            if plan.failure:
                log.warning("teardown of StageSet %s/%s, stage %s: %s", plan.owner.namespace, plan.owner.name,
                            stage, plan.failure)
            if not plan.expired:
                return self._again(plan.failure, now=plan.now, deleted_at=plan.deleted_at)
            break
        return None

    def _stage(self, writer: PassWriter, plan: _Plan, stage: str, *, release: bool) -> StageInventory | None:
        """One stage on the current target: deleted, or released (``prune: false``,
        ``deletionPolicy: Orphan``: an ``Orphaned`` event says what); what is left of it."""
        inv = plan.inventories[stage]
        releasing = None if not release else \
            functools.partial(self._leave_behind, writer.obj, stage, inv, owner=plan.owner,
                              why="has prune: false" if stage in plan.unpruned
                              else "(deletionPolicy: Orphan)")
        progress, failed = self.attempt(inv, target=plan.target, namespace=plan.owner.namespace,
                                       owner=plan.owner, release=releasing)
        plan.failure = failed or plan.failure
        still_there = {entry.id for entry in progress.remaining}
        for entry in inv.entries:
            if entry.id not in still_there:
                log.info("teardown of stage %s: %s %s", stage, entry_id(entry).describe(),
                         "released" if release else "deleted")
        if not progress.remaining:
            return None
        return stage_inventory(inv.name, inv.service_account_name, progress.remaining, target=inv.target)

    def _elsewhere(self, writer: PassWriter, stageset: StageSet, moving: PreviousTargets, plan: _Plan
                   ) -> tuple[PreviousTargets | None, str | None]:
        """Tear down what a move in flight left on previous clusters (each reached again through the
        kubeConfig Secret its inventory names, read as the StageSet), by the same rules; returns what
        is left there, and why the last cluster failed."""
        remaining: list[StageInventory] = []
        failure: str | None = None
        for invs in by_target(moving.inventory).values():
            try:
                identity = self._identities.for_stageset(stageset, what="reading spec.kubeConfig")
                target = self._targets.previous(self._clients.client(identity), stageset=stageset,
                                                applied=invs[0].target)
            except StageError as error:
                failure, remaining = error.message, [*remaining, *invs]
                continue
            except CLUSTER_ERRORS as error:
                failure = f"a previous cluster cannot be used: {how_failed(error)}"
                remaining = [*remaining, *invs]
                continue
            released = pruning.released_stages([inv.name for inv in invs], unpruned=plan.unpruned,
                                               policy=plan.leaving)
            cleared = self.clear(invs, stageset=stageset, target=target, owner=plan.owner, released=released)
            remaining.extend(cleared.remaining)
            failure = cleared.failure or failure
        left = moving.model_copy(update={"inventory": remaining}) if remaining else None
        writer.previous_targets(left)
        return left, failure

    def clear(self, inventories: Sequence[StageInventory], *, stageset: StageSet, target: Target,
              owner: Owner, released: Collection[str]) -> Cleared:
        """One cluster a StageSet leaves (a move's previous target, or one a deleted StageSet's move
        left): its stages, dependents first, each deleted — or released, if in ``released`` — as the
        identity its inventory names; once a stage is not gone, the rest wait (its dependencies are
        not deleted before it).  No event: the caller tells what it did."""
        by_name = {inv.name: inv for inv in inventories}
        remaining: list[StageInventory] = []
        deleted = let_go = 0
        failure: str | None = None
        for stage in teardown_order(stage_nodes(stageset), by_name):
            inv = by_name[stage]
            if remaining:
                remaining.append(inv)
                continue
            release = functools.partial(release_remaining, inv, owner=owner) if stage in released else None
            progress, failed = self.attempt(inv, target=target, namespace=owner.namespace, owner=owner,
                                           release=release)
            gone = len(inv.entries) - len(progress.remaining)
            if release is not None:
                let_go += gone
            else:
                deleted += gone
            if progress.remaining:
                remaining.append(stage_inventory(inv.name, inv.service_account_name, progress.remaining,
                                                 target=inv.target))
                failure = failed or failure
        return Cleared(remaining=remaining, deleted=deleted, released=let_go, failure=failure)

    def _finish(self, writer: PassWriter, plan: _Plan, moving: PreviousTargets | None) -> Result:
        """Let the StageSet go: the finalizer removed; what was left behind (the wait ran out) counted
        in one ``TeardownForced`` event."""
        try:
            writer.finalizer(present=False)
        except StageError:
            return Result(requeue_after=AGAIN)  # changed under us: read it again and retry
        left = [*plan.inventories.values(), *(moving.inventory if moving is not None else [])]
        if left:
            # Told once, when the release happened: a finalizer patch that must be retried
            # (a conflict, an overloaded apiserver) would otherwise warn once per try.
            self._forced(writer.obj, left, plan.failure)
        log.info("teardown finished: finalizer removed")
        return Result()

    def _again(self, failure: str | None, *, now: datetime.datetime, deleted_at: str | None) -> Result:
        """Look again soon while objects are going; with backoff when a cluster failed."""
        if failure is None:
            return Result(requeue_after=AGAIN)
        return Result(requeue_after=teardown_retry(now=now, deleted_at=deleted_at, max_wait=self._max_wait))

    def _recover(self, writer: PassWriter, inventories: dict[str, StageInventory], target: Target
                 ) -> tuple[dict[str, StageInventory], str | None]:
        """Status lost its inventory (restored without status): find the objects by their labels."""
        try:
            recovered = self._records.recover(writer.obj, inventories=inventories, wanted={}, target=target,
                                              now=format_time(self._clock()))
            writer.record(recovered.record)
        except CLUSTER_ERRORS as error:
            return inventories, f"rebuilding the inventory failed: {how_failed(error)}"
        return recovered.inventories, recovered.problem

    def _leave_behind(self, obj: KubeObject, stage: str, inventory: StageInventory,
                      client: KubeClient, target: Target, *, owner: Owner, why: str) -> list[InventoryEntry]:
        """``prune: false`` or ``deletionPolicy: Orphan`` (``why``): release the stage's objects (owner
        labels removed, as the stage's identity) instead of deleting them; returns what could not be
        released."""
        result = release_stage(inventory=inventory, client=client, owner=owner, applier=target.applier)
        if result.released:
            names = ", ".join(sorted(oid.describe() for oid in result.released)[:10])
            more = f" and {len(result.released) - 10} more" if len(result.released) > 10 else ""
            self._events.emit(normal(obj, EventReason.ORPHANED,
                                     f"stage {stage!r} {why}: left {len(result.released)} object(s) in place "
                                     f"without owner labels: {names}{more}", action="Teardown"))
        return result.remaining

    def _forced(self, obj: KubeObject, left: list[StageInventory], failure: str | None) -> None:
        count = sum(len(inv.entries) for inv in left)
        why = f" (last failure: {failure})" if failure else ""
        message = (f"gave up after {self._max_wait:.0f}s: {count} object(s) left behind{why}: "
                   f"{left_behind(left)}; they keep their stages.metio.wtf owner labels")
        log.warning("StageSet %s/%s released: %s", obj["metadata"]["namespace"], obj["metadata"]["name"],
                    message)
        self._events.emit(warning(obj, EventReason.TEARDOWN_FORCED, message, action="Teardown"))


def _within_reach(writer: PassWriter, inventories: dict[str, StageInventory], *, reach: pruning.Reach,
                  target: Target | None) -> dict[str, StageInventory]:
    """The inventories a teardown may touch: under ``Reach.OUTSIDE_OWN_NAMESPACE`` without what lies
    in the StageSet's own, terminating namespace on this cluster (its deletion takes it), recorded
    so; a remote target's namespaces are other namespaces."""
    if reach is pruning.Reach.EVERYWHERE or target is None or target.remote:
        return inventories
    meta = writer.obj["metadata"]
    namespace, stageset = str(meta["namespace"]), str(meta["name"])
    kept: dict[str, StageInventory] = {}
    left = 0
    for stage, inv in inventories.items():
        elsewhere = [entry for entry in inv.entries if entry_id(entry).namespace != namespace]
        left += len(inv.entries) - len(elsewhere)
        if elsewhere:
            kept[stage] = stage_inventory(inv.name, inv.service_account_name, elsewhere)
    if left:
        # Only logged: an Event cannot be created in a terminating namespace.
        log.info("StageSet %s/%s: namespace %s is terminating; left %d object(s) in it to its deletion, "
                 "tearing down %d elsewhere", namespace, stageset, namespace, left,
                 sum(len(inv.entries) for inv in kept.values()))
        writer.inventory(ordered(kept))
    return kept


def _here_and_elsewhere(writer: PassWriter, inventories: dict[str, StageInventory], target: Target | None, *,
                        now: str) -> tuple[dict[str, StageInventory], PreviousTargets | None]:
    """Only what is on the StageSet's target now is torn down there; what a move left on another
    cluster is torn down there, after.  Without a target (it cannot be read), or with a record from
    before targets, every inventory is taken to be on the target, as before."""
    moving = writer.status.previous_targets
    if target is None or parse(writer.obj).targetless:
        return inventories, moving
    return split_by_target(inventories, moving, target=target.id, now=now)


def by_target(inventories: Iterable[StageInventory]) -> dict[str, list[StageInventory]]:
    """Stage inventories by the cluster (target id) they were applied on, in their order."""
    found: dict[str, list[StageInventory]] = {}
    for inv in inventories:
        found.setdefault(inv.target_id, []).append(inv)
    return found


def release_remaining(inventory: StageInventory, client: KubeClient, target: Target, *, owner: Owner
                      ) -> list[InventoryEntry]:
    """Release a stage's objects on ``target`` (owner labels removed, objects kept) without an
    ``Orphaned`` event (a move's cleanup tells its own); returns what could not be released."""
    return release_stage(inventory=inventory, client=client, owner=owner, applier=target.applier).remaining
