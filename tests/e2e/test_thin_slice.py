"""The thin slice: a StageSet from Git reaches Ready through the controller process, as the tenant."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, apply, condition, get_or_none, stageset, wait_for
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

APP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: payments-config
data:
  currency: EUR
---
apiVersion: v1
kind: Service
metadata:
  name: payments
spec:
  selector: {app: payments}
  ports: [{port: 8080}]
"""

CLUSTER_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: payments-escalation
rules:
  - apiGroups: ["*"]
    resources: ["*"]
    verbs: ["*"]
"""


def git_repository(namespace: str, name: str, url: str) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m"}}


def payments_stageset(namespace: str) -> dict[str, Any]:
    # Verbatim from DESIGN.md (only the namespace is the test's).
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": "payments", "namespace": namespace},
            "spec": {"serviceAccountName": "payments-deployer",
                     "stages": [{"name": "app", "sourceRef": {"name": "payments-app"}}]}}


def managers(obj: dict[str, Any]) -> set[str]:
    return {entry["manager"] for entry in obj["metadata"].get("managedFields", [])}


def test_payments_reaches_ready_as_the_tenant(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: Any,
) -> None:
    tenant: Tenant = make_tenant(namespace="payments", service_account="payments-deployer")
    tenant.bind_cluster_role("edit")
    url = git_server.create_repo("payments-app", {"app.yaml": APP})
    commit = git_server.head("payments-app")
    apply(installed, git_repository("payments", "payments-app", url))
    apply(installed, payments_stageset("payments"))

    ready = wait_for(lambda: (c := condition(stageset(installed, "payments", "payments")))
                     and c["status"] == "True" and c, what="payments Ready=True")
    live = stageset(installed, "payments", "payments")
    assert ready["reason"] == "Succeeded"
    assert ready["observedGeneration"] == live["metadata"]["generation"]
    assert live["status"]["lastAppliedRevision"] == f"main@sha1:{commit}"
    assert [s["phase"] for s in live["status"]["stages"]] == ["Ready"]

    for path in ("/api/v1/namespaces/payments/configmaps/payments-config",
                 "/api/v1/namespaces/payments/services/payments"):
        obj = installed.get(path)
        assert "stageset-controller" in managers(obj), path
        labels = obj["metadata"]["labels"]
        assert labels["stages.metio.wtf/name"] == "payments"
        assert labels["stages.metio.wtf/namespace"] == "payments"
        assert labels["stages.metio.wtf/stage"] == "app"


def test_cluster_role_in_source_is_denied_and_nothing_applied(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: Any,
) -> None:
    tenant: Tenant = make_tenant("payments-rbac", service_account="payments-deployer")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    # The ConfigMap sorts first and is allowed: it must still not be applied.
    url = git_server.create_repo(f"{ns}-app", {"a-config.yaml": APP, "b-rbac.yaml": CLUSTER_ROLE})
    apply(installed, git_repository(ns, "payments-app", url))
    apply(installed, payments_stageset(ns))

    ready = wait_for(lambda: (c := condition(stageset(installed, ns, "payments")))
                     and c["status"] == "False" and c["reason"] == "RBACDenied" and c,
                     what="payments Ready=False/RBACDenied")
    assert "payments-escalation" in ready["message"]
    assert f"system:serviceaccount:{ns}:payments-deployer" in ready["message"]
    role = "/apis/rbac.authorization.k8s.io/v1/clusterroles/payments-escalation"
    assert get_or_none(installed, role) is None
    assert get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/payments-config") is None
    assert get_or_none(installed, f"/api/v1/namespaces/{ns}/services/payments") is None


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: gate
spec:
  replicas: 1
  selector: {matchLabels: {app: gate}}
  template:
    metadata: {labels: {app: gate}}
    spec:
      containers: [{name: gate, image: registry.invalid/gate:1}]
"""


def config_map(name: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata: {{k: v}}\n"


def test_dependents_start_only_after_their_dependency_is_ready(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: Any,
) -> None:
    tenant: Tenant = make_tenant("order", service_account="deployer")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    url = git_server.create_repo(f"{ns}-app", {
        "first/gate.yaml": DEPLOYMENT,
        "second/cm.yaml": config_map("second"),
        "third/cm.yaml": config_map("third"),
    })
    apply(installed, git_repository(ns, "app", url))
    apply(installed, {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "ordered", "namespace": ns},
        "spec": {"serviceAccountName": "deployer", "stages": [
            {"name": "first", "sourceRef": {"name": "app"}, "path": "./first"},
            {"name": "second", "sourceRef": {"name": "app"}, "path": "./second"},
            {"name": "third", "sourceRef": {"name": "app"}, "path": "./third", "dependsOn": ["first"]},
        ]},
    })
    deployment = f"/apis/apps/v1/namespaces/{ns}/deployments/gate"
    wait_for(lambda: get_or_none(installed, deployment), what="the first stage's Deployment")

    # Nothing runs the Deployment here, so the first stage stays unready: its dependents wait.
    time.sleep(3)
    phases = {s["name"]: s["phase"] for s in stageset(installed, ns, "ordered")["status"]["stages"]}
    assert phases["first"] != "Ready"
    assert phases["second"] == phases["third"] == "Pending"
    for name in ("second", "third"):
        assert get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/{name}") is None

    # Report the rollout done, as the kubelet and deployment controller would.
    installed.request("PATCH", f"{deployment}/status", content_type="application/merge-patch+json",
                      body={"status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                       "readyReplicas": 1, "availableReplicas": 1}})
    wait_for(lambda: (c := condition(stageset(installed, ns, "ordered"))) and c["status"] == "True",
             what="ordered Ready=True")
    for name in ("second", "third"):
        assert get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/{name}") is not None
