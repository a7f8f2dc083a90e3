"""Stage graphs and StageSet dependencies, through the controller process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, get_or_none, wait_for
from tests.e2e.stagesets import Scenario, cm, deployment, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


def roll_out(s: Scenario, name: str) -> None:
    """Report a Deployment rolled out, as the deployment controller and kubelet would."""
    s.admin.request("PATCH", f"/apis/apps/v1/namespaces/{s.ns}/deployments/{name}/status",
                    content_type="application/merge-patch+json",
                    body={"status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                     "readyReplicas": 1, "availableReplicas": 1}})


def deployment_exists(s: Scenario, name: str) -> Any:
    return get_or_none(s.admin, f"/apis/apps/v1/namespaces/{s.ns}/deployments/{name}")


def test_a_diamond_runs_its_two_middle_stages_concurrently(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("diamond"), {
        "top/cm.yaml": cm("top"), "left/d.yaml": deployment("left"), "right/d.yaml": deployment("right"),
        "bottom/cm.yaml": cm("bottom")})
    s.stageset("diamond", [
        {"name": "top", "path": "./top"},
        {"name": "left", "path": "./left", "dependsOn": ["top"]},
        {"name": "right", "path": "./right", "dependsOn": ["top"]},
        {"name": "bottom", "path": "./bottom", "dependsOn": ["left", "right"]},
    ])
    # Neither middle stage can finish (nothing runs the Deployments), so both existing at once
    # means both were started without waiting for the other.
    def phases() -> dict[str, str]:
        stages = (s.get("diamond").get("status") or {}).get("stages", [])
        return {st["name"]: st["phase"] for st in stages}

    wait_for(lambda: [phases().get("left"), phases().get("right")] == ["Waiting", "Waiting"],
             what="both middle stages waiting")
    assert deployment_exists(s, "left")
    assert deployment_exists(s, "right")
    assert phases()["bottom"] == "Pending"
    assert s.configmap("bottom") is None
    roll_out(s, "left")
    roll_out(s, "right")
    s.wait_ready("diamond")
    assert s.configmap("bottom") is not None


def test_a_stageset_waits_for_its_dependency_and_is_woken_by_it(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("deps"), {
        "db/d.yaml": deployment("db"), "app/cm.yaml": cm("app")})
    # The dependent retries only every 10 minutes: reaching Ready in the test proves it was woken.
    s.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "db"}],
               retryInterval="10m")
    waiting = s.wait_reason("app", "DependencyNotReady")
    assert "db" in waiting["message"]
    s.stageset("db", [{"name": "db", "path": "./db"}])
    wait_for(lambda: deployment_exists(s, "db"), what="db applied")
    assert s.configmap("app") is None
    roll_out(s, "db")
    s.wait_ready("db")
    s.wait_ready("app", timeout=30)
    assert s.configmap("app") is not None


def test_two_stagesets_in_a_cycle_are_stalled(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("cycle"), {"a/cm.yaml": cm("a"), "b/cm.yaml": cm("b")})
    s.stageset("ping", [{"name": "a", "path": "./a"}], dependsOn=[{"name": "pong"}])
    s.stageset("pong", [{"name": "b", "path": "./b"}], dependsOn=[{"name": "ping"}])
    for name in ("ping", "pong"):
        stalled = s.wait_reason(name, "Stalled")
        assert "cycle" in stalled["message"]
        assert f"{s.ns}/ping" in stalled["message"]
        assert f"{s.ns}/pong" in stalled["message"]
        conditions = {c["type"]: c["status"] for c in s.get(name)["status"]["conditions"]}
        assert conditions["Stalled"] == "True"
    assert s.configmap("a") is None
    assert s.configmap("b") is None


def test_ready_checks_wait_for_objects_the_stage_does_not_apply(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("checks"), {"app/cm.yaml": cm("app")})
    # Something else (another team's release) runs this Deployment; the stage waits for it.
    installed.request("POST", f"/apis/apps/v1/namespaces/{s.ns}/deployments",
                      body=yaml.safe_load(deployment("external")))
    s.stageset("checks", [{"name": "app", "path": "./app", "timeout": "2s", "readyChecks": {
        "objects": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "external"}]}}],
               retryInterval="2s")
    held = s.wait_reason("checks", "StageProgressing")
    assert "external" in held["message"]
    roll_out(s, "external")
    s.wait_ready("checks", timeout=60)


def _ledger_crd(group: str) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"ledgers.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "ledgers", "singular": "ledger", "kind": "Ledger"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": True}}}]}}


def test_a_ported_stage_waits_for_its_checks_before_its_dependent_starts(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    """The reference's spelling: ``readyChecks.checks`` on a cluster-scoped CRD (no namespace) and
    another release's Deployment, with ``disableWait`` (its own ConfigMap is not waited for)."""
    tenant = make_tenant("ported")
    group = f"{tenant.namespace}.example"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    # The checks are read as the tenant: it may read CustomResourceDefinitions, nothing more.
    installed.request("POST", f"{rbac}/clusterroles", body={
        "metadata": {"name": f"{tenant.namespace}-crd-reader"},
        "rules": [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                   "verbs": ["get", "list", "watch"]}]})
    installed.request("POST", f"{rbac}/clusterrolebindings", body={
        "metadata": {"name": f"{tenant.namespace}-crd-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": f"{tenant.namespace}-crd-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": tenant.service_account,
                      "namespace": tenant.namespace}]})
    s = scenario(installed, git_server, tenant, {"operator/cm.yaml": cm("operator"),
                                                 "app/cm.yaml": cm("app")})
    installed.request("POST", f"/apis/apps/v1/namespaces/{s.ns}/deployments",
                      body=yaml.safe_load(deployment("ledger-db")))
    s.stageset("ported", [
        {"name": "operator", "path": "./operator", "readyChecks": {"disableWait": True, "checks": [
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "name": f"ledgers.{group}"},
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ledger-db"}]}},
        {"name": "app", "path": "./app"}])

    def operator_message() -> str:
        stages = (s.get("ported").get("status") or {}).get("stages", [])
        return next((str(st.get("message", "")) for st in stages if st["name"] == "operator"), "")

    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ledgers.{group}"
    try:
        # Resolved without a namespace (cluster-scoped), waited for while it does not exist.
        wait_for(lambda: f"CustomResourceDefinition ledgers.{group} not found" in operator_message(),
                 what="the stage waiting for the CRD")
        assert s.configmap("operator") is not None
        assert s.configmap("app") is None
        installed.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                          body=_ledger_crd(group))
        # The CRD turns Established (the apiserver does that); the Deployment is still not rolled out.
        wait_for(lambda: operator_message().startswith(f"Deployment {s.ns}/ledger-db"),
                 what="the stage waiting for the Deployment only")
        assert s.configmap("app") is None
        roll_out(s, "ledger-db")
        s.wait_ready("ported")
        assert s.configmap("app") is not None
    finally:
        installed.request("DELETE", crd_path)
        for kind in ("clusterrolebindings", "clusterroles"):
            installed.request("DELETE", f"{rbac}/{kind}/{tenant.namespace}-crd-reader")
