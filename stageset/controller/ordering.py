"""Stage ordering: the dependsOn graph of one StageSet.  Pure; unit-tested directly.

Rule (DESIGN.md): a stage without ``dependsOn`` depends on the stage listed before
it, so a plain list runs top to bottom; a stage with ``dependsOn`` (even ``[]``)
depends on exactly those stages, so independent branches may run concurrently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx


@dataclass(frozen=True)
class StageNode:
    name: str
    depends_on: tuple[str, ...] | None  # None: "the stage before me"


class OrderingError(ValueError):
    """The graph cannot be run; ``cycle`` is set when a cycle is the cause."""

    def __init__(self, message: str, *, cycle: list[str] | None = None):
        super().__init__(message)
        self.cycle = cycle


def dependencies(stages: Sequence[StageNode]) -> dict[str, tuple[str, ...]]:
    """Each stage's direct dependencies after applying the implicit list-order rule."""
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise OrderingError(f"stage name {duplicate!r} is used more than once")
    result: dict[str, tuple[str, ...]] = {}
    for index, stage in enumerate(stages):
        if stage.depends_on is None:
            result[stage.name] = (names[index - 1],) if index > 0 else ()
            continue
        unknown = [d for d in stage.depends_on if d not in names]
        if unknown:
            raise OrderingError(f"stage {stage.name!r} depends on unknown stage(s) {', '.join(unknown)}")
        result[stage.name] = tuple(dict.fromkeys(stage.depends_on))
    return result


def stage_graph(stages: Sequence[StageNode]) -> nx.DiGraph:
    """Edges point from a dependency to its dependent; raises on cycles, naming one."""
    graph: nx.DiGraph = nx.DiGraph()
    for name, deps in dependencies(stages).items():
        graph.add_node(name)
        for dep in deps:
            graph.add_edge(dep, name)
    try:
        cycle_edges = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return graph
    cycle = [edge[0] for edge in cycle_edges]
    raise OrderingError("stages form a cycle: " + " -> ".join([*cycle, cycle[0]]), cycle=cycle)


def ready_to_start(graph: nx.DiGraph, *, done: set[str], started: set[str]) -> list[str]:
    """Stages not yet started whose dependencies are all done, in a stable order."""
    return sorted(n for n in graph.nodes if n not in started
                  and all(p in done for p in graph.predecessors(n)))
