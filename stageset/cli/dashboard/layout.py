"""Where each node of a stage graph goes in the picture.  Pure: no I/O, unit-tested directly.

The graph is the project's own (:func:`stageset.controller.ordering.stage_graph`, which applies
the "no ``dependsOn``: after the stage listed before it" rule), plus one node per StageSet this
one depends on, pointing at the stages that start first.  networkx layers it
(``topological_generations``: a node's layer is the longest chain of dependencies before it), so
everything a node waits for lies in earlier layers.  Within a layer, nodes keep the order the
user listed them in, nudged towards their predecessors (the mean of their rows) so that a
diamond does not cross itself.  Layers run left to right (``vertical=False``, for wide screens)
or top to bottom (``vertical=True``, for phones).

The output is numbers and node ids only: every label is rendered later by the template engine,
which escapes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

NODE_WIDTH = 168
NODE_HEIGHT = 54
LAYER_GAP = 64  # between layers (along the flow)
ROW_GAP = 22  # between nodes of one layer
MARGIN = 12


@dataclass(frozen=True)
class Placed:
    """A node's box, in SVG user units (``x``, ``y``: its top-left corner)."""

    id: str
    x: float
    y: float
    layer: int
    row: int

    @property
    def cx(self) -> float:
        return self.x + NODE_WIDTH / 2

    @property
    def cy(self) -> float:
        return self.y + NODE_HEIGHT / 2


@dataclass(frozen=True)
class Arrow:
    """An edge from ``source`` (a dependency) to ``target`` (its dependent), as an SVG path."""

    source: str
    target: str
    path: str


@dataclass(frozen=True)
class Picture:
    width: float
    height: float
    nodes: dict[str, Placed]
    arrows: list[Arrow]


def layers(graph: nx.DiGraph, order: Sequence[str]) -> list[list[str]]:
    """The nodes by layer (dependencies first); within a layer, nearest to their predecessors,
    then in ``order``.  A graph with a cycle (refused by the controller, but still drawable) gets
    one layer per node, in ``order``."""
    rank = {name: i for i, name in enumerate(order)}
    try:
        generations = [list(g) for g in nx.topological_generations(graph)]
    except nx.NetworkXUnfeasible:
        return [[name] for name in sorted(graph.nodes, key=lambda n: rank.get(n, len(rank)))]
    placed: dict[str, float] = {}
    result: list[list[str]] = []
    for generation in generations:
        def key(node: str) -> tuple[float, int]:
            rows = [placed[p] for p in graph.predecessors(node) if p in placed]
            return (sum(rows) / len(rows) if rows else -1.0, rank.get(node, len(rank)))

        ordered = sorted(generation, key=key)
        for row, node in enumerate(ordered):
            placed[node] = row - (len(ordered) - 1) / 2  # layers are drawn centred
        result.append(ordered)
    return result


def _curve(start: tuple[float, float], end: tuple[float, float], *, vertical: bool) -> str:
    (x1, y1), (x2, y2) = start, end
    if vertical:
        bend = max((y2 - y1) / 2, 16.0)
        return f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"
    bend = max((x2 - x1) / 2, 16.0)
    return f"M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"


def picture(graph: nx.DiGraph, *, order: Sequence[str], vertical: bool = False) -> Picture:
    """Lay ``graph`` out; ``order`` is the order the user listed the nodes in."""
    by_layer = layers(graph, order)
    tallest = max((len(layer) for layer in by_layer), default=0)
    along, across = (NODE_HEIGHT, NODE_WIDTH) if vertical else (NODE_WIDTH, NODE_HEIGHT)
    nodes: dict[str, Placed] = {}
    for index, layer in enumerate(by_layer):
        # Each layer is centred across the flow.
        offset = (tallest - len(layer)) * (across + ROW_GAP) / 2
        for row, node in enumerate(layer):
            flow = MARGIN + index * (along + LAYER_GAP)
            side = MARGIN + offset + row * (across + ROW_GAP)
            x, y = (side, flow) if vertical else (flow, side)
            nodes[node] = Placed(id=node, x=x, y=y, layer=index, row=row)
    arrows = []
    for source, target in graph.edges:
        a, b = nodes[source], nodes[target]
        if vertical:
            start, end = (a.cx, a.y + NODE_HEIGHT), (b.cx, b.y)
        else:
            start, end = (a.x + NODE_WIDTH, a.cy), (b.x, b.cy)
        arrows.append(Arrow(source=source, target=target, path=_curve(start, end, vertical=vertical)))
    count = len(by_layer)
    flow_size = MARGIN * 2 + count * along + max(count - 1, 0) * LAYER_GAP
    side_size = MARGIN * 2 + tallest * across + max(tallest - 1, 0) * ROW_GAP
    width, height = (side_size, flow_size) if vertical else (flow_size, side_size)
    return Picture(width=width, height=height, nodes=nodes, arrows=arrows)
