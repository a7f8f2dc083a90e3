"""What reconcilers declare to the manager: predicates, work keys, the watches of each kind, and a
manager that names no kind."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stageset.controller.keys import JobKey, ObjectKey, ReportKey
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS, STAGETARGETS
from stageset.controller.manager import indexes_by_kind, watches_by_kind
from stageset.controller.result import Result
from stageset.controller.setup import (
    ANY_CHANGE,
    CHANGED_OR_GONE,
    CREATED_OR_CHANGED,
    Controller,
    Event,
    Index,
    Predicate,
    Setup,
    Watch,
    merged,
    reconcile_trigger,
)
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

MANAGER = Path(__file__).resolve().parents[2] / "stageset" / "controller" / "manager.py"


class Nothing:
    def reconcile(self, raw: KubeObject) -> Result:
        del raw
        return Result()


def constant(obj: KubeObject) -> int:
    del obj
    return 1


@pytest.mark.parametrize(("predicate", "first_seen", "changed", "unchanged", "gone", "gone_unseen"), [
    (CREATED_OR_CHANGED, True, True, False, False, False),
    (ANY_CHANGE, True, True, False, True, False),
    (CHANGED_OR_GONE, False, True, False, True, False),
])
def test_each_predicate_fires_on_the_transitions_it_names(predicate: Predicate, first_seen: bool,
                                                          changed: bool, unchanged: bool, gone: bool,
                                                          gone_unseen: bool) -> None:
    assert predicate.fires(None, ("a",)) is first_seen
    assert predicate.fires(("a",), ("b",)) is changed
    assert predicate.fires(("a",), ("a",)) is unchanged
    assert predicate.fires(("a",), None) is gone
    assert predicate.fires(None, None) is gone_unseen


def test_the_reconcile_trigger_ignores_status_and_sees_spec_requests_and_deletion() -> None:
    obj: dict[str, Any] = {"metadata": {"generation": 1}, "status": {"conditions": []}}
    before = reconcile_trigger(obj)
    assert reconcile_trigger({**obj, "status": {"conditions": [{"type": "Ready"}]}}) == before
    assert reconcile_trigger({"metadata": {"generation": 2}}) != before
    assert reconcile_trigger({"metadata": {"generation": 1, "deletionTimestamp": "now"}}) != before
    requested = {"metadata": {"generation": 1, "annotations": {"reconcile.fluxcd.io/requestedAt": "t"}}}
    assert reconcile_trigger(requested) != before


def test_keys_of_different_work_never_collapse_in_the_queue() -> None:
    keys = {ObjectKey("StageSet", "ns", "a"), ReportKey("StageSet", "ns", "a"), JobKey("StageSet", "ns", "a")}
    assert len(keys) == 3
    assert ReportKey("StageSet", "ns", "a").object == ObjectKey("StageSet", "ns", "a")
    assert ObjectKey.of({"kind": "StageSet", "metadata": {"namespace": "ns", "name": "a"}}).ref == \
        ("StageSet", "ns", "a")


def test_each_kind_gets_its_own_trigger_first_then_the_watches_declared_on_it() -> None:
    def on_git(key: ObjectKey) -> list[ObjectKey]:
        return [ObjectKey("StageSet", key.namespace, "naming")]

    watch = Watch(kind="GitRepository", state=constant, fires=CHANGED_OR_GONE, keys=on_git)
    setup = Setup(controllers=(
        Controller(resource=STAGESETS, reconciler=Nothing(), workers=1, trigger=reconcile_trigger,
                   watches=(watch,)),
        Controller(resource=GITREPOSITORIES, reconciler=Nothing(), workers=1, trigger=reconcile_trigger)))
    found = watches_by_kind(setup)
    assert [w.fires for w in found["GitRepository"]] == [CREATED_OR_CHANGED, CHANGED_OR_GONE]
    own = found["GitRepository"][0]
    assert own.state is reconcile_trigger
    assert list(own.keys(ObjectKey("GitRepository", "ns", "r"))) == [ObjectKey("GitRepository", "ns", "r")]
    assert len(found["StageSet"]) == 1


def test_a_watch_of_a_kind_no_controller_lists_is_refused() -> None:
    watch = Watch(kind="Bucket", state=constant, fires=ANY_CHANGE, keys=lambda key: [key])
    setup = Setup(controllers=(Controller(resource=STAGESETS, reconciler=Nothing(), workers=1,
                                          trigger=reconcile_trigger, watches=(watch,)),))
    with pytest.raises(ValueError, match="Bucket"):
        watches_by_kind(setup)


def test_the_manager_names_no_kind() -> None:
    """A new kind or trigger is declared by a reconciler, never written into the runtime."""
    served = {STAGESETS.kind, GITREPOSITORIES.kind, "Artifact"}
    tree = ast.parse(MANAGER.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings
    code = {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose}
    assert code, "the manager's string literals were not found"
    assert not {text for text in code if any(kind in text for kind in served)}


class Guarding:
    def observe(self, key: ObjectKey, event: Event, obj: KubeObject, *, known: bool) -> None:
        del key, event, obj, known

    def run(self, key: ObjectKey, obj: KubeObject, reconcile: Callable[[KubeObject], Result]) -> Result:
        del key
        return reconcile(obj)


def controller(resource: Resource, *, namespaces: tuple[str, ...] | None = None,
               indexed: Callable[[Event, ObjectKey, KubeObject], None] | None = None) -> Controller:
    return Controller(resource=resource, reconciler=Nothing(), workers=1, trigger=reconcile_trigger,
                      namespaces=namespaces, indexed=indexed)


def test_features_are_joined_in_order_and_a_setup_wide_guard_covers_the_selected_controllers() -> None:
    guard = Guarding()
    targets = controller(STAGETARGETS, namespaces=("platform",))
    joined = merged(Setup(controllers=(controller(STAGESETS),)),
                    Setup(controllers=(controller(GITREPOSITORIES), targets)),
                    Setup(guard=guard), Setup(listeners=(print,)))
    assert [c.kind for c in joined.controllers] == ["StageSet", "GitRepository", "StageTarget"]
    assert [c.guard for c in joined.controllers] == [guard, guard, None], \
        "a controller watched in namespaces of its own is not under the shard's selector: not guarded"
    assert joined.listeners == (print,)
    with pytest.raises(ValueError, match="guard"):
        merged(Setup(guard=guard), Setup(guard=Guarding()))


def test_an_index_on_another_features_kind_is_told_after_the_controllers_own() -> None:
    told: list[str] = []
    own = controller(STAGESETS, indexed=lambda *_: told.append("own"))
    setup = Setup(controllers=(own,), indexes=(Index(kind="StageSet",
                                                     indexed=lambda *_: told.append("fleet")),))
    for hook in indexes_by_kind(setup)["StageSet"]:
        hook(Event.ADDED, ObjectKey("StageSet", "ns", "a"), {})
    assert told == ["own", "fleet"]
    with pytest.raises(ValueError, match="Bucket"):
        indexes_by_kind(Setup(controllers=(own,), indexes=(Index(kind="Bucket", indexed=lambda *_: None),)))
