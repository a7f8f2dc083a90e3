from __future__ import annotations

import pytest

from stageset.controller.ordering import (
    OrderingError,
    StageNode,
    dependencies,
    ready_to_start,
    stage_graph,
)


def nodes(*specs: tuple[str, tuple[str, ...] | None]) -> list[StageNode]:
    return [StageNode(name, deps) for name, deps in specs]


def test_plain_list_runs_top_to_bottom() -> None:
    deps = dependencies(nodes(("a", None), ("b", None), ("c", None)))
    assert deps == {"a": (), "b": ("a",), "c": ("b",)}


def test_explicit_empty_depends_on_means_no_dependencies() -> None:
    deps = dependencies(nodes(("a", None), ("b", ())))
    assert deps == {"a": (), "b": ()}


def test_explicit_edges_replace_the_implicit_one() -> None:
    deps = dependencies(nodes(("a", None), ("b", None), ("c", ("a",))))
    assert deps["c"] == ("a",)
    assert deps["b"] == ("a",)


def test_diamond_releases_both_middle_stages_together() -> None:
    graph = stage_graph(nodes(("top", None), ("left", ("top",)), ("right", ("top",)),
                              ("bottom", ("left", "right"))))
    assert ready_to_start(graph, done=set(), started=set()) == ["top"]
    assert ready_to_start(graph, done={"top"}, started={"top"}) == ["left", "right"]
    assert ready_to_start(graph, done={"top", "left"}, started={"top", "left", "right"}) == []
    assert ready_to_start(graph, done={"top", "left", "right"},
                          started={"top", "left", "right"}) == ["bottom"]


def test_unknown_dependency_is_named() -> None:
    with pytest.raises(OrderingError, match="unknown stage\\(s\\) nope"):
        dependencies(nodes(("a", ("nope",))))


def test_cycle_is_spelled_out() -> None:
    with pytest.raises(OrderingError) as caught:
        stage_graph(nodes(("a", ("c",)), ("b", ("a",)), ("c", ("b",))))
    assert caught.value.cycle is not None
    assert set(caught.value.cycle) == {"a", "b", "c"}
    assert "->" in str(caught.value)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(OrderingError, match="more than once"):
        dependencies(nodes(("a", None), ("a", None)))
