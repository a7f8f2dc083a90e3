"""Tearing a deleted StageSet down: every stage's objects, dependents first, then let it go.

Identity: each stage's objects are deleted as the identity that applied them (recorded in
its inventory; see :mod:`stageset.controller.identity`), on the StageSet's target cluster
(the kubeConfig Secret read as the StageSet's identity).  Status and the finalizer are
written as the controller.

A stage with ``prune: false`` is not deleted: its objects are released instead — our owner
labels removed, so a later StageSet can adopt them — and an ``Orphaned`` event names what
was left behind (:mod:`stageset.apply.orphan`).

A stage's objects must be gone before the next stage's are deleted.  A teardown that
cannot finish is given up after ``max_teardown_wait`` with a ``TeardownForced`` event, so
the StageSet (and its namespace) can still go.
"""

from __future__ import annotations

import logging

from stageset.api import InventoryEntry, StageInventory, StageSet, StageSetStatus
from stageset.api.vocabulary import EventReason, EventType
from stageset.apply.errors import StageError
from stageset.apply.inventory import ordered, stage_inventory
from stageset.apply.orphan import release_stage
from stageset.apply.prune import Owner, teardown_stage
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder
from stageset.controller.finalizers import set_finalizer
from stageset.controller.identity import IdentityPolicy
from stageset.controller.result import Result
from stageset.controller.stageset.plan import stage_nodes, teardown_expired, teardown_order
from stageset.controller.stageset.targets import Target, Targets
from stageset.controller.status import StatusReport
from stageset.kube.client import ClientPool, KubeClient, UnreachableError
from stageset.kube.mapping import Resource

log = logging.getLogger(__name__)

AGAIN = 1.0  # seconds between looks while objects are going


class Teardown:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, targets: Targets,
                 events: EventRecorder, resource: Resource, clock: Clock, max_wait: float):
        self._clients = clients
        self._identities = identities
        self._targets = targets
        self._events = events
        self._resource = resource
        self._clock = clock
        self._max_wait = max_wait

    def _target(self, stageset: StageSet | None, namespace: str, name: str) -> Target | None:
        if stageset is None:
            return self._targets.local
        try:
            identity = self._identities.for_stageset(stageset, what="reading spec.kubeConfig")
            return self._targets.resolve(self._clients.client(identity), stageset)
        except StageError as error:
            log.warning("cannot reach the cluster of StageSet %s/%s for teardown: %s", namespace, name,
                        error.message)
            return None

    def run(self, report: StatusReport[StageSetStatus], stageset: StageSet | None) -> Result:
        meta = report.obj["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        status = report.status
        inventories = {inv.name: inv for inv in status.inventory}
        target = self._target(stageset, namespace, name)
        owner = Owner(namespace, name)
        expired = teardown_expired(now=self._clock(), deleted_at=meta.get("deletionTimestamp"),
                                   max_wait=self._max_wait)
        kept = {s.name for s in stageset.spec.stages if not s.prune} if stageset else set()
        for stage in teardown_order(stage_nodes(stageset) if stageset else None, inventories):
            inv = inventories[stage]
            identity = self._identities.for_inventory_of(inv, namespace)
            client = None if identity is None or target is None else \
                self._clients.client(identity, target.cluster)
            try:
                if stage in kept:
                    remaining = self._leave_behind(report, stage, inv, client, target, owner)
                else:
                    remaining = teardown_stage(inventory=inv, client=client, owner=owner,
                                               applier=target.applier if target else None)
            except UnreachableError as error:
                log.warning("teardown of StageSet %s/%s: the cluster at %s cannot be used: %s",
                            namespace, name, error.server, error.why)
                remaining = list(inv.entries)
            if remaining:
                inventories[stage] = stage_inventory(inv.name, inv.service_account_name, remaining)
                status.inventory = ordered(inventories)
                report.write()
                if not expired:
                    return Result(requeue_after=AGAIN)
                self._events.emit(report.obj, type_=EventType.WARNING, reason=EventReason.TEARDOWN_FORCED,
                                  message=f"stage {stage!r} still has {len(remaining)} object(s) after "
                                  f"{self._max_wait:.0f}s; releasing the StageSet anyway")
                break
            del inventories[stage]
            status.inventory = ordered(inventories)
            report.write()
        try:
            set_finalizer(self._clients.client(), resource=self._resource, obj=report.obj, present=False)
        except StageError:
            return Result(requeue_after=AGAIN)  # changed under us: read it again and retry
        return Result()

    def _leave_behind(self, report: StatusReport[StageSetStatus], stage: str, inventory: StageInventory,
                      client: KubeClient | None, target: Target | None, owner: Owner) -> list[InventoryEntry]:
        """``prune: false``: release the stage's objects (owner labels removed) instead of deleting them."""
        result = release_stage(inventory=inventory, client=client, owner=owner,
                               applier=target.applier if target else None)
        if result.released:
            names = ", ".join(sorted(oid.describe() for oid in result.released)[:10])
            more = f" and {len(result.released) - 10} more" if len(result.released) > 10 else ""
            self._events.emit(report.obj, type_=EventType.NORMAL, reason=EventReason.ORPHANED,
                              message=f"stage {stage!r} has prune: false: left {len(result.released)} "
                              f"object(s) in place without owner labels: {names}{more}")
        return result.remaining
