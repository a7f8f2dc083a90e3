"""Watches of Flux's source kinds, started for the kinds the apiserver serves — also ones installed later.

Identity: the controller's own (list/watch of ``source.toolkit.fluxcd.io`` kinds, which the chart's
ClusterRole grants; RBAC rules for a group nobody serves grant nothing and fail nothing, so the
chart installs the same with or without Flux).  What the watches see is used **only as a
trigger**: which StageSets to requeue.  What a stage uses is read again as the tenant
(:mod:`stageset.controller.render.reads`).

Which kinds: :data:`~stageset.controller.sourcekinds.FLUX_KINDS`, each at the first served version
of :data:`~stageset.controller.sourcekinds.FLUX_VERSIONS`, found through discovery (allowed to every
authenticated user, and namespace-independent, so a sharded release finds them too).  Discovery
is asked at start, every :attr:`FluxWatches.interval` seconds, and at once when a StageSet names a
Flux kind no watch covers yet (:meth:`FluxWatches.poke`, at most every :data:`POKE_SPACING`
seconds): a CRD installed after the controller started is watched within seconds of a StageSet
event that needs it, or within the interval.
A kind that stops being served has its watches stopped.  With ``watch_namespaces`` there is one
namespace-scoped watch per namespace, as for our own kinds.

What triggers (:func:`~stageset.controller.sourcekinds.trigger`): a change of the artifact (URL,
digest, revision) or of the Ready condition — never a status write that changes neither.  Each
change calls ``on_change`` with the object's key and, for an ``ExternalArtifact``, its producer's
key (from ``spec.sourceRef``), so StageSets naming either are requeued.  No artifact URL is ever
polled: a new artifact is a watch event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from stageset.controller.sourcekinds import (
    EXTERNAL_ARTIFACT,
    FLUX_GROUP,
    FLUX_KINDS,
    FLUX_VERSIONS,
    SourceObject,
    group_of,
    trigger,
)
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

log = logging.getLogger(__name__)

OnChange = Callable[[set[SourceObject]], None]
POKE_SPACING = 2.0
"""Seconds between two looks at discovery asked for by pokes (a CRD just installed, or none)."""


def served_kinds(client: KubeClient) -> dict[str, str]:
    """Flux source kind -> the version to watch it at (the first of FLUX_VERSIONS serving it)."""
    found: dict[str, str] = {}
    for version in FLUX_VERSIONS:
        try:
            resources = client.get(f"/apis/{FLUX_GROUP}/{version}").get("resources") or []
        except ApiError as error:
            if error.not_found:
                continue
            raise
        for resource in resources:
            kind = resource.get("kind")
            if kind in FLUX_KINDS and "/" not in str(resource.get("name")) and kind not in found \
                    and "watch" in (resource.get("verbs") or []):
                found[str(kind)] = version
    return found


def keys_of(obj: KubeObject, kind: str) -> set[SourceObject]:
    """The object's own key and, for an ExternalArtifact, the producer it points back at."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    keys = {SourceObject(FLUX_GROUP, kind, namespace, name)}
    if kind == EXTERNAL_ARTIFACT:
        ref = (obj.get("spec") or {}).get("sourceRef") or {}
        if isinstance(ref, dict) and ref.get("kind") and ref.get("name"):
            keys.add(SourceObject(group_of(ref.get("apiVersion")), str(ref["kind"]),
                                  str(ref.get("namespace") or namespace), str(ref["name"])))
    return keys


class FluxWatches:
    def __init__(self, *, client: KubeClient, namespaces: tuple[str, ...] | None, stop: threading.Event,
                 on_change: OnChange, resync: float, interval: float = 30.0):
        self._client = client
        self._namespaces = namespaces or (None,)
        self._stop = stop
        self._on_change = on_change
        self._resync = resync
        self.interval = interval
        self._poke = threading.Event()
        self._lock = threading.Lock()
        self._watching: dict[str, tuple[str, threading.Event]] = {}  # kind -> (version, its stop)
        self._seen: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._keys: dict[tuple[str, str, str], set[SourceObject]] = {}
        self.discoveries = 0

    def watched(self) -> dict[str, str]:
        with self._lock:
            return {kind: version for kind, (version, _) in self._watching.items()}

    def poke(self, kind: str) -> None:
        """A StageSet names ``kind``: look for it now if no watch covers it."""
        with self._lock:
            covered = kind in self._watching
        if not covered:
            self._poke.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="flux-discovery", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while not self._stop.is_set():
            refreshed = time.monotonic()
            try:
                self.refresh()
            except Exception as error:  # discovery is retried; the watches keep running
                log.debug("discovery of %s failed: %s", FLUX_GROUP, error)
            # Until the interval is over, or a poke — at most one poke-driven look every few
            # seconds, however many StageSets name a kind nobody serves.
            while not self._stop.wait(0.25):
                now = time.monotonic()
                if now >= refreshed + self.interval or (
                        self._poke.is_set() and now >= refreshed + POKE_SPACING):
                    break
            self._poke.clear()
        with self._lock:
            for _, stop in self._watching.values():
                stop.set()

    def refresh(self) -> None:
        """Start watches for newly served kinds, stop those of kinds no longer served."""
        served = served_kinds(self._client)
        with self._lock:
            self.discoveries += 1
            for kind, (version, stop) in list(self._watching.items()):
                if served.get(kind) != version:
                    stop.set()
                    del self._watching[kind]
                    log.info("no longer watching %s.%s/%s", kind, FLUX_GROUP, version)
            started = [(kind, version) for kind, version in served.items() if kind not in self._watching]
            for kind, version in started:
                stop = threading.Event()
                self._watching[kind] = (version, stop)
        for kind, version in started:
            log.info("watching %s.%s/%s (a source kind StageSets may name)", kind, FLUX_GROUP, version)
            resource = Resource(group=FLUX_GROUP, version=version, kind=kind, plural=FLUX_KINDS[kind],
                                namespaced=True)
            for namespace in self._namespaces:
                Reflector(client=self._client, resource=resource, namespace=namespace,
                          handler=self._handler(kind), stop=self._watching[kind][1],
                          resync=self._resync).start()

    def _handler(self, kind: str) -> Callable[[str, KubeObject], None]:
        def handle(event: str, obj: KubeObject) -> None:
            meta = obj.get("metadata") or {}
            key = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            with self._lock:
                if event == "DELETED":
                    self._seen.pop(key, None)
                    keys = self._keys.pop(key, None) or keys_of(obj, kind)
                    changed = True
                else:
                    now = trigger(obj)
                    changed = self._seen.get(key) != now
                    self._seen[key] = now
                    keys = keys_of(obj, kind) | self._keys.get(key, set())
                    self._keys[key] = keys_of(obj, kind)
            if changed:
                self._on_change(keys)
        return handle
