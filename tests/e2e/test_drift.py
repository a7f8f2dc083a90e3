"""Drift by watch (issue 45), end to end: the real controller with the chart's multi-tenant rights,
real apiservers (this one and a "remote" one reached through ``spec.kubeConfig``), every StageSet at
``interval: 10m`` so the interval cannot explain what happens within a test.

What must hold: an admin's edit or delete of an applied object is corrected by the normal pass (a
``DriftCorrected`` event, the write made as the stage's ServiceAccount in the audit log), here and on
the remote, also after the remote's apiserver went away and came back; a Deployment whose status
changes every second costs no pass at all; ``Warn`` leaves the edit, says so once (condition, event,
metric, notification), still applies new revisions, and ``Correct`` then restores it; a rotated
kubeConfig Secret moves the StageSet without an edit of it; fifty StageSets of one namespace share
one watch per kind there.

Waits are generous (30 s) and nothing is timed: what proves the watch is that the interval is ten
minutes and no reconcile is requested.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.api import eventnote
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.actionserver import ActionServer
from tests.conftest import Tenant
from tests.e2e.conftest import condition, get_or_none, wait_for, writes_by
from tests.e2e.metrics import METRICS_ARGS, metrics_url, scrape
from tests.e2e.remotes import inline_kubeconfig, kubeconfig_secret
from tests.e2e.stagesets import Scenario, cm, deployment, poke, scenario
from tests.e2e.test_events import count, events, handled
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
PLATFORM = "stageset-drift-notify"
WAIT = 30.0
"""Generous: the interval is ten minutes, so anything within this came from a watch."""
EDITOR = {"fieldManager": "kubectl-edit"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[ActionServer]:
    with ActionServer() as server:
        yield server


@pytest.fixture(scope="module")
def controller_args(installed: KubeClient, receiver: ActionServer) -> list[str]:
    """Notifications on, with the platform's webhook for DriftDetected of every StageSet named
    ``audit`` in place before the controller starts (it reads its configuration every 30 s)."""
    install.grant_notifications(installed, namespace=PLATFORM)
    webhook(installed, receiver)
    return ["--notification-namespace", PLATFORM, *METRICS_ARGS]


def edit(admin: KubeClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """An admin's ``kubectl edit``: an update under its own field manager."""
    return admin.request("PATCH", path, content_type="application/merge-patch+json", body=body, query=EDITOR)


def cm_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


def data(admin: KubeClient, namespace: str, name: str) -> Any:
    found = get_or_none(admin, cm_path(namespace, name))
    return None if found is None else found.get("data")


def tenant_watches(
    audit: list[dict[str, Any]], *, user: str, namespace: str, resource: str
) -> list[dict[str, Any]]:
    """The watches ``user`` opened on ``resource`` in ``namespace`` (each logged when it starts)."""
    return [
        e
        for e in audit
        if e.get("verb") == "watch"
        and e.get("stage") == "ResponseStarted"
        and (e.get("impersonatedUser") or {}).get("username") == user
        and (e.get("objectRef") or {}).get("namespace") == namespace
        and (e.get("objectRef") or {}).get("resource") == resource
    ]


def patched(audit: list[dict[str, Any]], *, user: str, resource: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in writes_by(audit, user)
        if (e.get("objectRef") or {}).get("resource") == resource
        and (e.get("objectRef") or {}).get("name") == name
    ]


def corrected(admin: KubeClient, namespace: str, name: str) -> set[str]:
    """Every object a DriftCorrected event of StageSet ``name`` names."""
    return {
        part.strip()
        for e in events(admin, namespace, name=name, reason="DriftCorrected")
        for reason, message in eventnote.split("DriftCorrected", e["note"])
        if reason == "DriftCorrected"
        for part in message.split(": restored ", 1)[1].split(",")
    }


def test_an_admin_edit_and_delete_are_corrected_by_watch_as_the_tenant(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    control_plane: envtest.ControlPlane,
) -> None:
    tenant = make_tenant("drift")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    s.stageset("shop", [{"name": "app", "path": "./app"}], interval="10m")
    s.wait_ready("shop")
    # The watch is the tenant's: label-selected in its namespace, as its ServiceAccount.
    wait_for(
        lambda: tenant_watches(
            control_plane.audit_events(), user=tenant.username, namespace=s.ns, resource="configmaps"
        ),
        what="the tenant's drift watch",
    )
    [watch] = tenant_watches(
        control_plane.audit_events(), user=tenant.username, namespace=s.ns, resource="configmaps"
    )
    assert "labelSelector=stages.metio.wtf" in watch["requestURI"]
    seen = len(control_plane.audit_events())

    edit(installed, cm_path(s.ns, "a"), {"data": {"k": "by hand"}})
    wait_for(lambda: data(installed, s.ns, "a") == {"k": "v"}, timeout=WAIT, what="the edit corrected")
    installed.request("DELETE", cm_path(s.ns, "b"))
    wait_for(lambda: data(installed, s.ns, "b") == {"k": "v"}, timeout=WAIT, what="the delete corrected")

    # The normal pass corrected both: DriftCorrected names them (one event or two: the delete may
    # land while the edit's pass runs), and each write was the tenant's.
    wait_for(
        lambda: corrected(installed, s.ns, "shop") >= {f"ConfigMap {s.ns}/a", f"ConfigMap {s.ns}/b"},
        what="DriftCorrected naming both",
    )
    time.sleep(1)
    audit = control_plane.audit_events()[seen:]
    assert patched(audit, user=tenant.username, resource="configmaps", name="a"), "a restored as the tenant"
    assert patched(audit, user=tenant.username, resource="configmaps", name="b"), "b restored as the tenant"
    assert s.get("shop")["status"].get("lastHandledReconcileAt") is None, "nobody asked for a reconcile"


def roll_out(s: Scenario, *, tick: int) -> None:
    """The Deployment's status, as its controller and kubelet keep writing it (``tick``: a heartbeat)."""
    s.admin.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{s.ns}/deployments/web/status",
        content_type="application/merge-patch+json",
        body={
            "status": {
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": 1,
                "availableReplicas": 1,
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True",
                        "reason": "MinimumReplicasAvailable",
                        "message": f"heartbeat {tick}",
                    }
                ],
            }
        },
        query={"fieldManager": "kube-controller-manager"},
    )


STATUS_UPDATES = 20


def test_a_deployment_whose_status_changes_every_second_costs_no_pass(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    control_plane: envtest.ControlPlane,
) -> None:
    """Twenty status updates a second apart (not a minute: the point is that each one is judged and
    none costs anything, which twenty show as well as sixty), then an edit of the spec as the
    positive control that the watch was there all along."""
    tenant = make_tenant("drift-status")
    s = scenario(installed, git_server, tenant, {"app/web.yaml": deployment("web")})
    s.stageset("web", [{"name": "app", "path": "./app"}], interval="10m")
    wait_for(
        lambda: get_or_none(installed, f"/apis/apps/v1/namespaces/{s.ns}/deployments/web"),
        what="the Deployment applied",
    )
    roll_out(s, tick=0)
    s.wait_ready("web")
    wait_for(
        lambda: tenant_watches(
            control_plane.audit_events(), user=tenant.username, namespace=s.ns, resource="deployments"
        ),
        what="the tenant's drift watch of Deployments",
    )
    time.sleep(1)  # the last pass's requests land before the window
    seen = len(control_plane.audit_events())
    for tick in range(1, STATUS_UPDATES + 1):
        roll_out(s, tick=tick)
        time.sleep(1)
    time.sleep(2)
    window = control_plane.audit_events()[seen:]
    # Evidence first: every status update is in the log.
    updates = [
        e
        for e in window
        if e.get("verb") == "patch"
        and e.get("stage") == "ResponseComplete"
        and (e.get("objectRef") or {}).get("subresource") == "status"
        and (e.get("objectRef") or {}).get("namespace") == s.ns
    ]
    assert len(updates) == STATUS_UPDATES, len(updates)
    # No pass at all: the tenant made no request (no list, no dry-run, no write), and nothing was
    # written to the StageSet.
    by_tenant = [
        (e["verb"], e["requestURI"])
        for e in window
        if e.get("stage") == "ResponseComplete"
        and (e.get("impersonatedUser") or {}).get("username") == tenant.username
    ]
    assert by_tenant == []
    assert not [
        e
        for e in writes_by(window, "system:serviceaccount:stageset-system:stageset-controller")
        if (e.get("objectRef") or {}).get("namespace") == s.ns
    ]

    # The positive control: an edit of the spec is corrected, so the watch was live throughout.
    edit(installed, f"/apis/apps/v1/namespaces/{s.ns}/deployments/web", {"spec": {"replicas": 5}})
    wait_for(
        lambda: installed.get(f"/apis/apps/v1/namespaces/{s.ns}/deployments/web")["spec"]["replicas"] == 1,
        timeout=WAIT,
        what="spec.replicas restored",
    )


def webhook(admin: KubeClient, receiver: ActionServer) -> None:
    receiver.answer("/drift", 200)
    admin.apply(
        f"/apis/stages.metio.wtf/v1/namespaces/{PLATFORM}/notificationproviders/drift",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "NotificationProvider",
            "metadata": {"name": "drift", "namespace": PLATFORM},
            "spec": {"type": "generic", "address": receiver.url("/drift")},
        },
        field_manager="e2e-test",
    )
    admin.apply(
        f"/apis/stages.metio.wtf/v1/namespaces/{PLATFORM}/notificationalerts/drift",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "NotificationAlert",
            "metadata": {"name": "drift", "namespace": PLATFORM},
            "spec": {
                "providerRef": {"name": "drift"},
                "eventSeverity": "error",
                "eventReasons": ["DriftDetected"],
                "eventSources": [{"kind": "StageSet", "name": "audit"}],
            },
        },
        field_manager="e2e-test",
    )


def drift_notes(receiver: ActionServer, namespace: str) -> list[dict[str, Any]]:
    return [
        body
        for body in (json.loads(r.body) for r in receiver.received("/drift"))
        if body.get("reason") == "DriftDetected" and body["involvedObject"]["namespace"] == namespace
    ]


def test_warn_leaves_the_edit_says_so_once_and_correct_restores_it(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    control_plane: envtest.ControlPlane,
    receiver: ActionServer,
) -> None:
    tenant = make_tenant("drift-warn")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    s.stageset("audit", [{"name": "app", "path": "./app"}], interval="10m", driftDetection={"mode": "Warn"})
    s.wait_ready("audit")
    seen = len(control_plane.audit_events())
    edit(installed, cm_path(s.ns, "a"), {"data": {"k": "on-call fix"}})

    def drifted() -> Any:
        found = condition(s.get("audit"), "Drifted")
        return found if found and found["status"] == "True" else None

    said = wait_for(drifted, timeout=WAIT, what="the Drifted condition")
    assert said["reason"] == "DriftDetected"
    assert f"ConfigMap {s.ns}/a (data.k)" in said["message"]
    status = s.get("audit")["status"]
    assert status["drifted"] == [{"stage": "app", "id": f"{s.ns}_a__ConfigMap", "fields": ["data.k"]}]
    ready = condition(s.get("audit"))
    assert ready is not None
    assert ready["status"] == "True", "the release runs: Ready stays True"
    [note] = wait_for(lambda: drift_notes(receiver, s.ns), what="the webhook's DriftDetected notification")
    assert f"ConfigMap {s.ns}/a (data.k)" in note["message"]
    assert note["severity"] == "error"
    url = metrics_url(controller)
    wait_for(
        lambda: scrape(url).value("stageset_drifted_objects", namespace=s.ns, name="audit") == 1,
        what="the drifted-objects metric",
    )

    # More passes (asked for twice) find the same drift: no write, no second event.
    for _ in range(2):
        stamp = poke(installed, s.path("audit"))
        wait_for(lambda stamp=stamp: handled(s, "audit", stamp), what="the requested pass")
    assert data(installed, s.ns, "a") == {"k": "on-call fix"}
    [detected] = events(installed, s.ns, name="audit", reason="DriftDetected")
    assert count(detected) == 1
    assert detected["type"] == "Warning"
    assert len(drift_notes(receiver, s.ns)) == 1
    assert not patched(
        control_plane.audit_events()[seen:], user=tenant.username, resource="configmaps", name="a"
    )

    # A new revision is still applied (b changes), the drift still left.
    s.commit({"app/b.yaml": cm("b", "v2")})
    wait_for(lambda: data(installed, s.ns, "b") == {"k": "v2"}, what="the new revision applied")
    assert data(installed, s.ns, "a") == {"k": "on-call fix"}

    # Back to Correct: restored at once, Drifted gone, DriftCorrected instead.
    installed.request(
        "PATCH",
        s.path("audit"),
        content_type="application/merge-patch+json",
        body={"spec": {"driftDetection": {"mode": "Correct"}}},
    )
    wait_for(lambda: data(installed, s.ns, "a") == {"k": "v"}, what="the drift corrected")
    s.wait_ready("audit")
    wait_for(
        lambda: condition(s.get("audit"), "Drifted") is None and not s.get("audit")["status"].get("drifted"),
        what="Drifted cleared",
    )
    assert f"ConfigMap {s.ns}/a" in corrected(installed, s.ns, "audit")


def test_fifty_stagesets_of_a_namespace_share_one_watch_per_kind(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    control_plane: envtest.ControlPlane,
) -> None:
    tenant = make_tenant("drift-many")
    files = {f"s{i}/cm.yaml": cm(f"cm-{i}") for i in range(50)}
    s = scenario(installed, git_server, tenant, files)
    seen = len(control_plane.audit_events())
    for i in range(50):
        s.stageset(f"s{i}", [{"name": "app", "path": f"./s{i}"}], interval="10m")
    for i in range(50):
        s.wait_ready(f"s{i}", timeout=180)
    time.sleep(2)
    opened = tenant_watches(
        control_plane.audit_events()[seen:], user=tenant.username, namespace=s.ns, resource="configmaps"
    )
    assert 1 <= len(opened) <= 3, [e["requestURI"] for e in opened]
    # And it serves every one of them.
    edit(installed, cm_path(s.ns, "cm-37"), {"data": {"k": "by hand"}})
    wait_for(lambda: data(installed, s.ns, "cm-37") == {"k": "v"}, timeout=WAIT, what="cm-37 corrected")


# -- the remote cluster (spec.kubeConfig): last, since they stop and restart its apiserver ----------


def remote_scenario(
    installed: KubeClient,
    git_server: GitServer,
    tenant: Tenant,
    remote_admin: KubeClient,
    remote: envtest.ControlPlane,
) -> Scenario:
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    install.create_tenant(remote_admin, namespace=s.ns, service_account=tenant.service_account)
    aggregate_cluster_roles(remote_admin)
    kubeconfig_secret(installed, s.ns, "prod", inline_kubeconfig(remote))
    return s


def test_on_a_remote_cluster_drift_is_corrected_as_the_tenant_there_and_after_it_comes_back(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    remote: envtest.ControlPlane,
    remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("drift-remote")
    s = remote_scenario(installed, git_server, tenant, remote_admin, remote)
    s.stageset(
        "prod", [{"name": "app", "path": "./app"}], interval="10m", kubeConfig={"secretRef": {"name": "prod"}}
    )
    s.wait_ready("prod")
    wait_for(
        lambda: tenant_watches(
            remote.audit_events(), user=tenant.username, namespace=s.ns, resource="configmaps"
        ),
        what="the tenant's drift watch on the remote",
    )
    seen = len(remote.audit_events())
    edit(remote_admin, cm_path(s.ns, "a"), {"data": {"k": "by hand"}})
    wait_for(
        lambda: data(remote_admin, s.ns, "a") == {"k": "v"}, timeout=WAIT, what="the remote edit corrected"
    )
    remote_admin.request("DELETE", cm_path(s.ns, "b"))
    wait_for(
        lambda: data(remote_admin, s.ns, "b") == {"k": "v"}, timeout=WAIT, what="the remote delete corrected"
    )
    time.sleep(1)
    audit = remote.audit_events()[seen:]
    assert patched(audit, user=tenant.username, resource="configmaps", name="a")
    assert patched(audit, user=tenant.username, resource="configmaps", name="b")
    assert s.configmap("a") is None, "nothing lands on this cluster"

    # The remote goes away and comes back: the watch resumes and catches up with an edit made at once,
    # before it reconnected.
    remote.stop_apiserver()
    time.sleep(5)  # the watch fails and backs off
    remote.start_apiserver()
    edit(remote_admin, cm_path(s.ns, "a"), {"data": {"k": "while away"}})
    wait_for(
        lambda: data(remote_admin, s.ns, "a") == {"k": "v"},
        timeout=2 * WAIT,
        what="the edit corrected after the remote came back",
    )
    assert s.get("prod")["status"].get("lastHandledReconcileAt") is None, "nobody asked for a reconcile"


def test_a_rotated_kubeconfig_secret_starts_the_move_without_an_edit_of_the_stageset(
    controller: ControllerProcess,
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    remote: envtest.ControlPlane,
    remote_admin: KubeClient,
    control_plane: envtest.ControlPlane,
) -> None:
    tenant = make_tenant("drift-rotate")
    s = remote_scenario(installed, git_server, tenant, remote_admin, remote)
    tenant.bind_cluster_role("edit", name="local-edit")
    s.stageset(
        "mover",
        [{"name": "app", "path": "./app"}],
        interval="10m",
        kubeConfig={"secretRef": {"name": "prod"}},
    )
    ready = s.wait_ready("mover")
    generation = ready["metadata"]["generation"]
    assert data(remote_admin, s.ns, "a") == {"k": "v"}
    assert s.configmap("a") is None
    # The platform rotates the Secret to another cluster (this one, reached as a remote would be).
    installed.request(
        "PATCH",
        f"/api/v1/namespaces/{s.ns}/secrets/prod",
        content_type="application/merge-patch+json",
        body={"data": {"value": __import__("base64").b64encode(inline_kubeconfig(control_plane)).decode()}},
    )
    wait_for(
        lambda: s.configmap("a") is not None, timeout=WAIT, what="the objects applied on the new cluster"
    )
    wait_for(
        lambda: data(remote_admin, s.ns, "a") is None, timeout=2 * WAIT, what="the old cluster cleaned up"
    )
    assert s.get("mover")["metadata"]["generation"] == generation, "the StageSet was not edited"
