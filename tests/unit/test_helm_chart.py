"""The chart ships the CRDs and the RBAC the code and tests use.

What helm renders (every rule, per mode) is checked with the real binary in
``tests/helm/test_chart.py``; these checks need no binary.
"""

from __future__ import annotations

from pathlib import Path

from stageset.api.rbac import CONTROLLER_RULES, LEADER_ELECTION_RULES

CHART = Path(__file__).resolve().parents[2] / "helm" / "stageset"


def test_chart_crds_are_the_generated_ones() -> None:
    """The chart renders its CRDs from files/crds/ (templates/crds.yaml); Helm's crds/ folder, which
    `helm upgrade` never updates, stays empty."""
    root = CHART.parents[1] / "crds"
    generated = sorted(root.glob("*.yaml"))
    assert generated
    assert sorted(p.name for p in (CHART / "files" / "crds").glob("*.yaml")) == [p.name for p in generated]
    for crd in generated:
        assert (CHART / "files" / "crds" / crd.name).read_text() == crd.read_text()
    assert not (CHART / "crds").exists()


def test_controller_has_no_secret_read_or_general_write() -> None:
    for rule in CONTROLLER_RULES:
        assert "secrets" not in rule["resources"]
        assert "configmaps" not in rule["resources"]
        assert "*" not in rule["resources"]
        assert "*" not in rule["verbs"]


def test_leases_are_not_granted_cluster_wide() -> None:
    assert not any("leases" in rule["resources"] for rule in CONTROLLER_RULES)
    assert [rule["resources"] for rule in LEADER_ELECTION_RULES] == [["leases"]]
