"""A stage's actions end to end: the controller as a process with the chart's RBAC, the real apiserver,
a Git server and an HTTP endpoint on loopback.

There is no kube-controller-manager: the test writes a Job's status as the job controller would.
Each test runs its own controller, sharded to its namespace (``--watch-namespaces``), so the
restart and the guard's controller (without ``--allow-insecure-sources``) act on nothing else.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.actionserver import ActionServer
from tests.cli.conftest import run_cli
from tests.conftest import Tenant
from tests.e2e.conftest import (
    GITREPOS,
    condition,
    controller_kubeconfig,
    stop_controller,
    wait_for,
    writes_by,
)
from tests.e2e.stagesets import Scenario, cm, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"
TOKEN = "e2e-smoke-token-4d1f"

MIGRATION = """\
apiVersion: batch/v1
kind: Job
metadata: {name: migrate-schema}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: registry.invalid/migrate:1, args: [up]}]
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ActionServer]:
    with ActionServer() as running:
        yield running


class Controllers:
    """Controllers this module starts, each sharded to one namespace; stopped at the end."""

    def __init__(self, admin: KubeClient, plane: ControlPlane, workdir: Path):
        self._kubeconfig = controller_kubeconfig(admin, control_plane=plane, path=workdir / "kubeconfig")
        self._workdir = workdir
        self._running: list[ControllerProcess] = []

    def start(self, namespace: str, *flags: str, insecure: bool = True) -> ControllerProcess:
        handle = ControllerProcess(
            kubeconfig=self._kubeconfig,
            workdir=self._workdir / f"c{len(self._running)}",
            insecure=insecure,
            extra=["--watch-namespaces", namespace, *flags],
        )
        self._running.append(handle)
        return handle

    def stop(self, handle: ControllerProcess) -> None:
        stop_controller(handle)
        self._running.remove(handle)

    def close(self) -> None:
        for handle in list(self._running):
            self.stop(handle)


@pytest.fixture(scope="module")
def controllers(
    installed: KubeClient, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controllers]:
    started = Controllers(installed, control_plane, tmp_path_factory.mktemp("actions"))
    try:
        yield started
    finally:
        started.close()


def secret(admin: KubeClient, namespace: str, name: str, **values: str) -> None:
    admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": values},
    )


def jobs(s: Scenario) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = s.admin.get(f"/apis/batch/v1/namespaces/{s.ns}/jobs").get("items") or []
    return items


def complete(s: Scenario, name: str) -> None:
    """What the job controller writes when the pod succeeded."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = {
        "status": "True",
        "reason": "CompletionsReached",
        "message": "Reached expected number of succeeded pods",
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }
    s.admin.request(
        "PATCH",
        f"/apis/batch/v1/namespaces/{s.ns}/jobs/{name}/status",
        content_type="application/merge-patch+json",
        body={
            "status": {
                "startTime": now,
                "completionTime": now,
                "succeeded": 1,
                "active": 0,
                "ready": 0,
                "terminating": 0,
                "uncountedTerminatedPods": {},
                "conditions": [{"type": "SuccessCriteriaMet", **done}, {"type": "Complete", **done}],
            }
        },
    )


def stage_status(s: Scenario, name: str = "app", stageset: str = "shop") -> dict[str, Any]:
    stages = (s.get(stageset).get("status") or {}).get("stages") or []
    return next((st for st in stages if st["name"] == name), {})


def job_writes(control_plane: ControlPlane, s: Scenario, user: str) -> list[str]:
    return [
        e["verb"]
        for e in writes_by(control_plane.audit_events(), user)
        if e["requestURI"].startswith(f"/apis/batch/v1/namespaces/{s.ns}/jobs")
    ]


def test_a_pre_migration_job_and_a_post_smoke_test_gate_a_real_stage_once_per_revision(
    installed: KubeClient,
    control_plane: ControlPlane,
    git_server: GitServer,
    make_tenant: TenantFactory,
    controllers: Controllers,
    server: ActionServer,
) -> None:
    s = scenario(
        installed,
        git_server,
        make_tenant("actions"),
        {"app/cm.yaml": cm("app"), "after/cm.yaml": cm("after"), "migrations/job.yaml": MIGRATION},
    )
    secret(installed, s.ns, "smoke", Authorization=f"Bearer {TOKEN}")
    smoke = server.answer(f"/{s.ns}/smoke", 503, body=b"warming up")
    controller = controllers.start(s.ns, "--allowed-action-hosts=127.0.0.1")
    s.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {
                    "pre": [
                        {"name": "migrate", "job": {"sourceRef": {"name": "app"}, "path": "./migrations"}}
                    ],
                    "post": [
                        {
                            "name": "smoke",
                            "retries": 20,
                            "http": {
                                "url": smoke,
                                "method": "GET",
                                "expectedStatus": [200],
                                "headersFrom": [{"name": "smoke", "key": "Authorization"}],
                            },
                        }
                    ],
                },
            },
            {"name": "after", "path": "./after"},
        ],
    )

    # The migration runs first, as the tenant; nothing is applied until it has completed.
    (job,) = wait_for(lambda: jobs(s), what="the migration Job")
    assert job["metadata"]["name"].startswith("migrate-schema-")
    waiting = wait_for(
        lambda: "pre action 'migrate'" in (st := stage_status(s)).get("message", "") and st,
        what="the stage held by its pre action",
    )
    assert waiting["phase"] == "Waiting"
    assert s.configmap("app") is None
    assert s.configmap("after") is None
    complete(s, job["metadata"]["name"])

    # Applied; the smoke test holds it (and its dependent) until the endpoint answers 200.
    wait_for(lambda: s.configmap("app"), what="the stage applied after its migration")
    wait_for(
        lambda: (
            "post action 'smoke'" in stage_status(s).get("message", "") and server.received(f"/{s.ns}/smoke")
        ),
        what="the smoke test failing",
    )
    assert stage_status(s)["phase"] == "Waiting"
    assert s.configmap("after") is None
    server.answer(f"/{s.ns}/smoke", 200)
    first = s.wait_ready("shop")
    assert s.configmap("after") is not None
    ledger = stage_status(s)["actions"]
    assert ledger["executed"] == ["migrate", "smoke"]
    calls = len(server.received(f"/{s.ns}/smoke"))
    assert {r.headers["Authorization"] for r in server.received(f"/{s.ns}/smoke")} == {f"Bearer {TOKEN}"}
    # The Job was created as the tenant, never as the controller; the token is nowhere to be read.
    assert job_writes(control_plane, s, s.tenant.username) == ["create"]
    assert job_writes(control_plane, s, CONTROLLER) == []
    events = installed.get(f"/apis/events.k8s.io/v1/namespaces/{s.ns}/events")
    assert TOKEN not in json.dumps([first["status"], events]) + controller.output()
    assert "post action 'smoke': GET http://127.0.0.1" in json.dumps(events)

    # `stageset diff` says both would be skipped: they ran for this revision.
    diffed = run_cli("diff", "shop", "-n", s.ns, kubeconfig=control_plane.kubeconfig)
    assert diffed.exit_code == 0, diffed.stderr
    assert f"pre action migrate (job): skipped, ran for {ledger['revision']}" in diffed.stderr
    assert f"post action smoke (http): skipped, ran for {ledger['revision']}" in diffed.stderr

    # A restart and a requested reconcile run nothing again at the same revision.
    controllers.stop(controller)
    controller = controllers.start(s.ns, "--allowed-action-hosts=127.0.0.1")
    stamp = poke(installed, s.path("shop"))
    wait_for(
        lambda: (
            (obj := s.get("shop"))["status"].get("lastHandledReconcileAt") == stamp
            and condition(obj)["status"] == "True"
        ),
        what="the reconcile after the restart",
    )
    assert job_writes(control_plane, s, s.tenant.username) == ["create"]
    assert len(server.received(f"/{s.ns}/smoke")) == calls

    # A new revision runs both again: a new Job (the last one deleted), a new smoke test.
    sha = s.commit({"app/cm.yaml": cm("app", "v2")})
    second = wait_for(
        lambda: [j for j in jobs(s) if j["metadata"]["uid"] != job["metadata"]["uid"]],
        what="the next revision's Job",
    )[0]
    complete(s, second["metadata"]["name"])
    s.wait_ready("shop", revision=sha)
    assert stage_status(s)["actions"]["revision"].endswith(sha)
    assert len(server.received(f"/{s.ns}/smoke")) == calls + 1
    assert job_writes(control_plane, s, s.tenant.username) == ["create", "delete", "create"]
    controller.check_alive()


def test_a_redirect_to_a_host_not_allowed_is_never_followed(
    installed: KubeClient,
    git_server: GitServer,
    make_tenant: TenantFactory,
    controllers: Controllers,
    server: ActionServer,
) -> None:
    s = scenario(installed, git_server, make_tenant("actions-redirect"), {"app/cm.yaml": cm("app")})
    elsewhere = f"http://localhost:{server.port}/{s.ns}/elsewhere"
    server.answer(f"/{s.ns}/elsewhere")
    hook = server.answer(f"/{s.ns}/hook", 302, redirect=elsewhere)
    controllers.start(s.ns, "--allowed-action-hosts=127.0.0.1")
    s.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {"pre": [{"name": "approve", "retries": 3, "http": {"url": hook}}]},
            }
        ],
    )
    ready = s.wait_reason("shop", "ActionFailed")
    assert (
        "host localhost is not allowed for actions (the controller's --allowed-action-hosts lists "
        "127.0.0.1)" in ready["message"]
    )
    assert server.received(f"/{s.ns}/hook")  # asked (once per reconcile that reached it), never followed
    assert server.received(f"/{s.ns}/elsewhere") == []
    assert s.configmap("app") is None


GUARDED = [  # (url, what the refusal says), each a stage of its own
    ("http://127.0.0.1:{port}/{ns}/loopback", "loopback addresses are not allowed for actions"),
    ("http://localhost:{port}/{ns}/name", "loopback addresses are not allowed for actions"),
    ("http://[::ffff:127.0.0.1]:{port}/{ns}/mapped", "loopback (as 127.0.0.1 inside an IPv6 address)"),
    ("http://169.254.169.254/latest/meta-data/iam/", "the cloud metadata service addresses are not allowed"),
    ("http://hooks.example.com/{ns}/elsewhere", "host hooks.example.com is not allowed for actions"),
]


def test_the_address_guard_refuses_loopback_and_metadata_even_for_allowed_hosts(
    installed: KubeClient,
    make_tenant: TenantFactory,
    controllers: Controllers,
    server: ActionServer,
) -> None:
    """A controller without --allow-insecure-sources: every refused address is refused at connect
    time though --allowed-action-hosts lists it, and the endpoint never hears a thing.  (Its Git
    server speaks HTTPS, with its CA in the GitRepository's secretRef: plain http is off too.)"""
    with GitServer(tls=True) as git:
        assert git.ca_pem is not None
        files = {f"s{i}/cm.yaml": cm(f"c{i}") for i in range(len(GUARDED))}
        s = scenario(installed, git, make_tenant("actions-guard"), files)
        secret(installed, s.ns, "git-ca", caFile=git.ca_pem.decode())
        installed.request(
            "PATCH",
            f"{GITREPOS.format(ns=s.ns)}/app",
            content_type="application/merge-patch+json",
            body={"spec": {"secretRef": {"name": "git-ca"}, "serviceAccountName": s.tenant.service_account}},
        )
        _guarded(installed, s, controllers, server)


def _guarded(installed: KubeClient, s: Scenario, controllers: Controllers, server: ActionServer) -> None:
    handle = controllers.start(
        s.ns, "--allowed-action-hosts=127.0.0.1,localhost,::ffff:127.0.0.1,169.254.169.254", insecure=False
    )
    s.stageset(
        "shop",
        [
            {
                "name": f"s{i}",
                "path": f"./s{i}",
                "dependsOn": [],
                "actions": {
                    "pre": [
                        {"name": "call", "retries": 2, "http": {"url": url.format(port=server.port, ns=s.ns)}}
                    ]
                },
            }
            for i, (url, _) in enumerate(GUARDED)
        ],
    )
    def refused() -> list[dict[str, Any]] | None:
        # One read of the status for every stage and the Ready condition: a retry pass may start (and
        # clear a message, or say Progressing) between two reads.
        shop = s.get("shop")
        stages = {st["name"]: st for st in (shop.get("status") or {}).get("stages") or []}
        found = [stages.get(f"s{i}", {}) for i in range(len(GUARDED))]
        ready = condition(shop) or {}
        return found if ready.get("reason") == "ActionFailed" and all(
            st.get("phase") == "Failed" and st.get("message") for st in found) else None

    failed = wait_for(refused, what="every stage refused")
    for i, (_, says) in enumerate(GUARDED):
        message = failed[i]["message"]
        assert "pre action 'call' failed" in message
        assert says in message, message
        if "host hooks" not in message:
            assert "--allow-insecure-sources" in message
    assert [r for r in server.requests if r.path.startswith(f"/{s.ns}/")] == []
    assert [i for i in range(len(GUARDED)) if s.configmap(f"c{i}") is not None] == []
    handle.check_alive()
