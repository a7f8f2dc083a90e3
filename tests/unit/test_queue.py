from __future__ import annotations

import threading

from stageset.controller.queue import WorkQueue


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
