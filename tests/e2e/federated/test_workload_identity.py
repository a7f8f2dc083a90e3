"""Workload identity on two real control planes (issue 48): ``kubeConfig.configMapRef`` with
``provider: generic`` — no credential stored anywhere, every request to the remote made as the
federated identity of the ServiceAccount it is for, no impersonation.

This directory's planes (``conftest.py``): the local one serves its ServiceAccount issuer and audits
TokenRequests with their bodies; the remote trusts that issuer (audience: its own URL, usernames
prefixed ``local:``).  The evidence is both audit logs: on the remote, who made each request and
that none impersonated; here, the TokenRequests (whose account, which audience) and that no Secret
was read.  The controller runs with the chart's multi-tenant rights plus ``targets.workloadIdentity``
(``install.controller_kubeconfig(workload_identity=True)``) and ``--workload-identity``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ClientPool, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import get_or_none, start_controller, stop_controller, wait_for, writes_by
from tests.e2e.federated.conftest import PREFIX
from tests.e2e.metrics import METRICS_ARGS, metrics_url
from tests.e2e.remotes import inline_kubeconfig, kubeconfig_secret
from tests.e2e.stagesets import Scenario, cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

PLATFORM = "wi-platform"
"""The target namespace of this module's StageTarget."""
TOKEN = "eyJ"
"""How every ServiceAccount token (a JWT) begins: it must appear in no status, event, log or metric."""
APP = [{"name": "app", "path": "./app"}]


@pytest.fixture(scope="module")
def controller(installed: KubeClient, control_plane: ControlPlane,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    """The chart's multi-tenant rights with workload identity on, and one target namespace."""
    workdir = tmp_path_factory.mktemp("wi-controller")
    kubeconfig = install.controller_kubeconfig(installed, url=control_plane.url, ca=control_plane.pki.ca_cert,
                                               path=workdir / "kubeconfig", target_namespaces=[PLATFORM],
                                               workload_identity=True)
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir,
                              extra=["--workload-identity", "--target-namespaces", PLATFORM, *METRICS_ARGS])
    try:
        yield handle
    finally:
        stop_controller(handle)


def federated(namespace: str, account: str) -> str:
    """A local ServiceAccount as the remote names it."""
    return f"{PREFIX}system:serviceaccount:{namespace}:{account}"


def bind_there(remote_admin: KubeClient, *, namespace: str, user: str, role: str = "edit") -> None:
    """On the remote: ``namespace``, and ``role`` there bound to ``user`` (a federated identity)."""
    remote_admin.apply(f"/api/v1/namespaces/{namespace}",
                       {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                       field_manager="remote-platform")
    aggregate_cluster_roles(remote_admin)
    name = f"{role}-{abs(hash(user)) % 10**8}"
    remote_admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
        field_manager="remote-platform")


def workload_map(admin: KubeClient, namespace: str, name: str, data: dict[str, str]) -> None:
    admin.apply(f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
                 "data": data}, field_manager="platform-team")


def generic(remote: ControlPlane, **extra: str) -> dict[str, str]:
    """Flux's generic ConfigMap for ``remote``."""
    return {"provider": "generic", "address": remote.url, "ca.crt": remote.pki.ca_cert.read_text(), **extra}


def settle_audit() -> None:
    time.sleep(1)  # let the audit logs catch up with the last requests


def token_requests(plane: ControlPlane, namespace: str) -> list[tuple[str, list[str], int]]:
    """TokenRequests of ServiceAccounts in ``namespace``: (account, audiences asked for, answer)."""
    found = []
    for event in plane.audit_events():
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "serviceaccounts" and ref.get("subresource") == "token" \
                and ref.get("namespace") == namespace and event.get("stage") == "ResponseComplete":
            spec = (event.get("requestObject") or {}).get("spec") or {}
            found.append((str(ref.get("name")), list(spec.get("audiences") or []),
                          int(event["responseStatus"]["code"])))
    return found


def secret_reads(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return [e for e in plane.audit_events() if (e.get("objectRef") or {}).get("resource") == "secrets"
            and e["objectRef"].get("namespace") == namespace and e.get("verb") in ("get", "list", "watch")]


def remote_requests(remote: ControlPlane, remote_admin: KubeClient, *,
                    since: int = 0) -> list[dict[str, Any]]:
    """Every request the remote answered after the first ``since``, but the test's own (its admin)."""
    me = remote_admin.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                              body={"apiVersion": "authentication.k8s.io/v1",
                                    "kind": "SelfSubjectReview"})["status"]["userInfo"]["username"]
    return [e for e in remote.audit_events()[since:] if e.get("stage") == "ResponseComplete"
            and (e.get("user") or {}).get("username") not in (me, "system:apiserver")]


def no_token_leaks(controller: ControllerProcess, installed: KubeClient, s: Scenario, name: str) -> None:
    """No token in the StageSet's status, the namespace's events, the controller's log or metrics."""
    assert TOKEN not in json.dumps(s.get(name).get("status"))
    assert TOKEN not in json.dumps(installed.get(f"/api/v1/namespaces/{s.ns}/events"))
    assert TOKEN not in controller.output()
    with urllib.request.urlopen(metrics_url(controller), timeout=10) as reply:  # noqa: S310 - loopback
        metrics = reply.read().decode()
    assert "stageset_" in metrics, "the metrics were scraped"
    assert TOKEN not in metrics


def test_a_stageset_applies_on_the_remote_as_its_federated_identity(
    controller: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("wi", service_account="payments-deployer")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("on-prod")})
    identity = federated(s.ns, "payments-deployer")
    bind_there(remote_admin, namespace=s.ns, user=identity)  # the remote's RBAC binds the tenant itself
    workload_map(installed, s.ns, "prod-eu", generic(remote))
    seen = len(remote.audit_events())
    s.stageset("payments", APP, kubeConfig={"configMapRef": {"name": "prod-eu"}})

    obj = s.wait_ready("payments")
    on_prod = remote_admin.get(f"/api/v1/namespaces/{s.ns}/configmaps/on-prod")
    assert on_prod["metadata"]["labels"]["stages.metio.wtf/stage"] == "app"
    assert s.configmap("on-prod") is None, "nothing lands on the local cluster"
    (inventory,) = obj["status"]["inventory"]
    assert inventory["target"]["id"].startswith(f"{remote.url}#"), "the cluster: its URL and CA fingerprint"
    assert inventory["target"]["configMapRef"] == {"name": "prod-eu"}
    assert "cm" in obj["metadata"]["annotations"]["stages.metio.wtf/inventory-record"]

    settle_audit()
    # The remote: every request of the controller as the tenant's own federated identity, none impersonated.
    requests = remote_requests(remote, remote_admin, since=seen)
    assert requests, "the remote saw the controller's requests"
    assert {e["user"]["username"] for e in requests} == {identity}
    assert not [e for e in remote.audit_events()[seen:] if "impersonatedUser" in e], "no impersonation, ever"
    assert writes_by(requests, identity), "the writes there are the tenant's"
    # Here: TokenRequests for that ServiceAccount only, with the remote's audience; no Secret read.
    minted = token_requests(control_plane, s.ns)
    assert minted, "tokens were requested"
    assert {(account, tuple(audiences), code) for account, audiences, code in minted} == {
        ("payments-deployer", (remote.url,), 201)}
    assert len(minted) <= 2, "one token, kept (and at most once more if a pass raced the first)"
    assert secret_reads(control_plane, s.ns) == [], "no Secret is read: there is none"
    no_token_leaks(controller, installed, s, "payments")

    # A warm pass asks for no token again.
    before = len(token_requests(control_plane, s.ns))
    s.stageset("payments", APP, kubeConfig={"configMapRef": {"name": "prod-eu"}},
               interval="2s")
    s.wait_ready("payments")
    time.sleep(5)
    assert len(token_requests(control_plane, s.ns)) == before

    # Deleting the StageSet tears down on the remote, as the same identity.
    installed.request("DELETE", s.path("payments"))
    wait_for(lambda: get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/on-prod") is None,
             what="remote teardown")
    settle_audit()
    deletes = [e for e in remote.audit_events()[seen:] if e.get("verb") == "delete"
               and e.get("stage") == "ResponseComplete"]
    assert {e["user"]["username"] for e in deletes} == {identity}


def test_bad_configmaps_are_refused_naming_what_is_wrong_and_request_no_token(
    controller: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("wi-bad", service_account="deployer")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("never")})
    bind_there(remote_admin, namespace=s.ns, user=federated(s.ns, "deployer"))
    workload_map(installed, s.ns, "aws",
                 generic(remote, provider="aws", cluster="arn:aws:eks:eu-west-1:1:cluster/x"))
    workload_map(installed, s.ns, "no-address", {k: v for k, v in generic(remote).items() if k != "address"})
    workload_map(installed, s.ns, "borrowed", generic(remote, serviceAccountName="admin"))
    seen = len(remote.audit_events())
    cases = {
        "aws": ("InvalidSpec", f"spec.kubeConfig.configMapRef: ConfigMap {s.ns}/aws: provider 'aws' is not "
                               "supported yet"),
        "no-address": ("InvalidSpec", f"spec.kubeConfig.configMapRef: ConfigMap {s.ns}/no-address: key "
                                      "'address' is missing"),
        "borrowed": ("InvalidSpec", "key 'serviceAccountName' names ServiceAccount 'admin', but this "
                                    "StageSet acts as 'deployer': in multi-tenant mode"),
    }
    for name in cases:
        s.stageset(name, APP, kubeConfig={"configMapRef": {"name": name}})
    for name, (reason, message) in cases.items():
        ready = s.wait_reason(name, reason)
        assert message in ready["message"], ready["message"]

    # A ConfigMap the StageSet's ServiceAccount may not read: refused as that account, naming it.
    reader = make_tenant("wi-unreadable", service_account="deployer")
    u = scenario(installed, git_server, reader, {"app/cm.yaml": cm("never")}, role="stageset-view")
    workload_map(installed, u.ns, "prod-eu", generic(remote))
    u.stageset("unreadable", APP, kubeConfig={"configMapRef": {"name": "prod-eu"}})
    denied = u.wait_reason("unreadable", "RBACDenied")
    assert f"system:serviceaccount:{u.ns}:deployer may not read ConfigMap {u.ns}/prod-eu " \
           "(spec.kubeConfig.configMapRef)" in denied["message"]

    time.sleep(3)  # a few more passes: still nothing
    settle_audit()
    assert token_requests(control_plane, s.ns) == [], "no TokenRequest for a refused ConfigMap"
    assert token_requests(control_plane, u.ns) == []
    assert not [e for e in remote.audit_events()[seen:] if s.ns in e.get("requestURI", "")
                or u.ns in e.get("requestURI", "")], "nothing sent to the remote"
    assert get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/never") is None
    assert s.configmap("never") is None
    assert (s.get("aws").get("status") or {}).get("inventory") in (None, []), "nothing applied, nothing lost"


def test_a_stage_target_reaches_the_remote_as_the_platform_and_writes_as_the_tenant(
    controller: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    """The platform's StageTarget names a ConfigMap and the platform's ServiceAccount (of the target
    namespace): the controller reads both as itself, discovery and health go as the platform's
    federated identity, and each stage still writes as its own ServiceAccount's — a token requested
    for it, never impersonation — so a tenant stays inside its own rights there."""
    installed.apply(f"/api/v1/namespaces/{PLATFORM}/serviceaccounts/platform-deployer",
                    {"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "platform-deployer", "namespace": PLATFORM}},
                    field_manager="platform")
    tenant = make_tenant("wi-target", service_account="payments-deployer")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("on-target")})
    platform, writer = federated(PLATFORM, "platform-deployer"), federated(s.ns, "payments-deployer")
    bind_there(remote_admin, namespace=s.ns, user=writer)
    workload_map(installed, PLATFORM, "prod", generic(remote, serviceAccountName="platform-deployer"))
    seen = len(remote.audit_events())
    installed.apply(f"/apis/stages.metio.wtf/v1/namespaces/{PLATFORM}/stagetargets/prod",
                    {"apiVersion": "stages.metio.wtf/v1", "kind": "StageTarget",
                     "metadata": {"name": "prod", "namespace": PLATFORM},
                     "spec": {"kubeConfig": {"configMapRef": {"name": "prod"}}, "allowedNamespaces": [s.ns]}},
                    field_manager="platform-team")

    def target_ready() -> dict[str, Any] | None:
        obj = installed.get(f"/apis/stages.metio.wtf/v1/namespaces/{PLATFORM}/stagetargets/prod")
        conditions = (obj.get("status") or {}).get("conditions", [])
        ready = next((c for c in conditions if c["type"] == "Ready"), None)
        return obj if ready and ready["status"] == "True" else None
    target = wait_for(target_ready, what="StageTarget prod Ready")
    assert target["status"]["server"] == remote.url
    assert target["status"]["kubernetesVersion"].startswith("v1.")

    s.stageset("payments", APP, targetRef={"name": "prod", "namespace": PLATFORM})
    s.wait_ready("payments")
    assert remote_admin.get(f"/api/v1/namespaces/{s.ns}/configmaps/on-target")["metadata"]["labels"][
        "stages.metio.wtf/stage"] == "app"
    settle_audit()
    requests = remote_requests(remote, remote_admin, since=seen)
    assert {e["user"]["username"] for e in requests} == {platform, writer}
    assert not [e for e in remote.audit_events()[seen:] if "impersonatedUser" in e], "no impersonation, ever"
    assert {e["user"]["username"] for e in writes_by(requests, writer)} == {writer}
    assert not writes_by(requests, platform), "the platform's identity writes nothing there"
    assert {(a, tuple(aud), code) for a, aud, code in token_requests(control_plane, PLATFORM)} == {
        ("platform-deployer", (remote.url,), 201)}
    assert {(a, tuple(aud), code) for a, aud, code in token_requests(control_plane, s.ns)} == {
        ("payments-deployer", (remote.url,), 201)}
    # No Secret is read: the platform stores no credential.  (The target namespace's Secrets are
    # listed and watched metadata-only, for kubeconfig StageTargets; no Secret's data is ever got.)
    assert {e["verb"] for e in secret_reads(control_plane, PLATFORM)} <= {"list", "watch"}
    no_token_leaks(controller, installed, s, "payments")


def test_a_move_from_a_secret_cluster_to_a_workload_identity_cluster_is_make_before_break(
    controller: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    """From a cluster reached by a kubeconfig Secret to another reached by workload identity: applied and
    Ready on the new one first, then cleaned on the old one as the identity that applied there.  Then
    the same remote reached by a Secret again is the same cluster (server URL and CA fingerprint):
    no move, nothing deleted."""
    old = envtest.start()  # the cluster the StageSet leaves: an ordinary remote, reached by a Secret
    old_pool = ClientPool.from_kubeconfig(str(old.kubeconfig))
    try:
        old_admin = old_pool.client()
        tenant = make_tenant("wi-move", service_account="deployer")
        s = scenario(installed, git_server, tenant, {"db/d.yaml": cm("d"), "app/a.yaml": cm("a")})
        install.create_tenant(old_admin, namespace=s.ns, service_account="deployer")
        aggregate_cluster_roles(old_admin)
        kubeconfig_secret(installed, s.ns, "old", inline_kubeconfig(old))
        kubeconfig_secret(installed, s.ns, "new-by-secret", inline_kubeconfig(remote))
        identity = federated(s.ns, "deployer")
        bind_there(remote_admin, namespace=s.ns, user=identity)
        workload_map(installed, s.ns, "new", generic(remote))
        stages = [{"name": "db", "path": "./db"}, {"name": "app", "path": "./app", "dependsOn": ["db"]}]
        s.stageset("shop", stages, kubeConfig={"secretRef": {"name": "old"}})
        s.wait_ready("shop")
        assert get_or_none(old_admin, f"/api/v1/namespaces/{s.ns}/configmaps/a") is not None
        old_seen, remote_seen = len(old.audit_events()), len(remote.audit_events())

        s.stageset("shop", stages, kubeConfig={"configMapRef": {"name": "new"}})

        def moved() -> dict[str, Any] | None:
            obj = s.get("shop")
            status = obj.get("status") or {}
            ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
            if not ready or ready["status"] != "True" or status.get("previousTargets") \
                    or ready.get("observedGeneration") != obj["metadata"]["generation"]:
                return None
            inventory = status.get("inventory") or []
            if not inventory or any((inv.get("target") or {}).get("configMapRef") != {"name": "new"}
                                    for inv in inventory):
                return None
            return obj
        wait_for(moved, timeout=120, what="the move to the workload-identity cluster, over")
        for name in ("a", "d"):
            assert get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/{name}") is not None
            assert get_or_none(old_admin, f"/api/v1/namespaces/{s.ns}/configmaps/{name}") is None
        settle_audit()

        def acting(event: dict[str, Any]) -> str:
            return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))
        old_deletes = [e for e in old.audit_events()[old_seen:] if e.get("verb") == "delete"
                       and e.get("stage") == "ResponseComplete"]
        assert [(acting(e), e["objectRef"]["name"]) for e in old_deletes] == [
            (tenant.username, "a"), (tenant.username, "d")], "deleted as who applied them, dependents first"
        new_events = remote.audit_events()[remote_seen:]
        # Server-side applies (the audit's "patch"), as the tenant's federated identity there.
        applied = [e for e in writes_by(new_events, identity)
                   if (e.get("objectRef") or {}).get("resource") == "configmaps"]
        assert {e["objectRef"]["name"] for e in applied} == {"a", "d"}
        first_delete = min(e["stageTimestamp"] for e in old_deletes)  # one machine, one clock
        assert max(e["stageTimestamp"] for e in applied) < first_delete, "made before break"
        assert not [e for e in new_events if e.get("verb") == "delete"], "nothing deleted on the new cluster"
        messages = [str(e.get("message") or e.get("note"))
                    for e in installed.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
                    if e.get("reason") == "Retargeted"]
        assert messages == [f"moved from {old.url} to {remote.url}: 2 object(s) applied and ready there; on "
                            f"{old.url}: 2 deleted, 0 released (prune: false)"]

        # The same remote by a Secret (the admin's kubeconfig, impersonating the tenant's ServiceAccount
        # name, which the remote binds too): the same cluster, no move.
        install.create_tenant(remote_admin, namespace=s.ns, service_account="deployer")
        remote_seen = len(remote.audit_events())
        s.stageset("shop", stages, kubeConfig={"secretRef": {"name": "new-by-secret"}})
        ready = s.wait_ready("shop")
        assert not ready["status"].get("previousTargets")
        assert all(inv["target"]["kubeConfig"] == {"name": "new-by-secret", "key": "value"}
                   for inv in ready["status"]["inventory"])
        settle_audit()
        assert not [e for e in remote.audit_events()[remote_seen:] if e.get("verb") == "delete"]
        assert get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/a") is not None
    finally:
        old_pool.close()
        old.stop()
