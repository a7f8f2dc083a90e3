"""What a tenant writes that only the controller should (issue 43 items 4 and 7), attacked as the
tenant on a real apiserver: the controller as a process with the chart's multi-tenant rights, the
tenant acting through its own ServiceAccount (impersonated, bound to ``edit`` in its namespace), the
audit log as evidence.

- a durable record (``stages.metio.wtf/inventory-record``) the tenant edits to name a Secret that
  is no Secret name, and a remote kubeconfig whose token carries CR/LF or whose server URL carries
  ``user:password@``, end the next pass in ``Ready=False InvalidSpec`` naming the field — never
  the last pass's ``Ready=True`` while a new commit goes unapplied — and nothing of that commit is
  written anywhere;
- a forged durable record on a suspended, or never applied, StageSet of another tenant in a shared
  namespace, with the object's owner labels pointed at it, blocks nothing: the victim's next commit
  applies (item 4).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, condition, wait_for, writes_by
from tests.e2e.remotes import inline_kubeconfig
from tests.e2e.stagesets import Scenario, cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
RECORD = "stages.metio.wtf/inventory-record"


def as_tenant(kube_pool: ClientPool, tenant: Tenant) -> KubeClient:
    """The tenant's own ServiceAccount (impersonated by the test's admin): what a tenant may do."""
    return kube_pool.client(Identity(user=tenant.username))


def put_secret(client: KubeClient, namespace: str, name: str, data: bytes) -> None:
    """Create or replace a kubeconfig Secret (as ``client``)."""
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "data": {"value": base64.b64encode(data).decode()}}

    def put() -> bool:
        try:
            client.apply(f"/api/v1/namespaces/{namespace}/secrets/{name}", body, field_manager="tenant")
        except ApiError as error:
            if error.forbidden:  # a RoleBinding just made is not in the authorizer's cache yet
                return False
            raise
        return True
    wait_for(put, what=f"Secret {namespace}/{name} written as the tenant")


def stale_ready_never(s: Scenario, name: str, reason: str, *, old: str) -> dict[str, Any]:
    """Wait for ``reason``; the StageSet never shows Ready=True again meanwhile (at the old commit)."""
    def check() -> Any:
        obj = s.get(name)
        ready = condition(obj) or {}
        applied = (obj.get("status") or {}).get("lastAppliedRevision") or ""
        assert not (ready.get("reason") == "Succeeded" and ready.get("status") == "True"
                    and applied.endswith(old) and ready.get("lastTransitionTime", "") > s_marker[0]), \
            f"a stale Ready=True at {old}"
        return ready if ready.get("reason") == reason else None
    s_marker = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())]
    found: dict[str, Any] = wait_for(check, timeout=90, what=f"{name} {reason}")
    return found


# -- item 7: tenant values validated where parsed, and never a stale Ready -------------------------

def test_a_record_naming_a_non_dns_secret_ends_in_invalid_spec_naming_the_field(
    controller: ControllerProcess, installed: KubeClient, kube_pool: ClientPool, git_server: GitServer,
    make_tenant: TenantFactory, control_plane: ControlPlane,
) -> None:
    tenant = make_tenant("record")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("app", "v1")})
    s.stageset("shop", [{"name": "app", "path": "./app"}])
    s.wait_ready("shop")
    record = json.loads(s.get("shop")["metadata"]["annotations"][RECORD])
    stage = record["stages"]["app"]
    # The tenant (edit: patch on its own StageSet) forges a move's previous target reached through
    # a "Secret" whose name is no Secret name.
    record["prev"] = [{"stage": "app", **stage, "t": "https://elsewhere.example:6443#insecure",
                       "kc": ["Not_A/Secret\r\nName", "value"]}]
    record["since"] = "2030-01-01T00:00:00Z"
    as_tenant(kube_pool, tenant).request(
        "PATCH", s.path("shop"), content_type="application/merge-patch+json",
        body={"metadata": {"annotations": {RECORD: json.dumps(record)}}})
    seen = len(control_plane.audit_events())
    sha = s.commit({"app/cm.yaml": cm("app", "v2")})
    old = s.get("shop")["status"]["lastAppliedRevision"][-40:]
    refused = stale_ready_never(s, "shop", "InvalidSpec", old=old)
    assert refused["status"] == "False"
    assert f"metadata.annotations[{RECORD}]: prev[0].kc" in refused["message"], refused["message"]
    assert "Not_A" not in refused["message"], "the value is not quoted"
    time.sleep(2)
    assert (s.configmap("app") or {})["data"]["k"] == "v1", f"nothing of {sha} was applied"
    events = control_plane.audit_events()[seen:]
    assert events, "the audit log is the evidence: it cannot be empty"
    assert [e for e in writes_by(events, tenant.username)
            if (e.get("objectRef") or {}).get("resource") == "configmaps"] == []
    # The tenant removes what it forged: the controller writes its own record again, and applies.
    as_tenant(kube_pool, tenant).request(
        "PATCH", s.path("shop"), content_type="application/merge-patch+json",
        body={"metadata": {"annotations": {RECORD: None}}})
    s.wait_ready("shop", revision=sha, timeout=90)
    assert RECORD in s.get("shop")["metadata"]["annotations"]


def kubeconfig_with(remote: ControlPlane, *, server: str | None = None, token: str | None = None) -> bytes:
    document = yaml.safe_load(inline_kubeconfig(remote))
    if server is not None:
        document["clusters"][0]["cluster"]["server"] = server
    if token is not None:
        document["users"][0]["user"] = {"token": token}
    return yaml.safe_dump(document).encode()


@pytest.mark.parametrize(("case", "field"), [
    ("token", "user field 'token' must be one line of printable ASCII"),
    ("userinfo", "cluster.server must not carry user:password@"),
])
def test_a_hostile_remote_kubeconfig_ends_in_invalid_spec_and_reaches_nothing(
    controller: ControllerProcess, installed: KubeClient, kube_pool: ClientPool, git_server: GitServer,
    make_tenant: TenantFactory, remote: ControlPlane, remote_admin: KubeClient, case: str, field: str,
) -> None:
    tenant = make_tenant(f"kc-{case}")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm(f"app-{case}", "v1")})
    remote_admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": tenant.namespace}})
    put_secret(as_tenant(kube_pool, tenant), tenant.namespace, "prod", inline_kubeconfig(remote))
    # The remote's admin certificate impersonates the tenant's account there: give it the rights.
    bindings = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenant.namespace}/rolebindings"
    remote_admin.request("POST", bindings, body={"metadata": {"name": "deployer"},
                               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                           "name": "cluster-admin"},
                               "subjects": [{"kind": "User", "name": tenant.username}]})
    s.stageset("shop", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "prod"}})
    first = s.wait_ready("shop", timeout=90)
    old = first["status"]["lastAppliedRevision"][-40:]
    remote_cm = f"/api/v1/namespaces/{tenant.namespace}/configmaps/app-{case}"
    assert remote_admin.get(remote_cm)["data"]["k"] == "v1"

    host = remote.url.removeprefix("https://")
    hostile = kubeconfig_with(remote, token="t0k3n\r\nX-Injected: yes") if case == "token" else \
        kubeconfig_with(remote, server=f"https://tenant:hunter2@{host}")
    put_secret(as_tenant(kube_pool, tenant), tenant.namespace, "prod", hostile)
    sha = s.commit({"app/cm.yaml": cm(f"app-{case}", "v2")})
    refused = stale_ready_never(s, "shop", "InvalidSpec", old=old)
    assert refused["status"] == "False"
    assert f"spec.kubeConfig: kubeconfig {field}" in refused["message"], refused["message"]
    for secret in ("t0k3n", "hunter2", "X-Injected"):
        assert secret not in json.dumps(s.get("shop")), "a credential in status"
        assert secret not in controller.output(), "a credential in the controller's log"
    time.sleep(2)
    assert remote_admin.get(remote_cm)["data"]["k"] == "v1", f"{sha} reached the remote"
    assert "Traceback" not in controller.output()[-20000:]


# -- item 4: a forged durable record blocks nothing -------------------------------------------------

def second_account(admin: KubeClient, namespace: str, name: str) -> str:
    """Another tenant's deployer in the same (shared) namespace, bound to ``edit`` there."""
    admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                  body={"metadata": {"name": name}})
    admin.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", body={
        "metadata": {"name": f"{name}-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    return f"system:serviceaccount:{namespace}:{name}"


@pytest.mark.parametrize("holder", ["suspended", "never-applied"])
def test_a_forged_record_in_a_shared_namespace_blocks_nothing(
    controller: ControllerProcess, installed: KubeClient, kube_pool: ClientPool, git_server: GitServer,
    make_tenant: TenantFactory, control_plane: ControlPlane, holder: str,
) -> None:
    victim = make_tenant(f"shared-{holder}")
    s = scenario(installed, git_server, victim,
                 {"app/cm.yaml": cm("app", "v1"), "other/cm.yaml": cm("other")})
    s.stageset("victim", [{"name": "app", "path": "./app"}], retryInterval="2s")
    s.wait_ready("victim")
    squatter = second_account(installed, s.ns, "squatter")
    attacker = kube_pool.client(Identity(user=squatter))
    record = json.dumps({"v": 2, "stages": {"app": {"sa": "squatter", "kinds": {"v1//ConfigMap": [s.ns]}}}})
    spec: dict[str, Any] = {"serviceAccountName": "squatter",
                            "stages": [{"name": "app", "sourceRef": {"name": "app"}, "path": "./other"}]}
    if holder == "suspended":
        spec["suspend"] = True
    else:
        spec["stages"][0]["sourceRef"] = {"name": "no-such-source"}  # fails before any stage applies
    # As the other tenant: the victim's object's owner labels pointed at a StageSet of its own (one
    # label patch), then that StageSet with a forged record (edit in the shared namespace allows
    # both); the never-applied one's first pass rebuilds its "lost" inventory from those labels.
    def relabel() -> bool:
        try:
            attacker.request("PATCH", f"/api/v1/namespaces/{s.ns}/configmaps/app",
                             content_type="application/merge-patch+json",
                             body={"metadata": {"labels": {"stages.metio.wtf/name": "squatter"}}})
        except ApiError as error:
            if error.forbidden:  # the new RoleBinding is not in the apiserver's authorizer cache yet
                return False
            raise
        return True
    wait_for(relabel, what="the other tenant's rights in the shared namespace")
    attacker.request("POST", f"/apis/stages.metio.wtf/v1/namespaces/{s.ns}/stagesets", body={
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "squatter", "annotations": {RECORD: record}}, "spec": spec})
    reason = "Suspended" if holder == "suspended" else "SourceNotReady"
    wait_for(lambda: (condition(s.get("squatter")) or {}).get("reason") == reason, what=f"squatter {reason}",
             timeout=90)
    seen = len(control_plane.audit_events())
    sha = s.commit({"app/cm.yaml": cm("app", "v2"), "other/cm.yaml": cm("other")})
    s.wait_ready("victim", revision=sha, timeout=90)
    assert (s.configmap("app") or {})["data"]["k"] == "v2"
    assert (s.configmap("app") or {})["metadata"]["labels"]["stages.metio.wtf/name"] == "victim"
    assert "OwnershipConflict" not in json.dumps(s.get("victim")["status"]["conditions"])
    written = [e for e in writes_by(control_plane.audit_events()[seen:], victim.username)
               if (e.get("objectRef") or {}).get("resource") == "configmaps"
               and (e.get("objectRef") or {}).get("name") == "app"]
    assert written, "the victim applied its new commit (the audit log shows its write)"
