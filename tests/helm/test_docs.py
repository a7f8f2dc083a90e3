"""docs/reference/helm-values.md is generated from the schema; the schema's defaults are values.yaml's;
what docs/install.md shows `stageset check` count for the chart is what it renders."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from stageset.cli.check import parse_flags, rights_needed
from stageset.envtest import chartdocs
from tests.helm.chart import CHART, Helm, controller_args


def test_the_value_reference_is_current() -> None:
    page = chartdocs.PAGE.read_text()
    assert chartdocs.updated(page, json.loads(chartdocs.SCHEMA.read_text())) == page, \
        "docs/reference/helm-values.md is not current: run `make docs`"


def test_the_reference_lists_every_value() -> None:
    page = chartdocs.PAGE.read_text()
    for path in ("rbac.clusterAdmin", "controller.watchNamespaces", "controller.leaderElection.leaseDuration",
                 "image.repository", "replicaCount", "metrics.serviceMonitor.enabled"):
        assert f"| `{path}` |" in page


def test_schema_defaults_are_the_values_file_s() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert set(value) <= set(node["properties"]), path
            for key, child in node["properties"].items():
                if key in value:
                    walk(child, value[key], f"{path}.{key}".lstrip("."))
            return
        assert node.get("default") == value, f"{path}: schema default {node.get('default')!r} != {value!r}"

    walk(schema, values, "")


def test_the_install_guide_counts_the_rights_stageset_check_asks_for(helm: Helm) -> None:
    """docs/install.md shows `stageset check` on the default chart: its count of rights is the one
    check would ask the apiserver about for the flags the chart renders, so it cannot drift."""
    flags = parse_flags(controller_args(helm.render()))
    needed = len(rights_needed(flags, namespace="stageset-system"))
    guide = (Path(__file__).resolve().parents[2] / "docs" / "install.md").read_text()
    assert re.findall(r"has all (\d+) rights its flags need", guide) == [str(needed)]


def test_a_label_shard_needs_the_lease_rights_without_leader_election() -> None:
    """Its hand-off records are Leases in its own namespace (stageset/controller/handoff.py)."""
    shard = rights_needed({"watch-label-selector": "shard=a"}, namespace="shards")
    leases = [(a["verb"], a["namespace"]) for a in shard if a["resource"] == "leases"]
    assert leases == [(verb, "shards") for verb in ("get", "create", "update", "delete")]
    assert len(shard) == len(rights_needed({}, namespace="shards")) + len(leases)
