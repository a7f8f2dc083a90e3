from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from stageset.controller.queue import Backoff, WorkQueue


def test_duplicate_adds_collapse() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2


def test_key_added_while_processing_runs_again_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert queue.get() == "a"
    queue.add("a")
    assert len(queue) == 0  # never handed to a second worker concurrently
    queue.done("a")
    assert queue.get() == "a"


def test_delayed_add_arrives_later() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("later", 0.05)
    assert len(queue) == 0
    assert queue.get() == "later"


def test_shutdown_releases_waiters() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get()))
    waiter.start()
    queue.shutdown()
    waiter.join(timeout=5)
    assert got == [None]


@pytest.mark.parametrize(("failures", "low", "high"), [
    (0, 0.45, 0.55), (1, 0.9, 1.1), (2, 1.8, 2.2), (5, 14.4, 17.6), (9, 230.4, 281.6), (10, 270.0, 330.0),
    (50, 270.0, 330.0),
])
def test_backoff_doubles_from_half_a_second_to_five_minutes_with_jitter(failures: int, low: float,
                                                                         high: float) -> None:
    backoff = Backoff()
    assert backoff.delay(failures, draw=0.0) == pytest.approx(low)
    assert backoff.delay(failures, draw=1.0) == pytest.approx(high)


class Draws(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_failures_back_off_per_key_and_forget_starts_over() -> None:
    queue: WorkQueue[str] = WorkQueue(rng=Draws(0.5))
    assert [queue.add_rate_limited("a") for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert queue.add_rate_limited("b") == 0.5, "each key backs off on its own"
    assert queue.failures("a") == 4
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 0.5


def test_a_rate_limited_key_arrives_after_its_delay() -> None:
    queue: WorkQueue[str] = WorkQueue(backoff=Backoff(base=0.05), rng=Draws(0.5))
    started = time.monotonic()
    queue.add_rate_limited("a")
    assert len(queue) == 0
    assert queue.get() == "a"
    assert time.monotonic() - started >= 0.04


def test_shards_take_turns_and_a_shard_at_its_cap_waits() -> None:
    queue: WorkQueue[tuple[str, int]] = WorkQueue(shard=lambda key: key[0], max_per_shard=2)
    for key in [("a", 1), ("a", 2), ("a", 3), ("b", 1)]:
        queue.add(key)
    assert [queue.get(), queue.get(), queue.get()] == [("a", 1), ("b", 1), ("a", 2)]
    assert queue.in_processing("a") == 2
    got: list[tuple[str, int] | None] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get()))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive(), "shard a is at its cap: a3 waits although a worker is free"
    queue.add(("c", 1))
    waiter.join(timeout=5)
    assert got == [("c", 1)], "another shard's key goes first"
    queue.done(("a", 1))
    assert queue.get() == ("a", 3)


def test_a_shard_under_its_cap_again_is_served() -> None:
    queue: WorkQueue[tuple[str, int]] = WorkQueue(shard=lambda key: key[0], max_per_shard=1)
    queue.add(("a", 1))
    queue.add(("a", 2))
    assert queue.get() == ("a", 1)
    got: list[tuple[str, int] | None] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get()))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive()
    queue.done(("a", 1))
    waiter.join(timeout=5)
    assert got == [("a", 2)]


class Counting:
    """A :class:`QueueObserver` that remembers what it heard."""

    def __init__(self) -> None:
        self.adds = 0
        self.retries = 0
        self.waits: list[float] = []
        self.works: list[float] = []

    def added(self) -> None:
        self.adds += 1

    def retried(self) -> None:
        self.retries += 1

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def worked(self, seconds: float) -> None:
        self.works.append(seconds)


def test_metrics_count_adds_as_client_go_does() -> None:
    seen = Counting()
    queue: WorkQueue[str] = WorkQueue(observer=seen)
    queue.add("a")
    queue.add("a")  # already waiting: not an add
    queue.add("b")
    assert seen.adds == 2
    assert queue.get() == "a"
    queue.add("a")  # while processing: counted once, queued again after done
    queue.add("a")
    assert seen.adds == 3
    assert len(seen.waits) == 1
    assert seen.waits[0] >= 0
    time.sleep(0.02)
    assert queue.longest_running_seconds() >= 0.02
    assert queue.unfinished_seconds() >= 0.02
    queue.done("a")
    assert len(seen.works) == 1
    assert seen.works[0] >= 0.02
    assert queue.longest_running_seconds() == 0.0


def test_metrics_count_retries_and_delayed_adds_when_they_arrive() -> None:
    seen = Counting()
    queue: WorkQueue[str] = WorkQueue(observer=seen, backoff=Backoff(base=0.01, cap=0.01))
    queue.add_rate_limited("x")
    assert (seen.retries, seen.adds) == (1, 0)  # not added until its delay passed
    assert queue.get() == "x"
    assert seen.adds == 1
    assert seen.waits[0] < 1.0  # waiting is measured from the arrival, not from the request


def test_a_delayed_add_no_longer_wanted_when_due_is_dropped() -> None:
    queue: WorkQueue[str] = WorkQueue()
    asked: list[str] = []

    def wanted(key: str, answer: bool) -> Callable[[], bool]:
        def ask() -> bool:
            asked.append(key)
            return answer
        return ask

    queue.add_after("ended-sooner", 0.01, wanted=wanted("ended-sooner", False))
    queue.add_after("still-waiting", 0.02, wanted=wanted("still-waiting", True))
    assert queue.get() == "still-waiting"
    assert asked == ["ended-sooner", "still-waiting"], "each was asked when it was due"
    assert len(queue) == 0
