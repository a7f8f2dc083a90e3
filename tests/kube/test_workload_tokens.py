"""Workload identity's client side against a real apiserver: requests carry the acting
ServiceAccount's own token (TokenRequest, as the controller) and no impersonation header; a refused
token (401) is renewed once and the request made again; a ServiceAccount deleted and created again
works on the next request; one that is gone fails before anything is sent.

The "remote" here is the test's own apiserver, reached as a workload-identity cluster: its default
API audience is its ServiceAccount issuer, so a token for that audience is accepted there — what a
remote trusting this issuer does (the two-cluster story is ``tests/e2e/federated/``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from stageset.controller.targets.workload import bearers_for
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ClientPool, ClusterKey, CredentialUnavailable, Identity, KubeClient
from stageset.kube.federation import WorkloadConfig
from stageset.kube.tokens import Account, TokenRequester
from tests.conftest import Tenant

pytestmark = pytest.mark.apiserver

FEDERATED = ClusterKey("wi:self")


def answered(event: dict[str, Any]) -> bool:
    """One event per request: its completion, or for a refused token (401, the audit's ResponseStarted)."""
    code = (event.get("responseStatus") or {}).get("code")
    stage = event.get("stage")
    return stage == "ResponseComplete" or (stage == "ResponseStarted" and code == 401)


def audited(plane: ControlPlane, *, path: str) -> list[dict[str, Any]]:
    return [e for e in plane.audit_events() if answered(e) and e.get("requestURI", "").split("?")[0] == path]


@pytest.fixture
def federated(control_plane: ControlPlane, admin: KubeClient) -> tuple[ClientPool, TokenRequester]:
    tokens = TokenRequester(client=admin)
    configuration = k8s.Configuration()
    configuration.host = control_plane.url
    configuration.ssl_ca_cert = str(control_plane.pki.ca_cert)
    pool = ClientPool(configuration=configuration)
    return pool, tokens


def register(pool: ClientPool, tokens: TokenRequester, *, plane: ControlPlane, namespace: str) -> None:
    config = WorkloadConfig(provider="generic", address=plane.url, ca=plane.pki.ca_cert.read_bytes(),
                            audiences=(plane.issuer,), service_account=None)
    configuration = k8s.Configuration()
    configuration.host = plane.url
    configuration.ca_cert_data = plane.pki.ca_cert.read_text()
    pool.register(FEDERATED, configuration, bearers=bearers_for(
        tokens=tokens, config=config, own=Account(namespace, "deployer"),
        may_act=lambda ns: ns == namespace, scope=f"only ServiceAccounts of namespace {namespace}"))


def test_each_request_carries_its_own_token_and_no_impersonation(
    control_plane: ControlPlane, installed: KubeClient, make_tenant: Callable[..., Tenant],
    federated: tuple[ClientPool, TokenRequester],
) -> None:
    pool, tokens = federated
    tenant = make_tenant("wi", service_account="deployer")
    tenant.bind_cluster_role("edit")
    register(pool, tokens, plane=control_plane, namespace=tenant.namespace)
    as_tenant = pool.client(Identity.service_account(namespace=tenant.namespace, name="deployer"), FEDERATED)
    path = f"/api/v1/namespaces/{tenant.namespace}/configmaps/federated"
    for value in ("1", "2", "3"):
        as_tenant.apply(path, {"apiVersion": "v1", "kind": "ConfigMap", "data": {"v": value},
                               "metadata": {"name": "federated", "namespace": tenant.namespace}},
                        field_manager="test")
    assert tokens.requested == 1, "one token for three requests"
    events = audited(control_plane, path=path)
    assert len(events) == 3
    for event in events:
        assert event["user"]["username"] == tenant.username
        assert "impersonatedUser" not in event, "no impersonation header, ever"
        assert event["responseStatus"]["code"] in (200, 201)
    token_path = f"/api/v1/namespaces/{tenant.namespace}/serviceaccounts/deployer/token"
    minted = audited(control_plane, path=token_path)
    assert [e["verb"] for e in minted] == ["create"]
    # The controller's own requests there carry the connection's own account's token.
    as_controller = pool.client(Identity(), FEDERATED)
    assert as_controller.get(path)["data"] == {"v": "3"}
    # Another namespace's account has no identity there: refused before anything is sent.
    other = make_tenant("wi-other", service_account="deployer")
    before = len(control_plane.audit_events())
    with pytest.raises(CredentialUnavailable, match="may not act there"):
        pool.client(Identity.service_account(namespace=other.namespace, name="deployer"), FEDERATED).get(
            f"/api/v1/namespaces/{other.namespace}/configmaps")
    with pytest.raises(CredentialUnavailable, match="has no workload identity here"):
        pool.client(Identity(user="alice"), FEDERATED).get("/api")
    sent = control_plane.audit_events()[before:]
    assert not [e for e in sent if other.namespace in e.get("requestURI", "")]


def test_a_refused_token_is_renewed_once_and_a_recreated_account_works(
    control_plane: ControlPlane, installed: KubeClient, admin: KubeClient, make_tenant: Callable[..., Tenant],
    federated: tuple[ClientPool, TokenRequester],
) -> None:
    pool, tokens = federated
    tenant = make_tenant("wi-401", service_account="deployer")
    tenant.bind_cluster_role("edit")
    register(pool, tokens, plane=control_plane, namespace=tenant.namespace)
    as_tenant = pool.client(Identity.service_account(namespace=tenant.namespace, name="deployer"), FEDERATED)
    path = f"/api/v1/namespaces/{tenant.namespace}/configmaps"
    as_tenant.get(path)
    assert tokens.requested == 1
    account = f"/api/v1/namespaces/{tenant.namespace}/serviceaccounts/deployer"
    # Deleted and created again: the kept token names the old account (its uid), and is refused (401)
    # once the apiserver's cache of authenticated tokens (seconds) has let go of it.
    admin.request("DELETE", account)
    admin.request("POST", f"/api/v1/namespaces/{tenant.namespace}/serviceaccounts",
                  body={"metadata": {"name": "deployer"}})
    before = len(audited(control_plane, path=path))
    deadline = time.monotonic() + 60
    while tokens.requested == 1 and time.monotonic() < deadline:
        as_tenant.get(path)  # every answer a success: the old token until refused, then a new one
        time.sleep(0.2)
    assert tokens.requested == 2, "the 401 renewed the token once"
    codes = [e["responseStatus"]["code"] for e in audited(control_plane, path=path)[before:]]
    assert codes.count(401) == 1, "refused once"
    assert codes[-2:] == [401, 200], "then made again with a new token"
    # Gone for good: the refusal's renewal finds no account, and says so; nothing else is tried.
    admin.request("DELETE", account)
    before = len(audited(control_plane, path=path))
    deadline = time.monotonic() + 60
    def until_refused() -> None:
        while time.monotonic() < deadline:
            as_tenant.get(path)  # the old token until refused; then its renewal finds no account
            time.sleep(0.2)

    with pytest.raises(CredentialUnavailable, match=f"ServiceAccount {tenant.namespace}/deployer not found"):
        until_refused()
    codes = [e["responseStatus"]["code"] for e in audited(control_plane, path=path)[before:]]
    assert codes.count(401) == 1
    assert codes[-1] == 401
    assert tokens.requested == 3
    # The next use asks again (a failure is not remembered): created again, it works.
    admin.request("POST", f"/api/v1/namespaces/{tenant.namespace}/serviceaccounts",
                  body={"metadata": {"name": "deployer"}})
    as_tenant.get(path)
    assert tokens.requested == 4
