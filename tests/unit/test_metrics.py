"""The metrics registry: series per object live exactly as long as the object, Git URL series as
long as a GitRepository fetches the URL, request records become verb/identity/cluster/code."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stageset.apply.changeset import Action, Change, ChangeSet
from stageset.apply.inventory import ObjectId
from stageset.controller.metrics import Metrics
from stageset.kube.client import LOCAL, ClusterKey, Identity, RequestRecord, request_verb


def samples(metrics: Metrics, series: str, /, **labels: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == series and all(sample.labels.get(k) == v for k, v in labels.items()):
                found.append((sample.labels, sample.value))
    return found


def value(metrics: Metrics, series: str, /, **labels: str) -> float:
    return sum(v for _, v in samples(metrics, series, **labels))


def stageset(
    *, ready: str | None = None, stages: list[dict[str, Any]] | None = None, suspend: bool = False
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready}] if ready else []
    return {"spec": {"suspend": suspend}, "status": {"conditions": conditions, "stages": stages or []}}


KEY = ("StageSet", "shop", "web")


def test_conditions_and_phases_are_one_hot_and_follow_the_object() -> None:
    metrics = Metrics()
    metrics.observe(KEY, stageset())
    ready = {"kind": "StageSet", "namespace": "shop", "name": "web", "type": "Ready"}
    assert {s["status"]: v for s, v in samples(metrics, "stageset_reconcile_condition", **ready)} == {
        "True": 0,
        "False": 0,
        "Unknown": 0,
    }
    metrics.observe(
        KEY, stageset(ready="Unknown", stages=[{"name": "app", "phase": "Waiting", "objects": 3}])
    )
    phases = {s["phase"]: v for s, v in samples(metrics, "stageset_stage_phase", stage="app")}
    assert phases == {"Pending": 0, "Applying": 0, "Waiting": 1, "Ready": 0, "Progressing": 0, "Failed": 0}
    assert value(metrics, "stageset_stage_objects", stage="app") == 3
    metrics.observe(KEY, stageset(ready="True", stages=[{"name": "other", "phase": "Ready"}]))
    assert value(metrics, "stageset_reconcile_condition", **ready, status="True") == 1
    assert samples(metrics, "stageset_stage_phase", stage="app") == []  # a removed stage's series go
    assert value(metrics, "stageset_stage_phase", stage="other", phase="Ready") == 1


def test_forget_removes_every_series_naming_the_object_and_later_records_are_dropped() -> None:
    metrics = Metrics()
    other = ("StageSet", "shop", "other")
    for key in (KEY, other):
        metrics.observe(key, stageset(ready="True", stages=[{"name": "app", "phase": "Ready"}], suspend=True))
        metrics.reconciled(key, result="requeue_after", seconds=0.2)
        changes = ChangeSet(
            [
                Change(
                    ObjectId(namespace="shop", name="a", group="", kind="ConfigMap"),
                    Action.CREATED,
                    drift=True,
                )
            ]
        )
        metrics.applied(key[1:], "app", changes)  # type: ignore[arg-type]
        metrics.pruned(key[1:], deleted=1, failed=0)  # type: ignore[arg-type]
    assert value(metrics, "stageset_objects_applied_total", name="web", action="created") == 1
    assert value(metrics, "stageset_drift_corrections_total", name="web") == 1
    metrics.forget(KEY)
    text = metrics.exposition().decode()
    assert 'name="web"' not in text
    assert 'name="other"' in text
    # A reconcile that finishes after the deletion records nothing about the object...
    metrics.reconciled(KEY, result="success", seconds=0.1)
    metrics.applied(("shop", "web"), "app", ChangeSet([]))
    assert 'name="web"' not in metrics.exposition().decode()
    # ...but still counts for the controller.
    assert value(metrics, "controller_runtime_reconcile_total", controller="stageset", result="success") == 1


@pytest.mark.parametrize(
    ("result", "errors", "terminal"),
    [("success", 0, 0), ("requeue_after", 0, 0), ("error", 1, 0), ("terminal", 1, 1)],
)
def test_results_use_controller_runtimes_words(result: str, errors: int, terminal: int) -> None:
    metrics = Metrics()
    metrics.reconciled(("GitRepository", "ns", "repo"), result=result, seconds=0.5)
    counted = "error" if result == "terminal" else result
    assert (
        value(metrics, "controller_runtime_reconcile_total", controller="gitrepository", result=counted) == 1
    )
    assert value(metrics, "controller_runtime_reconcile_errors_total", controller="gitrepository") == errors
    assert value(metrics, "controller_runtime_terminal_reconcile_errors_total") == terminal
    assert value(metrics, "controller_runtime_reconcile_time_seconds_count", controller="gitrepository") == 1


def test_git_series_live_while_a_repository_fetches_the_url() -> None:
    metrics = Metrics()
    a, b = ("GitRepository", "t1", "a"), ("GitRepository", "t2", "b")
    url = "https://git.example/org/repo"
    for key in (a, b):
        metrics.observe(key, {})
        metrics.fetched(key, url=url, result="fetched", seconds=1.0)
    assert value(metrics, "stageset_git_fetches_total", url=url, result="fetched") == 2
    assert value(metrics, "stageset_git_fetches_total", url=url, result="failed") == 0
    # The histogram's buckets are cumulative, as prometheus_client writes them.
    assert value(metrics, "stageset_git_fetch_duration_seconds_bucket", url=url, le="0.5") == 0
    assert value(metrics, "stageset_git_fetch_duration_seconds_bucket", url=url, le="1.0") == 2
    assert value(metrics, "stageset_git_fetch_duration_seconds_bucket", url=url, le="+Inf") == 2
    assert value(metrics, "stageset_git_fetch_duration_seconds_sum", url=url) == 2.0
    metrics.forget(a)
    assert value(metrics, "stageset_git_fetch_duration_seconds_count", url=url) == 2  # b still uses it
    metrics.fetched(b, url="https://git.example/org/moved", result="failed", seconds=0.1)
    assert samples(metrics, "stageset_git_fetches_total", url=url) == []  # nobody fetches it any more
    metrics.forget(b)
    assert samples(metrics, "stageset_git_fetches_total") == []


def test_requests_are_counted_by_verb_identity_kind_cluster_and_code() -> None:
    metrics = Metrics()
    tenant = Identity.service_account(namespace="shop", name="deployer")
    metrics.request(
        RequestRecord(verb="apply", dry_run=True, identity=tenant, cluster=LOCAL, code=403, seconds=0.01)
    )
    metrics.request(
        RequestRecord(
            verb="get", dry_run=False, identity=Identity(), cluster=ClusterKey("x"), code=None, seconds=0.01
        )
    )
    assert (
        value(
            metrics,
            "stageset_apiserver_requests_total",
            verb="apply",
            identity="tenant",
            cluster="local",
            code="403",
        )
        == 1
    )
    assert (
        value(
            metrics,
            "stageset_apiserver_requests_total",
            verb="get",
            identity="controller",
            cluster="remote",
            code="<error>",
        )
        == 1
    )
    assert "deployer" not in metrics.exposition().decode()


@pytest.mark.parametrize(
    ("method", "path", "content_type", "stream", "verb"),
    [
        ("GET", "/api/v1/namespaces/shop/configmaps/a", None, False, "get"),
        ("GET", "/api/v1/namespaces/shop/configmaps", None, False, "list"),
        ("GET", "/apis/stages.metio.wtf/v1/stagesets", None, False, "list"),
        ("GET", "/apis/stages.metio.wtf/v1/stagesets", None, True, "watch"),
        ("GET", "/api/v1/namespaces/shop", None, False, "get"),
        ("GET", "/api/v1/namespaces", None, False, "list"),
        ("GET", "/apis/apps/v1", None, False, "discovery"),
        ("GET", "/api", None, False, "discovery"),
        ("PATCH", "/api/v1/namespaces/shop/configmaps/a", "application/apply-patch+yaml", False, "apply"),
        (
            "PATCH",
            "/apis/stages.metio.wtf/v1/namespaces/shop/stagesets/a/status",
            "application/merge-patch+json",
            False,
            "patch",
        ),
        ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events", "application/json", False, "create"),
        ("PUT", "/api/v1/namespaces/shop/configmaps/a", "application/json", False, "update"),
        ("DELETE", "/api/v1/namespaces/shop/configmaps/a", None, False, "delete"),
    ],
)
def test_request_verbs_are_kubernetes_verbs(
    method: str, path: str, content_type: str | None, stream: bool, verb: str
) -> None:
    assert request_verb(method, path, content_type=content_type, stream=stream) == verb


def test_process_gauges() -> None:
    metrics = Metrics()
    assert value(metrics, "stageset_leader") == 1
    assert value(metrics, "stageset_caches_synced") == 0
    assert [labels["version"] for labels, _ in samples(metrics, "stageset_build_info")] != [""]
    assert "_created" not in metrics.exposition().decode()


def test_release_series_count_promotions_deferrals_rollbacks_and_go_with_the_object() -> None:
    metrics = Metrics()
    metrics.promoted(("shop", "web"), "app", how="soak")  # not observed yet: not counted
    assert samples(metrics, "stageset_stage_promotions_total") == []
    soaking = {"name": "app", "phase": "Ready", "promotionState": {"phase": "Soaking"}}
    metrics.observe(KEY, stageset(ready="False", stages=[soaking]))
    assert value(metrics, "stageset_stage_promotion_pending", stage="app") == 1
    metrics.promoted(("shop", "web"), "app", how="manual")
    metrics.deferred(("shop", "web"))
    metrics.rolled_back(("shop", "web"), result="rolled_back")
    promoted = {**soaking, "promotionState": {"phase": "Promoted"}}
    metrics.observe(KEY, stageset(ready="True", stages=[promoted]))
    assert value(metrics, "stageset_stage_promotion_pending", stage="app") == 0
    assert value(metrics, "stageset_stage_promotions_total", stage="app", how="manual") == 1
    assert value(metrics, "stageset_update_deferred_total", name="web") == 1
    assert value(metrics, "stageset_rollbacks_total", name="web", result="rolled_back") == 1
    metrics.forget(KEY)
    for series in ("stageset_stage_promotions_total", "stageset_stage_promotion_pending",
                   "stageset_update_deferred_total", "stageset_rollbacks_total"):
        assert samples(metrics, series) == [], series


def test_every_per_object_series_carries_the_tenant_of_its_namespace_never_of_the_object() -> None:
    metrics = Metrics()
    namespace = {"metadata": {"name": "shop", "labels": {"stages.metio.wtf/tenant": "payments"}}}
    metrics.tenants.handle("ADDED", namespace)
    # The StageSet claims another tenant with the same label: a tenant's own labels never count.
    claimed = {**stageset(ready="True", stages=[{"name": "app", "phase": "Ready", "objects": 1}]),
               "metadata": {"labels": {"stages.metio.wtf/tenant": "billing"}}}
    metrics.observe(KEY, claimed)
    metrics.reconciled(KEY, result="success", seconds=0.2)
    metrics.applied(("shop", "web"), "app", ChangeSet())
    metrics.pruned(("shop", "web"), deleted=0, failed=0)
    metrics.observe(("StageSet", "elsewhere", "web"), claimed)  # a namespace of no tenant
    per_object = ("stageset_reconcile_condition", "stageset_suspended",
                  "stageset_reconcile_duration_seconds_count", "stageset_stage_phase",
                  "stageset_stage_objects", "stageset_objects_applied_total", "stageset_objects_pruned_total")
    for series in per_object:
        found = samples(metrics, series, namespace="shop")
        assert found, series
        assert {labels["tenant"] for labels, _ in found} == {"payments"}, series
        assert {labels.get("tenant") for labels, _ in samples(metrics, series, namespace="elsewhere")} <= {""}
    # Relabelled (or unlabelled) namespaces move their series at the next scrape.
    metrics.tenants.handle("MODIFIED", {"metadata": {"name": "shop",
                                                     "labels": {"stages.metio.wtf/tenant": "shops"}}})
    assert {s["tenant"] for s, _ in samples(metrics, "stageset_suspended", namespace="shop")} == {"shops"}
    metrics.tenants.handle("DELETED", namespace)
    assert {s["tenant"] for s, _ in samples(metrics, "stageset_suspended", namespace="shop")} == {""}
