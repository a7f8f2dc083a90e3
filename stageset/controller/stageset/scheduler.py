"""Running a StageSet's stages over their dependency graph, independent branches concurrently.

A stage starts once every stage it depends on finished Ready in this pass; a stage that
is skipped (it could not be rendered) or does not end Ready blocks its dependents.  No
I/O of its own: the work and the bookkeeping are the caller's callbacks, all called on
the caller's thread except ``work``, which runs in the caller's context (log fields).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

import networkx as nx

from stageset.controller.ordering import ready_to_start

T = TypeVar("T")


class StageScheduler(Generic[T]):
    def __init__(self, *, graph: nx.DiGraph, parallelism: int, name: str):
        self._graph = graph
        self._parallelism = parallelism
        self._name = name

    def run(self, *, skip: Iterable[str], work: Callable[[str], T], started: Callable[[str], None],
            finished: Callable[[str, T], bool], progress: Callable[[int], None]) -> set[str]:
        """Run every stage not in ``skip`` whose dependencies allow it; returns the stages done.

        ``started(stage)`` before its work is submitted; ``work(stage)`` on a pool thread;
        ``finished(stage, result)`` says whether it is done (Ready); ``progress(done)`` whenever
        more remains to run after a stage finished.
        """
        done: set[str] = set()
        begun: set[str] = set(skip)
        futures: dict[Future[T], str] = {}
        with ThreadPoolExecutor(max_workers=self._parallelism,
                                thread_name_prefix=f"stages-{self._name}") as pool:
            while True:
                for stage in ready_to_start(self._graph, done=done, started=begun):
                    begun.add(stage)
                    started(stage)
                    futures[pool.submit(contextvars.copy_context().run, work, stage)] = stage
                if not futures:
                    return done
                completed, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                for future in completed:
                    stage = futures.pop(future)
                    if finished(stage, future.result()):
                        done.add(stage)
                if futures or ready_to_start(self._graph, done=done, started=begun):
                    progress(len(done))
