"""Which StageSets wait on which: wakes dependents on a status change and finds cycles.

Built from the controller's watch cache (controller identity), it only ever answers
about StageSets the controller already watches; whether a tenant may *read* its
dependency is still checked with the tenant's identity by the reconciler.  Messages
built from it (:func:`spell_cycle`) name only StageSets in the asking StageSet's own
namespace: the index sees every namespace, the tenant does not.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import networkx as nx

Key = tuple[str, str]  # (namespace, name)

ELSEWHERE = "(a StageSet in another namespace)"


def describe(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def spell_cycle(cycle: Sequence[Key], *, namespace: str) -> str:
    """``ns/a -> ns/b -> ns/a``, with StageSets outside ``namespace`` not named."""
    return " -> ".join(describe(k) if k[0] == namespace else ELSEWHERE for k in [*cycle, cycle[0]])


class DependencyIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._graph: nx.DiGraph = nx.DiGraph()  # edge: dependency -> dependent

    def update(self, key: Key, depends_on: list[Key]) -> None:
        with self._lock:
            if key in self._graph:
                self._graph.remove_edges_from(list(self._graph.in_edges(key)))
            self._graph.add_node(key)
            for dependency in depends_on:
                self._graph.add_edge(dependency, key)

    def remove(self, key: Key) -> None:
        with self._lock:
            if key in self._graph:
                self._graph.remove_edges_from(list(self._graph.in_edges(key)))
                if not self._graph.out_degree(key):
                    self._graph.remove_node(key)

    def dependents(self, key: Key) -> list[Key]:
        with self._lock:
            return sorted(self._graph.successors(key)) if key in self._graph else []

    def cycle_through(self, key: Key) -> list[Key] | None:
        """A dependency cycle that contains ``key``, in order, or ``None``."""
        with self._lock:
            if key not in self._graph:
                return None
            try:
                edges = nx.find_cycle(self._graph, source=key)
            except nx.NetworkXNoCycle:
                return None
            cycle = [edge[0] for edge in edges]
            return cycle if key in cycle else None
