"""What a StageSet's passes changed, told once: metrics per apply, drift and prune events, and a
``ReconciliationSucceeded`` event naming every change since the StageSet was last Ready.

Identity: prune deletes as the identity each inventory entry records
(:meth:`~stageset.controller.identity.IdentityPolicy.for_inventory`: the stage's
ServiceAccount, or the controller in single-tenant mode), on the StageSet's target cluster;
events are written as the controller (:class:`~stageset.controller.events.EventRecorder`).
Every message passes the StageSet's redactor.

Memory: per StageSet, the changes since it was last Ready (one entry per object), dropped when
it turns Ready or is deleted (:meth:`Changes.forget`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from stageset.api.vocabulary import EventReason, EventType
from stageset.apply.changeset import WRITES, Change
from stageset.apply.engine import StageResult
from stageset.apply.inventory import ObjectId, Stale, stale
from stageset.apply.prune import Owner, prune
from stageset.controller.events import EventRecorder, change_summary
from stageset.controller.identity import IdentityPolicy
from stageset.controller.metrics import Metrics
from stageset.controller.redact import Redactor
from stageset.controller.stageset.progress import Pass, Report
from stageset.controller.stageset.targets import Target
from stageset.kube.client import ClientPool, KubeClient
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

StageSetRef = tuple[str, str]  # (namespace, name)
LISTED = 10  # objects named in a drift or prune message before "and N more"


def ref_of(obj: KubeObject) -> StageSetRef:
    return str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"])


class Changes:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, events: EventRecorder,
                 metrics: Metrics):
        self._clients = clients
        self._identities = identities
        self._events = events
        self._metrics = metrics
        self._changes: dict[StageSetRef, dict[ObjectId, Change]] = {}
        self._lock = threading.Lock()

    def forget(self, namespace: str, name: str) -> None:
        """The StageSet is gone: drop what is remembered of it."""
        with self._lock:
            self._changes.pop((namespace, name), None)

    def applied(self, obj: KubeObject, stage: str, result: StageResult, redactor: Redactor) -> None:
        """A stage's apply finished: count it, remember what it wrote, tell any drift corrected."""
        ref = ref_of(obj)
        self._metrics.applied(ref, stage, result.changes)
        self._remember(ref, result.changes)
        drifted = result.changes.drifted
        if not drifted:
            return
        names = ", ".join(sorted(c.id.describe() for c in drifted)[:LISTED])
        more = f" and {len(drifted) - LISTED} more" if len(drifted) > LISTED else ""
        log.info("drift corrected in stage %s: restored %s%s", stage, names, more)
        self._events.emit(obj, type_=EventType.WARNING, reason=EventReason.DRIFT_CORRECTED,
                          message=f"stage {stage!r}: restored {names}{more}", action="Apply", redact=redactor)

    def _remember(self, ref: StageSetRef, changes: Iterable[Change]) -> None:
        with self._lock:
            known = self._changes.setdefault(ref, {})
            for change in changes:
                if change.action in WRITES:
                    known.setdefault(change.id, change)  # "created" stays created when changed again

    def _take(self, ref: StageSetRef) -> list[Change]:
        with self._lock:
            return list(self._changes.pop(ref, {}).values())

    def succeeded(self, report: Report, state: Pass, *, pruned: int, revision: str,
                  redactor: Redactor) -> None:
        """Ready: a Normal event naming what changed since the StageSet was last Ready (none when a
        Ready StageSet's pass changed nothing)."""
        summary = change_summary(self._take(ref_of(report.obj)), pruned=pruned)
        if not summary and state.previous.ready:
            return
        message = summary or f"no changes; {len(state.outcomes)} stage(s) ready at {revision}"
        self._events.emit(report.obj, type_=EventType.NORMAL, reason=EventReason.RECONCILIATION_SUCCEEDED,
                          message=message, redact=redactor,
                          annotations={"stages.metio.wtf/revision": revision})

    def prune(self, report: Report, state: Pass, target: Target, redactor: Redactor
              ) -> tuple[list[Stale], int]:
        """Delete what no stage renders any more; returns what could not be deleted, and how many
        objects were."""
        namespace, name = ref_of(report.obj)

        def client_for(account: str | None) -> KubeClient | None:
            identity = self._identities.for_inventory(account, namespace)
            return None if identity is None else self._clients.client(identity, target.cluster)

        disabled = [s.name for s in state.stageset.spec.stages if not s.prune]
        result = prune(stale=stale(old=state.previous.inventories, new=state.fresh, prune_disabled=disabled),
                       client_for=client_for, applier=target.applier, owner=Owner(namespace, name))
        deleted = [c for c in result.changes if c.action in WRITES]
        for change in deleted:
            log.info("pruned %s: no longer in Git", change.id.describe())
        self._metrics.pruned((namespace, name), deleted=len(deleted), failed=len(result.kept))
        if result.kept:
            names = ", ".join(sorted(i.id.describe() for i in result.kept)[:LISTED])
            log.warning("could not prune %d object(s) no longer in Git: %s", len(result.kept), names)
            self._events.emit(report.obj, type_=EventType.WARNING, reason=EventReason.PRUNE_FAILED,
                              message=f"could not delete {len(result.kept)} object(s) no longer in Git: "
                              f"{names}", action="Prune", redact=redactor)
        return result.kept, len(deleted)
