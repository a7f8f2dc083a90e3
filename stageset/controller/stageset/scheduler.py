"""Running a StageSet's stages over their dependency graph, independent branches concurrently.

A stage starts once every stage it depends on finished Ready in this pass; a stage that
is skipped (it could not be rendered) or does not end Ready blocks its dependents.  No
I/O of its own: the work and the bookkeeping are the caller's callbacks.

Only ``work`` runs elsewhere (an :class:`Executor`: a thread pool, in the caller's context —
its log fields), unless one thread could never run two stages at once (one stage to run, or a
parallelism of 1): then :class:`Inline` runs it on the caller's thread and spares the pass a pool
and a thread; everything else — ``started``, ``heard`` (what a stage's work tells while it
runs), ``finished``, ``progress`` — is called on the caller's thread, one at a time, so the
caller's state needs no lock.  A ``work`` that raises stops new stages from starting; what is
running is let finish (its notices still heard), then the error is raised.
"""

from __future__ import annotations

import contextvars
import functools
import queue
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

import networkx as nx

from stageset.controller.ordering import ready_to_start

T = TypeVar("T")
Tell = Callable[[Any], None]
"""What a stage's work calls to tell the pass something while it runs (heard on the caller's thread)."""


@dataclass(frozen=True)
class Told:
    stage: str
    notice: Any


@dataclass(frozen=True)
class Finished(Generic[T]):
    stage: str
    result: T | None = None
    error: BaseException | None = None


class Executor(Protocol[T]):
    """Where stages' work runs; :meth:`next` hands back, in order, what it told and how it ended."""

    def submit(self, stage: str, work: Callable[[Tell], T]) -> None: ...

    def next(self, *, block: bool) -> Told | Finished[T] | None: ...

    def close(self) -> None: ...


class Threads(Generic[T]):
    """The executor of a pass: a pool of ``parallelism`` threads, each work in the submitter's context."""

    def __init__(self, *, parallelism: int, name: str):
        self._pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix=f"stages-{name}")
        self._events: queue.SimpleQueue[Told | Finished[T]] = queue.SimpleQueue()

    def submit(self, stage: str, work: Callable[[Tell], T]) -> None:
        def tell(notice: Any) -> None:
            self._events.put(Told(stage, notice))

        def ended(future: Future[T]) -> None:
            error = future.exception()
            self._events.put(Finished(stage, None if error else future.result(), error))

        future = self._pool.submit(contextvars.copy_context().run, work, tell)
        future.add_done_callback(ended)

    def next(self, *, block: bool) -> Told | Finished[T] | None:
        try:
            return self._events.get(block=block)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Inline(Generic[T]):
    """The executor of a pass that runs one stage at a time: each work on the caller's thread, in a
    copy of its context as a pool would run it.  What the work tells is heard as it is told (the
    same thread: still one at a time), so a slow stage shows its progress as it would on a pool."""

    def __init__(self, *, heard: Callable[[str, Any], None]):
        self._heard = heard
        self._events: queue.SimpleQueue[Told | Finished[T]] = queue.SimpleQueue()

    def submit(self, stage: str, work: Callable[[Tell], T]) -> None:
        def tell(notice: Any) -> None:
            self._heard(stage, notice)

        try:
            result = contextvars.copy_context().run(work, tell)
        except BaseException as error:  # as a pool's future holds it: the scheduler raises it
            self._events.put(Finished(stage, None, error))
        else:
            self._events.put(Finished(stage, result))

    def next(self, *, block: bool) -> Told | Finished[T] | None:
        del block  # every submitted work has ended by the time it is asked for
        try:
            return self._events.get(block=False)
        except queue.Empty:
            return None

    def close(self) -> None:
        pass


class StageScheduler(Generic[T]):
    def __init__(self, *, graph: nx.DiGraph, parallelism: int, name: str,
                 executor: Callable[[], Executor[T]] | None = None):
        self._graph = graph
        self._parallelism = parallelism
        self._executor = executor or (lambda: Threads(parallelism=parallelism, name=name))
        self._chosen = executor is not None

    def run(self, *, skip: Iterable[str], work: Callable[[str, Tell], T], started: Callable[[str], None],
            finished: Callable[[str, T], bool], heard: Callable[[str, Any], None],
            progress: Callable[[int], None]) -> set[str]:
        """Run every stage not in ``skip`` whose dependencies allow it; returns the stages done.

        ``started(stage)`` before its work is submitted; ``work(stage, tell)`` on the executor;
        ``heard(stage, notice)`` for each ``tell``; ``finished(stage, result)`` says whether it is
        done (Ready); ``progress(done)`` once per batch of finished stages while more remains.
        """
        done: set[str] = set()
        begun: set[str] = set(skip)
        running = 0
        failure: BaseException | None = None
        alone = self._parallelism <= 1 or len(set(self._graph.nodes) - begun) <= 1
        executor: Executor[T] = (Inline(heard=heard) if alone and not self._chosen else self._executor())
        try:
            while True:
                if failure is None:
                    for stage in ready_to_start(self._graph, done=done, started=begun):
                        begun.add(stage)
                        started(stage)
                        executor.submit(stage, functools.partial(work, stage))
                        running += 1
                if not running:
                    break
                ended = False
                # One batch: block for the next event, then take whatever else has arrived.
                event = executor.next(block=True)
                while event is not None:
                    if isinstance(event, Told):
                        heard(event.stage, event.notice)
                    else:
                        running -= 1
                        if event.error is not None:
                            failure = failure or event.error
                        elif failure is None:
                            ended = True
                            if finished(event.stage, cast(T, event.result)):
                                done.add(event.stage)
                    event = executor.next(block=False)
                if ended and failure is None and (running or ready_to_start(self._graph, done=done,
                                                                               started=begun)):
                    progress(len(done))
        finally:
            executor.close()
        if failure is not None:
            raise failure
        return done
