"""A de-duplicating work queue with delayed re-adds, like client-go's rate-limited queue.

A key is never processed by two workers at once: adding a key that is being
processed marks it dirty, and it is queued again once its worker is done.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []
        self._counter = itertools.count()
        self._shutdown = False

    def add(self, key: K) -> None:
        with self._cond:
            if key in self._processing:
                self._dirty.add(key)
                return
            if key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            heapq.heappush(self._delayed, (time.monotonic() + delay, next(self._counter), key))
            self._cond.notify()

    def _promote_due(self) -> float | None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            if key in self._processing:
                self._dirty.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self) -> K | None:
        """Block for the next key; ``None`` after shutdown."""
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._queued.discard(key)
                    self._processing.add(key)
                    return key
                self._cond.wait(timeout=wait)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                if key not in self._queued:
                    self._queued.add(key)
                    self._queue.append(key)
                    self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)
