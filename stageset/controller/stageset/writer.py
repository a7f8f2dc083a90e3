"""Everything a StageSet reconcile writes to its StageSet, and when: the one place.

Identity: the controller's own — the status subresource, the finalizer and the inventory record
annotation are the only parts of a StageSet its ClusterRole may write.

What a reconcile writes, in the order a pass does:

1. :meth:`PassWriter.finalizer` — present before anything is applied: a pass asks for it first and
   it is written with the record before the first apply (one optimistic merge patch that carries
   the resourceVersion), or, when no stage gets that far, before the conclusion; removed at the
   end of a teardown (an optimistic JSON patch that tests the resourceVersion);
2. :meth:`PassWriter.handed_over` — the hand-over record (``spec.supersedes``) without the entries
   that no longer hold, before anything else (an optimistic merge patch; a successor may be adding
   to it);
   :meth:`PassWriter.record` — the inventory record: covering what the stages are about to apply
   (before they apply it), rebuilt when status lost the inventory, settled to what is still owned
   after a complete prune; skipped when the annotation already says so;
3. :meth:`PassWriter.announce` — a pass begins: Ready=Unknown "applying stages" (never in a quiet
   pass, nor when a pass is already visibly in progress: :func:`plan.announce`), written with the
   first progress the pass shows — a pass that ends without showing any says it only once, in
   its conclusion (status writes are the costliest requests of a pass);
4. :meth:`PassWriter.show` — the stages and the merged inventory as they stand, after each stage
   that finishes while more remain (never in a quiet pass: :func:`plan.quiet`, which the pass
   runner decides and passes to every call as ``quiet`` — the writer keeps no pass mode);
5. :meth:`PassWriter.waiting` — a stage waits for readiness: its phase at once, a new message at
   most every :data:`~stageset.controller.stageset.progress.PROGRESS_INTERVAL` seconds;
   :meth:`PassWriter.release` — a rollback's record, before it touches the first stage and after
   each stage it restores (:mod:`~stageset.controller.stageset.release`);
6. :meth:`PassWriter.conclude` — every reconcile ends with its conditions (after teardown
   steps, :meth:`PassWriter.inventory`) — unless :meth:`PassWriter.held` holds back the first word
   of a new StageSet that only waits for another object and has written nothing
   (:mod:`~stageset.controller.stageset.holding`): then the reconcile ends with no write at all.

Every status written is a value made by pure functions (:mod:`~stageset.controller.stageset.progress`,
:func:`~stageset.controller.conditions.concluded`) and written by one
:class:`~stageset.controller.status.StatusWriter`, which redacts every message and skips a write
that would change nothing.  Nothing here changes the object the reconcile was given; the object
as written is :attr:`PassWriter.obj`.  Called from the reconcile's own thread only (stages tell
the pass through the scheduler).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from stageset.api import PreviousTargets, StageInventory, StageSetStatus
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.apply.handover import ANNOTATION as HANDOVER
from stageset.apply.ownership import FINALIZER
from stageset.apply.record import ANNOTATION, Record
from stageset.controller.finalizers import set_finalizer
from stageset.controller.result import Result
from stageset.controller.stageset.holding import WAITING, Holding
from stageset.controller.stageset.plan import StageOutcome
from stageset.controller.stageset.progress import Progress, shown, waiting_due
from stageset.controller.status import StatusWriter, with_version
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, metadata

Ticks = Callable[[], float]  # seconds, monotonic: only ever compared with itself


class PassWriter:
    def __init__(self, *, status: StatusWriter[StageSetStatus], client: KubeClient, resource: Resource,
                 ticks: Ticks = time.monotonic, holding: Holding | None = None):
        self._status = status
        self._holding = holding
        self._client = client
        self._resource = resource
        self._ticks = ticks
        self._published = 0.0
        self._finalizer_due = False
        """Asked for and not written yet: written with the record before the first apply."""
        self._announced: str | None = None
        """An announcement not written yet: written with the first progress shown."""

    @property
    def obj(self) -> KubeObject:
        return self._status.obj

    @property
    def status(self) -> StageSetStatus:
        return self._status.status

    @property
    def generation(self) -> int:
        return self._status.generation

    @property
    def requested(self) -> bool:
        """The pass was asked for (``reconcile.fluxcd.io/requestedAt``), not only due."""
        return self._status.requested

    # -- the object: finalizer and record ---------------------------------------------------

    def finalizer(self, *, present: bool, deferred: bool = False) -> None:
        """Add or remove our finalizer; :class:`StageError` when the object changed meanwhile.
        ``deferred`` (a pass adding it): written with the record before the first apply, or before
        the conclusion (:meth:`record`, :meth:`conclude`), whichever comes first."""
        if deferred and present:
            self._finalizer_due = FINALIZER not in (metadata(self.obj).get("finalizers") or [])
            return
        written = set_finalizer(self._client, resource=self._resource, obj=self.obj, present=present)
        if written is not None:
            self._status.wrote(written)

    def record(self, record: Record | None, *, before_apply: bool = False) -> None:
        """The inventory record annotation (``None``: nothing to record now).  ``before_apply``: the
        last write before the stages apply, which carries the finalizer if it is still due."""
        due = self._finalizer_due and before_apply
        kept = record is not None and (record.stages or record.rebuild or record.previous)
        value = record.encode() if record is not None and kept else None
        meta = metadata(self.obj)
        annotations = dict(meta.get("annotations") or {})
        changes = record is not None and annotations.get(ANNOTATION) != value
        if not changes and not due:
            return
        body: dict[str, Any] = {"annotations": {ANNOTATION: value}} if changes else {}
        finalizers = list(meta.get("finalizers") or [])
        if due:
            # Optimistic, as the finalizer's own patch is: the resourceVersion must still be ours.
            finalizers.append(FINALIZER)
            body.update(finalizers=finalizers, resourceVersion=meta.get("resourceVersion"))
        path = self._resource.object_path(name=meta["name"], namespace=meta.get("namespace"))
        try:
            written = self._client.request("PATCH", path, content_type="application/merge-patch+json",
                                           body={"metadata": body})
        except ApiError as error:
            if due and (error.conflict or error.not_found):
                self._finalizer_due = False
                raise StageError(Reason.PROGRESSING, "object changed while updating finalizers; "
                                 "retrying") from error
            if error.not_found:
                return
            raise
        self._finalizer_due = False
        if changes:
            if value is None:
                annotations.pop(ANNOTATION, None)
            else:
                annotations[ANNOTATION] = value
        extra = {"finalizers": finalizers} if due else {}
        self._status.wrote(with_version(self.obj, written, annotations=annotations, **extra))

    def handed_over(self, value: str | None) -> None:
        """The hand-over record (:mod:`stageset.apply.handover`) as ``value`` (``None``: removed), when it
        changed.  Optimistic (a successor writes entries into it): if the object changed meanwhile,
        nothing is written and the next pass tries again."""
        meta = metadata(self.obj)
        annotations = dict(meta.get("annotations") or {})
        if annotations.get(HANDOVER) == value:
            return
        path = self._resource.object_path(name=meta["name"], namespace=meta.get("namespace"))
        try:
            body = {"resourceVersion": meta.get("resourceVersion"), "annotations": {HANDOVER: value}}
            written = self._client.request("PATCH", path, content_type="application/merge-patch+json",
                                           body={"metadata": body})
        except ApiError as error:
            if error.conflict or error.not_found:
                return
            raise
        if value is None:
            annotations.pop(HANDOVER, None)
        else:
            annotations[HANDOVER] = value
        self._status.wrote(with_version(self.obj, written, annotations=annotations))

    # -- status while a pass runs -------------------------------------------------------------

    def announce(self, progress: Progress, message: str) -> None:
        """A pass begins: Ready=Unknown with ``message``, shown with the first progress the pass
        shows (:meth:`show`); a pass that shows none (a quiet one) concludes without it."""
        del progress  # what is shown is the progress at the first write
        self._announced = message

    def show(self, progress: Progress, *, quiet: bool) -> None:
        """Show the stages as they stand now (and the merged inventory so far) — never in a
        ``quiet`` pass (a routine pass over a Ready StageSet: nothing is written until its
        conclusion).  Conditions are left to the announcement and the conclusion, so a re-check
        pass whose stages did not change writes nothing."""
        if quiet:
            return
        if self._announced is not None:
            message, self._announced = self._announced, None
            self._status.conclude(ready=None, reason=Reason.PROGRESSING, message=message,
                                  status=shown(self.status, progress))
            self._published = self._ticks()
            return
        if self._status.write(shown(self.status, progress)):
            self._published = self._ticks()

    def waiting(self, before: StageOutcome, progress: Progress, *, quiet: bool) -> None:
        """A stage waits for readiness (its outcome in ``progress``; ``before``: what it was) —
        never shown in a ``quiet`` pass."""
        since = self._ticks() - self._published
        if waiting_due(before, progress.outcomes[before.name], since_published=since):
            self.show(progress, quiet=quiet)

    def release(self, progress: Progress, **fields: object) -> None:
        """Steering a release: the stages and inventory as they stand with ``fields`` (the rollback
        record, before and after each stage it restores) — written even in a quiet pass."""
        if self._status.write(shown(self.status, progress).model_copy(update=fields)):
            self._published = self._ticks()

    # -- the end ------------------------------------------------------------------------------

    def held(self, reason: Reason | None, *, changed_elsewhere: bool = False, patient: bool = False
             ) -> Result | None:
        """When to look again, holding this pass's conclusion back (the reconcile then ends without
        any write; sooner when the awaited object changes), or ``None``: conclude now.
        Held only as :mod:`~stageset.controller.stageset.holding` says: a pass that ends waiting
        (``reason``) for another object, over a generation status does not show yet, not asked
        for, that wrote nothing to the StageSet and, ``changed_elsewhere`` false, nothing else;
        ``patient``: it waits only for objects that said nothing yet (held longer: their first
        word wakes it)."""
        if self._holding is None:
            return None
        meta = metadata(self.obj)
        ref = (str(meta.get("namespace")), str(meta.get("name")))
        if reason not in WAITING or changed_elsewhere or self.requested or self._status.writes \
                or self.status.observed_generation == self.generation:
            self._holding.release(ref)
            return None
        holding = self._holding
        wait = holding.hold(ref, generation=self.generation, patient=patient)
        return None if wait is None else Result(requeue_after=wait, wanted=holding.wanted(ref))

    def inventory(self, inventory: list[StageInventory]) -> None:
        """Teardown: what is left of the inventory."""
        self._status.write(self.status.model_copy(update={"inventory": inventory}))

    def previous_targets(self, previous: PreviousTargets | None) -> None:
        """Teardown mid-move: what is left on previous clusters (written only when it changed)."""
        if previous != self.status.previous_targets:
            self._status.write(self.status.model_copy(update={"previous_targets": previous}))

    def conclude(self, *, ready: bool | None, reason: Reason, message: str, stalled: bool = False,
                 status: StageSetStatus | None = None) -> None:
        """The reconcile's conditions (with ``status``: the status a pass ended with).  A finalizer
        still due is written first; if the object changed meanwhile, the next pass adds it."""
        self._announced = None
        if self._holding is not None:
            meta = metadata(self.obj)
            self._holding.release((str(meta.get("namespace")), str(meta.get("name"))))
        if self._finalizer_due:
            with contextlib.suppress(StageError):  # the object changed: its next reconcile adds it
                self.record(None, before_apply=True)
        self._status.conclude(ready=ready, reason=reason, message=message, stalled=stalled, status=status)
