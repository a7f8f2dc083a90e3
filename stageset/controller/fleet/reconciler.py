"""The FleetRollout reconciler: reads what its members show, decides, writes status and releases.

A reconcile: parse the rollout (refused fields and bad specs: ``InvalidSpec``, and it releases
nobody: the index keeps a refused rollout's label selector, and what it selects holds everything
new) -> its members from the :class:`~stageset.controller.fleet.index.FleetIndex` (the watch
cache's view of every StageSet: labels, held and applied revisions, Ready) -> the pure decision
(:func:`~stageset.controller.fleet.decide.decide`, given what the last decision recorded each member
was released: ``status.releases``, never anything on the member) -> the status (the round, the
waves, the members, a halt, and ``releases``: what each member may apply — the record a member's
pass takes its release from) -> each member's release annotation where it changed (a hint: the
member applies only while it says what the status records) -> the annotation taken back from
StageSets no rollout holds any more -> events and metrics.

Identity: the controller's own, and only for (a) the FleetRollout's status subresource and (b) a
merge patch of one annotation (:data:`~stageset.api.fleet.ANNOTATION_FLEET_RELEASE`) on member
StageSets.  Nothing here reads a tenant's Secrets or sources, or applies anything: a member's
pass applies what its wave released, as its own stage identities (the member reads the
annotation from its own object).  Members are read from the watch cache only: a reconcile makes
no read request.

Invariants: the status is written before the annotations (what was decided — a round, a
withdrawn revision — is recorded before anyone acts on it; a failed annotation write is retried
with the key's backoff and decided again, to the same answer); an annotation is written only
when its value changes.
"""

from __future__ import annotations

import copy
import logging

from pydantic import ValidationError

from stageset.api.fleet import ANNOTATION_FLEET_RELEASE, FleetRollout, FleetRolloutStatus, MemberRelease
from stageset.api.vocabulary import EventReason, Reason
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder, normal, warning
from stageset.controller.fleet.decide import Decision, Member, decide
from stageset.controller.fleet.index import FleetIndex, Seen
from stageset.controller.fleet.selection import waves_of
from stageset.controller.keys import JobKey
from stageset.controller.metrics import Metrics
from stageset.controller.result import Result
from stageset.controller.status import StatusWriter, WriteListener, validation_message
from stageset.kube.client import ApiError, ClientPool
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

RECHECK = 300.0
"""A rollout is decided again at least this often (seconds): a Namespace's labels are no trigger."""
JOB_KIND = "fleet-release"
"""The job that takes release annotations back from StageSets no rollout selects (name: the
deleted rollout, empty: any)."""


class FleetRolloutReconciler:
    def __init__(self, *, clients: ClientPool, resource: Resource, stagesets: Resource, index: FleetIndex,
                 clock: Clock, events: EventRecorder, metrics: Metrics, runbook_base_url: str,
                 on_write: WriteListener | None = None):
        self._clients = clients
        self._resource = resource
        self._stagesets = stagesets
        self._index = index
        self._clock = clock
        self._events = events
        self._metrics = metrics
        self._runbooks = runbook_base_url
        self._on_write = on_write

    def reconcile(self, raw: KubeObject) -> Result:
        """Decide one FleetRollout (``raw``, from the watch cache: read, never changed)."""
        obj = copy.deepcopy(raw)
        name = str(obj["metadata"]["name"])
        writer = StatusWriter(client=self._clients.client(), resource=self._resource, obj=obj,
                              model=FleetRolloutStatus, clock=self._clock, runbook_base_url=self._runbooks,
                              on_write=self._on_write)
        try:
            rollout = FleetRollout.model_validate({**obj, "status": None})
        except ValidationError as error:
            writer.conclude(ready=False, reason=Reason.INVALID_SPEC,
                            message=f"{validation_message(error)}; the StageSets its selector picks apply no "
                                    "new revision until it is fixed", stalled=True)
            self.release_orphans(rollout=name)
            return Result()
        if obj["metadata"].get("deletionTimestamp"):
            return Result()
        found = self._index.members(rollout)
        records = {(r.namespace, r.name): r for r in writer.status.releases}
        members = [self._member(rollout, view, others, selected=selected, record=records.get((view.namespace,
                                                                                             view.name)))
                   for view, others, selected in found]
        decision = decide(rollout=name, waves=rollout.spec.waves, members=members, previous=writer.status,
                          now=self._clock())
        status = decision.status.model_copy(
            update={"last_handled_reconcile_at": writer.status.last_handled_reconcile_at})
        writer.conclude(ready=decision.ready, reason=decision.reason, message=decision.message, status=status)
        self._tell(writer.obj, name, decision)
        for view, _, _ in found:
            release = decision.releases.get((view.namespace, view.name))
            # A member only by its record whose round is over is free: its annotation goes.
            self._annotate(view, None if release is None else release.encode())
        self.release_orphans(rollout=name)
        return Result(requeue_after=min(decision.requeue_after or RECHECK, RECHECK))

    @staticmethod
    def _member(rollout: FleetRollout, view: Seen, others: list[str], *, selected: bool,
                record: MemberRelease | None) -> Member:
        # What was released is what this rollout's own status recorded (never the member's annotation,
        # which its tenant can write); a held record released nothing.
        released = dict(record.revisions) if record is not None and not record.hold else {}
        return Member(namespace=view.namespace, name=view.name,
                      waves=waves_of(rollout.spec.waves, view.labels),
                      pending=view.pending, applied=view.applied, ready=view.ready, reason=view.reason,
                      released=released, contested_by=others, selected=selected)

    def forget(self, name: str) -> None:
        """The rollout is gone: its series go."""
        self._metrics.fleet_forget(name)

    def release_orphans(self, *, rollout: str | None) -> None:
        """Take the annotation back from StageSets that ``rollout`` (``None``: any) named but no
        rollout selects any more: they are free again."""
        for view in self._index.orphans(rollout=rollout):
            log.info("StageSet %s/%s is selected by no FleetRollout any more: its release annotation goes",
                     view.namespace, view.name)
            self._annotate(view, None)

    def job(self, key: JobKey) -> Result:
        """The ``fleet-release`` job: a rollout was deleted (or the controller started)."""
        try:
            self.release_orphans(rollout=key.name or None)
        except ApiError as error:
            log.warning("taking release annotations back failed: HTTP %s; retrying", error.status)
            return Result(backoff=True)
        return Result()

    def _annotate(self, view: Seen, value: str | None) -> None:
        """Set (or, ``None``, remove) a member's release annotation, as the controller."""
        if view.annotation == value:
            return
        path = self._stagesets.object_path(name=view.name, namespace=view.namespace)
        body = {"metadata": {"annotations": {ANNOTATION_FLEET_RELEASE: value}}}
        try:
            self._clients.client().request("PATCH", path, body=body,
                                           content_type="application/merge-patch+json")
        except ApiError as error:
            if not error.not_found:
                raise

    def _tell(self, obj: KubeObject, name: str, decision: Decision) -> None:
        """Events and metrics per wave."""
        self._metrics.fleet_waves(name, decision.status.waves)
        for wave in decision.opened:
            self._metrics.fleet_wave_opened(name, wave)
            revisions = ", ".join(decision.status.round.revisions) if decision.status.round else "-"
            self._events.emit(normal(obj, EventReason.WAVE_OPENED,
                                     f"wave {wave} opened: its members ship {revisions}", action="Rollout"))
        if decision.halted is not None:
            halt = decision.halted
            self._metrics.fleet_halted(name)
            self._events.emit(warning(obj, EventReason.ROLLOUT_HALTED,
                                      f"member {halt.member} of wave {halt.wave} failed ({halt.reason}); "
                                      "no further wave opens until a new revision arrives", action="Rollout"))
        if decision.completed:
            self._events.emit(normal(obj, EventReason.ROLLOUT_COMPLETED,
                                     "every wave is Ready at the newest revisions", action="Rollout"))
