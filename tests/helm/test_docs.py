"""docs/reference/helm-values.md is generated from the schema; the schema's defaults are values.yaml's."""

from __future__ import annotations

import json
from typing import Any

import yaml

from stageset.envtest import chartdocs
from tests.helm.chart import CHART


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
