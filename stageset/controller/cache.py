"""The manager's watch cache: the objects of every kind a controller is ``For``, and what watches last saw.

Identity: none; it holds what the controller's own watches listed.

Invariants:

- A cached object is read-only: it is kept as compact, compressed JSON (:func:`pack`), and
  :meth:`ObjectCache.get` parses a fresh, private copy for each reconcile.
- Our own writes win until the watch shows them: the status a reconcile wrote (``on_write``,
  :meth:`ObjectCache.wrote`) is laid over an older cached copy, never over a newer one, and
  dropped once the watch has caught up (only the controller writes status, so its last write
  is the truth; a reconcile that read an older one would announce progress again).
- Per object, the states the watches of its kind compare (:meth:`ObjectCache.update`) are kept
  beside it and go with it.
"""

from __future__ import annotations

import copy
import threading
import zlib
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson

from stageset.controller.keys import ObjectKey
from stageset.kube.types import KubeObject

States = tuple[Any, ...]


def pack(obj: KubeObject) -> bytes:
    """An object as the watch cache keeps it: compact JSON, compressed (zlib level 1: about 18 us
    for a StageSet of 1 KB, a third of its size; 5000 StageSets and their GitRepositories keep
    tens of MiB less)."""
    return zlib.compress(orjson.dumps(obj), 1)


def unpack(raw: bytes) -> KubeObject:
    """A fresh, private copy of a cached object (about 4 us to decompress)."""
    parsed: KubeObject = orjson.loads(zlib.decompress(raw))
    return parsed


def version(obj: KubeObject) -> int | None:
    """``metadata.resourceVersion`` as a number (etcd's revisions are; ``None`` otherwise).
    Compared only to tell whether the watch cache has seen one of our own writes yet."""
    value = str(obj.get("metadata", {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else None


class ObjectCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Each object as compressed compact JSON (pack): a parsed StageSet costs several times its
        # JSON in memory, and the cache holds every one.
        self.objects: MutableMapping[ObjectKey, bytes] = {}
        self._states: dict[ObjectKey, States] = {}
        # Per object: the status our last reconcile left, at the resourceVersion it made, until
        # the watch catches up.
        self._written: dict[ObjectKey, tuple[int, Any]] = {}

    def update(self, key: ObjectKey, obj: KubeObject | None, *, states: Callable[[KubeObject], States]
               ) -> tuple[States | None, States | None]:
        """A watch event: ``obj`` now (``None``: deleted).  Returns the states its watches saw at the
        last event and see now (``None``: not there)."""
        with self._lock:
            before = self._states.get(key)
            if obj is None or ((written := self._written.get(key)) and written[0] <= (version(obj) or 0)):
                self._written.pop(key, None)  # the cache has caught up with our own writes
            if obj is None:
                self.objects.pop(key, None)
                self._states.pop(key, None)
                return before, None
            self.objects[key] = pack(obj)
            now = self._states[key] = states(obj)
            return before, now

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
            if raw is None:
                return None
            obj = unpack(raw)
            written = self._written.get(key)
            current = version(obj)
            if written is None or current is None or current >= written[0]:
                return obj
            return {**obj, "status": copy.deepcopy(written[1])}

    def wrote(self, obj: KubeObject) -> None:
        """A reconcile wrote ``obj`` (its status, record or finalizer): remember the status it left,
        at the version the write made, until the watch shows it."""
        made = version(obj)
        if made is None:
            return
        key = ObjectKey.of(obj)
        with self._lock:
            if key in self.objects:  # not deleted meanwhile
                self._written[key] = (made, copy.deepcopy(obj.get("status")))
