"""Tenant-owned alerts end to end (``--tenant-notifications``): the real controller, with the chart's
multi-tenant rights plus what ``controller.notifications.tenants`` grants (``get``/``list`` of the
two kinds, no Secret), against the real apiserver, sending to a loopback receiver.

What must hold: an app team's alert in its namespace hears that namespace's StageSets and no
other's, whatever its event sources say; its provider's Secret is read as the provider's
``serviceAccountName`` (the audit log shows the impersonation) and a provider without one sends
nothing; the platform's alerts are unchanged.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.actionserver import ActionServer
from tests.conftest import Tenant
from tests.e2e.conftest import wait_for
from tests.e2e.metrics import METRICS_ARGS, metrics_url, scrape
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
PLATFORM = "stageset-notify-t"
GROUP = "/apis/stages.metio.wtf/v1/namespaces/{ns}"


@pytest.fixture(scope="module")
def receiver() -> Iterator[ActionServer]:
    with ActionServer() as server:
        yield server


@pytest.fixture(scope="module")
def controller_args(installed: KubeClient, receiver: ActionServer) -> list[str]:
    install.grant_notifications(installed, namespace=PLATFORM)
    install.grant_tenant_notifications(installed)
    for path in ("/platform", "/team-a", "/no-account"):
        receiver.answer(path, 200)
    # The platform's alert, unchanged: every StageSet named `web`, in any namespace.
    put(installed, PLATFORM, "notificationproviders", "platform",
        {"type": "generic", "address": receiver.url("/platform")})
    put(installed, PLATFORM, "notificationalerts", "platform",
        {"providerRef": {"name": "platform"}, "eventSources": [{"namespace": "*", "name": "web"}]})
    return ["--notification-namespace", PLATFORM, "--tenant-notifications", *METRICS_ARGS]


def put(admin: KubeClient, namespace: str, plural: str, name: str, spec: dict[str, Any]) -> None:
    kind = {"notificationproviders": "NotificationProvider",
            "notificationalerts": "NotificationAlert"}[plural]
    admin.apply(f"{GROUP.format(ns=namespace)}/{plural}/{name}",
                {"apiVersion": "stages.metio.wtf/v1", "kind": kind,
                 "metadata": {"name": name, "namespace": namespace}, "spec": spec}, field_manager="e2e-test")


def told(receiver: ActionServer, path: str) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in receiver.received(path)]


def test_a_team_s_alert_hears_its_own_stagesets_only_and_its_secret_is_read_as_its_account(
    controller: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: TenantFactory, receiver: ActionServer,
) -> None:
    team_a = scenario(installed, git_server, make_tenant("team-a"), {"app/cm.yaml": cm("app")})
    team_b = scenario(installed, git_server, make_tenant("team-b"), {"app/cm.yaml": cm("app")})
    a, b = team_a.ns, team_b.ns
    since = len(control_plane.audit_events())
    # Team A's own configuration, in its namespace: the webhook's address in a Secret its deployer may
    # read, an alert that asks for every namespace's events (it gets its own only), and a provider that
    # names no account (it sends nothing: its Secret is never read as the controller).
    address = base64.b64encode(receiver.url("/team-a").encode()).decode()
    installed.request("POST", f"/api/v1/namespaces/{a}/secrets",
                      body={"metadata": {"name": "hook"}, "data": {"address": address}})
    put(installed, a, "notificationproviders", "mine",
        {"type": "generic", "secretRef": {"name": "hook"}, "serviceAccountName": "deployer"})
    put(installed, a, "notificationproviders", "no-account",
        {"type": "generic", "secretRef": {"name": "hook"}})
    for name in ("mine", "no-account"):
        put(installed, a, "notificationalerts", name,
            {"providerRef": {"name": name}, "eventSources": [{"namespace": "*", "name": "*"}]})
    # Team B has a StageSet but no alert: nothing of it may reach team A's receiver.
    team_a.stageset("web", [{"name": "app", "path": "./app"}])
    team_b.stageset("web", [{"name": "app", "path": "./app"}])
    team_a.wait_ready("web")
    team_b.wait_ready("web")

    mine = wait_for(lambda: [e for e in told(receiver, "/team-a")
                             if e["reason"] == "ReconciliationSucceeded"],
                    timeout=90, what="team A's own event at its receiver")
    assert mine[0]["involvedObject"]["namespace"] == a
    assert {e["involvedObject"]["namespace"] for e in told(receiver, "/team-a")} == {a}
    # The platform's alert is unchanged: both teams' `web`.
    wait_for(lambda: {a, b} <= {e["involvedObject"]["namespace"] for e in told(receiver, "/platform")},
             what="the platform's alert hearing both teams")

    # The provider without an account sent nothing, and counted its failure.
    def counted() -> float | None:
        found = scrape(metrics_url(controller)).value("stageset_notification_failures_total",
                                                      provider=f"{a}/no-account", type="generic")
        return found if found >= 1 else None
    wait_for(counted, what="the account-less provider's failure in the metrics")
    assert not receiver.received("/no-account")
    assert not [e for e in told(receiver, "/team-a") if e["involvedObject"]["namespace"] == b]

    # Team A's Secret was read as team A's deployer, never with the controller's own rights.
    reads = [e for e in control_plane.audit_events()[since:]
             if (e.get("objectRef") or {}).get("resource") == "secrets"
             and (e.get("objectRef") or {}).get("namespace") == a and e.get("verb") == "get"
             and e.get("stage") == "ResponseComplete"]
    assert reads, "the provider's Secret was read"
    assert {(e.get("impersonatedUser") or {}).get("username") for e in reads} == {
        f"system:serviceaccount:{a}:deployer"}
    assert {e["responseStatus"]["code"] for e in reads} == {200}
