"""The CEL sandbox: tenant expressions cannot freeze or exhaust the controller.

Measured before the sandbox existed: evaluated in-process, one expression held the
interpreter lock for 27 s and grew the process to 4.7 GB.  Here the same kinds of expression
run in a worker process: a slow one is killed at the time limit, a greedy one meets
``RLIMIT_DATA``, and the next request is served by a fresh worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from stageset.apply.cel import CelLimits, CelSandbox, LimitExceededError

BASE = {"apiVersion": "v1", "kind": "Widget", "metadata": {}, "status": {}, "self": {}}
BIG = {**BASE, "spec": {"s": "x" * 200_000, "items": list(range(9000))}}


@pytest.fixture
def sandbox() -> Iterator[CelSandbox]:
    box = CelSandbox(CelLimits(timeout=1.0, memory_bytes=256 * 1024 * 1024, workers=1))
    yield box
    box.close()


def test_a_slow_expression_is_killed_at_its_time_limit_while_other_threads_run(sandbox: CelSandbox) -> None:
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.monotonic()
    try:
        with pytest.raises(LimitExceededError):
            sandbox.evaluate(["spec.items.all(i, !spec.s.matches('(x+x+)+y'))"], BIG)
    finally:
        stop.set()
        ticker.join()
    took = time.monotonic() - started
    assert 1.0 <= took < 5, took
    assert sandbox.killed == 1
    # The controller's own threads were never held: the ticker kept ticking all along.
    assert len(ticks) >= 0.5 * took / 0.01, (len(ticks), took)
    # The next request gets a fresh worker.
    assert sandbox.evaluate(["true"], BIG)[0].value is True


def test_a_greedy_expression_meets_the_memory_limit_not_the_machine() -> None:
    # A time limit far above what filling 256 MiB takes: on a loaded machine the default 1 s
    # fired first once, and this test is about the memory limit.
    sandbox = CelSandbox(CelLimits(timeout=20.0, memory_bytes=256 * 1024 * 1024, workers=1))
    try:
        answer = sandbox.evaluate(["spec.items.map(i, spec.s + spec.s + spec.s + spec.s).size() > 0"], BIG)[0]
        assert answer.value is None
        assert answer.error is not None
        assert "bad_alloc" in answer.error
        assert sandbox.evaluate(["true"], BASE)[0].value is True
    finally:
        sandbox.close()


def test_nesting_and_iterations_are_bounded_by_the_runtime(sandbox: CelSandbox) -> None:
    deep = "(" * 100 + "true" + ")" * 100
    assert "recursion limit" in (sandbox.check([deep])[0].error or "")
    many = {**BASE, "spec": {"items": list(range(200))}}
    nested = sandbox.evaluate(["spec.items.all(x, spec.items.all(y, x + y >= 0))"], many)[0]
    assert "Iteration budget exceeded" in (nested.error or "")
