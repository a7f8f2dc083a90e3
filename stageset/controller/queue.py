"""A de-duplicating work queue with delayed re-adds and per-key backoff, like client-go's.

A key is never processed by two workers at once: adding a key that is being
processed marks it dirty, and it is queued again once its worker is done.

Failures back off per key (:meth:`WorkQueue.add_rate_limited`): ``base`` doubling up to
``cap``, with jitter so keys that failed together do not retry together; :meth:`forget`
(on success) starts the key over.

Fairness: keys are grouped into shards (namespaces); shards take turns, and with
``max_per_shard`` a shard never has more keys in processing than that, so one tenant's
slow work cannot occupy every worker.

Metrics as client-go's workqueue counts them (:class:`QueueObserver`): an add of a key not
yet waiting, a retry, how long a key waited before a worker took it and how long the
worker took; depth, unfinished work and the longest running worker are read on demand.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class QueueObserver(Protocol):
    def added(self) -> None: ...

    def retried(self) -> None: ...

    def waited(self, seconds: float) -> None: ...

    def worked(self, seconds: float) -> None: ...


class _Unobserved:
    def added(self) -> None:
        return None

    def retried(self) -> None:
        return None

    def waited(self, seconds: float) -> None:
        del seconds

    def worked(self, seconds: float) -> None:
        del seconds


@dataclass(frozen=True)
class Backoff:
    """Per-key exponential backoff: ``base * 2**failures``, at most ``cap``, times a jitter in
    ``[1 - jitter, 1 + jitter]``."""

    base: float = 0.5
    cap: float = 300.0
    jitter: float = 0.1

    def delay(self, failures: int, *, draw: float) -> float:
        """The delay after ``failures`` earlier failures; ``draw`` is uniform in [0, 1)."""
        exact = min(self.cap, self.base * 2.0 ** min(failures, 64))
        return float(exact * (1 - self.jitter + 2 * self.jitter * draw))


class WorkQueue(Generic[K]):
    """``shard`` groups keys (by namespace, in the manager); with ``max_per_shard`` no group has
    more keys in processing at once, and groups take turns: one tenant's slow keys can hold
    at most its share of the workers, however many it queues."""

    def __init__(self, *, backoff: Backoff | None = None, rng: random.Random | None = None,
                 shard: Callable[[K], Hashable] | None = None, max_per_shard: int | None = None,
                 observer: QueueObserver | None = None) -> None:
        self._backoff = backoff or Backoff()
        self.observer: QueueObserver = observer or _Unobserved()
        # When each waiting key was added, and when each key in processing was taken (monotonic).
        self._added_at: dict[K, float] = {}
        self._taken_at: dict[K, float] = {}
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._shard = shard or (lambda _key: None)
        self._max_per_shard = max_per_shard
        self._failures: dict[K, int] = {}
        self._cond = threading.Condition()
        # Ready keys per shard; ``_turns`` is the order shards are served in (round robin).
        self._ready: dict[Hashable, deque[K]] = {}
        self._turns: deque[Hashable] = deque()
        self._active: dict[Hashable, int] = {}
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        # (due, tie-breaker, key, still wanted?): a re-add whose ``wanted`` says no when it is due is dropped.
        self._delayed: list[tuple[float, int, K, Callable[[], bool] | None]] = []
        self._counter = itertools.count()
        self._shutdown = False

    def _enqueue(self, key: K) -> None:
        """Make ``key`` ready (the caller holds the lock and checked it is not queued)."""
        self._queued.add(key)
        shard = self._shard(key)
        if shard not in self._ready:
            self._ready[shard] = deque()
            self._turns.append(shard)
        self._ready[shard].append(key)
        self._cond.notify()

    def _add(self, key: K) -> None:
        """Queue ``key`` now, or again once its worker is done (the caller holds the lock)."""
        if key in self._processing:
            if key not in self._dirty:
                self._dirty.add(key)
                self._counted(key)
            return
        if key not in self._queued:
            self._counted(key)
            self._enqueue(key)

    def _counted(self, key: K) -> None:
        self._added_at.setdefault(key, time.monotonic())
        self.observer.added()

    def add(self, key: K) -> None:
        with self._cond:
            self._add(key)

    def add_after(self, key: K, delay: float, *, wanted: Callable[[], bool] | None = None) -> None:
        """Add ``key`` in ``delay`` seconds — unless ``wanted``, asked then, says it no longer is
        (the wait it was for ended sooner; it must not block: it is asked under the queue's lock)."""
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            heapq.heappush(self._delayed, (time.monotonic() + delay, next(self._counter), key, wanted))
            self._cond.notify()

    def add_rate_limited(self, key: K, *, at_least: float = 0.0, at_most: float | None = None) -> float:
        """Add ``key`` after its backoff (which then grows), no sooner than ``at_least`` (a server's
        ``Retry-After``) and no later than ``at_most`` (the object's own interval); returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            delay = self._backoff.delay(failures, draw=self._rng.random())
            if at_most is not None:
                delay = min(delay, at_most)
            delay = max(at_least, delay)
        self.observer.retried()
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure backs off from the start again."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How many times in a row ``key`` failed (since the last :meth:`forget`)."""
        with self._cond:
            return self._failures.get(key, 0)

    def _promote_due(self) -> float | None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key, wanted = heapq.heappop(self._delayed)
            if wanted is None or wanted():
                self._add(key)
        return self._delayed[0][0] - now if self._delayed else None

    def _take(self) -> K | None:
        """The next key of the first shard (in turn) that is under its cap."""
        for _ in range(len(self._turns)):
            shard = self._turns[0]
            self._turns.rotate(-1)
            if self._max_per_shard is not None and self._active.get(shard, 0) >= self._max_per_shard:
                continue
            ready = self._ready[shard]
            key = ready.popleft()
            if not ready:
                del self._ready[shard]
                self._turns.remove(shard)
            self._queued.discard(key)
            self._processing.add(key)
            self._active[shard] = self._active.get(shard, 0) + 1
            now = time.monotonic()
            self._taken_at[key] = now
            self.observer.waited(now - self._added_at.pop(key, now))
            return key
        return None

    def get(self) -> K | None:
        """Block for the next key; ``None`` after shutdown."""
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote_due()
                key = self._take()
                if key is not None:
                    return key
                self._cond.wait(timeout=wait)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            taken = self._taken_at.pop(key, None)
            if taken is not None:
                self.observer.worked(time.monotonic() - taken)
            shard = self._shard(key)
            remaining = self._active.get(shard, 1) - 1
            if remaining > 0:
                self._active[shard] = remaining
            else:
                self._active.pop(shard, None)
            if key in self._dirty:
                self._dirty.discard(key)
                if key not in self._queued:
                    self._enqueue(key)
            # A shard under its cap again may have keys waiting: wake every worker to look.
            self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        """Keys ready to be processed (whether or not their shard is at its cap)."""
        with self._cond:
            return sum(len(ready) for ready in self._ready.values())

    def unfinished_seconds(self) -> float:
        """Seconds of work in progress, summed over the keys being processed (client-go's
        ``unfinished_work_seconds``)."""
        now = time.monotonic()
        with self._cond:
            return sum(now - taken for taken in self._taken_at.values())

    def longest_running_seconds(self) -> float:
        """How long the longest running worker has held its key."""
        now = time.monotonic()
        with self._cond:
            return max((now - taken for taken in self._taken_at.values()), default=0.0)

    def in_processing(self, shard: Hashable) -> int:
        with self._cond:
            return self._active.get(shard, 0)
