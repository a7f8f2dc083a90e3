"""The dashboard's watches: one per kind (and namespace), shared by every open page.

Identity: every request is **the user's** (the kubeconfig's own credentials, never an
impersonated one), and every request is a read — ``GET`` lists, watches and discovery, through a
client that refuses any other verb (:class:`ReadOnlyClient`).  So the dashboard shows exactly
what the user may read and changes nothing.

What is watched:

- StageSets in the dashboard's scope (``-n``: one namespace; ``-A``: every namespace), from the
  start, for the list page;
- while a StageSet's page is open (a :class:`Lease` held by its live stream), the kinds its
  inventory, sources and StageSet dependencies name — one :class:`~stageset.kube.watch.Reflector`
  per (kind, namespace), shared by every page that needs it — and the Events about our kinds (and
  the sources' kinds) in the namespaces involved, selected on the server by
  ``involvedObject.apiVersion``.  A watch no page has needed for ``idle`` seconds is stopped.

- while the Sources page is open, every source kind the cluster serves (our GitRepository and
  Flux's source kinds) in the dashboard's scope.

Memory: StageSets are kept whole (the pages show them); of every other object only its kstatus
verdict (and a source's artifact revision) is kept, of a source the Sources page lists only its
URL, ref, artifact revision and time and conditions; Events are kept as short rows, at most
:data:`MAX_EVENTS` per namespace and API version, newest first.

A kind the user may not list in a namespace is not watched: its objects show as ``Unknown`` with
that reason, never guessed.  Changes reach listeners (the pages' streams) on the watch threads;
listeners must hand them over to their own loop quickly.
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from stageset.api import API_VERSION, parse_time
from stageset.api.vocabulary import ConditionStatus, ConditionType, Reason
from stageset.apply.readiness import readiness
from stageset.cli.dashboard.diffs import REVISION_ANNOTATION, EventRow
from stageset.cli.dashboard.links import split_runbook
from stageset.cli.dashboard.views import (
    STAGESET_KIND,
    ObjectState,
    Ref,
    Transition,
    event_scopes,
    refs_to_watch,
    stage_sources,
    transitions,
)
from stageset.cli.inspect import event_row
from stageset.controller.conditions import find_condition, ready_at_generation
from stageset.controller.kinds import FLEETROLLOUTS, STAGESETS
from stageset.controller.sourcekinds import FLUX_GROUP, FLUX_KINDS, FLUX_VERSIONS
from stageset.kube.client import ApiError, KubeClient, QueryValue, UnreachableError
from stageset.kube.mapping import Resource, RestMapper, UnknownKindError
from stageset.kube.types import KubeObject, conditions, metadata
from stageset.kube.watch import DEFAULT_RESYNC, Reflector, object_key

log = logging.getLogger(__name__)

_K = TypeVar("_K")
_V = TypeVar("_V")

EVENTS = Resource(group="", version="v1", kind="Event", plural="events", namespaced=True)
MAX_EVENTS = 2000
ACTIVITY = 100  # transitions kept per StageSet
SYNC_WAIT = 5.0  # how long a page waits for a new watch's first list
RETRY_KINDS = 30.0  # how long "no such kind" (or a failed discovery) stands before asking again


class ReadOnlyClient:
    """The user's client, limited to reads: the dashboard can never write, whatever its code says."""

    def __init__(self, client: KubeClient):
        self._client = client

    def request(self, method: str, path: str, *, query: dict[str, QueryValue] | None = None,
                **_: Any) -> KubeObject:
        if method != "GET":
            raise PermissionError(f"the dashboard is read-only: refused {method} {path}")
        return self._client.request("GET", path, query=query)

    def get(self, path: str) -> KubeObject:
        return self._client.request("GET", path)

    def stream(self, path: str, *, query: dict[str, QueryValue], timeout: float) -> Iterator[KubeObject]:
        return self._client.stream(path, query=query, timeout=timeout)

    @property
    def server(self) -> str:
        return self._client.server


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _normal_time(value: Any) -> str | None:
    """Event timestamps come in seconds and in microseconds: one format, so they sort."""
    parsed = parse_time(str(value)) if value else None
    return parsed.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if parsed else None


# Ready=False reasons that mean "waiting for something else", not "failed".
WAITING_REASONS = frozenset({Reason.DEPENDENCY_NOT_READY, Reason.SOURCE_NOT_READY, Reason.ARTIFACT_NOT_FOUND,
                             Reason.PROGRESSING, Reason.STAGE_PROGRESSING, Reason.SOAKING,
                             Reason.AWAITING_PROMOTION, Reason.UPDATE_DEFERRED, Reason.SUSPENDED})


def failed(obj: KubeObject) -> bool:
    """One of our kinds failed: ``Stalled=True``, or the controller concluded ``Ready=False`` about
    the current generation (no longer ``Reconciling``) for a reason that is not a wait."""
    found = conditions(obj)
    if find_condition(found, ConditionType.STALLED).get("status") == ConditionStatus.TRUE:
        return True
    ready = find_condition(found, ConditionType.READY)
    return (ready.get("status") == ConditionStatus.FALSE
            and ready.get("observedGeneration") == metadata(obj).get("generation")
            and find_condition(found, ConditionType.RECONCILING).get("status") != ConditionStatus.TRUE
            and ready.get("reason") not in WAITING_REASONS)


def object_state(obj: KubeObject) -> ObjectState:
    """kstatus, except for our own kinds: they are Current only once Ready=True was said about
    their current generation (kstatus would call one with no status yet Current), and Failed
    when :func:`failed` (kstatus would call a plain Ready=False InProgress)."""
    revision = ((obj.get("status") or {}).get("artifact") or {}).get("revision")
    artifact = revision if isinstance(revision, str) else None
    if obj.get("apiVersion") == API_VERSION:
        ready = find_condition(conditions(obj), ConditionType.READY)
        if ready_at_generation(obj):
            return ObjectState("Current", "", artifact)
        if not ready:
            return ObjectState("InProgress", "not reconciled yet", artifact)
        message = split_runbook(str(ready.get("message", "")))[0]
        text = f"Ready={ready.get('status', 'Unknown')} {ready.get('reason', '')}: {message}"
        return ObjectState("Failed" if failed(obj) else "InProgress", text.rstrip(": "), artifact)
    verdict = readiness(obj)
    return ObjectState(verdict.status.value, verdict.message, artifact)


def _row(event: KubeObject) -> EventRow:
    shown = event_row(event)
    involved, meta = event.get("involvedObject") or {}, event.get("metadata") or {}
    revision = (meta.get("annotations") or {}).get(REVISION_ANNOTATION)
    return EventRow(uid=str(meta.get("uid") or meta.get("name")),
                    namespace=str(involved.get("namespace") or ""),
                    kind=str(involved.get("kind") or ""), name=str(involved.get("name") or ""),
                    type=str(shown["type"]), reason=str(shown["reason"]), message=str(shown["message"]),
                    last_seen=_normal_time(shown["lastSeen"]), count=int(shown["count"] or 1),
                    revision=str(revision) if revision else None)


WatchKey = tuple[str, str, str]
"""("objects", plural.group, namespace), ("events", apiVersion, namespace) or ("sources",
plural.group, namespace or "" for every namespace)."""

SOURCE_KINDS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((API_VERSION,), "GitRepository"),
    *((tuple(f"{FLUX_GROUP}/{version}" for version in FLUX_VERSIONS), kind) for kind in FLUX_KINDS),
)
"""The Sources page's kinds: ours, and Flux's source kinds (the first version the cluster serves)."""


def _trimmed(obj: KubeObject) -> KubeObject:
    """What the Sources page shows of a source (its URL, ref, artifact and conditions), nothing more."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    artifact = status.get("artifact") or {}
    return {
        "apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {k: spec[k] for k in ("url", "ref", "endpoint", "bucketName", "sourceRef") if k in spec},
        "status": {"conditions": status.get("conditions") or [],
                   "artifact": {k: artifact[k] for k in ("revision", "lastUpdateTime") if k in artifact}},
    }


@dataclass
class _Watch:
    stop: threading.Event
    reflector: Reflector | None = None
    error: str | None = None
    users: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    states: dict[str, ObjectState] = field(default_factory=dict)
    events: dict[str, EventRow] = field(default_factory=dict)
    sources: dict[tuple[str, str], KubeObject] = field(default_factory=dict)

    @property
    def synced(self) -> bool:
        return self.reflector is not None and self.reflector.synced.is_set()


@dataclass(frozen=True)
class Lease:
    """The watches one open page holds."""

    keys: frozenset[WatchKey]


class Hub:
    def __init__(self, *, client: KubeClient, namespace: str | None, idle: float = 60.0,
                 resync: float = DEFAULT_RESYNC):
        # Typed as the client it wraps: the reflectors and the REST mapper only read.
        self._client = cast("KubeClient", ReadOnlyClient(client))
        self.namespace = namespace
        self._idle = idle
        self._resync = resync
        self._mapper = RestMapper(self._client)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._stagesets: dict[tuple[str, str], KubeObject] = {}
        self._activity: dict[tuple[str, str], collections.deque[Transition]] = {}
        self._watches: dict[WatchKey, _Watch] = {}
        # A kind's resource, or why there is none and until when that answer stands.
        self._kinds: dict[tuple[str, str], tuple[Resource | str, float]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._main = Reflector(client=self._client, resource=STAGESETS, namespace=namespace,
                               handler=self._on_stageset, stop=self._stop, resync=resync)
        self._janitor = threading.Thread(target=self._sweep, name="dashboard-janitor", daemon=True)

    # -- life ------------------------------------------------------------------------------------

    def start(self, *, timeout: float = 10.0) -> bool:
        """Start watching StageSets; whether they were listed within ``timeout``."""
        self._main.start()
        self._janitor.start()
        return self._main.synced.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for watch in self._watches.values():
                watch.stop.set()
            self._watches.clear()

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (on a watch thread) after every change; returns the unsubscribe."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def touch(self) -> None:
        """Something the pages show changed outside the watches (an action taken): render again."""
        self._changed()

    def _changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    # -- StageSets -------------------------------------------------------------------------------

    def in_scope(self, namespace: str) -> bool:
        return self.namespace is None or namespace == self.namespace

    def _on_stageset(self, kind: str, obj: KubeObject) -> None:
        key = object_key(obj)
        with self._lock:
            before = self._stagesets.get(key)
            if kind == "DELETED":
                self._stagesets.pop(key, None)
                self._activity.pop(key, None)
            else:
                self._stagesets[key] = obj
                if before is not None:
                    changes = transitions(before, obj, when=_now())
                    if changes:
                        self._activity.setdefault(key, collections.deque(maxlen=ACTIVITY)).extend(changes)
        self._changed()

    def stagesets(self) -> list[KubeObject]:
        with self._lock:
            return list(self._stagesets.values())

    def stageset(self, namespace: str, name: str) -> KubeObject | None:
        with self._lock:
            return self._stagesets.get((namespace, name))

    def activity(self, namespace: str, name: str) -> list[Transition]:
        """What the watch saw change, newest first."""
        with self._lock:
            return list(reversed(self._activity.get((namespace, name), ())))

    @property
    def synced(self) -> bool:
        return self._main.synced.is_set()

    # -- other objects ---------------------------------------------------------------------------

    def _resource(self, api_version: str, kind: str) -> Resource | str:
        """The kind's REST resource (discovery, cached), or why there is none: that answer is kept
        for :data:`RETRY_KINDS` seconds (a CRD may be installed later; a failed discovery must not
        be repeated by every render)."""
        now = time.monotonic()
        with self._lock:
            known = self._kinds.get((api_version, kind))
        if known is not None and (isinstance(known[0], Resource) or now < known[1]):
            return known[0]
        try:
            found: Resource | str = self._mapper.resolve(api_version, kind)
        except UnknownKindError:
            found = f"the cluster serves no {kind} in {api_version}"
        except (ApiError, UnreachableError) as error:
            found = f"discovery of {api_version} failed: {error}"
        with self._lock:
            self._kinds[(api_version, kind)] = (found, now + RETRY_KINDS)
        return found

    def _object_key(self, ref: Ref) -> WatchKey | None:
        if ref.api_version == API_VERSION and ref.kind == STAGESET_KIND and self.in_scope(ref.namespace):
            return None  # the main watch has it
        resource = self._resource(ref.api_version, ref.kind)
        if isinstance(resource, str):
            return None
        return ("objects", f"{resource.plural}.{resource.group}/{resource.version}",
                ref.namespace if resource.namespaced else "")

    def lease(self, obj: KubeObject | None, previous: Lease | None = None) -> Lease:
        """Hold the watches ``obj``'s page needs (starting those not running), then let go of
        ``previous``; waits up to :data:`SYNC_WAIT` for new watches' first lists."""
        wanted: dict[WatchKey, Callable[[threading.Event, _Watch], Reflector | None]] = {}
        if obj is not None:
            for ref in refs_to_watch(obj):
                key = self._object_key(ref)
                if key is not None and key not in wanted:
                    wanted[key] = self._object_starter(ref)
            for api_version, namespace in event_scopes(obj):
                wanted[("events", api_version, namespace)] = self._event_starter(api_version, namespace)
        return self._hold(wanted, previous)

    def source_lease(self, previous: Lease | None = None) -> Lease:
        """Hold a watch of every source kind the cluster serves, in the dashboard's scope (the
        Sources page)."""
        wanted: dict[WatchKey, Callable[[threading.Event, _Watch], Reflector | None]] = {}
        for versions, kind in SOURCE_KINDS:
            for api_version in versions:
                resource = self._resource(api_version, kind)
                if isinstance(resource, Resource):
                    key: WatchKey = ("sources", f"{resource.plural}.{resource.group}/{resource.version}",
                                     self.namespace or "")
                    wanted[key] = self._source_starter(resource)
                    break
        return self._hold(wanted, previous)

    def sources(self) -> list[KubeObject]:
        """The sources the Sources page's watches hold (what the viewer may list)."""
        with self._lock:
            return [obj for (kind, _, _), watch in self._watches.items() if kind == "sources"
                    for obj in watch.sources.values()]

    def fleet_lease(self, previous: Lease | None = None) -> Lease:
        """Hold a watch of FleetRollouts (cluster-scoped: the Fleet page; listed as the viewer, so
        only the platform, who may read them, sees any)."""
        key: WatchKey = ("fleet", f"{FLEETROLLOUTS.plural}.{FLEETROLLOUTS.group}/{FLEETROLLOUTS.version}", "")
        return self._hold({key: self._fleet_starter()}, previous)

    def fleetrollouts(self) -> list[KubeObject]:
        """The FleetRollouts the Fleet page's watch holds (name and status only)."""
        with self._lock:
            return [obj for (kind, _, _), watch in self._watches.items() if kind == "fleet"
                    for obj in watch.sources.values()]

    def _fleet_starter(self) -> Callable[[threading.Event, _Watch], Reflector | None]:
        def start(stop: threading.Event, watch: _Watch) -> Reflector | None:
            def handle(kind: str, obj: KubeObject) -> None:
                meta = obj.get("metadata") or {}
                named = {"name": meta.get("name"), "creationTimestamp": meta.get("creationTimestamp")}
                kept = None if kind == "DELETED" else {"metadata": named, "status": obj.get("status") or {}}
                self._keep(watch.sources, object_key(obj), kept)

            return self._reflect(watch, stop, resource=FLEETROLLOUTS, namespace=None,
                                 what="fleetrollouts.stages.metio.wtf", handler=handle)

        return start

    def _hold(self, wanted: dict[WatchKey, Callable[[threading.Event, _Watch], Reflector | None]],
              previous: Lease | None) -> Lease:
        started: list[Reflector] = []
        with self._lock:
            fresh = [key for key in wanted if key not in self._watches]
            for key in wanted:
                self._watches.setdefault(key, _Watch(stop=threading.Event())).users += 1
        for key in fresh:
            with self._lock:
                starting = self._watches.get(key)  # gone only when the hub closed meanwhile
            if starting is None:
                continue
            reflector = wanted[key](starting.stop, starting)
            with self._lock:
                starting.reflector = reflector
            if reflector is not None:
                started.append(reflector)
        if previous is not None:
            self.release(previous)
        deadline = time.monotonic() + SYNC_WAIT
        for reflector in started:
            reflector.synced.wait(max(0.0, deadline - time.monotonic()))
        if started:
            self._changed()
        return Lease(frozenset(wanted))

    def release(self, lease: Lease) -> None:
        with self._lock:
            for key in lease.keys:
                watch = self._watches.get(key)
                if watch is not None:
                    watch.users = max(0, watch.users - 1)
                    if watch.users == 0:
                        watch.idle_since = time.monotonic()

    def _probe(self, path: str, query: dict[str, QueryValue], what: str) -> str | None:
        """Why the user cannot list ``path`` (``None``: they can)."""
        try:
            self._client.request("GET", path, query={"limit": 1, **query})
        except ApiError as error:
            if error.forbidden:
                return f"you may not list {what}"
            if error.not_found:
                return f"the cluster serves no {what}"
        except UnreachableError:
            pass  # the reflector retries
        return None

    def _reflect(self, watch: _Watch, stop: threading.Event, *, resource: Resource, namespace: str | None,
                 what: str, handler: Callable[[str, KubeObject], None],
                 field_selector: str | None = None) -> Reflector | None:
        """Start ``watch``'s reflector, or, when the user may not list ``what`` (or the cluster
        serves none), record why on ``watch`` and start nothing (its objects then show as
        ``Unknown`` with that reason)."""
        error = self._probe(resource.collection_path(namespace),
                            {"fieldSelector": field_selector} if field_selector else {}, what)
        if error is not None:
            watch.error = error
            return None
        reflector = Reflector(client=self._client, resource=resource, namespace=namespace, handler=handler,
                              stop=stop, resync=self._resync, field_selector=field_selector)
        reflector.start()
        return reflector

    def _keep(self, table: dict[_K, _V], key: _K, value: _V | None) -> None:
        """Hold ``value`` under ``key`` (``None``: the object is gone, drop it) and tell the pages
        — only when what they show changed: most watch events (a resync, a status write that
        leaves the verdict as it was) change nothing the dashboard keeps."""
        with self._lock:
            if table.get(key) == value:
                return
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
        self._changed()

    def _object_starter(self, ref: Ref) -> Callable[[threading.Event, _Watch], Reflector | None]:
        def start(stop: threading.Event, watch: _Watch) -> Reflector | None:
            resource = self._resource(ref.api_version, ref.kind)
            assert not isinstance(resource, str)
            namespace = ref.namespace if resource.namespaced else None
            where = f" in namespace {namespace}" if namespace else ""

            def handle(kind: str, obj: KubeObject) -> None:
                self._keep(watch.states, str((obj.get("metadata") or {}).get("name", "")),
                           None if kind == "DELETED" else object_state(obj))

            return self._reflect(watch, stop, resource=resource, namespace=namespace,
                                 what=f"{resource.plural}{where}", handler=handle)

        return start

    def _source_starter(self, resource: Resource) -> Callable[[threading.Event, _Watch], Reflector | None]:
        namespace = self.namespace

        def start(stop: threading.Event, watch: _Watch) -> Reflector | None:
            where = f" in namespace {namespace}" if namespace else " in every namespace"

            def handle(kind: str, obj: KubeObject) -> None:
                self._keep(watch.sources, object_key(obj), None if kind == "DELETED" else _trimmed(obj))

            return self._reflect(watch, stop, resource=resource, namespace=namespace,
                                 what=f"{resource.plural}.{resource.group}{where}", handler=handle)

        return start

    def _event_starter(self, api_version: str, namespace: str
                       ) -> Callable[[threading.Event, _Watch], Reflector | None]:
        selector = f"involvedObject.apiVersion={api_version}"

        def start(stop: threading.Event, watch: _Watch) -> Reflector | None:
            def handle(kind: str, obj: KubeObject) -> None:
                uid = str((obj.get("metadata") or {}).get("uid") or (obj.get("metadata") or {}).get("name"))
                with self._lock:
                    if kind == "DELETED":
                        watch.events.pop(uid, None)
                    else:
                        watch.events[uid] = _row(obj)
                        if len(watch.events) > MAX_EVENTS:
                            oldest = min(watch.events.values(), key=lambda r: r.last_seen or "")
                            watch.events.pop(oldest.uid, None)
                self._changed()

            return self._reflect(watch, stop, resource=EVENTS, namespace=namespace,
                                 what=f"events in namespace {namespace}", handler=handle,
                                 field_selector=selector)

        return start

    def lookup(self, ref: Ref) -> ObjectState:
        """What the watches know of ``ref`` (answers from memory; never a request, unless the
        kind was never resolved)."""
        if ref.api_version == API_VERSION and ref.kind == STAGESET_KIND and self.in_scope(ref.namespace):
            found = self.stageset(ref.namespace, ref.name)
            return ObjectState("NotFound") if found is None else object_state(found)
        resource = self._resource(ref.api_version, ref.kind)
        if isinstance(resource, str):
            return ObjectState("Unknown", resource)
        key: WatchKey = ("objects", f"{resource.plural}.{resource.group}/{resource.version}",
                         ref.namespace if resource.namespaced else "")
        with self._lock:
            watch = self._watches.get(key)
            if watch is None:
                return ObjectState("Unknown", "not watched")
            if watch.error:
                return ObjectState("Unknown", watch.error)
            if not watch.synced:
                return ObjectState("Unknown", "loading")
            return watch.states.get(ref.name) or ObjectState("NotFound")

    def events_for(self, obj: KubeObject) -> list[EventRow]:
        """The Events about a StageSet and its sources, from the event watches its page holds."""
        namespace, name = object_key(obj)
        wanted = {(API_VERSION, namespace, STAGESET_KIND, name)}
        wanted.update((ref.api_version, ref.namespace, ref.kind, ref.name)
                      for ref in stage_sources(obj).values())
        rows: list[EventRow] = []
        with self._lock:
            for (kind, api_version, scope), watch in self._watches.items():
                if kind != "events":
                    continue
                rows.extend(row for row in watch.events.values()
                            if (api_version, row.namespace or scope, row.kind, row.name) in wanted)
        return rows

    def problems(self) -> list[str]:
        """Watches that could not start (what the user may not list), for the pages to say."""
        with self._lock:
            return sorted({w.error for w in self._watches.values() if w.error})

    def _sweep(self) -> None:
        while not self._stop.wait(min(15.0, self._idle)):
            now = time.monotonic()
            with self._lock:
                idle = [key for key, w in self._watches.items()
                        if w.users == 0 and now - w.idle_since > self._idle]
                for key in idle:
                    self._watches.pop(key).stop.set()
            if idle:
                log.debug("stopped %d idle watches", len(idle))
