"""Runs the controller: watches, the work queue and the reconcilers (built in :mod:`.wiring`).

Identity: watches of StageSets and GitRepositories and all status writes use the
controller's own identity; everything a StageSet applies goes through the
per-tenant clients the reconcilers ask :class:`ClientPool` for.

Watches are namespace-scoped when ``watch_namespaces`` is set (one list/watch per
namespace), so a sharded release never needs cluster-wide list rights.  With
``watch_label_selector`` (label shards, :mod:`stageset.controller.sharding`) the same lists and
watches of StageSets and GitRepositories carry the selector: the apiserver sends only this shard's
objects, and an object relabelled away arrives as ``DELETED`` — forgotten here, never torn down
(teardown follows a ``deletionTimestamp`` only).  The main shard told ``shard_keys`` also watches
the objects no shard serves and reports them (:mod:`stageset.controller.unserved`).

Objects in the watch cache are read-only: each reconcile works on its own copy, and its own
writes reach the manager as values (``on_write``), kept until the watch has caught up with them.

Flux sources: :class:`~stageset.controller.fluxwatch.FluxWatches` watches the Flux source kinds the
apiserver serves (as the controller, for triggers only); artifact downloads are jobs
(``Artifact`` keys) of the source pool (:mod:`stageset.controller.artifacts`).  A source whose
artifact or readiness changes — ours or Flux's — requeues exactly the StageSets whose stages name
it (:func:`~stageset.controller.sourcekinds.referenced`).

Observability hooks live here once for both kinds: every watch event updates the object's
metrics (and a deletion removes them), every reconcile runs with its log fields bound
(:mod:`stageset.controller.logs`), is counted and timed (:mod:`stageset.controller.metrics`),
and a Ready condition that turns False is told as a Warning event.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from sources import MirrorStore, UrlPolicy
from sources.addresses import AddressGuard
from sources.artifacts import ArtifactStore
from stageset.api import GROUP, VERSION
from stageset.api.release import ANNOTATION_PROMOTE, ANNOTATION_UPDATE_NOW
from stageset.api.vocabulary import NO_TRANSITION_EVENT, EventType, Reason
from stageset.controller import logs
from stageset.controller.artifacts import JOB_KIND, ArtifactFetcher
from stageset.controller.clock import Clock, system_clock
from stageset.controller.conditions import ready_at_generation
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.events import EventRecorder, ready_condition, ready_transition
from stageset.controller.fluxwatch import FluxWatches
from stageset.controller.handoff import ShardHandoff
from stageset.controller.health import Lifecycle
from stageset.controller.memory import Trimmer
from stageset.controller.metrics import Metrics
from stageset.controller.queue import Backoff, WorkQueue
from stageset.controller.redact import REGISTRY, Redactor
from stageset.controller.result import Result, TerminalError
from stageset.controller.settings import ControllerSettings
from stageset.controller.sourcekinds import FLUX_GROUP, OUR_GROUP, SourceObject, referenced, trigger
from stageset.controller.status import requested_at
from stageset.controller.unserved import KIND_PREFIX as UNSERVED
from stageset.controller.unserved import Unserved
from stageset.controller.wiring import Shared, Store, reconcilers
from stageset.kube.client import ClientPool, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector, wait_synced
from stageset.kube.watches import WatchPool

log = logging.getLogger(__name__)

STAGESETS = Resource(group=GROUP, version=VERSION, kind="StageSet", plural="stagesets", namespaced=True)
GITREPOSITORIES = Resource(group=GROUP, version=VERSION, kind="GitRepository",
                           plural="gitrepositories", namespaced=True)
NAMESPACES = Resource(group="", version="v1", kind="Namespace", plural="namespaces", namespaced=False)
Key = tuple[str, str, str]  # (kind, namespace, name)


def _namespace(key: Key) -> str:
    return key[1]


class Reconciler(Protocol):
    def reconcile(self, raw: KubeObject) -> Result: ...


def _version(obj: KubeObject) -> int | None:
    """``metadata.resourceVersion`` as a number (etcd's revisions are; ``None`` otherwise).
    Compared only to tell whether the watch cache has seen one of our own writes yet."""
    value = str(obj.get("metadata", {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else None


def wait_until_set(event: threading.Event) -> None:
    """Block until ``event`` is set, waking twice a second.

    A signal the kernel delivers to another thread runs its Python handler only when the main
    thread next runs bytecode; a wait without a timeout may never return to let it (SIGTERM was
    seen to go unanswered that way)."""
    while not event.wait(0.5):
        pass


def _as_dependency(obj: KubeObject) -> tuple[Any, ...]:
    """What a dependent StageSet waits on: Ready at the generation, the revision applied
    (``minVersion``), and whether an update window holds a new revision back."""
    status = obj.get("status") or {}
    held = bool((status.get("pendingUpdate") or {}).get("revisions"))
    return ready_at_generation(obj), status.get("lastAppliedRevision"), held


def _trigger(obj: KubeObject) -> tuple[Any, Any, bool, Any, Any]:
    """What, when changed, calls for a reconcile (status writes alone do not); a promote or
    update-now request is an annotation, so it is named here."""
    metadata = obj.get("metadata", {})
    annotations = metadata.get("annotations") or {}
    return (metadata.get("generation"), requested_at(obj), bool(metadata.get("deletionTimestamp")),
            annotations.get(ANNOTATION_PROMOTE), annotations.get(ANNOTATION_UPDATE_NOW))


def _pack(obj: KubeObject) -> bytes:
    """An object as the watch cache keeps it: compact JSON, compressed (zlib level 1: about 18 us
    for a StageSet of 1 KB, a third of its size; 5000 StageSets and their GitRepositories keep
    tens of MiB less)."""
    return zlib.compress(orjson.dumps(obj), 1)


def _unpack(raw: bytes) -> KubeObject:
    """A fresh, private copy of a cached object (about 4 us to decompress)."""
    parsed: KubeObject = orjson.loads(zlib.decompress(raw))
    return parsed


class Manager:
    def __init__(self, *, clients: ClientPool, settings: ControllerSettings, store: Store | None = None,
                 clock: Clock = system_clock, metrics: Metrics | None = None,
                 lifecycle: Callable[[threading.Event], Lifecycle] | None = None):
        self._clients = clients
        self._settings = settings
        self.stop = threading.Event()
        self.metrics = metrics or Metrics()
        clients.observe(self.metrics.request)
        # Probes, start-up waits and leader election (controller/health.py); None: none of them.
        self.lifecycle = lifecycle(self.stop) if lifecycle else None
        if self.lifecycle is not None and self.lifecycle.elector is not None:
            leading = self.lifecycle.elector.leading
            self.metrics.leader.set_function(lambda: 1 if leading.is_set() else 0)
        # Separate pools for sources and StageSets, each capped per namespace: slow Git servers
        # cannot hold up applying, and one tenant cannot hold every worker of a pool.
        backoff = Backoff(base=settings.backoff_base, cap=settings.backoff_cap)
        self._pools = {kind: (WorkQueue[Key](backoff=backoff, shard=_namespace,
                                             max_per_shard=settings.namespace_cap(size)), size)
                       for kind, size in (("StageSet", settings.workers),
                                          ("GitRepository", settings.source_workers))}
        for kind, (queue, size) in self._pools.items():
            self.metrics.pool(kind, workers=size)
            queue.observer = self.metrics.queue(kind, depth=queue.__len__,
                                                unfinished=queue.unfinished_seconds,
                                                longest=queue.longest_running_seconds)
        self.trimmer = Trimmer()
        self._lock = threading.Lock()
        # The watch cache, each object as compressed compact JSON (_pack): a parsed StageSet costs
        # several times its JSON in memory, and the cache holds every one; a reconcile gets a
        # freshly parsed copy.
        self._objects: dict[Key, bytes] = {}
        # StageSets by the sources they name, and back (the watch handler keeps both): a source's
        # change requeues its StageSets without a scan of the cache.
        self._by_source: dict[SourceObject, set[Key]] = {}
        self._sources_of: dict[Key, set[SourceObject]] = {}
        # Per object: what last triggered a reconcile, and (StageSets) what its dependents wait on.
        self._seen: dict[Key, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
        # Per object: the status our last reconcile left, at the resourceVersion it made, until
        # the watch catches up (see :meth:`_with_own_status`).
        self._written: dict[Key, tuple[int, Any]] = {}
        # Per GitRepository: its artifact and readiness as last seen (a change wakes its StageSets).
        self._source_states: dict[Key, tuple[Any, ...]] = {}
        admin = clients.client()
        self._store: Store = store or self._mirror_store(settings)
        if isinstance(self._store, MirrorStore):
            self.metrics.mirror(self._store.disk_usage)
        self.events = EventRecorder(admin, clock=clock)
        self._index = DependencyIndex()
        self.artifacts = ArtifactFetcher(
            store=ArtifactStore(root=settings.artifacts.directory, limits=settings.artifacts.limits,
                                guard=AddressGuard(allow_insecure=settings.allow_insecure_sources),
                                max_bytes=settings.artifacts.max_bytes,
                                max_tenant_bytes=settings.artifacts.max_tenant_bytes),
            timeout=settings.artifacts.timeout, wake=self._wake, stop=self.stop,
            schedule=lambda namespace, job: self._enqueue((JOB_KIND, namespace, job)))
        self.flux = FluxWatches(client=admin, namespaces=settings.watch_namespaces, stop=self.stop,
                                on_change=self._wake, resync=settings.resync_period,
                                interval=settings.artifacts.discovery_interval)
        # Waiting stages watch what they wait for (each watch as the stage's identity), bounded.
        self.watches = WatchPool(capacity=settings.max_readiness_watches,
                                 on_refused=self.metrics.readiness_watches_refused.inc) \
            if settings.max_readiness_watches > 0 else None
        if self.watches is not None:
            self.metrics.readiness_watches.set_function(self.watches.__len__)
        shared = Shared(clients=clients, settings=settings, events=self.events, metrics=self.metrics,
                        clock=clock, on_write=self._wrote, watches=self.watches,
                        wake=lambda namespace, name: self._enqueue(("StageSet", namespace, name)))
        wired = reconcilers(shared,
                            store=self._store, stagesets=STAGESETS, gitrepositories=GITREPOSITORIES,
                            index=self._index, stop=self.stop, on_revision=self._revision_changed,
                            artifacts=self.artifacts)
        self._stagesets, self._git = wired.stagesets, wired.gitrepositories
        self._reflectors: list[Reflector] = []
        selector = settings.watch_label_selector
        for namespace in settings.watch_namespaces or (None,):
            for resource in (STAGESETS, GITREPOSITORIES):
                self._reflectors.append(Reflector(client=admin, resource=resource, namespace=namespace,
                                                  handler=self._handler(resource.kind), stop=self.stop,
                                                  resync=settings.resync_period,
                                                  label_selector=str(selector) if selector else None))
        # The main shard's report of objects no shard serves (not part of "synced": a report only).
        self.unserved: Unserved | None = None
        self._unserved_watches: list[Reflector] = []
        if settings.shard_keys is not None and selector is not None:
            self.unserved = Unserved(client=admin, shard_keys=settings.shard_keys,
                                     resources={"StageSet": STAGESETS, "GitRepository": GITREPOSITORIES},
                                     clock=clock, metrics=self.metrics,
                                     runbook_base_url=settings.runbook_base_url)
            for namespace in settings.watch_namespaces or (None,):
                for resource in (STAGESETS, GITREPOSITORIES):
                    self._unserved_watches.append(Reflector(
                        client=admin, resource=resource, namespace=namespace, stop=self.stop,
                        handler=self._unserved_handler(resource.kind), resync=settings.resync_period,
                        label_selector=str(selector.unserved(settings.shard_keys))))
        # The metrics' `tenant` label (controller/tenants.py): Namespaces, metadata only, for a
        # cluster-wide release (one bound per namespace may not list Namespaces: no tenant label).
        # A report only, like the unserved watches: not part of "synced".
        if settings.watch_namespaces is None:
            self._unserved_watches.append(Reflector(
                client=admin, resource=NAMESPACES, namespace=None, handler=self.metrics.tenants.handle,
                stop=self.stop, resync=settings.resync_period, metadata_only=True))
        self.metrics.caches_synced.set_function(lambda: all(r.synced.is_set() for r in self._reflectors))
        # Label shards: one writer per object across shards (controller/handoff.py).
        self.handoff = None if selector is None else ShardHandoff(
            client=admin, selector=selector, namespace=settings.shard_handoff_namespace,
            timeout=settings.shard_handoff_timeout, metrics=self.metrics, stop=self.stop,
            synced=lambda: all(r.synced.is_set() for r in self._reflectors),
            leading=lambda: self.lifecycle is None or self.lifecycle.elector is None or
            self.lifecycle.elector.leading.is_set())

    @staticmethod
    def _mirror_store(settings: ControllerSettings) -> MirrorStore:
        policy = UrlPolicy(allow_http=settings.allow_insecure_sources,
                           allow_file=settings.allow_local_sources)
        return MirrorStore(root=settings.mirror_dir, policy=policy, limits=settings.source_limits,
                           max_bytes=settings.mirror_max_bytes)

    # -- events -------------------------------------------------------------------

    def _handler(self, kind: str) -> Any:
        def handle(event: str, obj: KubeObject) -> None:
            metadata = obj.get("metadata", {})
            # Never read by a reconcile, and often the largest part of an object: the cache keeps
            # every StageSet, so it is dropped as it arrives (as controller-runtime's
            # TransformStripManagedFields does).  ``obj`` is fresh from the watch, not yet shared.
            metadata.pop("managedFields", None)
            key: Key = (kind, metadata.get("namespace", ""), metadata.get("name", ""))
            if self.handoff is not None:
                self.handoff.observe(key, event, obj, known=key in self._objects)
            if event == "DELETED" and not metadata.get("deletionTimestamp") and \
                    self._settings.watch_label_selector is not None:
                # Gone from this shard's watch: deleted (without a finalizer of ours) or relabelled
                # to another shard.  Either way forgotten; nothing is torn down.
                log.info("%s %s/%s left this shard's watch (deleted, or its labels no longer match)", *key)
            if kind == "StageSet":
                # Before the reconcile is queued, so it sees this object's edges (cycles).
                ref = (key[1], key[2])
                if event == "DELETED":
                    self._index.remove(ref)
                    self._stagesets.forget(key[1], key[2])
                else:
                    self._index.update(ref, self._dependencies(key[1], obj))
                    self._poke_flux(obj)
            if event == "DELETED":
                self.metrics.forget(key)
                self.events.forget(key[1], key[2])
            else:
                self.metrics.observe(key, obj)
            with self._lock:
                before = self._seen.get(key)
                if event == "DELETED" or ((written := self._written.get(key)) and \
                        written[0] <= (_version(obj) or 0)):
                    self._written.pop(key, None)  # the cache has caught up with our own writes
                if event == "DELETED":
                    self._objects.pop(key, None)
                    self._seen.pop(key, None)
                    REGISTRY.drop(key)  # its Secret values leave the log filter with it
                    now: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None
                else:
                    self._objects[key] = _pack(obj)
                    now = (_trigger(obj), _as_dependency(obj))
                    self._seen[key] = now
                if kind == "StageSet":
                    self._index_sources(key, None if event == "DELETED" else
                                        referenced(obj, self._settings.default_source_kind))
            if now is not None and (before is None or before[0] != now[0]):
                self._enqueue(key)
            if kind == "GitRepository":
                self._source_changed(key, None if event == "DELETED" else obj)
            if kind == "StageSet" and (before is None or now is None or before[1] != now[1]):
                # Event-driven: a dependency turning (un)Ready, applying a new revision or releasing
                # a held one wakes its dependents at once.
                for namespace, name in self._index.dependents((key[1], key[2])):
                    self._enqueue(("StageSet", namespace, name))
        return handle

    def _unserved_handler(self, kind: str) -> Any:
        def handle(event: str, obj: KubeObject) -> None:
            assert self.unserved is not None
            if (key := self.unserved.handle(kind, event, obj)) is not None:
                self._enqueue(key)
        return handle

    def _dependencies(self, namespace: str, obj: KubeObject) -> list[tuple[str, str]]:
        found = [(dep.get("namespace") or namespace, dep.get("name", ""))
                 for dep in (obj.get("spec") or {}).get("dependsOn") or []]
        if self._settings.no_cross_namespace_refs:
            # Refused references are no edges: cycles never span namespaces on such a controller.
            found = [dep for dep in found if dep[0] == namespace]
        return found

    def _revision_changed(self, namespace: str, name: str, revision: str) -> None:
        log.info("GitRepository %s/%s now at %s", namespace, name, revision)
        self._wake({SourceObject(OUR_GROUP, "GitRepository", namespace, name)})

    def _wake(self, sources: set[SourceObject]) -> None:
        """Requeue exactly the StageSets whose stages name one of ``sources``."""
        with self._lock:
            dependents = sorted({key for source in sources for key in self._by_source.get(source, ())})
        for key in dependents:
            self._enqueue(key)

    def _index_sources(self, key: Key, sources: set[SourceObject] | None) -> None:
        """Record which sources StageSet ``key`` names (``None``: it is gone), so a source's change
        finds its StageSets without scanning every one (lock held)."""
        for source in self._sources_of.pop(key, set()) - (sources or set()):
            named = self._by_source.get(source)
            if named is not None:
                named.discard(key)
                if not named:
                    del self._by_source[source]
        if sources:
            self._sources_of[key] = sources
            for source in sources:
                self._by_source.setdefault(source, set()).add(key)

    def _source_changed(self, key: Key, obj: KubeObject | None) -> None:
        """Our GitRepository's artifact or readiness changed — a failure too: the StageSets naming it
        say so now rather than at their next retry."""
        state = None if obj is None else trigger(obj)
        with self._lock:
            before = self._source_states.pop(key, None)
            if state is not None:
                self._source_states[key] = state
        if before is not None and before != state:
            self._wake({SourceObject(OUR_GROUP, "GitRepository", key[1], key[2])})

    def _poke_flux(self, obj: KubeObject) -> None:
        """A StageSet naming a Flux kind no watch covers yet: look for it now (its CRD may be new)."""
        for source in referenced(obj, self._settings.default_source_kind):
            if source.group == FLUX_GROUP:
                self.flux.poke(source.kind)
            elif source.group != OUR_GROUP:
                self.flux.poke("ExternalArtifact")

    # -- workers ------------------------------------------------------------------

    def _queue(self, key: Key) -> WorkQueue[Key]:
        # Artifact downloads share the source pool (and its per-namespace cap) with Git fetches;
        # reports of unserved objects go to the StageSet pool.
        if key[0].startswith(UNSERVED):
            return self._pools["StageSet"][0]
        return self._pools["GitRepository" if key[0] == JOB_KIND else key[0]][0]

    def _enqueue(self, key: Key) -> None:
        self._queue(key).add(key)

    def _work(self, queue: WorkQueue[Key]) -> None:
        while True:
            key = queue.get()
            if key is None:
                return
            try:
                if key[0] == JOB_KIND:
                    self._download(queue, key)
                    continue
                if key[0].startswith(UNSERVED):
                    self._report_unserved(queue, key)
                    continue
                with self._lock:
                    raw = self._objects.get(key)
                    obj = None if raw is None else self._with_own_status(key, _unpack(raw))
                if obj is not None:
                    self._reconcile(queue, key, obj)
            finally:
                queue.done(key)
                # Not kept alive while this worker waits for its next key: a StageSet's object can
                # be megabytes (its status), and a deleted one's would outlive it.
                raw = obj = None
                # Give the pass's freed memory back to the kernel (controller/memory.py).
                self.trimmer.after_work(idle=len(queue) == 0)

    def _download(self, queue: WorkQueue[Key], key: Key) -> None:
        """One artifact download job; a transient failure is retried with the key's backoff."""
        try:
            result = self.artifacts.run(key[1], key[2])
        except Exception:  # never lose a worker to a download
            log.exception("artifact download %s/%s failed", key[1], key[2])
            queue.add_rate_limited(key)
            return
        if result.backoff:
            queue.add_rate_limited(key)
        else:
            queue.forget(key)

    def _report_unserved(self, queue: WorkQueue[Key], key: Key) -> None:
        assert self.unserved is not None
        try:
            self.unserved.report(key)
        except Exception as error:  # never lose a worker to a report; retried with backoff
            log.warning("reporting %s/%s as served by no shard failed: %s", key[1], key[2], error)
            queue.add_rate_limited(key)
            return
        queue.forget(key)

    def _with_own_status(self, key: Key, obj: KubeObject) -> KubeObject:
        """``obj`` from the watch cache, with the status our last reconcile of it wrote if the
        cache has not seen that write yet (its watch event can lag behind the next reconcile under
        load).  Only the controller writes status, so its last write is the truth; a reconcile
        that read an older status would re-announce progress and write it again.  The spec and
        metadata stay the cache's: a change there arrives as its own event."""
        written = self._written.get(key)
        version = _version(obj)
        if written is None or version is None or version >= written[0]:
            return obj
        return {**obj, "status": copy.deepcopy(written[1])}

    def _wrote(self, obj: KubeObject) -> None:
        """A reconcile wrote ``obj`` (its status, record or finalizer): remember the status it left,
        at the version the write made, until the watch cache shows it."""
        version = _version(obj)
        meta = obj.get("metadata") or {}
        key: Key = (str(obj.get("kind")), str(meta.get("namespace", "")), str(meta.get("name", "")))
        if version is None:
            return
        with self._lock:
            if key in self._objects:  # not deleted meanwhile
                self._written[key] = (version, copy.deepcopy(obj.get("status")))

    def _latest(self, key: Key, obj: KubeObject) -> KubeObject:
        """The object as the cache and our own writes know it now (``obj`` once it is gone)."""
        with self._lock:
            cached = self._objects.get(key)
            return obj if cached is None else self._with_own_status(key, _unpack(cached))

    def _reconcile(self, queue: WorkQueue[Key], key: Key, obj: KubeObject) -> None:
        before = dict(ready_condition(obj) or {}) or None
        self.metrics.working(key[0], 1)
        started = time.monotonic()
        outcome = "error"
        try:
            with logs.bind(**{key[0].lower(): f"{key[1]}/{key[2]}"}, reconcileID=logs.new_reconcile_id()):
                outcome = self._reconcile_once(queue, key, obj)
        finally:
            self.metrics.working(key[0], -1)
            self.metrics.reconciled(key, result=outcome, seconds=time.monotonic() - started)
            self._tell_transition(key, obj, before)

    def _tell_transition(self, key: Key, obj: KubeObject, before: dict[str, str] | None) -> None:
        """A Warning event (reason: Ready's) when this reconcile turned Ready False."""
        after = ready_condition(self._latest(key, obj))
        if after is None or not ready_transition(before, after):
            return
        try:
            reason = Reason(after.get("reason", ""))
        except ValueError:
            return
        if reason in NO_TRANSITION_EVENT:
            return  # a release held as asked, or a rollback the reconciler told itself
        self.events.emit(obj, type_=EventType.WARNING, reason=reason, message=str(after.get("message", "")),
                         redact=Redactor(REGISTRY.of(key)))

    def _reconcile_once(self, queue: WorkQueue[Key], key: Key, obj: KubeObject) -> str:
        """One reconcile; returns controller-runtime's result word for the metrics."""
        reconciler: Reconciler = self._stagesets if key[0] == "StageSet" else self._git
        started = time.monotonic()
        try:
            result = reconciler.reconcile(obj) if self.handoff is None else \
                self.handoff.run(key, obj, reconciler.reconcile)
        except TerminalError as error:
            log.warning("%s %s/%s: %s; not retried until it changes", *key, error)
            queue.forget(key)
            return "terminal"
        except UnreachableError as error:
            # The apiserver itself cannot be reached (it restarts, the network drops): no bug, no
            # traceback; retried with the key's backoff.
            failures = queue.failures(key)
            delay = queue.add_rate_limited(key)
            log.log(logging.WARNING if failures == 0 else logging.DEBUG,
                    "reconciling %s %s/%s: the apiserver cannot be reached (%s); retrying in %.1fs",
                    *key, error.why, delay)
            return "error"
        except Exception as error:
            # Never crash on user data: log (the traceback once per failure streak), back off.
            failures = queue.failures(key)
            delay = queue.add_rate_limited(key, at_least=getattr(error, "retry_after", None) or 0.0)
            if failures == 0:
                log.exception("reconciling %s %s/%s failed; retrying in %.1fs", *key, delay)
            else:
                log.warning("reconciling %s %s/%s failed again (%d in a row): %s: %s; retrying in %.1fs",
                            *key, failures + 1, type(error).__name__, error, delay)
            return "error"
        elapsed = time.monotonic() - started
        if result.backoff:
            # The failure is in the object's status; one log line per failure streak.
            failures = queue.failures(key)
            delay = queue.add_rate_limited(key, at_most=result.requeue_after)
            log.log(logging.WARNING if failures == 0 else logging.DEBUG,
                    "reconciling %s %s/%s failed (see its status); retrying in %.1fs", *key, delay)
            return "error"
        queue.forget(key)
        log.debug("reconciled %s %s/%s in %.2fs; next in %s", *key, elapsed,
                  "-" if result.requeue_after is None else f"{result.requeue_after:.0f}s")
        if result.requeue_after is not None and not self.stop.is_set():
            queue.add_after(key, result.requeue_after)
        return "success" if result.requeue_after is None else "requeue_after"

    def run(self) -> None:
        """Run until :attr:`stop` is set."""
        if self.lifecycle:
            self.lifecycle.start()
        for reflector in (*self._reflectors, *self._unserved_watches):
            reflector.start()
        self.flux.start()
        if self.lifecycle:
            # Caches synced, then the Lease held; returns False at once when stopped meanwhile.
            if not self.lifecycle.before_workers([r.synced for r in self._reflectors]):
                for queue, _ in self._pools.values():
                    queue.shutdown()
                self.lifecycle.after_workers()
                return
        elif not wait_synced(self._reflectors, timeout=60, stop=self.stop) and not self.stop.is_set():
            log.warning("caches not synced after 60s; starting workers anyway")
        workers = [threading.Thread(target=self._work, args=(queue,), name=f"{kind.lower()}-worker-{i}",
                                    daemon=True)
                   for kind, (queue, size) in self._pools.items() for i in range(size)]
        for worker in workers:
            worker.start()
        log.info("controller started: %d StageSet and %d source workers (at most %d and %d per namespace), "
                 "namespaces: %s, labels: %s", self._settings.workers, self._settings.source_workers,
                 self._settings.namespace_cap(self._settings.workers),
                 self._settings.namespace_cap(self._settings.source_workers),
                 ", ".join(self._settings.watch_namespaces or ("all",)),
                 self._settings.watch_label_selector or "all")
        wait_until_set(self.stop)
        if self.watches is not None:
            self.watches.close()
        for queue, _ in self._pools.values():
            queue.shutdown()
        # One deadline for all workers: in-flight passes finish or are abandoned within it.
        deadline = time.monotonic() + self._settings.shutdown_timeout
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.lifecycle:
            self.lifecycle.after_workers()
