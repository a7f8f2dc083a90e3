"""What the FleetRollout reconciler declares to the manager (its ``SetupWithManager``).

- ``For`` FleetRollouts (cluster-scoped): a new generation, a ``requestedAt``, a deletion; a
  Ready that turns ``False`` is told as a Warning (:class:`~stageset.controller.events.ReadyWarnings`);
- ``Watches`` FleetRollouts: a rollout created, changed or deleted requeues every rollout (which
  StageSets are contested depends on all of them);
- ``Watches`` StageSets (:func:`~stageset.controller.fleet.index.state`): a member's labels, held
  or applied revisions, readiness or release annotation moving requeues the rollouts selecting
  it, recording it and the ones its annotation names;
- a rollout's event whose ``status.releases`` changed what it records for a member queues that
  member's StageSet: its pass takes what it may apply from there (the annotation written after the
  status queues it too; whichever arrives first, the pass holds until both agree);
- jobs (``fleet-release``): a deleted rollout's annotations taken back; once the caches synced
  after a start, any rollout's (:class:`Sweep`, a runnable).

Both kinds' events reach the :class:`~stageset.controller.fleet.index.FleetIndex` before any key
is queued: the rollout's through :attr:`Controller.indexed`, the StageSets' through an
:class:`~stageset.controller.setup.Index` on their kind (declared by :mod:`~stageset.controller.fleet.setup`).

Only on a cluster-wide release without label shards (:mod:`~stageset.controller.fleet.setup`'s
rule): a rollout must see every StageSet it may select, and FleetRollouts are cluster-scoped.

Identity: none; nothing here makes a request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stageset.controller.events import EventRecorder, ReadyWarnings
from stageset.controller.fleet.index import FleetIndex, state
from stageset.controller.fleet.reconciler import JOB_KIND, FleetRolloutReconciler
from stageset.controller.keys import JobKey, ObjectKey
from stageset.controller.setup import (
    ANY_CHANGE,
    Controller,
    Enqueue,
    Event,
    Jobs,
    Watch,
    reconcile_trigger,
)
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

Indexed = Callable[[Event, ObjectKey, KubeObject], None]


def spec_of(obj: KubeObject) -> Any:
    return (obj.get("metadata") or {}).get("generation")


class FleetWatches:
    def __init__(self, *, reconciler: FleetRolloutReconciler, resource: Resource, stageset_kind: str,
                 index: FleetIndex, enqueue: Enqueue, events: EventRecorder):
        self._reconciler = reconciler
        self._events = events
        self._resource = resource
        self._stageset_kind = stageset_kind
        self._index = index
        self._enqueue = enqueue
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def controller(self, *, workers: int) -> Controller:
        return Controller(
            resource=self._resource, reconciler=self._reconciler, workers=workers, trigger=reconcile_trigger,
            watches=(Watch(kind=self._resource.kind, state=spec_of, fires=ANY_CHANGE, keys=self._every),
                     Watch(kind=self._stageset_kind, state=state, fires=ANY_CHANGE, keys=self._selecting)),
            indexed=self._indexed, transitions=ReadyWarnings(self._events))

    def jobs(self) -> Jobs:
        return Jobs(runner=JOB_KIND, pool=self._resource.kind, run=self._reconciler.job)

    def _indexed(self, event: Event, key: ObjectKey, obj: KubeObject) -> None:
        for namespace, name in self._index.rollout(event, key, obj):
            self._enqueue(ObjectKey(self._stageset_kind, namespace, name))
        with self._lock:
            if event is Event.DELETED:
                self._known.discard(key.name)
            else:
                self._known.add(key.name)
        if event is Event.DELETED:
            self._reconciler.forget(key.name)
            # Its members are free again: their annotations are taken back (a job, not a reconcile:
            # the rollout is gone from the cache).
            self._enqueue(JobKey(JOB_KIND, "", key.name))

    def _every(self, key: ObjectKey) -> list[ObjectKey]:
        with self._lock:
            return [ObjectKey(key.kind, "", name) for name in sorted(self._known)]

    def _selecting(self, key: ObjectKey) -> list[ObjectKey]:
        return [ObjectKey(self._resource.kind, "", name)
                for name in self._index.rollouts_for((key.namespace, key.name))]


class Sweep:
    """Once the caches synced after a start: take back annotations of rollouts deleted meanwhile."""

    def __init__(self, *, enqueue: Enqueue, synced: Callable[[], bool], stop: threading.Event):
        self._enqueue = enqueue
        self._synced = synced
        self._stop = stop

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="fleet-sweep", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            if self._synced():
                self._enqueue(JobKey(JOB_KIND, "", ""))
                return
