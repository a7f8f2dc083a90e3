"""Our own list/watch loop: resourceVersion tracking, bookmarks, 410 Gone -> relist, periodic resync.

The official ``Watch`` helper loses track of resourceVersion across reconnects, so
we own the loop.  A :class:`Reflector` lists once, emits every object as ``ADDED``
(a relist emits ``DELETED`` for objects that vanished meanwhile), then watches from
the list's resourceVersion with bookmarks; when a watch ends it re-watches from the last
seen version; on 410 it relists.  ``namespace`` scopes both calls to one namespace,
so sharding by namespace never issues a cluster-wide watch; ``field_selector`` and
``label_selector`` narrow both calls on the server (Events about one API group; a label shard),
never in Python.  With a label selector, an object whose labels stop matching arrives as
``DELETED`` (and one that starts matching as ``ADDED``): the apiserver's watch says so, and the
handler must not take it for a deletion of the object itself.

Watches that cannot be lost: every ``resync`` seconds (``--resync-period``, default 5m)
the reflector lists again, whatever the watch said.  A relist re-emits every object, so an
event a watch never delivered (a proxy that silently stopped forwarding, a compaction
that outran us) is seen within one period; the handler decides what is new.  Each watch
asks the server to end it at the next resync, and a stream that stays silent past that
(the server's end never arrived: the connection is dead) is abandoned by the read
timeout.  Failures back off exponentially (0.5 s doubling to 30 s, with jitter), a
``Retry-After`` the server sent counting as the least wait.

Held watches (drift, :mod:`stageset.kube.watches`) may start from a known ``resourceVersion``
(what a pass just saw) instead of a list: no list is made until the watch expires (410) or the
resync comes; after every list the keys present are told to ``listed`` (a relist's ``DELETED``
only covers keys this reflector has seen).  :meth:`Reflector.close` ends a stream at once (the
connection is shut down, not left to its timeout); ``health`` hears whether the last attempt
worked; ``read_timeout`` bounds a silent stream below the resync (the apiserver sends a bookmark
about every minute, so a longer silence is a dead connection); ``backoff_cap`` and
``denied_backoff`` bound the waits between failures (a refusal, 403 or 404, waits longer).
Held watches of one cluster share a :class:`ClusterGate`: while the cluster does not answer, one
of them probes it on its own backoff and the others wait for its answer, so an outage costs one
watch's retries, not one per watch.

Identity: whatever ``client`` is — the controller's own, for our kinds.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

import urllib3

from stageset.kube.client import METADATA, METADATA_LIST, ApiError, KubeClient, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, WatchEvent

log = logging.getLogger(__name__)

Handler = Callable[[str, KubeObject], None]
Listed = Callable[[set[tuple[str, str]]], None]
"""Told the (namespace, name) keys a list found, after each list."""
DEFAULT_RESYNC = 300.0
# How long past the requested end a silent stream is still waited for.
_GRACE = 10.0
_BACKOFF_BASE, _BACKOFF_CAP = 0.5, 30.0
HELD_CHUNK = 8 * 1024
"""What a held watch reads at once: a quiet stream of metadata blocks in its read holding this much."""


class ClusterGate:
    """The held watches of one cluster while it does not answer: one probes it (on its own backoff),
    the others wait until it answers, then all go on.  An answer of any kind (an error status too)
    is the cluster answering; only a connection that cannot be made or breaks counts as down."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._down = False
        self._prober: object | None = None

    def admit(self, who: object, stop: threading.Event) -> bool:
        """Wait while the cluster is down and another watch probes it; ``False`` once ``stop`` is set."""
        with self._cond:
            while self._down and self._prober is not None and self._prober is not who:
                if stop.is_set():
                    return False
                self._cond.wait(1.0)
            if self._down:
                self._prober = who
            return not stop.is_set()

    def failed(self, who: object) -> None:
        """``who`` could not reach the cluster."""
        with self._cond:
            self._down = True
            if self._prober is None:
                self._prober = who

    def answered(self) -> None:
        """The cluster answered: every waiting watch goes on."""
        with self._cond:
            if self._down or self._prober is not None:
                self._down, self._prober = False, None
                self._cond.notify_all()

    def leave(self, who: object) -> None:
        """``who`` stops (closed, drained): another watch probes instead."""
        with self._cond:
            if self._prober is who:
                self._prober = None
                self._cond.notify_all()


def object_key(obj: KubeObject) -> tuple[str, str]:
    metadata = obj.get("metadata", {})
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


class Reflector:
    """Keeps ``handler`` informed of every change to one resource (optionally in one namespace)."""

    def __init__(self, *, client: KubeClient, resource: Resource, namespace: str | None,
                 handler: Handler, stop: threading.Event, resync: float = DEFAULT_RESYNC,
                 rng: random.Random | None = None, label_selector: str | None = None,
                 field_selector: str | None = None, metadata_only: bool = False,
                 resource_version: str = "", listed: Listed | None = None,
                 health: Callable[[bool], None] | None = None, read_timeout: float | None = None,
                 backoff_cap: float = _BACKOFF_CAP, denied_backoff: float | None = None,
                 gate: ClusterGate | None = None):
        self._client = client
        # Start watching here instead of listing first (the caller knows the objects as of it).
        self._start = resource_version
        self._listed = listed
        self._health = health
        self._read_timeout = read_timeout
        self._backoff_cap = backoff_cap
        self._denied_backoff = denied_backoff
        self._gate = gate
        # How the stream being read is shut down from another thread (close()).
        self._abort: Callable[[], None] | None = None
        # drain(): nothing more is handed over, and the stream ends when the server ends it.
        self._draining = threading.Event()
        self._abort_lock = threading.Lock()
        # Metadata only (PartialObjectMetadata): the handler sees metadata, never spec or status.
        self._metadata_only = metadata_only
        self._resource = resource
        self._namespace = namespace
        # Scoped by the server (never filtered here): only matching objects are sent at all.
        self._selectors: dict[str, str | int | bool] = {
            k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        self._handler = handler
        self._stop = stop
        self._resync = resync
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        # Only the keys: the handler keeps the objects; a relist needs just what vanished.
        self._known: set[tuple[str, str]] = set()
        self.synced = threading.Event()
        # Counters, for tests and logs: lists made (the first included) and why.
        self.lists = 0
        self.relists_after_gone = 0

    def _path(self) -> str:
        return self._resource.collection_path(self._namespace)

    def _list(self) -> str:
        """List everything (page by page, each page handed over as it comes: thousands of objects
        are never all parsed at once), then tell what vanished since the last list."""
        self.lists += 1
        fresh: set[tuple[str, str]] = set()
        query: dict[str, str | int | bool] = {"limit": 500, **self._selectors}
        while True:
            listing = self._client.request("GET", self._path(), query=query, accept=METADATA_LIST) \
                if self._metadata_only else self._client.request("GET", self._path(), query=query)
            items = listing.get("items") or []
            for item in items:
                item.setdefault("apiVersion", self._resource.api_version)
                item.setdefault("kind", self._resource.kind)
                fresh.add(object_key(item))
            for item in items:
                self._handler("ADDED", item)
            del items
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {**query, "continue": str(token)}
        for namespace, name in sorted(self._known - fresh):
            self._handler("DELETED", {"apiVersion": self._resource.api_version, "kind": self._resource.kind,
                                      "metadata": {"namespace": namespace, "name": name}})
        self._known = fresh
        if self._listed is not None:
            self._listed(set(fresh))
        return str(listing.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, resource_version: str, *, until: float) -> str:
        """Watch from ``resource_version`` until the monotonic time ``until`` (the next resync)."""
        seconds = max(1, int(until - time.monotonic()))
        query: dict[str, str | int | bool] = {
            "watch": True, "resourceVersion": resource_version, "allowWatchBookmarks": True,
            "timeoutSeconds": seconds, **self._selectors}
        # The read timeout is per read: a healthy watch is ended by the server at ``seconds``; one
        # silent for longer than that (plus grace) is a dead connection.
        # (``accept`` is passed only when asked for: test doubles of a client need not know it.)
        timeout = seconds + _GRACE
        if self._read_timeout is not None:
            timeout = min(timeout, self._read_timeout)
        extra: dict[str, object] = {} if not self._metadata_only else {"accept": METADATA}
        if self._health is not None:  # held watches only: a test double need not know these
            extra["opened"] = self._opened
            extra["chunk"] = HELD_CHUNK
        lines = self._client.stream(self._path(), query=query, timeout=timeout, **extra)  # type: ignore[arg-type]
        for line in lines:
            if self._stop.is_set():
                break
            if self._draining.is_set():
                continue  # read to the server's end of the stream, told to nobody
            if self._health is not None:
                self._health(True)
            event: WatchEvent = {"type": str(line.get("type", "")), "object": line.get("object") or {}}
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                code = int(obj.get("code", 0))
                raise ApiError(status=code, reason=str(obj.get("reason", "")),
                               message=str(obj.get("message", "")), body=obj)
            resource_version = str(obj.get("metadata", {}).get("resourceVersion", resource_version))
            if kind == "BOOKMARK":
                continue
            key = object_key(obj)
            if kind == "DELETED":
                self._known.discard(key)
            else:
                self._known.add(key)
            self._handler(kind, obj)
        return resource_version

    def _next_resync(self) -> float:
        # Jittered down by up to 10%: reflectors started together do not relist together.
        return time.monotonic() + self._resync * (1 - 0.1 * self._rng.random())

    def _backoff(self, failures: int, *, at_least: float = 0.0, cap: float | None = None) -> float:
        exact = min(cap or self._backoff_cap, _BACKOFF_BASE * 2.0 ** min(failures, 16))
        return max(at_least, exact * (0.9 + 0.2 * self._rng.random()))

    def _opened(self, abort: Callable[[], None] | None) -> None:
        """The stream now being read can be shut down with ``abort`` (``None`` once it ended)."""
        if abort is not None and self._gate is not None:
            self._gate.answered()
        with self._abort_lock:
            self._abort = abort
        if abort is not None and self._stop.is_set():
            abort()  # closed while it opened

    def close(self) -> None:
        """Stop, and shut the stream being read now (its thread ends at once, not at the stream's end)."""
        self._stop.set()
        if self._gate is not None:
            self._gate.leave(self)
        with self._abort_lock:
            abort = self._abort
        if abort is not None:
            abort()

    def drain(self) -> None:
        """Stop without a word to the server: nothing more is handed over, no request is made again,
        and the stream open now ends when the server ends it (at the resync at the latest) — for a
        watch of a namespace being deleted, where nothing more is to be sent, not even a close."""
        self._draining.set()
        if self._gate is not None:
            self._gate.leave(self)

    def _told(self, healthy: bool) -> None:
        if self._health is not None:
            self._health(healthy)

    def run(self) -> None:
        resource_version = self._start
        resync_at = 0.0 if not resource_version else self._next_resync()
        if resource_version:
            self.synced.set()  # known as of resource_version: nothing to list first
        failures = 0
        while not self._stop.is_set() and not self._draining.is_set():
            if self._gate is not None and not self._gate.admit(self, self._stop):
                return
            try:
                if not resource_version or time.monotonic() >= resync_at:
                    resource_version = self._list()
                    if self._gate is not None:
                        self._gate.answered()
                    resync_at = self._next_resync()
                    self.synced.set()
                    self._told(True)
                resource_version = self._watch(resource_version, until=resync_at)
                failures = 0
            except ApiError as error:
                if self._stop.is_set() or self._draining.is_set():
                    return
                if self._gate is not None:
                    self._gate.answered()  # an error status is an answer: the cluster is there
                if error.gone:
                    log.info("watch of %s expired (410); relisting", self._resource.plural)
                    self.relists_after_gone += 1
                    resource_version = ""
                    continue
                self._told(False)
                denied = error.status in (403, 404)
                delay = self._backoff(failures, at_least=error.retry_after or 0.0,
                                      cap=self._denied_backoff if denied else None)
                failures += 1
                log.warning("watch of %s failed: %s; retrying in %.1fs", self._resource.plural, error, delay)
                resource_version = "" if denied else resource_version
                self._stop.wait(delay)
            except (UnreachableError, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
                if self._stop.is_set() or self._draining.is_set():
                    return
                self._told(False)
                if self._gate is not None:
                    self._gate.failed(self)
                delay = self._backoff(failures)
                failures += 1
                log.log(logging.WARNING if failures == 1 else logging.DEBUG,
                        "watch of %s interrupted (%s); retrying in %.1fs", self._resource.plural,
                        _short(error), delay)
                self._stop.wait(delay)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"watch-{self._resource.plural}", daemon=True)
        thread.start()
        return thread


def _short(error: BaseException) -> str:
    if isinstance(error, UnreachableError):
        return error.why
    return type(error).__name__


def wait_synced(synced: Sequence[threading.Event], *, timeout: float, stop: threading.Event | None = None
                ) -> bool:
    """Whether every ``synced`` event (a reflector's, set once it listed) was set within ``timeout``
    (False at once when ``stop`` is set).

    Polls in short sleeps rather than blocking on one event: called on the main thread, it must
    return to the interpreter often enough for signal handlers to run."""
    deadline = time.monotonic() + timeout
    while not all(event.is_set() for event in synced):
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            return False
        time.sleep(min(0.1, left))
    return True
