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
Past the wait the finalizer is removed anyway, with a ``TeardownForced`` event that counts what
was left behind per kind and namespace (names the tenant's own manifests gave, nothing else);
those objects keep their owner labels, so they can be found (``-l stages.metio.wtf/name=…``)
and adopted or deleted later.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import urllib3

from stageset.api import InventoryEntry, StageInventory, StageSet
from stageset.api.stageset import DeletionPolicy
from stageset.api.vocabulary import EventReason, EventType
from stageset.apply.errors import StageError
from stageset.apply.inventory import entry_id, left_behind, ordered, stage_inventory
from stageset.apply.orphan import release_stage
from stageset.apply.prune import Owner, TeardownProgress, teardown_stage, unpruned_stages
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder
from stageset.controller.identity import IdentityPolicy
from stageset.controller.result import Result
from stageset.controller.stageset import pruning
from stageset.controller.stageset.plan import stage_nodes, teardown_expired, teardown_order, teardown_retry
from stageset.controller.stageset.records import Records
from stageset.controller.stageset.targets import Target, Targets
from stageset.controller.stageset.writer import PassWriter
from stageset.kube.client import ApiError, ClientPool, KubeClient, UnreachableError
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

AGAIN = 1.0  # seconds between looks while objects are going

# What reaching a cluster can raise besides our own errors: broken connections, bodies that
# are not JSON.  All of it is a cluster failing, which counts toward the wait.
_CLUSTER_ERRORS = (UnreachableError, ApiError, urllib3.exceptions.HTTPError, OSError, ValueError)


@dataclass(frozen=True)
class Attempt:
    """One stage's teardown attempt: what is left, and why the cluster failed (if it did)."""

    remaining: list[StageInventory]
    failure: str | None = None


class Teardown:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, targets: Targets,
                 events: EventRecorder, clock: Clock, max_wait: float, records: Records,
                 terminating: Callable[[str], bool]):
        self._clients = clients
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
        except _CLUSTER_ERRORS as error:
            return None, f"reading spec.kubeConfig failed: {_why(error)}"

    def _stage(self, inventory: StageInventory, *, target: Target | None, namespace: str,
               owner: Owner, release: Callable[[KubeClient, Target], list[InventoryEntry]] | None = None
               ) -> tuple[TeardownProgress, str | None]:
        """Try to delete one stage's objects (or ``release`` them: ``prune: false``); never raises
        for a failing cluster."""
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
        except _CLUSTER_ERRORS as error:
            where = target.where if target.remote else "the cluster"
            return TeardownProgress(remaining=list(inventory.entries), failed=len(inventory.entries)), \
                f"{where} cannot be used: {_why(error)}"
        if progress.failed:
            return progress, (f"{progress.failed} object(s) could not be read or deleted as "
                              f"{identity.describe()}")
        return progress, None

    def run(self, writer: PassWriter, stageset: StageSet | None) -> Result:
        meta = writer.obj["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        inventories = {inv.name: inv for inv in writer.status.inventory}
        now = self._clock()
        deleted_at = meta.get("deletionTimestamp")
        expired = teardown_expired(now=now, deleted_at=deleted_at, max_wait=self._max_wait)
        target, failure = self._target(stageset)
        owner = Owner(namespace, name)
        if target is not None:
            inventories, problem = self._recover(writer, inventories, target)
            if problem:
                failure = problem
                if not expired:
                    log.warning("teardown of StageSet %s/%s waits: %s", namespace, name, problem)
                    return Result(requeue_after=teardown_retry(now=now, deleted_at=deleted_at,
                                                               max_wait=self._max_wait))
        policy = stageset.spec.deletion_policy if stageset else DeletionPolicy.DELETE
        allowed = pruning.permission(pruning.TearingDown(
            policy=policy, namespace_terminating=self._terminating(namespace)))
        deletes = allowed.scope is pruning.Scope.ALL
        inventories = _within_reach(writer, inventories, reach=allowed.reach, target=target)
        unpruned = set(unpruned_stages(stageset)) if stageset else set()
        released = set(unpruned)
        if not deletes:
            released = set(inventories)
        why = "(deletionPolicy: Orphan)"
        order = teardown_order(stage_nodes(stageset) if stageset else None, inventories)
        log.debug("tearing down stages in order: %s", ", ".join(order) or "none left")
        for stage in order:
            inv = inventories[stage]
            release = None if stage not in released else \
                functools.partial(self._leave_behind, writer.obj, stage, inv, owner=owner,
                                  why="has prune: false" if stage in unpruned else why)
            progress, failed = self._stage(inv, target=target, namespace=namespace, owner=owner,
                                           release=release)
            failure = failed or failure
            still_there = {entry.id for entry in progress.remaining}
            for entry in inv.entries:
                if entry.id not in still_there:
                    log.info("teardown of stage %s: %s %s", stage, entry_id(entry).describe(),
                             "released" if stage in released else "deleted")
            if progress.remaining:
                inventories[stage] = stage_inventory(inv.name, inv.service_account_name, progress.remaining)
            else:
                del inventories[stage]
            writer.inventory(ordered(inventories))
            if not progress.remaining:
                continue
            if failure:
                log.warning("teardown of StageSet %s/%s, stage %s: %s", namespace, name, stage, failure)
            if not expired:
                if failure is None:
                    return Result(requeue_after=AGAIN)
                return Result(requeue_after=teardown_retry(now=now, deleted_at=deleted_at,
                                                           max_wait=self._max_wait))
            break
        try:
            writer.finalizer(present=False)
        except StageError:
            return Result(requeue_after=AGAIN)  # changed under us: read it again and retry
        if inventories:
            # Told once, when the release happened: a finalizer patch that must be retried
            # (a conflict, an overloaded apiserver) would otherwise warn once per try.
            self._forced(writer.obj, list(inventories.values()), failure)
        log.info("teardown finished: finalizer removed")
        return Result()

    def _recover(self, writer: PassWriter, inventories: dict[str, StageInventory], target: Target
                 ) -> tuple[dict[str, StageInventory], str | None]:
        """Status lost its inventory (restored without status): find the objects by their labels."""
        try:
            recovered = self._records.recover(writer.obj, inventories=inventories, wanted={}, target=target)
            writer.record(recovered.record)
        except _CLUSTER_ERRORS as error:
            return inventories, f"rebuilding the inventory failed: {_why(error)}"
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
            self._events.emit(obj, type_=EventType.NORMAL, reason=EventReason.ORPHANED,
                              message=f"stage {stage!r} {why}: left {len(result.released)} "
                              f"object(s) in place without owner labels: {names}{more}", action="Teardown")
        return result.remaining

    def _forced(self, obj: KubeObject, left: list[StageInventory], failure: str | None) -> None:
        count = sum(len(inv.entries) for inv in left)
        why = f" (last failure: {failure})" if failure else ""
        message = (f"gave up after {self._max_wait:.0f}s: {count} object(s) left behind{why}: "
                   f"{left_behind(left)}; they keep their stages.metio.wtf owner labels")
        log.warning("StageSet %s/%s released: %s", obj["metadata"]["namespace"], obj["metadata"]["name"],
                    message)
        self._events.emit(obj, type_=EventType.WARNING, reason=EventReason.TEARDOWN_FORCED,
                          message=message, action="Teardown")


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


def _why(error: BaseException) -> str:
    """How a cluster failed, in our words (nothing it sent)."""
    if isinstance(error, UnreachableError):
        return error.why
    if isinstance(error, ApiError):
        return f"answered HTTP {error.status}" + (f" {error.reason}" if error.reason else "")
    if isinstance(error, ValueError):
        return "answered with something that is not JSON"
    return "the connection failed"
