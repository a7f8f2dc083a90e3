"""Platform targets on real apiservers: a StageTarget in a platform namespace, StageSets naming it by
``spec.targetRef``, two control planes and both audit logs as the evidence of who read and sent what."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import get_or_none, start_controller, stop_controller, wait_for, writes_by
from tests.e2e.remotes import inline_kubeconfig
from tests.e2e.stagesets import Scenario, cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

PLATFORM = "platform-targets"
CONTROLLER_SA = "system:serviceaccount:stageset-system:stageset-controller"
TARGETS = f"/apis/stages.metio.wtf/v1/namespaces/{PLATFORM}/stagetargets"


@pytest.fixture(scope="module")
def platform_controller(installed: KubeClient, control_plane: envtest.ControlPlane,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    """The controller with the chart's rights plus a Role in the one target namespace."""
    workdir = tmp_path_factory.mktemp("platform-controller")
    kubeconfig = install.controller_kubeconfig(installed, url=control_plane.url, ca=control_plane.pki.ca_cert,
                                               path=workdir / "kubeconfig", target_namespaces=[PLATFORM])
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir,
                              extra=["--target-namespaces", PLATFORM, "--max-remote-targets", "8"])
    try:
        yield handle
    finally:
        stop_controller(handle)


def put_secret(admin: KubeClient, name: str, raw: bytes, *, namespace: str = PLATFORM) -> None:
    admin.apply(f"/api/v1/namespaces/{namespace}/secrets/{name}",
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
                 "data": {"value": base64.b64encode(raw).decode()}}, field_manager="platform-team")


def put_target(admin: KubeClient, name: str, *, secret: str, allowed: list[str],
               namespace: str = PLATFORM) -> None:
    admin.apply(f"/apis/stages.metio.wtf/v1/namespaces/{namespace}/stagetargets/{name}",
                {"apiVersion": "stages.metio.wtf/v1", "kind": "StageTarget",
                 "metadata": {"name": name, "namespace": namespace},
                 "spec": {"kubeConfig": {"secretRef": {"name": secret}}, "allowedNamespaces": allowed}},
                field_manager="platform-team")


def ready_target(admin: KubeClient, name: str, *, secret_version: str | None = None) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = admin.get(f"{TARGETS}/{name}")
        status = obj.get("status") or {}
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
        if not ready or ready["status"] != "True":
            return None
        if secret_version is not None and status.get("observedSecretVersion") != secret_version:
            return None
        return obj
    found: dict[str, Any] = wait_for(check, what=f"StageTarget {name} Ready")
    return found


def remote_tenant(remote_admin: KubeClient, tenant: Tenant) -> None:
    install.create_tenant(remote_admin, namespace=tenant.namespace, service_account=tenant.service_account)
    aggregate_cluster_roles(remote_admin)


def on_target(s: Scenario, name: str, target: str, *, target_namespace: str = PLATFORM) -> None:
    s.stageset(name, [{"name": "app", "path": "./app"}],
               targetRef={"name": target, "namespace": target_namespace})


def secret_reads(events: list[dict[str, Any]], *, namespace: str = PLATFORM, name: str | None = None
                 ) -> list[dict[str, Any]]:
    return [e for e in events if (e.get("objectRef") or {}).get("resource") == "secrets"
            and e["objectRef"].get("namespace") == namespace and e.get("verb") in ("get", "list", "watch")
            and (name is None or e["objectRef"].get("name") == name) and e.get("stage") == "ResponseComplete"]


def user_of(event: dict[str, Any]) -> str:
    return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))


def test_a_target_applies_as_the_tenant_and_only_the_controller_reads_its_secret(
    platform_controller: ControllerProcess, installed: KubeClient, control_plane: envtest.ControlPlane,
    git_server: GitServer, make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane,
    remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("platform", service_account="payments-deployer")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("on-prod")})
    remote_tenant(remote_admin, tenant)
    put_secret(installed, "prod-kubeconfig", inline_kubeconfig(remote))
    put_target(installed, "prod", secret="prod-kubeconfig", allowed=[s.ns])
    target = ready_target(installed, "prod")
    assert target["status"]["server"] == remote.url
    assert target["status"]["kubernetesVersion"].startswith("v1.")

    on_target(s, "payments", "prod")
    s.wait_ready("payments")
    on_prod = remote_admin.get(f"/api/v1/namespaces/{s.ns}/configmaps/on-prod")
    assert on_prod["metadata"]["labels"]["stages.metio.wtf/stage"] == "app"
    assert s.configmap("on-prod") is None, "nothing lands on the local cluster"
    assert writes_by(remote.audit_events(), tenant.username), "writes on the remote impersonate the tenant"

    time.sleep(1)  # let the audit log catch up
    readers = {user_of(e) for e in secret_reads(control_plane.audit_events())}
    assert readers == {CONTROLLER_SA}, "the target's Secret is read by the controller's own identity only"
    assert not [e for e in control_plane.audit_events() if e.get("impersonatedUser")
                and (e.get("objectRef") or {}).get("namespace") == PLATFORM], "never as a tenant"

    # Withdrawing the namespace stops the release there and deletes nothing.
    before = len(remote.audit_events())
    put_target(installed, "prod", secret="prod-kubeconfig", allowed=[])
    refused = s.wait_reason("payments", "TargetNotAvailable")
    assert f"StageTarget {PLATFORM}/prod is not available to namespace {s.ns}" in refused["message"]
    assert remote.url not in refused["message"]
    time.sleep(1)
    assert not [e for e in remote.audit_events()[before:] if e.get("verb") in ("delete", "deletecollection")]
    assert get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/on-prod") is not None


def test_a_disallowed_missing_or_foreign_target_gets_one_message_and_no_remote_request(
    platform_controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane,
) -> None:
    s = scenario(installed, git_server, make_tenant("refused"), {"app/cm.yaml": cm("never")})
    put_secret(installed, "closed-kubeconfig", inline_kubeconfig(remote))
    put_target(installed, "closed", secret="closed-kubeconfig", allowed=["someone-else"])
    # A StageTarget in the tenant's own namespace (not a target namespace) is never honoured.
    put_secret(installed, "own-kubeconfig", inline_kubeconfig(remote), namespace=s.ns)
    put_target(installed, "own", secret="own-kubeconfig", allowed=[s.ns], namespace=s.ns)
    before = len(remote.audit_events())

    on_target(s, "disallowed", "closed")
    on_target(s, "missing", "nope")
    on_target(s, "foreign", "own", target_namespace=s.ns)
    messages = {name: s.wait_reason(name, "TargetNotAvailable")["message"]
                for name in ("disallowed", "missing", "foreign")}
    asked = (f"{PLATFORM}/closed", f"{PLATFORM}/nope", f"{s.ns}/own")
    shapes = {m.replace(asked[0], "T").replace(asked[1], "T").replace(asked[2], "T")
              for m in messages.values()}
    assert len(shapes) == 1, messages
    assert all(remote.url not in m for m in messages.values())
    time.sleep(1)
    touched = [e for e in remote.audit_events()[before:]
               if (e.get("objectRef") or {}).get("namespace") == s.ns or s.ns in user_of(e)]
    assert touched == [], "nothing was sent to the remote for a refused target"


def test_ten_stagesets_on_one_target_make_one_discovery_and_bounded_secret_reads(
    platform_controller: ControllerProcess, installed: KubeClient, control_plane: envtest.ControlPlane,
    git_server: GitServer, make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane,
    remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("ten")
    s = scenario(installed, git_server, tenant, {f"app{i}/cm.yaml": cm(f"cm{i}") for i in range(10)})
    remote_tenant(remote_admin, tenant)
    # Content of its own (a comment), so this target's connection and discovery are new.
    put_secret(installed, "ten-kubeconfig", inline_kubeconfig(remote) + b"# ten\n")
    remote_before = len(remote.audit_events())
    put_target(installed, "ten", secret="ten-kubeconfig", allowed=[s.ns])
    ready_target(installed, "ten")
    for i in range(10):
        s.stageset(f"s{i}", [{"name": "app", "path": f"./app{i}"}],
                   targetRef={"name": "ten", "namespace": PLATFORM})
    for i in range(10):
        s.wait_ready(f"s{i}")
    time.sleep(1)
    discovery = [e for e in remote.audit_events()[remote_before:]
                 if e.get("requestURI") == "/api/v1" and e.get("stage") == "ResponseComplete"]
    assert len(discovery) == 1, "ten StageSets on one target: one discovery"
    reads = secret_reads(control_plane.audit_events(), name="ten-kubeconfig")
    gets = [e for e in reads if e["verb"] == "get"]
    assert 1 <= len(gets) <= 3, f"the Secret is read once per connect, not per StageSet ({len(gets)})"


def test_a_rotated_secret_reconnects_within_seconds_and_wakes_its_stagesets(
    platform_controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane,
    remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("rotate", service_account="deployer")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("first")})
    remote_tenant(remote_admin, tenant)
    put_secret(installed, "rotate-kubeconfig", inline_kubeconfig(remote) + b"# rotate\n")
    put_target(installed, "rotate", secret="rotate-kubeconfig", allowed=[s.ns])
    on_target(s, "app", "rotate")
    s.wait_ready("app")

    # The new credential: a remote-agent ServiceAccount that may only impersonate this tenant's
    # deployer there (docs/tenancy.md's platform-target path).
    agent = "remote-agent"
    remote_admin.apply(f"/api/v1/namespaces/kube-system/serviceaccounts/{agent}",
                       {"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": agent, "namespace": "kube-system"}},
                       field_manager="platform-team")
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    remote_admin.apply(f"{rbac}/namespaces/{s.ns}/roles/{agent}",
                       {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                        "metadata": {"name": agent, "namespace": s.ns},
                        "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"],
                                   "verbs": ["impersonate"], "resourceNames": [tenant.service_account]}]},
                       field_manager="platform-team")
    remote_admin.apply(f"{rbac}/namespaces/{s.ns}/rolebindings/{agent}",
                       {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": {"name": agent, "namespace": s.ns},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": agent},
                        "subjects": [{"kind": "ServiceAccount", "name": agent, "namespace": "kube-system"}]},
                       field_manager="platform-team")
    token = remote_admin.request("POST", f"/api/v1/namespaces/kube-system/serviceaccounts/{agent}/token",
                                 body={"spec": {"expirationSeconds": 3600}})["status"]["token"]
    config = yaml.safe_load(inline_kubeconfig(remote))
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    put_secret(installed, "rotate-kubeconfig", yaml.safe_dump(config).encode())
    version = installed.get(f"/api/v1/namespaces/{PLATFORM}/secrets/rotate-kubeconfig")["metadata"][
        "resourceVersion"]
    target = ready_target(installed, "rotate", secret_version=version)
    assert target["status"]["server"] == remote.url, "the same cluster"

    # Its StageSet is woken at once (its interval is ten minutes) and uses the new credential.
    agent_user = f"system:serviceaccount:kube-system:{agent}"
    wait_for(lambda: [e for e in remote.audit_events() if user_of(e) == tenant.username
                      and (e.get("user") or {}).get("username") == agent_user],
             what="a pass through the rotated credential")
    before = len(remote.audit_events())
    s.commit({"app/cm.yaml": cm("second")})
    wait_for(lambda: get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/second"),
             what="the release through the rotated credential")
    time.sleep(1)
    writes = writes_by(remote.audit_events()[before:], tenant.username)
    assert writes
    assert {str((e.get("user") or {}).get("username")) for e in writes} == \
        {agent_user}, "the new credential, impersonating the tenant"


def test_a_target_secret_that_names_another_cluster_moves_every_release_on_it_with_nothing_edited(
    platform_controller: ControllerProcess, installed: KubeClient, control_plane: envtest.ControlPlane,
    git_server: GitServer, make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane,
    remote_admin: KubeClient,
) -> None:
    # Two tenants on one StageTarget, both Ready on the remote cluster.
    tenants = [make_tenant(f"move{i}", service_account="deployer") for i in range(2)]
    scenarios = [scenario(installed, git_server, t, {"app/cm.yaml": cm(f"moved-{i}")})
                 for i, t in enumerate(tenants)]
    for t in tenants:
        remote_tenant(remote_admin, t)
    put_secret(installed, "move-kubeconfig", inline_kubeconfig(remote))
    put_target(installed, "move", secret="move-kubeconfig", allowed=[s.ns for s in scenarios])
    ready_target(installed, "move")
    for s in scenarios:
        on_target(s, "app", "move")
    for i, s in enumerate(scenarios):
        s.wait_ready("app")
        assert get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/moved-{i}") is not None
    generations = [s.get("app")["metadata"]["generation"] for s in scenarios]
    remote_seen = len(remote.audit_events())

    # The platform points the target's Secret at another cluster (here: the control plane the
    # controller runs on, reached through its own URL and CA, which is a cluster of its own id).
    put_secret(installed, "move-kubeconfig", inline_kubeconfig(control_plane))

    def moved_here(i: int, s: Scenario) -> bool:
        status = s.get("app").get("status") or {}
        return bool(get_or_none(installed, f"/api/v1/namespaces/{s.ns}/configmaps/moved-{i}")) \
            and get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/moved-{i}") is None \
            and not status.get("previousTargets")
    for i, s in enumerate(scenarios):
        wait_for(lambda i=i, s=s: moved_here(i, s), timeout=60,  # type: ignore[misc]
                 what=f"release {i} moved to the other cluster, its old copy deleted")
    assert [s.get("app")["metadata"]["generation"] for s in scenarios] == generations, "no StageSet edited"
    time.sleep(1)  # let the audit log catch up
    for s, t in zip(scenarios, tenants, strict=True):
        deleted = [e for e in remote.audit_events()[remote_seen:] if e.get("verb") == "delete"
                   and e.get("stage") == "ResponseComplete"
                   and (e.get("objectRef") or {}).get("namespace") == s.ns]
        assert [user_of(e) for e in deleted] == [t.username], "the old copy deleted once, as the tenant"
        # The event is recorded after the pass that finished the move (and may trail its status).
        def retargeted_events(ns: str = s.ns) -> list[str]:
            events = installed.get(f"/api/v1/namespaces/{ns}/events")["items"]
            return [str(e.get("message") or e.get("note")) for e in events if e.get("reason") == "Retargeted"]
        retargeted = wait_for(retargeted_events, what=f"a Retargeted event in {s.ns}")
        assert len(retargeted) == 1, retargeted
        assert "1 deleted" in retargeted[0]
        assert "BEGIN" not in retargeted[0]
        assert "client-key" not in retargeted[0]
