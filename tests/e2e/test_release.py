"""Steering a release through the controller process and a real apiserver: a soak holds the stages
after it, a manual gate is released by ``stageset promote`` run as a user who may patch the
StageSet (and not by one who may only read it), and a deny window holds a new commit until it
ends (or ``stageset reconcile --update-now`` ships it).  No timed assertions: states are polled."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli, user_kubeconfig
from tests.conftest import Tenant
from tests.e2e.conftest import WRITE_VERBS, ControllerProcess, condition, wait_for
from tests.e2e.stagesets import Scenario, cm, scenario

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


def stage(obj: dict[str, Any], name: str) -> dict[str, Any]:
    stages = (obj.get("status") or {}).get("stages", [])
    found: dict[str, Any] = next((s for s in stages if s["name"] == name), {})
    return found


def value(s: Scenario, name: str) -> str | None:
    found = s.configmap(name)
    return None if found is None else str(found["data"]["k"])


def iso(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_soak_holds_the_stage_after_it_until_it_ends(
    controller: ControllerProcess, installed: KubeClient, git_server: Any, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("soak"), {"staging/cm.yaml": cm("staging"),
                                                             "prod/cm.yaml": cm("prod")})
    s.stageset("soaked", [{"name": "staging", "path": "./staging", "promotion": {"soak": "5s"}},
                          {"name": "prod", "path": "./prod"}])
    soaking = s.wait_reason("soaked", "Soaking")
    assert "stage 'staging' soaks until" in soaking["message"]
    promoted = s.wait_ready("soaked")
    gate = stage(promoted, "staging")["promotionState"]
    assert (gate["phase"], gate["promotedBy"]) == ("Promoted", "soak")
    # The stage after the soak was created no earlier than the soak ended.
    started = (s.configmap("prod") or {})["metadata"]["creationTimestamp"]
    soaked = s.get("soaked")
    assert started >= soaked["status"]["stages"][0]["promotionState"]["since"]
    events = installed.get(f"/apis/events.k8s.io/v1/namespaces/{s.ns}/events")["items"]
    assert any(e["reason"] == "Promoted" and "its soak ended" in e["note"] for e in events)


def test_a_manual_gate_is_released_by_stageset_promote_as_a_user_who_may_patch_it(
    controller: ControllerProcess, installed: KubeClient, git_server: Any, make_tenant: TenantFactory,
    control_plane: ControlPlane, tmp_path: Path,
) -> None:
    tenant = make_tenant("gate")
    s = scenario(installed, git_server, tenant, {"staging/cm.yaml": cm("staging"),
                                                 "prod/cm.yaml": cm("prod")})
    gated = {"name": "staging", "path": "./staging", "promotion": {"requireManualPromotion": True}}
    s.stageset("gated", [gated, {"name": "prod", "path": "./prod"}])
    waiting = s.wait_reason("gated", "AwaitingPromotion")
    assert "stageset promote NAME --stage staging" in waiting["message"]
    assert s.configmap("prod") is None

    def user(account: str, role: str) -> Path:
        path = user_kubeconfig(installed, control_plane, namespace=s.ns, account=account,
                               path=tmp_path / f"{account}.kubeconfig", context_namespace=s.ns)
        Tenant(namespace=s.ns, service_account=account, api=tenant.api).bind_cluster_role(role)
        return path

    # Who may only read the StageSet may not promote it: nothing is written, nothing promoted.
    viewer = user("viewer", "view")
    refused = run_cli("promote", "gated", "--stage", "staging", kubeconfig=viewer)
    assert refused.exit_code == 3, refused.output
    assert "you may not patch StageSet" in refused.stderr
    assert stage(s.get("gated"), "staging").get("lastHandledPromotion") is None

    releaser = user("releaser", "edit")
    done = run_cli("promote", "gated", "--stage", "staging", "--wait", "--timeout", "60s",
                   kubeconfig=releaser)
    assert done.exit_code == 0, done.output
    assert "stage 'staging' promoted at main@sha1:" in done.stdout
    s.wait_ready("gated")
    assert s.configmap("prod") is not None
    # The annotation was written by the user, not by the controller.
    patches = [e for e in control_plane.audit_events() if e.get("verb") == "patch"
               and e.get("objectRef", {}).get("resource") == "stagesets"
               and e.get("objectRef", {}).get("name") == "gated" and e.get("stage") == "ResponseComplete"
               and not e.get("objectRef", {}).get("subresource")]
    users = {str((e.get("user") or {}).get("username")) for e in patches}
    assert f"system:serviceaccount:{s.ns}:releaser" in users
    assert not [e for e in patches if (e.get("user") or {}).get("username", "").endswith(":viewer")
                and int(e.get("responseStatus", {}).get("code", 0)) < 300]


def test_a_deny_window_holds_a_new_commit_until_it_ends_and_update_now_ships_one_at_once(
    controller: ControllerProcess, installed: KubeClient, git_server: Any, make_tenant: TenantFactory,
    tmp_path: Path, control_plane: ControlPlane,
) -> None:
    tenant = make_tenant("window")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("app", "v1")})
    s.stageset("frozen", [{"name": "app", "path": "./app"}])
    s.wait_ready("frozen")
    now = datetime.datetime.now(datetime.UTC)
    freeze = {"type": "Deny", "from": iso(now - datetime.timedelta(minutes=1)),
              "to": iso(now + datetime.timedelta(hours=1))}
    s.stageset("frozen", [{"name": "app", "path": "./app"}], updateWindows=[freeze])
    s.wait_ready("frozen")

    s.commit({"app/cm.yaml": cm("app", "v2")})

    def deferred() -> Any:
        obj = s.get("frozen")
        ready = condition(obj) or {}
        held = (obj.get("status") or {}).get("pendingUpdate")
        return obj if ready.get("reason") == "UpdateDeferred" and held else None

    held = wait_for(deferred, what="the new commit held by the window")
    assert condition(held)["status"] == "True"  # type: ignore[index]  # the applied revision is Ready
    assert value(s, "app") == "v1"
    assert held["status"]["pendingUpdate"]["nextWindowOpens"] == freeze["to"]

    # The window now ends in two seconds: the controller ships the held commit when it does.
    ends = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    s.stageset("frozen", [{"name": "app", "path": "./app"}], updateWindows=[{**freeze, "to": iso(ends)}])
    wait_for(lambda: value(s, "app") == "v2", what="the held commit shipped when the window ended")

    # The pass that held the commit left Ready=True at this generation, so "Ready" alone could be
    # read before the shipping pass writes its status: wait for that status, the hold cleared.
    def shipped_status() -> Any:
        obj = s.get("frozen")
        ready = condition(obj) or {}
        if ready.get("status") == "True" and ready.get("reason") != "UpdateDeferred" \
                and "pendingUpdate" not in (obj.get("status") or {}):
            return obj
        return None

    wait_for(shipped_status, what="Ready with the hold cleared once the held commit shipped")

    # A new freeze, a new commit held, and `stageset reconcile --update-now` ships it at once.
    s.stageset("frozen", [{"name": "app", "path": "./app"}], updateWindows=[freeze])
    s.commit({"app/cm.yaml": cm("app", "v3")})
    wait_for(deferred, what="the next commit held")
    kubeconfig = user_kubeconfig(installed, control_plane, namespace=s.ns, account="oncall",
                                 path=tmp_path / "oncall.kubeconfig", context_namespace=s.ns)
    Tenant(namespace=s.ns, service_account="oncall", api=tenant.api).bind_cluster_role("edit")
    shipped = run_cli("reconcile", "frozen", "--update-now", kubeconfig=kubeconfig)
    assert shipped.exit_code == 0, shipped.output
    wait_for(lambda: value(s, "app") == "v3", what="update-now shipped the held commit")
    events = installed.get(f"/apis/events.k8s.io/v1/namespaces/{s.ns}/events")["items"]
    assert any(e["reason"] == "UpdateOverridden" and "app to main@sha1:" in e["note"] for e in events)
    assert any(e["reason"] == "UpdateDeferred" for e in events)
    # Every write to the tenant's objects was the tenant's own.
    writes = [e for e in control_plane.audit_events() if e.get("verb") in WRITE_VERBS
              and e.get("objectRef", {}).get("namespace") == s.ns
              and e.get("objectRef", {}).get("resource") == "configmaps"
              and e.get("stage") == "ResponseComplete"]
    assert writes
    assert {str((e.get("impersonatedUser") or e.get("user") or {}).get("username")) for e in writes} == {
        tenant.username}
