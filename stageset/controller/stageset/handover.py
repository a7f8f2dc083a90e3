"""What one pass of a successor may take over, and the record it writes on each predecessor first.

A :class:`Handover` is made at the start of a pass of a StageSet that names predecessors in
``spec.supersedes`` (:mod:`~stageset.controller.stageset.supersedes` decides which it may take over
from: read and allowed as its identity).  Each stage's claims
(:class:`~stageset.controller.stageset.claims.LiveClaims`) ask it whether an object's holder is one
of them — then the holder's claim does not count — and, before the first such object is written,
have it record the hand-over on the holder
(:meth:`Handover.record`, the annotation of :mod:`stageset.apply.handover`): from then on the holder
no longer applies, lists, prunes or deletes those objects, even before their labels change.

Identity: the record is written **as the controller** (its ClusterRole may patch StageSets: the
finalizer and the durable record are written the same way), with the holder's resourceVersion as a
precondition, after reading the holder afresh as the controller.  Whether the successor may take
over at all was asked as the successor's identity before this object was made.

Thread safety: the stages of a pass run on a small pool; the records are written one at a time
(one lock per pass), so two stages taking objects from one holder never lose each other's entries.

Cost: nothing for a StageSet that names no predecessor (no :class:`Handover` is made); one read and
one patch of a holder per check of a stage's objects that finds some of its to take (a stage's first
write is checked on its own: usually one or two per stage), and none once the record lists them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from stageset.api import API_VERSION
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.apply.handover import ANNOTATION, MAX_BYTES, Ref, parse
from stageset.apply.inventory import ObjectId
from stageset.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""Writes of one record tried before the stage fails (each a conflict: the holder changed meanwhile)."""


def stageset_path(namespace: str, name: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/stagesets/{name}"


class Handover:
    """The predecessors one pass takes over from (their UIDs, as read when it was allowed), and the
    hand-over records it writes on them."""

    def __init__(self, *, controller: KubeClient, ours: Ref, uid: str, predecessors: Mapping[Ref, str],
                 target: str, now: str):
        self._controller = controller
        self._ours = ours
        self._uid = uid
        self._predecessors = dict(predecessors)
        self._target = target
        self._now = now
        self._lock = threading.Lock()
        self._taken: dict[tuple[str, Ref], set[ObjectId]] = {}

    @property
    def predecessors(self) -> Mapping[Ref, str]:
        return self._predecessors

    def takes_from(self, holder: Ref) -> bool:
        """Is ``holder`` a predecessor this pass may take objects from?"""
        return holder in self._predecessors

    def taken(self) -> dict[tuple[str, Ref], int]:
        """How many objects each stage recorded as taken from each predecessor in this pass."""
        with self._lock:
            return {key: len(objects) for key, objects in self._taken.items()}

    def record(self, holder: Ref, objects: Sequence[ObjectId], *, stage: str) -> None:
        """Record on ``holder`` that ``objects`` (on this pass's target) are handed to this StageSet,
        before any of them is written.  Raises :class:`StageError` when it cannot be recorded (then
        none of them is written); a holder that is gone needs no record (nothing holds the objects)."""
        with self._lock:
            self._record(holder, objects)
            self._taken.setdefault((stage, holder), set()).update(objects)

    def _record(self, holder: Ref, objects: Sequence[ObjectId]) -> None:
        path = stageset_path(*holder)
        for _ in range(ATTEMPTS):
            try:
                live = self._controller.get(path)
            except ApiError as error:
                if error.not_found:
                    return  # gone: its teardown is over, nothing holds the objects
                raise StageError(Reason.STAGE_FAILED, self._failed(holder, error)) from error
            meta = live.get("metadata") or {}
            if str(meta.get("uid") or "") != self._predecessors[holder]:
                raise StageError(Reason.STAGE_FAILED, f"StageSet {holder[0]}/{holder[1]} was replaced "
                                 "while it was being taken over (spec.supersedes); the next pass looks at "
                                 "the new one")
            record = parse(live)
            if record.covers(successor=self._ours, uid=self._uid, target=self._target, objects=objects):
                return
            grown = record.grown(successor=self._ours, uid=self._uid, target=self._target, since=self._now,
                                 generation=int(meta.get("generation") or 0), objects=objects)
            value = grown.encode()
            if value is not None and len(value) > MAX_BYTES:
                raise StageError(Reason.STAGE_FAILED, f"taking {len(objects)} object(s) over from "
                                 f"StageSet {holder[0]}/{holder[1]} would make its hand-over record larger "
                                 f"than {MAX_BYTES} bytes; split the hand-over (fewer objects per StageSet)")
            try:
                self._controller.request("PATCH", path, content_type="application/merge-patch+json", body={
                    "metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": {ANNOTATION: value}}})
            except ApiError as error:
                if error.conflict:
                    continue  # it changed meanwhile: read it again
                if error.not_found:
                    return
                raise StageError(Reason.STAGE_FAILED, self._failed(holder, error)) from error
            log.info("StageSet %s/%s: recorded on StageSet %s/%s that %d object(s) are handed over to it",
                     *self._ours, *holder, len(objects))
            return
        raise StageError(Reason.STAGE_FAILED, f"StageSet {holder[0]}/{holder[1]} kept changing while the "
                         "hand-over was recorded on it; retrying")

    @staticmethod
    def _failed(holder: Ref, error: ApiError) -> str:
        return (f"recording the hand-over on StageSet {holder[0]}/{holder[1]} failed: HTTP {error.status}"
                + (f" {error.reason}" if error.reason else "") + "; nothing taken over yet, retrying")
