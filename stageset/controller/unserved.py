"""The main shard's report of objects no shard serves: a ``sharding.fluxcd.io/key`` naming no shard.

Identity: the controller's own — the same label-selected list/watch of our kinds and the same
status subresource write its ClusterRole allows for the objects it reconciles.

With ``--shard-keys`` (the chart sets it on the main shard of ``controller.shards``) the main
shard watches, besides its own objects, the StageSets and GitRepositories whose shard key names
none of the shards (:meth:`~stageset.controller.sharding.LabelSelector.unserved`: selected by the
apiserver, never filtered here).  Each one gets ``Ready=False``, ``Stalled=True`` with reason
``NoShard`` and a message naming the key and the shards there are — written by a worker, so only
while this process holds the Lease, and only when it changes something — and is counted in
``stageset_unserved_objects{kind}``.  Nothing else is done to it: no apply, no prune, no
finalizer; its objects stay as they are.  Relabelled to a served key, it leaves this watch
(``DELETED`` here) and its shard's next pass writes its own status over this one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from stageset.api import GitRepositoryStatus, StageSetStatus
from stageset.api.vocabulary import Reason
from stageset.controller.clock import Clock
from stageset.controller.keys import ObjectKey, ReportKey
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.metrics import Metrics
from stageset.controller.result import Result
from stageset.controller.setup import Reports, Setup
from stageset.controller.sharding import SHARD_LABEL, unserved_message
from stageset.controller.shared import Shared
from stageset.controller.status import StatusWriter
from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)


class Unserved:
    """Objects whose shard key no shard serves, as the unserved watches see them."""

    def __init__(self, *, client: KubeClient, resources: dict[str, Resource], shard_keys: tuple[str, ...],
                 clock: Clock, metrics: Metrics, runbook_base_url: str):
        self._client = client
        self._resources = resources
        self._keys = shard_keys
        self._clock = clock
        self._runbooks = runbook_base_url
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, KubeObject] = {}
        for kind in resources:
            metrics.unserved.labels(kind).set_function(self._counter(kind))

    def _counter(self, kind: str) -> Callable[[], float]:
        return lambda: self.count(kind)

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for key in self._objects if key.kind == kind)

    def handle(self, kind: str, event: str, obj: KubeObject) -> ReportKey | None:
        """A watch event; returns the report to write, if one is due."""
        metadata = obj.get("metadata", {})
        key = ObjectKey.of(obj, kind=kind)
        with self._lock:
            if event == "DELETED":
                self._objects.pop(key, None)
                return None
            before = self._objects.get(key)
            self._objects[key] = obj
        label = (metadata.get("labels") or {}).get(SHARD_LABEL)
        if before is None or (before.get("metadata", {}).get("labels") or {}).get(SHARD_LABEL) != label:
            log.warning("%s %s/%s carries %s=%s, which no shard serves (shards: %s)", kind, key.namespace,
                        key.name, SHARD_LABEL, label, ", ".join(self._keys) or "none")
        return ReportKey(kind, key.namespace, key.name)

    def run(self, key: ReportKey) -> Result:
        """One report, as a worker runs it: an API failure is retried with the key's backoff."""
        try:
            self.report(key)
        except Exception as error:  # never lose a worker to a report
            log.warning("reporting %s/%s as served by no shard failed: %s", key.namespace, key.name, error)
            return Result(backoff=True)
        return Result()

    def report(self, key: ReportKey) -> None:
        """Write ``NoShard`` on the object (raises on an API failure)."""
        kind = key.kind
        with self._lock:
            obj = self._objects.get(key.object)
        if obj is None:
            return  # relabelled to a served key, or deleted, meanwhile
        label = str((obj.get("metadata", {}).get("labels") or {}).get(SHARD_LABEL, ""))
        message = unserved_message(kind=kind, key=label, shard_keys=self._keys)
        resource = self._resources[kind]
        if kind == "StageSet":
            self._conclude(StatusWriter(client=self._client, resource=resource, obj=obj, model=StageSetStatus,
                                        clock=self._clock, runbook_base_url=self._runbooks), message)
        else:
            self._conclude(StatusWriter(client=self._client, resource=resource, obj=obj,
                                        model=GitRepositoryStatus, clock=self._clock,
                                        runbook_base_url=self._runbooks), message)

    @staticmethod
    def _conclude(writer: StatusWriter[Any], message: str) -> None:
        writer.conclude(ready=False, reason=Reason.NO_SHARD, stalled=True, message=message)


def setup(shared: Shared) -> Setup:
    """With ``--shard-keys`` on a label shard, the report of StageSets and GitRepositories no shard
    serves (its reports run in the StageSet pool); nothing otherwise."""
    settings = shared.settings
    selector, shard_keys = settings.watch_label_selector, settings.shard_keys
    if shard_keys is None or selector is None:
        return Setup()
    resources = (STAGESETS, GITREPOSITORIES)
    unserved = Unserved(client=shared.clients.client(), shard_keys=shard_keys,
                        resources={r.kind: r for r in resources}, clock=shared.clock, metrics=shared.metrics,
                        runbook_base_url=settings.runbook_base_url)
    return Setup(reports=Reports(resources=resources, label_selector=str(selector.unserved(shard_keys)),
                                 handle=unserved.handle, run=unserved.run, pool=STAGESETS.kind))
