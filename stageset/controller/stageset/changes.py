"""What a StageSet's passes changed, told once: metrics per apply, drift and prune events, and a
``ReconciliationSucceeded`` event naming every change since the StageSet was last Ready.  Drift
restored is a ``DriftCorrected`` event per stage; drift left (``driftDetection.mode: Warn``) a
``DriftDetected`` event when a pass finds drift status did not show yet (once per drift).

This module reports; it decides and deletes nothing (prune: :mod:`stageset.apply.prune`).
Identity: events are written as the controller (:class:`~stageset.controller.events.EventRecorder`).
Every message passes the StageSet's redactor.

Memory: per StageSet, the changes since it was last Ready (one entry per object), dropped when
it turns Ready or is deleted (:meth:`Changes.forget`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence

from stageset.api import DriftedObject
from stageset.api.vocabulary import EventReason
from stageset.apply.changeset import WRITES, Change
from stageset.apply.engine import StageResult
from stageset.apply.inventory import ObjectId
from stageset.apply.prune import PruneResult
from stageset.controller.drift.report import message as drift_message
from stageset.controller.events import EventRecorder, change_summary, normal, warning
from stageset.controller.metrics import Metrics
from stageset.controller.redact import Redactor
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

StageSetRef = tuple[str, str]  # (namespace, name)
LISTED = 10  # objects named in a drift or prune message before "and N more"


def ref_of(obj: KubeObject) -> StageSetRef:
    return str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"])


class Changes:
    def __init__(self, *, events: EventRecorder, metrics: Metrics):
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
        restored = f"stage {stage!r}: restored {names}{more}"
        self._events.emit(warning(obj, EventReason.DRIFT_CORRECTED, restored, action="Apply",
                                  redact=redactor))

    def drift_found(self, obj: KubeObject, new: Sequence[DriftedObject], *, count: int, warn: bool,
                    redactor: Redactor) -> None:
        """A pass's drift report: the count (a series only in ``Warn`` mode), and the drift left as found
        that status did not show before, in one Warning naming it."""
        self._metrics.drifted(ref_of(obj), count if warn else None)
        if not new:
            return
        text = drift_message(new)
        log.info("drift left as found (Warn): %s", text)
        said = f"{text} ({count} drifted in all)" if count > len(new) else text
        self._events.emit(warning(obj, EventReason.DRIFT_DETECTED, said, action="Apply", redact=redactor))

    def attempting(self, obj: KubeObject, revisions: Mapping[str, str]) -> None:
        """This pass sets out to apply ``revisions`` (by stage): a failure event names them."""
        namespace, name = ref_of(obj)
        self._events.attempting(namespace, name, revisions)

    def _remember(self, ref: StageSetRef, changes: Iterable[Change]) -> None:
        with self._lock:
            known = self._changes.setdefault(ref, {})
            for change in changes:
                if change.action in WRITES:
                    known.setdefault(change.id, change)  # "created" stays created when changed again

    def _take(self, ref: StageSetRef) -> list[Change]:
        with self._lock:
            return list(self._changes.pop(ref, {}).values())

    def succeeded(self, obj: KubeObject, *, was_ready: bool, stages: int, pruned: int, revision: str,
                  redactor: Redactor) -> None:
        """Ready: a Normal event naming what changed since the StageSet was last Ready (none when a
        Ready StageSet's pass changed nothing)."""
        summary = change_summary(self._take(ref_of(obj)), pruned=pruned)
        if not summary and was_ready:
            return
        message = summary or f"no changes; {stages} stage(s) ready at {revision}"
        self._events.emit(normal(obj, EventReason.RECONCILIATION_SUCCEEDED, message, redact=redactor,
                                 revision=revision))

    def pruned(self, obj: KubeObject, result: PruneResult, redactor: Redactor) -> int:
        """Prune ran (:func:`stageset.apply.prune.prune`): log and count what it deleted, and tell
        what it could not delete (a ``PruneFailed`` event); returns how many objects it deleted."""
        ref = ref_of(obj)
        deleted = [c for c in result.changes if c.action in WRITES]
        for change in deleted:
            log.info("pruned %s: no longer in Git", change.id.describe())
        self._metrics.pruned(ref, deleted=len(deleted), failed=len(result.kept))
        if result.kept:
            names = ", ".join(sorted(i.id.describe() for i in result.kept)[:LISTED])
            log.warning("could not prune %d object(s) no longer in Git: %s", len(result.kept), names)
            self._events.emit(warning(obj, EventReason.PRUNE_FAILED,
                                      f"could not delete {len(result.kept)} object(s) no longer in Git: "
                                      f"{names}",
                                      action="Prune", redact=redactor))
        return len(deleted)
