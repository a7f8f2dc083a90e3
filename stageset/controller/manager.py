"""Wires watches, the work queue and the reconcilers into one running controller.

Identity: watches of StageSets and GitRepositories and all status writes use the
controller's own identity; everything a StageSet applies goes through the
per-tenant clients the reconcilers ask :class:`ClientPool` for.

Watches are namespace-scoped when ``watch_namespaces`` is set (one list/watch per
namespace), so a sharded release never needs cluster-wide list rights.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sources import MirrorStore, UrlPolicy
from stageset.api import GROUP, VERSION
from stageset.apply.engine import StageApplier
from stageset.controller.conditions import ready_at_generation
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.events import EventRecorder
from stageset.controller.gitrepository import GitRepositoryReconciler
from stageset.controller.queue import WorkQueue
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset import StageSetReconciler
from stageset.controller.status import requested_at
from stageset.kube.client import ClientPool
from stageset.kube.mapping import Resource, RestMapper
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector, wait_synced

log = logging.getLogger(__name__)

STAGESETS = Resource(group=GROUP, version=VERSION, kind="StageSet", plural="stagesets", namespaced=True)
GITREPOSITORIES = Resource(group=GROUP, version=VERSION, kind="GitRepository",
                           plural="gitrepositories", namespaced=True)
Key = tuple[str, str, str]  # (kind, namespace, name)


def _trigger(obj: KubeObject) -> tuple[Any, Any, bool]:
    """What, when changed, calls for a reconcile (status writes alone do not)."""
    metadata = obj.get("metadata", {})
    return metadata.get("generation"), requested_at(obj), bool(metadata.get("deletionTimestamp"))


class Manager:
    def __init__(self, *, clients: ClientPool, settings: ControllerSettings):
        self._clients = clients
        self._settings = settings
        self.stop = threading.Event()
        self._queue: WorkQueue[Key] = WorkQueue()
        self._lock = threading.Lock()
        self._objects: dict[Key, KubeObject] = {}
        # Per object: what last triggered a reconcile, and (StageSets) whether it was Ready.
        self._seen: dict[Key, tuple[tuple[Any, Any, bool], bool]] = {}
        admin = clients.client()
        policy = UrlPolicy(allow_http=settings.allow_insecure_sources,
                           allow_file=settings.allow_local_sources)
        self._store = MirrorStore(root=settings.mirror_dir, policy=policy, limits=settings.source_limits,
                                  max_bytes=settings.mirror_max_bytes)
        self._git = GitRepositoryReconciler(clients=clients, store=self._store,
                                            resource=GITREPOSITORIES, on_revision=self._revision_changed)
        self._index = DependencyIndex()
        self._stagesets = StageSetReconciler(
            clients=clients, store=self._store, applier=StageApplier(mapper=RestMapper(admin)),
            resource=STAGESETS, source_resource=GITREPOSITORIES, settings=settings,
            events=EventRecorder(admin), index=self._index, stop=self.stop)
        self._reflectors: list[Reflector] = []
        for namespace in settings.watch_namespaces or (None,):
            for resource in (STAGESETS, GITREPOSITORIES):
                self._reflectors.append(Reflector(client=admin, resource=resource, namespace=namespace,
                                                  handler=self._handler(resource.kind), stop=self.stop))

    # -- events -------------------------------------------------------------------

    def _handler(self, kind: str) -> Any:
        def handle(event: str, obj: KubeObject) -> None:
            metadata = obj.get("metadata", {})
            key: Key = (kind, metadata.get("namespace", ""), metadata.get("name", ""))
            if kind == "StageSet":
                # Before the reconcile is queued, so it sees this object's edges (cycles).
                ref = (key[1], key[2])
                if event == "DELETED":
                    self._index.remove(ref)
                else:
                    self._index.update(ref, [(dep.get("namespace") or key[1], dep.get("name", ""))
                                             for dep in (obj.get("spec") or {}).get("dependsOn") or []])
            with self._lock:
                before = self._seen.get(key)
                if event == "DELETED":
                    self._objects.pop(key, None)
                    self._seen.pop(key, None)
                    now: tuple[tuple[Any, Any, bool], bool] | None = None
                else:
                    self._objects[key] = obj
                    now = (_trigger(obj), ready_at_generation(obj))
                    self._seen[key] = now
            if now is not None and (before is None or before[0] != now[0]):
                self._queue.add(key)
            if kind == "StageSet" and (before is None or now is None or before[1] != now[1]):
                # Event-driven: a dependency turning (un)Ready wakes its dependents at once.
                for namespace, name in self._index.dependents((key[1], key[2])):
                    self._queue.add(("StageSet", namespace, name))
        return handle

    def _revision_changed(self, namespace: str, name: str, revision: str) -> None:
        log.info("GitRepository %s/%s now at %s", namespace, name, revision)
        with self._lock:
            dependents = [key for key, obj in self._objects.items() if key[0] == "StageSet"
                          and any(s.get("sourceRef", {}).get("name") == name
                                  and s.get("sourceRef", {}).get("namespace", key[1]) == namespace
                                  for s in obj.get("spec", {}).get("stages", []))]
        for key in dependents:
            self._queue.add(key)

    # -- workers ------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            try:
                with self._lock:
                    obj = self._objects.get(key)
                if obj is None:
                    continue
                reconciler = self._stagesets if key[0] == "StageSet" else self._git
                started = time.monotonic()
                again = reconciler.reconcile(obj)
                log.debug("reconciled %s %s/%s in %.2fs; next in %s", *key, time.monotonic() - started,
                          "-" if again is None else f"{again:.0f}s")
                if again is not None and not self.stop.is_set():
                    self._queue.add_after(key, again)
            except Exception:
                # Never crash on user data: log, back off, retry.
                log.exception("reconciling %s %s/%s failed", *key)
                self._queue.add_after(key, 10.0)
            finally:
                self._queue.done(key)

    def run(self) -> None:
        """Run until :attr:`stop` is set."""
        for reflector in self._reflectors:
            reflector.start()
        if not wait_synced(self._reflectors, timeout=60):
            log.warning("caches not synced after 60s; starting workers anyway")
        workers = [threading.Thread(target=self._work, name=f"worker-{i}", daemon=True)
                   for i in range(self._settings.workers)]
        for worker in workers:
            worker.start()
        log.info("controller started: %d workers, namespaces: %s", len(workers),
                 ", ".join(self._settings.watch_namespaces or ("all",)))
        self.stop.wait()
        self._queue.shutdown()
        for worker in workers:
            worker.join(timeout=30)
