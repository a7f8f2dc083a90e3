"""The chart ships the CRDs and the RBAC the code and tests use.

What helm renders (every rule, per mode) is checked with the real binary in
``tests/helm/test_chart.py``; these checks need no binary.
"""

from __future__ import annotations

from pathlib import Path

from stageset.api.rbac import CONTROLLER_RULES, LEADER_ELECTION_RULES

CHART = Path(__file__).resolve().parents[2] / "helm" / "stageset"


def test_the_chart_carries_no_crds() -> None:
    """The chart's hook applies the CRDs the image generates (`stageset crds --apply`,
    templates/crds.yaml): no copy in the chart that could drift, and no Helm crds/ folder, which
    `helm upgrade` never updates."""
    assert not (CHART / "crds").exists()
    assert not (CHART / "files" / "crds").exists()


def test_controller_has_no_secret_read_or_general_write() -> None:
    for rule in CONTROLLER_RULES:
        assert "secrets" not in rule["resources"]
        assert "configmaps" not in rule["resources"]
        assert "*" not in rule["resources"]
        assert "*" not in rule["verbs"]


def test_leases_are_not_granted_cluster_wide() -> None:
    assert not any("leases" in rule["resources"] for rule in CONTROLLER_RULES)
    assert [rule["resources"] for rule in LEADER_ELECTION_RULES] == [["leases"]]
