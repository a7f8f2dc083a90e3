"""The write fence (stageset/kube/fence.py): refused once revoked, reads never, and the moment the
last write in flight ends is told exactly once."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stageset.kube import fence


def test_no_fence_lets_everything_through() -> None:
    with fence.writing("PATCH"):
        pass
    fence.check()


def test_a_revoked_fence_refuses_writes_but_not_reads() -> None:
    refused: list[int] = []
    held = fence.Fence(on_refused=lambda: refused.append(1))
    with fence.holding(held):
        with fence.writing("PATCH"):
            pass
        assert held.revoke() is True  # nothing in flight
        with fence.writing("GET"), fence.writing("HEAD"):
            pass
        for method in ("PATCH", "POST", "PUT", "DELETE", "patch"):
            with pytest.raises(fence.WriteFenced), fence.writing(method):
                raise AssertionError("sent under a revoked fence")
        with pytest.raises(fence.WriteFenced):
            fence.check()
    assert len(refused) == 6
    with fence.writing("PATCH"):  # outside the fence again
        pass


def test_the_end_of_the_last_write_in_flight_is_told_once() -> None:
    held = fence.Fence()
    quiet: list[str] = []
    with fence.holding(held), fence.writing("PATCH"):
        with fence.writing("PUT"):
            assert held.revoke(on_quiet=lambda: quiet.append("quiet")) is False
        assert quiet == []  # one still in flight
    assert quiet == ["quiet"]
    with fence.holding(held), pytest.raises(fence.WriteFenced), fence.writing("PATCH"):
        pass
    assert quiet == ["quiet"]


def test_threads_started_in_the_context_hold_the_fence() -> None:
    held = fence.Fence()
    with fence.holding(held):
        context = contextvars.copy_context()
    held.revoke()
    with ThreadPoolExecutor(max_workers=1) as pool:
        outcome = pool.submit(context.run, fence.check).exception()
        plain = pool.submit(fence.check).exception()  # a thread outside the context
    assert isinstance(outcome, fence.WriteFenced)
    assert plain is None


def test_revoking_while_writes_race_never_loses_the_quiet_call() -> None:
    for _ in range(50):
        held = fence.Fence()
        quiet = threading.Event()
        started = threading.Barrier(5)

        def write(held: fence.Fence = held, started: threading.Barrier = started) -> None:
            started.wait()
            with fence.holding(held):
                try:
                    with fence.writing("PATCH"):
                        pass
                except fence.WriteFenced:
                    pass

        threads = [threading.Thread(target=write) for _ in range(4)]
        for thread in threads:
            thread.start()
        started.wait()
        if held.revoke(on_quiet=quiet.set):
            quiet.set()
        for thread in threads:
            thread.join()
        assert quiet.is_set()
