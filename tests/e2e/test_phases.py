"""Stage phases tell the truth while a stage waits: ``Waiting``, naming what it waits for, and no
status write while nothing changes (through the controller process, on the real apiserver)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import condition, wait_for, writes_by
from tests.e2e.stagesets import Scenario, cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"

WEB = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: app, image: registry.invalid/web:1}]
"""


def stage(s: Scenario, name: str) -> dict[str, Any]:
    stages = (s.get("shop").get("status") or {}).get("stages", [])
    return next((st for st in stages if st["name"] == name), {})


def report(s: Scenario, **status: int) -> None:
    """Report the Deployment's rollout as the deployment controller and kubelet would."""
    s.admin.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{s.ns}/deployments/web/status",
        content_type="application/merge-patch+json",
        body={"status": {"observedGeneration": 1, "replicas": 3, **status}},
    )


def test_a_waiting_stage_reads_waiting_with_what_it_waits_for_and_costs_no_writes_while_nothing_changes(
    controller: ControllerProcess,
    installed: KubeClient,
    control_plane: ControlPlane,
    git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("phases")
    s = scenario(installed, git_server, tenant, {"config/cm.yaml": cm("c"), "web/d.yaml": WEB})
    # Two independent stages: config finishes (and the pass publishes progress) while web waits.
    s.stageset(
        "shop",
        [
            {"name": "config", "path": "./config", "dependsOn": []},
            {"name": "web", "path": "./web", "dependsOn": []},
        ],
        timeout="10m",
    )
    first = wait_for(
        lambda: (st := stage(s, "web")).get("phase") == "Waiting" and st, what="stage web Waiting"
    )
    assert first["message"] == f"Deployment {s.ns}/web: 0/3 replicas updated"
    assert first["waitingSince"]
    # The first pass concludes: Ready=Unknown says what the StageSet waits for.
    concluded = wait_for(
        lambda: (c := condition(s.get("shop"))) and c["message"].startswith("waiting for readiness") and c,
        what="the first pass concluded",
    )
    assert concluded["status"] == "Unknown"
    assert concluded["message"] == f"waiting for readiness: stage 'web': {first['message']}; " \
        "runbook: https://stageset.github.io/stageset/runbooks/progressing/"

    # Sampled for 9 s while the stage waits, woken only by its watch: always Waiting.
    start = len(control_plane.audit_events())
    phases = []
    deadline = time.monotonic() + 9
    while time.monotonic() < deadline:
        phases.append(stage(s, "web").get("phase"))
        time.sleep(0.1)
    assert set(phases) == {"Waiting"}, f"phases seen while waiting: {sorted(set(phases))}"
    events = control_plane.audit_events()
    window = events[start:]
    deployment = f"/apis/apps/v1/namespaces/{s.ns}/deployments/web"
    # Evidence for what follows: the stage watches its Deployment, as the tenant, in its namespace,
    # by its owner labels...
    watches = [
        e
        for e in events
        if e.get("verb") == "watch"
        and (e.get("impersonatedUser") or {}).get("username") == tenant.username
        and e.get("requestURI", "").startswith(f"/apis/apps/v1/namespaces/{s.ns}/deployments?")
        and "labelSelector=stages.metio.wtf" in e.get("requestURI", "")
    ]
    assert watches, "the waiting stage watches its Deployment"
    # ...and reads nothing while nothing changes (it used to poll every half second).
    reads = [
        e
        for e in window
        if e.get("verb") == "get"
        and e.get("requestURI") == deployment
        and (e.get("impersonatedUser") or {}).get("username") == tenant.username
    ]
    assert reads == [], "a watched stage is not polled"
    status_writes = [e for e in writes_by(window, CONTROLLER) if "/stagesets/shop" in e["requestURI"]]
    assert [(e["requestURI"], e["stageTimestamp"]) for e in status_writes] == [], (
        "nothing changed, yet the status was written"
    )
    assert stage(s, "config")["phase"] == "Ready"

    # Progress shows within a few seconds: the message follows the rollout.
    report(s, updatedReplicas=3, readyReplicas=1, availableReplicas=1)
    moved = wait_for(
        lambda: (st := stage(s, "web")).get("message", "").endswith("1/3 replicas ready") and st,
        timeout=15,
        what="the message to follow the rollout",
    )
    assert moved["phase"] == "Waiting"
    assert moved["waitingSince"] == first["waitingSince"], "the wait goes on: its start is kept"
    report(s, updatedReplicas=3, readyReplicas=3, availableReplicas=3)
    ready = s.wait_ready("shop")
    assert [st["phase"] for st in ready["status"]["stages"]] == ["Ready", "Ready"]
    assert "message" not in stage(s, "web")
