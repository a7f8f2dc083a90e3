"""``/metrics`` of the controller process, scraped while StageSets live and die on a real apiserver.

Also checks the dashboard and the alert rules the chart ships: every series and label they
name must be one the endpoint really exposes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import get_or_none, wait_for
from tests.e2e.metrics import METRICS_ARGS, Scrape, metrics_url, scrape
from tests.e2e.stagesets import Scenario, cm, deployment, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
FILES = Path(__file__).resolve().parents[2] / "helm" / "stageset" / "files"


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return METRICS_ARGS


@pytest.fixture(scope="module")
def url(controller: ControllerProcess) -> str:
    return metrics_url(controller)


def roll_out(s: Scenario, name: str) -> None:
    s.admin.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{s.ns}/deployments/{name}/status",
        content_type="application/merge-patch+json",
        body={
            "status": {
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": 1,
                "availableReplicas": 1,
            }
        },
    )


def eventually(url: str, check: Callable[[Scrape], Any], what: str, timeout: float = 60) -> Scrape:
    def probe() -> Scrape | None:
        found = scrape(url)
        return found if check(found) else None

    result: Scrape = wait_for(probe, timeout=timeout, what=what)
    return result


def test_series_follow_a_stageset_from_creation_to_deletion(
    controller: ControllerProcess,
    url: str,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    before = scrape(url)
    s = scenario(
        installed,
        git_server,
        make_tenant("metrics"),
        {"config/a.yaml": cm("a"), "config/b.yaml": cm("b"), "web/d.yaml": deployment("web")},
    )
    s.stageset("shop", [{"name": "config", "path": "./config"}, {"name": "web", "path": "./web"}])
    me = {"namespace": s.ns, "name": "shop"}

    # Waiting for the Deployment: the stage's phase says so, Ready is Unknown.
    waiting = eventually(
        url,
        lambda m: m.value("stageset_stage_phase", **me, stage="web", phase="Waiting") == 1,
        "stage web Waiting",
    )
    assert waiting.value("stageset_stage_phase", **me, stage="web", phase="Applying") == 0
    assert waiting.value("stageset_stage_phase", **me, stage="config", phase="Ready") == 1
    assert (
        waiting.value("stageset_reconcile_condition", kind="StageSet", **me, type="Ready", status="Unknown")
        == 1
    )
    roll_out(s, "web")
    s.wait_ready("shop")
    ready = eventually(
        url,
        lambda m: (
            m.value("stageset_reconcile_condition", kind="StageSet", **me, type="Ready", status="True") == 1
        ),
        "Ready=True in the metrics",
    )
    assert (
        ready.value("stageset_reconcile_condition", kind="StageSet", **me, type="Ready", status="False") == 0
    )
    assert ready.value("stageset_stage_phase", **me, stage="web", phase="Ready") == 1
    assert ready.value("stageset_stage_objects", **me, stage="config") == 2
    assert ready.value("stageset_objects_applied_total", **me, stage="config", action="created") == 2
    assert ready.value("stageset_objects_applied_total", **me, stage="web", action="created") == 1
    # At least the reconcile that concluded Ready was timed since the Waiting scrape (which
    # may have been taken inside that very reconcile, so it is not counted twice).
    assert ready.value("stageset_reconcile_duration_seconds_count", kind="StageSet", **me) > \
        waiting.value("stageset_reconcile_duration_seconds_count", kind="StageSet", **me)
    # The shared parts moved too, under controller-runtime's names.
    for name, labels in [
        ("controller_runtime_reconcile_total", {"controller": "stageset"}),
        ("controller_runtime_reconcile_total", {"controller": "gitrepository"}),
        ("controller_runtime_reconcile_time_seconds_count", {"controller": "stageset"}),
        ("workqueue_adds_total", {"name": "stageset"}),
        ("workqueue_work_duration_seconds_count", {"name": "stageset"}),
        ("workqueue_queue_duration_seconds_count", {"name": "gitrepository"}),
        ("stageset_apiserver_requests_total", {"identity": "tenant", "verb": "apply"}),
        ("stageset_apiserver_requests_total", {"identity": "controller", "verb": "patch"}),
    ]:
        assert ready.value(name, **labels) > before.value(name, **labels), (name, labels)
    assert (
        ready.value("controller_runtime_reconcile_total", controller="stageset", result="requeue_after") > 0
    )
    # One list and one watch per kind, as the controller: the watches are long-lived.
    assert ready.value("stageset_apiserver_requests_total", identity="controller", verb="watch") >= 2
    assert ready.value("stageset_apiserver_requests_total", identity="controller", verb="list") >= 2
    assert ready.value("controller_runtime_max_concurrent_reconciles", controller="stageset") == 4
    assert ready.value("workqueue_depth", name="stageset") >= 0
    assert ready.has("workqueue_longest_running_processor_seconds", name="stageset")
    assert ready.has("workqueue_retries_total", name="stageset")
    # Dry-runs are applies too: the tenant's apply count holds both (3 writes, and a dry-run of
    # every object but the first written of config, whose sibling's dry-run came first); no
    # request as a tenant is counted under the controller's identity.
    assert (
        sum(
            ready.value("stageset_apiserver_requests_total", identity="tenant", verb="apply", code=code)
            for code in ("200", "201")
        )
        >= 5
    )
    repo_url = git_server.url(s.repo)
    assert ready.value("stageset_git_fetches_total", url=repo_url, result="fetched") >= 1
    assert ready.value("stageset_git_fetch_duration_seconds_count", url=repo_url) >= 1
    assert ready.value("stageset_leader") == 1
    assert ready.value("stageset_caches_synced") == 1
    assert [labels["version"] for labels, _ in ready.samples("stageset_build_info")] != [""]

    # Drift: someone edits an object; the next pass restores it and counts it.
    installed.request(
        "PATCH",
        f"/api/v1/namespaces/{s.ns}/configmaps/a",
        content_type="application/merge-patch+json",
        body={"data": {"k": "by hand"}},
    )
    poke(installed, s.path("shop"))
    drifted = eventually(
        url,
        lambda m: m.value("stageset_drift_corrections_total", **me, stage="config") == 1,
        "a drift correction counted",
    )
    assert drifted.value("stageset_objects_applied_total", **me, stage="config", action="configured") == 1
    assert drifted.value("stageset_objects_applied_total", **me, stage="config", action="unchanged") >= 1

    # Prune: b leaves Git.
    second = s.commit({"config/b.yaml": None})
    s.wait_ready("shop", revision=second)
    eventually(
        url,
        lambda m: m.value("stageset_objects_pruned_total", **me, result="deleted") == 1,
        "a prune counted",
    )

    # Deleted: every series naming the StageSet goes (the GitRepository's stay).
    installed.request("DELETE", s.path("shop"))
    wait_for(lambda: get_or_none(installed, s.path("shop")) is None, what="StageSet deleted")
    gone = eventually(
        url,
        lambda m: (
            not any(
                labels.get("namespace") == s.ns and labels.get("name") == "shop"
                for family in m.families.values()
                for labels in (sample.labels for sample in family.samples)
            )
        ),
        "the StageSet's series to disappear",
    )
    assert (
        gone.value(
            "stageset_reconcile_condition",
            kind="GitRepository",
            namespace=s.ns,
            name="app",
            type="Ready",
            status="True",
        )
        == 1
    )
    assert gone.value("controller_runtime_reconcile_total", controller="stageset") > 0  # shared parts stay


def test_labels_carry_no_identity_names_secrets_or_messages(
    controller: ControllerProcess,
    url: str,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("mlabels")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("x", "${value}")}, role="view")
    secret_value = "metrics-secret-value-7d1e"
    installed.request(
        "POST",
        f"/api/v1/namespaces/{s.ns}/secrets",
        body={"metadata": {"name": "vars"}, "stringData": {"value": secret_value}},
    )
    # view cannot write ConfigMaps: RBACDenied, with the tenant's name in its message.
    s.stageset(
        "denied",
        [
            {
                "name": "app",
                "path": "./app",
                "postBuild": {"substituteFrom": [{"kind": "Secret", "name": "vars"}]},
            }
        ],
    )
    denied = s.wait_reason("denied", "RBACDenied")
    assert tenant.username in denied["message"] or "may not" in denied["message"]
    found = eventually(
        url,
        lambda m: (
            m.value(
                "stageset_reconcile_condition",
                kind="StageSet",
                namespace=s.ns,
                name="denied",
                type="Ready",
                status="False",
            )
            == 1
        ),
        "Ready=False in the metrics",
    )
    assert found.value("stageset_apiserver_requests_total", identity="tenant", code="403") > 0
    values = found.label_values()
    assert {
        v for labels, _ in found.samples("stageset_apiserver_requests_total") for v in [labels["identity"]]
    } <= {"controller", "tenant"}
    for forbidden in (tenant.service_account, tenant.username, secret_value, "RBACDenied", "may not"):
        assert not any(forbidden in value for value in values if value not in (s.ns,)), forbidden
    assert secret_value not in found.text


# -- the dashboard and the alert rules ---------------------------------------------------------

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$namespace": ".*"}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((FILES / "grafana-dashboard.json").read_text())
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable["type"] == "query" and isinstance(query, str):
            # label_values(<selector>, <label>): the selector is PromQL.
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
            assert match, query
            found.append(match[1])
    return found


def alert_expressions() -> list[str]:
    rules = yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def selectors(expression: str) -> list[tuple[str, set[str]]]:
    """The series names an expression reads, with the label names its matchers use."""
    for variable, value in GRAFANA_VARIABLES.items():
        expression = expression.replace(variable, value)
    found: list[tuple[str, set[str]]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers if m.name != "__name__"}
            found.append((node.name, labels))
        return True

    promql_parser.walk(promql_parser.parse(expression), visit)
    return found


def test_the_dashboard_and_alerts_name_only_series_the_endpoint_exposes(
    controller: ControllerProcess,
    url: str,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    # A StageSet and a source, so that every per-object family has samples whose labels we can read.
    s = scenario(installed, git_server, make_tenant("dash"), {"app/cm.yaml": cm("x")})
    s.stageset("dash", [{"name": "app", "path": "./app"}])
    s.wait_ready("dash")
    exposed = eventually(
        url, lambda m: m.has("stageset_stage_phase", namespace=s.ns, name="dash"), "the StageSet's series"
    ).exposed_names()
    expressions = dashboard_expressions() + alert_expressions()
    assert len(alert_expressions()) >= 8
    assert len(dashboard_expressions()) >= 20
    checked = 0
    for expression in expressions:
        found = selectors(expression)
        assert found, f"names no series: {expression}"
        for name, labels in found:
            assert name in exposed, f"{name} (in {expression!r}) is not exposed by /metrics"
            if exposed[name]:  # labels are known where the family has samples
                assert labels <= exposed[name], f"{name}: labels {labels - exposed[name]} are not exposed"
            checked += 1
    assert checked >= len(expressions)


def test_a_mistyped_series_fails_the_check() -> None:
    # The check above must be able to fail: a name the endpoint does not expose is caught.
    assert selectors("sum(rate(stageset_reconciles_totl[$__rate_interval]))") == [
        ("stageset_reconciles_totl", set())
    ]
    assert ("controller_runtime_reconcile_total", {"result"}) in selectors(
        'rate(controller_runtime_reconcile_total{result="error"}[5m])'
    )
