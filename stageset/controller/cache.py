"""The manager's watch cache: the objects of every kind a controller is ``For``, and what watches last saw.

Identity: none; it holds what the controller's own watches listed.

Invariants:

- A cached object is read-only: it is kept as compact JSON in a zlib stream (immutable bytes), and
  :meth:`ObjectCache.get` parses a fresh, private copy for each reconcile.
- Our own writes win until the watch shows them: the status a reconcile wrote (``on_write``,
  :meth:`ObjectCache.wrote`) is laid over an older cached copy, never over a newer one, and
  dropped once the watch has caught up (only the controller writes status, so its last write
  is the truth; a reconcile that read an older one would announce progress again).
- Per object, the states the watches of its kind compare (:meth:`ObjectCache.update`) are kept
  beside it and go with it.

What it compresses, and when.  Deflating JSON costs about 100 CPU instructions a byte (a StageSet
of 1.8 KB: ~0.2 M, four times parsing it), and a cold StageSet changes three to five times within
seconds (created, finalizer and record, status; its GitRepository twice), so compressing every
version paid for copies read at most once.  So an object that just changed is kept as a *stored*
zlib stream (:func:`pack`, level 0: the JSON as it is, in zlib's framing, ~10 % of the cost), and
is deflated (:func:`settle`) only once it has not changed for :data:`SETTLE_SECONDS` — or earlier
when more than :data:`MAX_UNSETTLED` objects wait, which bounds what the uncompressed copies cost:
at most that many objects at about three times their compressed size (a StageSet 1.8 KB against
0.6 KB).  Waiting objects are settled a few at a time by the watch events that follow
(:data:`SETTLE_PER_CALL`), and all that are due when a worker finds its queue empty
(:meth:`ObjectCache.settle`).  Both kinds of stream read back with ``zlib.decompress``.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson

from stageset.controller.keys import ObjectKey
from stageset.kube.types import KubeObject

States = tuple[Any, ...]

SETTLE_SECONDS = 10.0
"""An object unchanged for this long is deflated (a cold pass's writes come within seconds)."""

MAX_UNSETTLED = 2048
"""At most this many objects wait uncompressed; past it the oldest are deflated at once."""

SETTLE_PER_CALL = 4
"""Objects deflated by one watch event, at most (the rest wait for the next, or for an idle worker)."""


def pack(obj: KubeObject) -> bytes:
    """An object as the watch cache keeps it while it changes: compact JSON in a stored zlib stream
    (no compression: framing and a checksum around the bytes; the smallest window and hash, which
    a stored stream does not use and zlib would otherwise allocate and clear, 64 KiB each time)."""
    store = zlib.compressobj(0, zlib.DEFLATED, 9, 1)
    return store.compress(orjson.dumps(obj)) + store.flush()


def settle(raw: bytes) -> bytes:
    """A cached object deflated for keeping (zlib level 1, a quarter of the hash memory of the default:
    the same size for objects of a few KB, and cheaper to start)."""
    deflate = zlib.compressobj(1, zlib.DEFLATED, 15, 4)
    return deflate.compress(zlib.decompress(raw)) + deflate.flush()


def unpack(raw: bytes) -> KubeObject:
    """A fresh, private copy of a cached object."""
    parsed: KubeObject = orjson.loads(zlib.decompress(raw))
    return parsed


def version(obj: KubeObject) -> int | None:
    """``metadata.resourceVersion`` as a number (etcd's revisions are; ``None`` otherwise).
    Compared only to tell whether the watch cache has seen one of our own writes yet."""
    value = str(obj.get("metadata", {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else None


class ObjectCache:
    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic,
                 settle_seconds: float = SETTLE_SECONDS, max_unsettled: int = MAX_UNSETTLED) -> None:
        self._lock = threading.Lock()
        self._monotonic = monotonic
        self._settle_seconds = settle_seconds
        self._max_unsettled = max_unsettled
        # Each object as a zlib stream (pack, then settle): a parsed StageSet costs several times its
        # JSON in memory, and the cache holds every one.
        self.objects: MutableMapping[ObjectKey, bytes] = {}
        # Objects kept uncompressed since their last change, oldest change first: (when, the stream).
        self._unsettled: OrderedDict[ObjectKey, tuple[float, bytes]] = OrderedDict()
        self._states: dict[ObjectKey, States] = {}
        # Per object: the status our last reconcile left (as JSON), at the resourceVersion it made,
        # until the watch catches up.
        self._written: dict[ObjectKey, tuple[int, bytes]] = {}

    def update(self, key: ObjectKey, obj: KubeObject | None, *, states: Callable[[KubeObject], States]
               ) -> tuple[States | None, States | None]:
        """A watch event: ``obj`` now (``None``: deleted).  Returns the states its watches saw at the
        last event and see now (``None``: not there)."""
        raw = None if obj is None else pack(obj)
        with self._lock:
            before = self._states.get(key)
            if obj is None or ((written := self._written.get(key)) and written[0] <= (version(obj) or 0)):
                self._written.pop(key, None)  # the cache has caught up with our own writes
            self._unsettled.pop(key, None)
            if obj is None or raw is None:
                self.objects.pop(key, None)
                self._states.pop(key, None)
                now = None
            else:
                self.objects[key] = raw
                self._unsettled[key] = (self._monotonic(), raw)
                now = self._states[key] = states(obj)
        self.settle(limit=SETTLE_PER_CALL)
        return before, now

    def settle(self, *, limit: int | None = None) -> int:
        """Deflate the objects due (unchanged for the settle time, or the oldest past the bound), at most
        ``limit``; returns how many.  The deflating runs outside the lock; an object that changed
        meanwhile keeps its newer copy."""
        settled = 0
        while limit is None or settled < limit:
            with self._lock:
                if not self._unsettled:
                    return settled
                key, (since, raw) = next(iter(self._unsettled.items()))
                if len(self._unsettled) <= self._max_unsettled and (
                        self._monotonic() - since < self._settle_seconds):
                    return settled
                del self._unsettled[key]
            deflated = settle(raw)
            with self._lock:
                if self.objects.get(key) is raw:
                    self.objects[key] = deflated
            settled += 1
        return settled

    def __contains__(self, key: object) -> bool:
        """Whether ``key``'s object is cached (the watch listed it and has not seen it go)."""
        with self._lock:
            return key in self.objects

    def get(self, key: ObjectKey) -> KubeObject | None:
        """A private copy of the object, with the status our last reconcile wrote if the watch has
        not shown that write yet (its event can lag behind the next reconcile under load).  The
        spec and metadata stay the cache's: a change there arrives as its own event."""
        with self._lock:
            raw = self.objects.get(key)
            written = self._written.get(key)
        if raw is None:
            return None
        obj = unpack(raw)
        current = version(obj)
        if written is None or current is None or current >= written[0]:
            return obj
        return {**obj, "status": orjson.loads(written[1])}

    def wrote(self, obj: KubeObject) -> None:
        """A reconcile wrote ``obj`` (its status, record or finalizer): remember the status it left,
        at the version the write made, until the watch shows it."""
        made = version(obj)
        if made is None:
            return
        key = ObjectKey.of(obj)
        status = orjson.dumps(obj.get("status"))
        with self._lock:
            if key in self.objects:  # not deleted meanwhile
                self._written[key] = (made, status)
