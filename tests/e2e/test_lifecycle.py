"""Immutable fields, readiness outcomes and forced teardown, through the controller process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, get_or_none, wait_for
from tests.e2e.stagesets import cm, deployment, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--max-teardown-wait", "3s"]


def job(image: str) -> str:
    return f"""\
apiVersion: batch/v1
kind: Job
metadata: {{name: migrate}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: migrate, image: "{image}"}}]
"""


def test_an_immutable_change_fails_by_default_and_force_recreates(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("job"), {"db/job.yaml": job("migrate:1")})
    stage = {"name": "db", "path": "./db", "readyChecks": {"wait": False}}
    s.stageset("job", [stage])
    s.wait_ready("job")
    path = f"/apis/batch/v1/namespaces/{s.ns}/jobs/migrate"
    uid = installed.get(path)["metadata"]["uid"]

    s.commit({"db/job.yaml": job("migrate:2")})
    failed = s.wait_reason("job", "StageFailed")
    assert "immutable" in failed["message"]
    assert "force: true" in failed["message"]
    assert installed.get(path)["metadata"]["uid"] == uid

    s.stageset("job", [{**stage, "force": True}])
    s.wait_ready("job")
    recreated = installed.get(path)
    assert recreated["metadata"]["uid"] != uid
    assert recreated["spec"]["template"]["spec"]["containers"][0]["image"] == "migrate:2"


def test_a_deployment_that_never_becomes_ready_holds_and_a_failed_rollout_fails(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("rollout"), {
        "app/web.yaml": deployment("web"), "next/cm.yaml": cm("after-web")})
    s.stageset("rollout", [{"name": "app", "path": "./app", "timeout": "2s"},
                           {"name": "next", "path": "./next"}])
    held = s.wait_reason("rollout", "StageProgressing")
    assert "Deployment" in held["message"]
    stages = {st["name"]: st["phase"] for st in s.get("rollout")["status"]["stages"]}
    assert stages == {"app": "Progressing", "next": "Pending"}
    assert get_or_none(installed, f"/apis/apps/v1/namespaces/{s.ns}/deployments/web") is not None
    assert s.configmap("after-web") is None

    # The deployment controller gives up on the rollout: terminal.
    installed.request(
        "PATCH", f"/apis/apps/v1/namespaces/{s.ns}/deployments/web/status",
        content_type="application/merge-patch+json",
        body={"status": {"observedGeneration": 1, "replicas": 1, "unavailableReplicas": 1, "conditions": [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet web-1 has timed out progressing"}]}})
    failed = s.wait_reason("rollout", "StageFailed")
    assert "rollout failed" in failed["message"]
    assert s.configmap("after-web") is None


def test_a_teardown_that_cannot_finish_is_forced_after_the_maximum_wait(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("forced"), {
        "app/stuck.yaml": cm("stuck", finalizers=["example.com/never"])})
    s.stageset("forced", [{"name": "app", "path": "./app"}])
    s.wait_ready("forced")
    installed.request("DELETE", s.path("forced"))
    wait_for(lambda: get_or_none(installed, s.path("forced")) is None, timeout=60,
             what="the StageSet released after --max-teardown-wait")
    # The event is recorded after the finalizer is removed: it may trail the StageSet's going.
    events = f"/api/v1/namespaces/{s.ns}/events"
    forced = wait_for(lambda: [e for e in installed.get(events)["items"] if e["reason"] == "TeardownForced"],
                      timeout=30, what="the TeardownForced event")
    assert forced[0]["type"] == "Warning"
    assert "stuck" not in forced[0]["message"] or "object" in forced[0]["message"]
