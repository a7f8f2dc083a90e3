"""Rendered stages, keyed by what they were rendered from, so an unchanged subtree is not re-rendered.

The key is the Git tree id of the stage's path (equal ids mean equal content), the
ignore patterns and the substitution variables (as a digest: values are never kept
in keys or logs).  Entries are shared read-only: the apply engine copies objects
before labelling them.  Bounded, least recently used first out, so memory stays
flat however many StageSets there are.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping

from stageset.kube.types import KubeObject


def render_key(*, url: str, tree: str, ignore: str | None, variables: Mapping[str, str] | None) -> str:
    material = json.dumps([url, tree, ignore, sorted((variables or {}).items()) if variables is not None
                           else None], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()


class RenderCache:
    def __init__(self, *, max_entries: int = 256):
        self._max = max_entries
        self._entries: OrderedDict[str, list[KubeObject]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> list[KubeObject] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: str, objects: list[KubeObject]) -> None:
        with self._lock:
            self._entries[key] = objects
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
