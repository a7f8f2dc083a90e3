"""The Helm chart ships the same RBAC and CRDs the code and tests use (no helm binary needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from stageset.api.rbac import CONTROLLER_RULES, aggregated_cluster_roles

CHART = Path(__file__).resolve().parents[2] / "helm" / "stageset"


def static_documents(template: str) -> list[dict[str, Any]]:
    """The template's documents with Go-template lines dropped and inline actions blanked."""
    kept = [line for line in template.splitlines() if not line.strip().startswith("{{")]
    text = re.sub(r"\{\{[^}]*\}\}", "x", "\n".join(kept))
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_controller_cluster_role_matches_the_code() -> None:
    docs = static_documents((CHART / "templates" / "rbac.yaml").read_text())
    roles = [d for d in docs if d["kind"] == "ClusterRole"]
    assert len(roles) == 1
    assert roles[0]["rules"] == CONTROLLER_RULES


def test_aggregated_roles_match_the_code() -> None:
    docs = static_documents((CHART / "templates" / "aggregate-roles.yaml").read_text())
    expected = aggregated_cluster_roles()
    assert [(d["metadata"]["name"], d["metadata"]["labels"], d["rules"]) for d in docs] == \
        [(r["metadata"]["name"], r["metadata"]["labels"], r["rules"]) for r in expected]


def test_chart_crds_are_the_generated_ones() -> None:
    root = CHART.parents[1] / "crds"
    for crd in root.glob("*.yaml"):
        assert (CHART / "crds" / crd.name).read_text() == crd.read_text()


def test_controller_has_no_secret_read_or_general_write() -> None:
    for rule in CONTROLLER_RULES:
        assert "secrets" not in rule["resources"]
        assert "configmaps" not in rule["resources"]
        assert "*" not in rule["resources"]
        assert "*" not in rule["verbs"]

