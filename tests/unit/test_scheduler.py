"""The stage scheduler, table by table, on a fake clock: ordering, concurrency, failures.

:class:`Clocked` runs each stage's work on a simulated pool of ``parallelism`` workers: a
stage takes its duration in ticks, and the clock jumps to the next finish — so "when did each
stage start" and "how many ran at once" are exact, with no threads and no sleeping.  One test
at the end runs the real thread pool.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from stageset.controller.ordering import StageNode, stage_graph
from stageset.controller.stageset.scheduler import Finished, StageScheduler, Tell, Threads, Told


@dataclass
class Clocked:
    durations: dict[str, int]
    parallelism: int
    now: int = 0
    starts: dict[str, int] = field(default_factory=dict)
    most: int = 0
    closed: bool = False
    _waiting: deque[tuple[str, Callable[[Tell], Any]]] = field(default_factory=deque)
    _running: list[tuple[int, int, str, Callable[[Tell], Any]]] = field(default_factory=list)
    _events: deque[Told | Finished[Any]] = field(default_factory=deque)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, stage: str, work: Callable[[Tell], Any]) -> None:
        self._waiting.append((stage, work))
        self._start()

    def _start(self) -> None:
        while self._waiting and len(self._running) < self.parallelism:
            stage, work = self._waiting.popleft()
            self.starts[stage] = self.now
            end = self.now + self.durations.get(stage, 1)
            heapq.heappush(self._running, (end, next(self._order), stage, work))
            self.most = max(self.most, len(self._running))

    def next(self, *, block: bool) -> Told | Finished[Any] | None:
        if not self._events and self._running and (block or self._running[0][0] == self.now):
            end, _, stage, work = heapq.heappop(self._running)
            self.now = end
            def tell(notice: Any) -> None:
                self._events.append(Told(stage, notice))

            try:
                self._events.append(Finished(stage, work(tell)))
            except Exception as error:
                self._events.append(Finished(stage, None, error))
            self._start()
        assert self._events or not block, "the scheduler waits for work that was never submitted"
        return self._events.popleft() if self._events else None

    def close(self) -> None:
        self.closed = True


def graph(spec: str) -> Any:
    """``"a b>a c>a d>b,c"``: each stage and what it depends on (``x>`` — nothing; ``x`` — the one before)."""
    nodes = []
    for item in spec.split():
        name, _, deps = item.partition(">")
        nodes.append(StageNode(name, None if ">" not in item else tuple(d for d in deps.split(",") if d)))
    return stage_graph(nodes)


@dataclass
class Run:
    done: set[str]
    calls: list[str]
    clock: Clocked


def run(spec: str, *, parallelism: int = 4, durations: dict[str, int] | None = None,
        fails: set[str] = frozenset(), skip: tuple[str, ...] = (), raises: set[str] = frozenset(),
        tells: dict[str, list[str]] | None = None, calls: list[str] | None = None) -> Run:
    clock = Clocked(durations or {}, parallelism)
    calls = [] if calls is None else calls

    def work(stage: str, tell: Tell) -> bool:
        for notice in (tells or {}).get(stage, []):
            tell(notice)
        if stage in raises:
            raise RuntimeError(f"{stage} broke")
        return stage not in fails

    scheduler: StageScheduler[bool] = StageScheduler(graph=graph(spec), parallelism=parallelism, name="t",
                                                     executor=lambda: clock)
    done = scheduler.run(skip=skip, work=work, started=lambda s: calls.append(f"start {s}@{clock.now}"),
                         heard=lambda s, n: calls.append(f"heard {s}: {n}"),
                         finished=lambda s, ready: calls.append(f"finish {s}@{clock.now}") or ready,
                         progress=lambda n: calls.append(f"progress {n}"))
    return Run(done, calls, clock)


@pytest.mark.parametrize(("case", "spec", "parallelism", "durations", "starts", "most"), [
    ("a plain list runs top to bottom", "a b c", 4, {}, {"a": 0, "b": 1, "c": 2}, 1),
    ("branches run at once", "a> b>a c>a d>b,c", 4, {"b": 3}, {"a": 0, "b": 1, "c": 1, "d": 4}, 2),
    ("a dependent waits for its slowest dependency", "a> b> c>a,b", 4, {"a": 5}, {"a": 0, "b": 0, "c": 5}, 2),
    ("parallelism bounds what runs at once", "a> b> c> d>", 2, {}, {"a": 0, "b": 0, "c": 1, "d": 1}, 2),
    ("one worker: independent stages in name order", "c> a> b>", 1, {}, {"a": 0, "b": 1, "c": 2}, 1),
    ("a queued stage starts when a worker frees", "a> b> c>", 2, {"a": 4}, {"a": 0, "b": 0, "c": 1}, 2),
])
def test_ordering_and_concurrency(case: str, spec: str, parallelism: int, durations: dict[str, int],
                                  starts: dict[str, int], most: int) -> None:
    done = run(spec, parallelism=parallelism, durations=durations)
    assert done.clock.starts == starts, case
    assert done.clock.most == most, case
    assert done.done == set(starts), case
    assert done.clock.closed, case


@pytest.mark.parametrize(("case", "spec", "fails", "skip", "done", "never"), [
    ("a failed stage blocks its dependents", "a b c", {"a"}, (), set(), {"b", "c"}),
    ("only its dependents", "a> b>a c>", {"a"}, (), {"c"}, {"b"}),
    ("a failure deep in a chain", "a b c", {"b"}, (), {"a"}, {"c"}),
    ("a skipped stage (not rendered) blocks its dependents", "a> b>a c>", set(), ("a",), {"c"}, {"a", "b"}),
    ("a dependency skipped, another failed", "a> b> c>a,b", {"b"}, ("a",), set(), {"a", "c"}),
])
def test_failures_propagate_to_dependents_only(case: str, spec: str, fails: set[str], skip: tuple[str, ...],
                                               done: set[str], never: set[str]) -> None:
    result = run(spec, fails=fails, skip=skip)
    assert result.done == done, case
    assert not never & set(result.clock.starts), case


def test_callbacks_come_in_order_and_progress_once_per_batch_while_more_remains() -> None:
    result = run("a> b> c>a,b", tells={"a": ["waiting"], "b": ["waiting", "still"]})
    assert result.calls == [
        "start a@0", "start b@0",
        # a and b finish together (one batch): what they told first, then one progress.
        "heard a: waiting", "finish a@1", "heard b: waiting", "heard b: still", "finish b@1", "progress 2",
        "start c@1", "finish c@2",  # nothing remains after c: no progress
    ]


def test_a_work_that_raises_stops_new_starts_lets_running_work_finish_then_raises() -> None:
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="b broke"):
        run("a> b> c>a d>b", durations={"a": 3}, raises={"b"}, tells={"a": ["waiting"]}, calls=calls)
    # b raised at 1 while a ran: a still tells (heard) and ends, but neither finishes nor starts anything.
    assert calls == ["start a@0", "start b@0", "heard a: waiting"]


def test_the_thread_pool_runs_work_in_the_callers_context_and_callbacks_on_its_thread() -> None:
    field_ = contextvars.ContextVar("field", default="unset")
    field_.set("bound by the caller")
    caller = threading.get_ident()
    seen: dict[str, Any] = {}
    gate = threading.Barrier(2, timeout=10)  # a and b must run at once to pass it

    def work(stage: str, tell: Tell) -> str:
        if stage in ("a", "b"):
            gate.wait()
        tell(threading.get_ident())
        return field_.get()

    def finished(stage: str, value: str) -> bool:
        seen[stage] = (value, threading.get_ident())
        return True

    heard: list[int] = []
    scheduler: StageScheduler[str] = StageScheduler(graph=graph("a> b> c>a,b"), parallelism=2, name="t",
                                                    executor=lambda: Threads(parallelism=2, name="t"))
    done = scheduler.run(skip=(), work=work, started=lambda _: None, heard=lambda _, n: heard.append(n),
                         finished=finished, progress=lambda _: None)
    assert done == {"a", "b", "c"}
    assert {v for v, _ in seen.values()} == {"bound by the caller"}
    assert {t for _, t in seen.values()} == {caller}, "finished is called on the caller's thread"
    assert len(heard) == 3
    assert caller not in heard, "work ran on the pool"


def _default(spec: str, *, parallelism: int, work: Callable[[str, Tell], Any],
             heard: Callable[[str, Any], None] = lambda _, __: None) -> set[str]:
    """The scheduler as the pass builds it: no executor handed in, so it picks one."""
    scheduler: StageScheduler[Any] = StageScheduler(graph=graph(spec), parallelism=parallelism, name="t")
    return scheduler.run(skip=(), work=work, started=lambda _: None, heard=heard,
                         finished=lambda _, __: True, progress=lambda _: None)


def test_a_single_stage_runs_on_the_callers_thread_and_is_heard_while_it_runs() -> None:
    field_ = contextvars.ContextVar("field", default="unset")
    field_.set("bound by the caller")
    caller = threading.get_ident()
    heard: list[str] = []
    seen: list[tuple[int, str, list[str]]] = []

    def work(stage: str, tell: Tell) -> None:
        tell("waiting")
        seen.append((threading.get_ident(), field_.get(), list(heard)))  # heard before work ends
        field_.set("set by the work")

    assert _default("a", parallelism=4, work=work, heard=lambda _, n: heard.append(n)) == {"a"}
    assert seen == [(caller, "bound by the caller", ["waiting"])]
    assert field_.get() == "bound by the caller", "the work ran in a copy of the caller's context"


def test_one_stage_at_a_time_runs_inline_and_raises_what_a_stage_raised() -> None:
    threads: set[int] = set()

    def work(stage: str, tell: Tell) -> None:
        threads.add(threading.get_ident())
        if stage == "c":
            raise RuntimeError("c broke")

    with pytest.raises(RuntimeError, match="c broke"):
        _default("a b c", parallelism=1, work=work)
    assert threads == {threading.get_ident()}


def test_stages_that_may_run_at_once_get_the_pool() -> None:
    threads: set[int] = set()
    gate = threading.Barrier(2, timeout=10)  # a and b must run at once to pass it

    def work(stage: str, tell: Tell) -> None:
        gate.wait()
        threads.add(threading.get_ident())

    assert _default("a> b>", parallelism=2, work=work) == {"a", "b"}
    assert threading.get_ident() not in threads
