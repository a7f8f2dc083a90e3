"""Memory the process gives back: glibc's allocator, capped and trimmed.

CPython returns freed objects to glibc's ``malloc``, which keeps them: after one huge stage
(thousands of objects parsed, rendered and applied) the controller's resident memory would stay
at the stage's peak for the life of the process, and every thread that allocates gets an arena
of its own (up to eight per core), each holding its own freed memory.  Two calls fix both:

- at start, before any thread exists, ``mallopt(M_ARENA_MAX, 2)``: the controller's threads
  share two arenas (its work is I/O-bound; contention on two arenas was not measurable);
- after work, ``malloc_trim(0)``, at most once per ``interval``: glibc returns the free pages
  of every arena to the kernel (``madvise``), not only the top of the heap.  When the workers
  go quiet, a full garbage collection first, so objects held only by reference cycles (an
  exception's traceback and the frames it keeps) are freed before the trim, not at some later
  collection.

What remains after a huge stage is what is still referenced — the bounded caches (render
cache, resourceVersions, watch cache) — and CPython's small-object arenas that a surviving
object keeps partly used (``python -m bench.memory`` measures it: docs/benchmarks.md).

``STAGESET_ALLOCATOR=keep`` in the controller's environment turns both off (glibc's defaults:
what ``python -m bench.memory`` compares against).

Identity: none; this touches no cluster and no source.  Invariant: on a libc without these
calls (musl, macOS) both are no-ops; nothing here can fail the controller.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
import time
from collections.abc import Callable

M_ARENA_MAX = -8  # glibc's malloc.h
DEFAULT_ARENAS = 2
DEFAULT_INTERVAL = 10.0  # seconds between trims while work goes on (a trim of 200 MiB: a few ms)
IDLE_INTERVAL = 2.0  # seconds between trims (and collections) when a worker finds its queue empty


def _libc() -> ctypes.CDLL | None:
    if os.environ.get("STAGESET_ALLOCATOR") == "keep":
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()


def cap_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before the controller starts its threads.  True if set."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(arenas)))


def trim() -> bool:
    """Give the allocator's free pages back to the kernel now.  True if any were released."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(ctypes.c_size_t(0)))


class Trimmer:
    """Trims after work, at most once per ``interval`` seconds, from whichever thread asks first.

    A worker calls :meth:`after_work` when it finishes a key; most calls return at once (the
    interval has not passed, or another thread is trimming).  A worker whose queue is empty
    (``idle``) trims after a shorter interval, so the memory of the last pass of a burst (one
    huge stage) is returned as the controller goes quiet, not at its next piece of work."""

    def __init__(self, *, interval: float = DEFAULT_INTERVAL, idle_interval: float = IDLE_INTERVAL,
                 monotonic: Callable[[], float] = time.monotonic,
                 release: Callable[[], bool] = trim, collect: Callable[[], object] = gc.collect):
        self._collect = collect
        self._interval = interval
        self._idle_interval = idle_interval
        self._monotonic = monotonic
        self._release = release
        self._lock = threading.Lock()
        self._last = monotonic()
        self.trims = 0

    def after_work(self, *, idle: bool = False) -> bool:
        """Trim if the interval has passed since the last trim.  True if this call trimmed."""
        interval = self._idle_interval if idle else self._interval
        if self._monotonic() - self._last < interval:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._monotonic() - self._last < interval:
                return False
            if idle:
                self._collect()
            self._release()
            self._last = self._monotonic()
            self.trims += 1
            return True
        finally:
            self._lock.release()
