"""The one watchdog thread of Git HTTP sessions (sources/transport.py): each armed action runs once
its deadline passes, a cancelled one never, in deadline order, and a failing action stops nothing."""

from __future__ import annotations

import threading

from sources.transport import Watchdog


def test_actions_run_at_their_deadlines_in_order_and_cancelled_ones_never() -> None:
    watchdog = Watchdog()
    ran: list[str] = []
    done = threading.Event()

    def record(name: str) -> None:
        ran.append(name)
        if name == "last":
            done.set()

    watchdog.arm(0.30, lambda: record("last"))
    cancelled = watchdog.arm(0.05, lambda: record("cancelled"))
    watchdog.arm(0.10, lambda: (_ for _ in ()).throw(RuntimeError("a failing action")))
    watchdog.arm(0.15, lambda: record("first"))
    cancelled.cancel()

    assert done.wait(10)
    assert ran == ["first", "last"]


def test_one_thread_for_every_session() -> None:
    watchdog = Watchdog()
    before = threading.active_count()
    armed = [watchdog.arm(60, lambda: None) for _ in range(50)]
    assert threading.active_count() == before + 1
    for one in armed:
        one.cancel()
