"""Events (``events.k8s.io/v1``) the controller process records, counted on the real apiserver."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import wait_for
from tests.e2e.stagesets import Scenario, cm, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


def events(
    admin: KubeClient,
    namespace: str,
    *,
    kind: str = "StageSet",
    name: str | None = None,
    reason: str | None = None,
) -> list[dict[str, Any]]:
    items = admin.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events").get("items", [])
    return [
        e
        for e in items
        if e["regarding"]["kind"] == kind
        and (name is None or e["regarding"]["name"] == name)
        and (reason is None or e["reason"] == reason)
    ]


def count(event: dict[str, Any]) -> int:
    return int((event.get("series") or {}).get("count", 1))


def handled(s: Scenario, name: str, stamp: str) -> Any:
    return (s.get(name).get("status") or {}).get("lastHandledReconcileAt") == stamp


def test_success_is_one_event_per_change_naming_the_change_set(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("events"), {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    s.stageset("shop", [{"name": "app", "path": "./app"}])
    s.wait_ready("shop")
    first = wait_for(
        lambda: events(installed, s.ns, name="shop", reason="ReconciliationSucceeded"), what="a success event"
    )
    assert [(e["type"], e["note"], e["action"]) for e in first] == [
        ("Normal", f"ConfigMap/{s.ns}/a created, ConfigMap/{s.ns}/b created", "Reconcile")
    ]
    assert first[0]["reportingController"] == "stages.metio.wtf/stageset-controller"
    assert (
        first[0]["metadata"]["annotations"]["stages.metio.wtf/revision"]
        == f"main@sha1:{git_server.head(s.repo)}"
    )

    # Passes that change nothing record nothing (a SourceNotReady warning may come first, if the
    # StageSet was reconciled before its source was fetched).
    recorded = [(e["metadata"]["name"], count(e)) for e in events(installed, s.ns, name="shop")]
    for _ in range(3):
        stamp = poke(installed, s.path("shop"))
        wait_for(lambda stamp=stamp: handled(s, "shop", stamp), what="the poke handled")
    assert [(e["metadata"]["name"], count(e)) for e in events(installed, s.ns, name="shop")] == recorded

    second = s.commit({"app/a.yaml": cm("a", "new"), "app/b.yaml": None, "app/c.yaml": cm("c")})
    s.wait_ready("shop", revision=second)
    notes = wait_for(
        lambda: [
            e["note"]
            for e in events(installed, s.ns, name="shop", reason="ReconciliationSucceeded")
            if e["note"] != first[0]["note"]
        ],
        what="a second success event",
    )
    assert notes == [f"ConfigMap/{s.ns}/a configured, ConfigMap/{s.ns}/c created, 1 pruned"]
    # The GitRepository told of each new artifact.
    artifacts = events(installed, s.ns, kind="GitRepository", name="app", reason="NewArtifact")
    assert {e["note"] for e in artifacts} >= {f"stored artifact for revision 'main@sha1:{second}'"}


def test_repeats_are_one_event_with_a_series_count(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("series"), {"app/a.yaml": cm("a")})
    s.stageset("shop", [{"name": "app", "path": "./app"}])
    s.wait_ready("shop")
    # The same drift twice: one DriftCorrected Event, counted twice.
    for attempt in (1, 2):
        installed.request(
            "PATCH",
            f"/api/v1/namespaces/{s.ns}/configmaps/a",
            content_type="application/merge-patch+json",
            body={"data": {"k": f"hand {attempt}"}},
        )
        poke(installed, s.path("shop"))
        wait_for(lambda: (s.configmap("a") or {}).get("data") == {"k": "v"}, what="the drift corrected")
        wait_for(
            lambda attempt=attempt: (
                [count(e) for e in events(installed, s.ns, name="shop", reason="DriftCorrected")] == [attempt]
            ),
            what=f"DriftCorrected counted {attempt} time(s)",
        )
    [drift] = events(installed, s.ns, name="shop", reason="DriftCorrected")
    assert drift["type"] == "Warning"
    # One Event per pass (issue 51): the pass that restored the drift also made the StageSet Ready
    # after a change; that success follows in the Warning's note (its own Event before), and the
    # Event carries the revision it applied.
    assert drift["note"] == (f"stage 'app': restored ConfigMap {s.ns}/a; "
                             f"also ReconciliationSucceeded: ConfigMap/{s.ns}/a configured")
    revision = drift["metadata"]["annotations"]["stages.metio.wtf/revision"]
    assert revision == f"main@sha1:{git_server.head(s.repo)}"
    assert drift["series"]["lastObservedTime"] >= drift["eventTime"]
    successes = events(installed, s.ns, name="shop", reason="ReconciliationSucceeded")
    assert [e["note"] for e in successes] == [f"ConfigMap/{s.ns}/a created"], "the cold pass's own, no other"


def test_ready_turning_false_is_a_warning_with_its_reason_and_repeats_aggregate(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("denied")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a")}, role="view")
    s.stageset("shop", [{"name": "app", "path": "./app"}])
    s.wait_reason("shop", "RBACDenied")
    [warning] = wait_for(
        lambda: events(installed, s.ns, name="shop", reason="RBACDenied"), what="a RBACDenied warning"
    )
    assert warning["type"] == "Warning"
    assert "may not apply ConfigMap" in warning["note"]
    # Retries of the same failure are no transition: no new event, no count.
    for _ in range(2):
        stamp = poke(installed, s.path("shop"))
        wait_for(lambda stamp=stamp: handled(s, "shop", stamp), what="the retry handled")
    assert [count(e) for e in events(installed, s.ns, name="shop", reason="RBACDenied")] == [1]

    # Granted, then taken away again: a second transition to the same failure joins the series.
    tenant.bind_cluster_role("edit")
    poke(installed, s.path("shop"))
    s.wait_ready("shop")
    installed.request(
        "DELETE",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{s.ns}/rolebindings/{tenant.service_account}-edit",
    )
    poke(installed, s.path("shop"))
    s.wait_reason("shop", "RBACDenied")
    wait_for(
        lambda: [count(e) for e in events(installed, s.ns, name="shop", reason="RBACDenied")] == [2],
        what="the second RBACDenied counted on the first Event",
    )
    kinds = sorted(
        (e["type"], e["reason"])
        for e in events(installed, s.ns, name="shop")
        if e["reason"] != "SourceNotReady"
    )  # if reconciled before its source was fetched
    assert kinds == [("Normal", "ReconciliationSucceeded"), ("Warning", "RBACDenied")]
