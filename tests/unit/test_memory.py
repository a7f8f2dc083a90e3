"""The allocator trimmer (controller/memory.py): when it trims, with an injected clock."""

from __future__ import annotations

import threading

import pytest

from stageset.controller import memory


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("steps", "expected"), [
    # (seconds since the trimmer was made or last trimmed, idle?) -> trimmed?
    ([(0.5, False)], [False]),
    ([(9.9, False)], [False]),
    ([(10.0, False)], [True]),
    ([(0.5, True)], [False]),
    ([(1.0, True)], [True]),
    ([(10.0, False), (2.0, False), (8.0, False)], [True, False, True]),
    ([(1.0, True), (0.5, True), (0.5, True)], [True, False, True]),
    ([(3.0, False), (0.0, True)], [False, True]),
], ids=["busy-too-soon", "busy-just-before", "busy-interval", "idle-too-soon", "idle-interval",
        "busy-measured-from-the-last-trim", "idle-measured-from-the-last-trim", "going-idle-trims"])
def test_trims_at_most_once_per_interval(steps: list[tuple[float, bool]], expected: list[bool]) -> None:
    clock = FakeClock()
    released: list[float] = []
    collected: list[float] = []
    trimmer = memory.Trimmer(interval=10.0, idle_interval=1.0, monotonic=clock,
                             release=lambda: released.append(clock.now) is None,
                             collect=lambda: collected.append(clock.now))
    results = []
    for advance, idle in steps:
        clock.now += advance
        results.append(trimmer.after_work(idle=idle))
    assert results == expected
    assert trimmer.trims == len(released) == expected.count(True)
    # A full collection only when the workers go quiet (a busy one would cost every pass).
    quiet = [idle and trimmed for (_, idle), trimmed in zip(steps, expected, strict=True)]
    assert len(collected) == quiet.count(True)


def test_a_thread_that_finds_a_trim_in_progress_does_not_wait() -> None:
    clock = FakeClock()
    inside, leave = threading.Event(), threading.Event()

    def slow_release() -> bool:
        inside.set()
        leave.wait(10)
        return True

    trimmer = memory.Trimmer(interval=1.0, monotonic=clock, release=slow_release, collect=lambda: None)
    clock.now += 5
    first = threading.Thread(target=trimmer.after_work)
    first.start()
    assert inside.wait(10)
    assert trimmer.after_work() is False  # returns at once: another thread holds the trim
    leave.set()
    first.join(10)
    assert trimmer.trims == 1


def test_trimming_gives_freed_memory_back_on_glibc() -> None:
    if not memory.cap_arenas():
        pytest.skip("not glibc: the allocator calls are no-ops by design")

    def rss_kib() -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))

    before = rss_kib()
    garbage = [bytes(1000) + i.to_bytes(4, "little") for i in range(200_000)]  # ~200 MiB of small blocks
    keep = [str(i) for i in range(0, 200_000, 1000)]  # scattered survivors fragment the heap
    del garbage
    freed = rss_kib()
    memory.trim()
    trimmed = rss_kib()
    assert keep
    assert freed - before > 100_000, (before, freed)  # the memory was still held before the trim
    assert trimmed - before < 40_000, (before, freed, trimmed)
