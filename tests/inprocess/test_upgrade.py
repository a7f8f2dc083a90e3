"""Upgrade safety: StageSets as earlier controllers stored them are read by this code without loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stageset.api import StageSet, StageSetStatus
from stageset.apply.inventory import by_stage, entry_id
from stageset.apply.record import ANNOTATION, parse
from tests.inprocess.conftest import NS, World, configmap, deployment

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
OWNED = {"stages.metio.wtf/name": "shop", "stages.metio.wtf/namespace": NS}


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_a_stored_stageset_is_read_whole(fixture: str) -> None:
    stored = json.loads((FIXTURES / fixture).read_text())
    StageSet.model_validate({**stored, "status": None})
    status = StageSetStatus.model_validate(stored["status"])
    inventories = by_stage(status.inventory)
    assert sorted(inventories) == ["app", "web"]
    assert sorted(str(entry_id(e).name) for e in inventories["app"].entries) == ["a", "b"]
    assert inventories["web"].entries[0].v == "apps/v1"
    assert inventories["app"].service_account_name == "deployer"
    record = parse(stored)
    if ANNOTATION in stored["metadata"].get("annotations", {}):
        assert not record.rebuild
        assert sorted(record.stages) == ["app", "web"]
    else:
        assert record.stages == {}


def _cases() -> list[tuple[str, bool]]:
    """Every fixture as stored, and — where it has a record — with its status lost too (without a
    record, a lost status leaves nothing to rebuild from: documented in docs/concepts.md)."""
    cases = []
    for path in sorted(FIXTURES.glob("*.json")):
        cases.append((path.name, False))
        if ANNOTATION in json.loads(path.read_text())["metadata"].get("annotations", {}):
            cases.append((path.name, True))
    return cases


@pytest.mark.parametrize(("fixture", "status_lost"), _cases())
def test_the_new_controller_prunes_from_what_was_stored(
    world: World, fixture: str, status_lost: bool
) -> None:
    stored = json.loads((FIXTURES / fixture).read_text())
    # The cluster as the old controller left it: its objects, labelled, and the StageSet.
    for name, stage in (("a", "app"), ("b", "app")):
        world.cluster.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "namespace": NS, "labels": {**OWNED, "stages.metio.wtf/stage": stage}}})
    world.cluster.put({**json.loads(deployment("web")), "metadata": {
        "name": "web", "namespace": NS, "labels": {**OWNED, "stages.metio.wtf/stage": "web"}}})
    world.commit({"app/a.json": configmap("a"), "web/web.json": deployment("web")})
    if status_lost:
        stored.pop("status")
    world.cluster.put(stored)
    world.roll_out("web")

    world.reconcile("shop")

    assert world.configmap("b") is None, "b left Git: pruned"
    assert world.configmap("a") is not None
    assert world.ready("shop")["status"] == "True"
    record = parse(world.get("shop"))
    assert sorted(record.stages) == ["app", "web"], "the record is written by the new code"
