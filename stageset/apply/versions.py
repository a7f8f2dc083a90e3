"""What each applied object looked like when we last wrote or checked it: its resourceVersion.

A warm pass over an unchanged stage needs no dry-run: if an object still has the
resourceVersion it had right after our last write (or our last check found it as wanted), and
its manifest is the one we applied then, nothing has changed it since — any write by anyone
(a manual edit, another controller, a deletion and re-creation) moves the resourceVersion.
The engine's warm check (:mod:`stageset.apply.warm`) learns the live versions from one
label-selected list per kind and namespace of a stage, made as the stage's identity, and sends
only the objects whose version moved through the dry-run and write path
(:mod:`stageset.apply.write`).

Keys are ``(cluster, identity, object path)``: what one identity saw is never used for another
(a new ServiceAccount goes through the full dry-run path, as the first pass of any identity does).
The map is bounded in bytes (:data:`DEFAULT_MAX_BYTES`), least recently used entries first out;
an entry lost costs one dry-run and one read, never correctness.  No I/O; thread-safe.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""About 100,000 objects; past that the least recently used go back to dry-runs."""

_ENTRY_OVERHEAD = 120
"""Bytes an entry costs beyond its value's characters (the key digest, two bytes objects, a dict slot)."""

Key = tuple[str, str, str]  # (cluster, identity, object path)


@dataclass(frozen=True)
class Seen:
    """An object as we last left it: its resourceVersion, and the digest of the manifest applied."""

    version: str
    digest: str


def _digest(key: Key) -> bytes:
    # Kept as 16 bytes, not three strings: tens of thousands of entries (collisions: 2^-64 odds
    # at a billion entries, and one would only cost a wrong "unchanged" for an object whose
    # manifest digest also matched).
    return hashlib.blake2b("\0".join(key).encode(), digest_size=16).digest()


class LiveVersions:
    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES):
        self._max = max_bytes
        # Insertion order is recency: a hit moves its entry to the end, eviction takes the front.
        self._entries: dict[bytes, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: Key) -> Seen | None:
        with self._lock:
            found = self._entries.pop(_digest(key), None)
            if found is None:
                return None
            self._entries[_digest(key)] = found
        version, _, digest = found.decode().partition(" ")
        return Seen(version=version, digest=digest)

    def put(self, key: Key, seen: Seen) -> None:
        value = f"{seen.version} {seen.digest}".encode()
        size = len(value) + _ENTRY_OVERHEAD
        name = _digest(key)
        with self._lock:
            old = self._entries.pop(name, None)
            if old is not None:
                self._bytes -= len(old) + _ENTRY_OVERHEAD
            if size > self._max:
                return
            self._entries[name] = value
            self._bytes += size
            while self._bytes > self._max:
                dropped = self._entries.pop(next(iter(self._entries)))
                self._bytes -= len(dropped) + _ENTRY_OVERHEAD

    def drop(self, key: Key) -> None:
        with self._lock:
            old = self._entries.pop(_digest(key), None)
            if old is not None:
                self._bytes -= len(old) + _ENTRY_OVERHEAD
