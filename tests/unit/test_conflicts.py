"""conflictPolicy: which answer an immutable-field conflict gets, object by object."""

from __future__ import annotations

from typing import Any

import pytest

from stageset.api import Stage
from stageset.api.stageset import ConflictAction
from stageset.apply.conflicts import ConflictResolver


def job(name: str = "migrate", namespace: str = "db") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace}}


def obj(kind: str, api_version: str = "v1", name: str = "x") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "db"}}


def resolver(**stage: Any) -> ConflictResolver:
    return ConflictResolver.of(Stage.model_validate({"name": "s", "sourceRef": {"name": "r"}, **stage}))


RULES = {"conflictPolicy": {"default": "KeepExisting", "rules": [
    {"target": {"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"}, "action": "Recreate"},
    {"target": {"kind": "Job"}, "action": "Fail"},
    {"target": {"kind": "Service", "namespace": "other"}, "action": "Recreate"},
]}}


@pytest.mark.parametrize(("case", "stage", "manifest", "action"), [
    ("nothing set: fail", {}, job(), ConflictAction.FAIL),
    ("force is Recreate", {"force": True}, job(), ConflictAction.RECREATE),
    ("force with default Recreate", {"force": True, "conflictPolicy": {"default": "Recreate"}}, job(),
     ConflictAction.RECREATE),
    ("rules without default keep force's", {"force": True, "conflictPolicy": {"rules": [
        {"target": {"kind": "Service"}, "action": "KeepExisting"}]}}, job(), ConflictAction.RECREATE),
    ("first matching rule wins", RULES, job(), ConflictAction.RECREATE),
    ("a later rule matches other names", RULES, job(name="seed"), ConflictAction.FAIL),
    ("group must match", RULES, obj("Job", api_version="example.com/v1", name="migrate"),
     ConflictAction.FAIL),
    ("namespace must match", RULES, obj("Service"), ConflictAction.KEEP_EXISTING),
    ("no rule: the default", RULES, obj("ConfigMap"), ConflictAction.KEEP_EXISTING),
])
def test_resolve(case: str, stage: dict[str, Any], manifest: dict[str, Any], action: ConflictAction) -> None:
    resolution = resolver(**stage).resolve(manifest)
    assert resolution.action is action, case
    assert resolution.refusal == "", case


def test_recreating_data_needs_a_rule_with_allow_data_loss() -> None:
    claim = obj("PersistentVolumeClaim")
    refused = resolver(force=True).resolve(claim)
    assert refused.action is ConflictAction.FAIL
    assert "allowDataLoss: true" in refused.refusal
    allowed = resolver(conflictPolicy={"rules": [
        {"target": {"kind": "PersistentVolumeClaim"}, "action": "Recreate", "allowDataLoss": True}]})
    assert allowed.resolve(claim).action is ConflictAction.RECREATE
    kept = resolver(conflictPolicy={"default": "KeepExisting"})
    assert kept.resolve(claim).action is ConflictAction.KEEP_EXISTING
