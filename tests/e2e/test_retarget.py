"""Re-targeting is make-before-break (issue 32 items 1-3), on two real control planes.

The StageSet moves between this cluster and a remote one (``spec.kubeConfig`` set and removed); the
audit logs of both apiservers are the evidence of what was deleted where, and as whom.  The tests
run their own controller (sharded to the test's namespace, ``--watch-namespaces``) so one can be
restarted mid-move, with a short ``--max-teardown-wait``.  The last test stops the remote plane.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.envtest import install
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import (
    controller_kubeconfig,
    get_or_none,
    start_controller,
    stop_controller,
    wait_for,
)
from tests.e2e.remotes import inline_kubeconfig, kubeconfig_secret
from tests.e2e.stagesets import Scenario, cm, deployment, scenario
from tests.e2e.test_platform_targets import put_secret, put_target
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

WAIT = 20.0
LABEL = "stages.metio.wtf/name"
TARGETS = "retarget-targets"
"""The platform's target namespace of this module's StageTargets."""


class Controllers:
    """This module's controllers: each sharded to one namespace, stopped at the end."""

    def __init__(self, admin: KubeClient, plane: ControlPlane, workdir: Path):
        self._kubeconfig = controller_kubeconfig(admin, control_plane=plane, path=workdir / "kubeconfig")
        self._admin, self._plane = admin, plane
        self._workdir = workdir
        self._running: list[ControllerProcess] = []
        self._started = 0

    def start(self, namespace: str, *, targets: bool = False) -> ControllerProcess:
        """A controller for ``namespace``; with ``targets``, honouring the StageTargets of
        :data:`TARGETS` (and granted a Role there, as the chart's ``targets.namespaces``)."""
        self._started += 1
        workdir = self._workdir / f"c{self._started}"
        workdir.mkdir()
        flags = ["--watch-namespaces", namespace, "--max-teardown-wait", f"{WAIT:.0f}s"]
        kubeconfig = self._kubeconfig
        if targets:
            plane = self._plane
            kubeconfig = install.controller_kubeconfig(self._admin, url=plane.url, ca=plane.pki.ca_cert,
                                                       path=workdir / "kubeconfig",
                                                       target_namespaces=[TARGETS])
            flags += ["--target-namespaces", TARGETS]
        handle = start_controller(kubeconfig=kubeconfig, workdir=workdir, extra=flags)
        self._running.append(handle)
        return handle

    def stop(self, handle: ControllerProcess) -> None:
        stop_controller(handle)
        self._running.remove(handle)

    def stop_all(self) -> None:
        for handle in list(self._running):
            self.stop(handle)


@pytest.fixture(scope="module")
def controllers(installed: KubeClient, control_plane: ControlPlane,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controllers]:
    running = Controllers(installed, control_plane, tmp_path_factory.mktemp("retarget"))
    try:
        yield running
    finally:
        running.stop_all()


PRE = [{"name": "migrate", "apply": {"sourceRef": {"name": "app"}, "path": "./pre"}}]


def stages(*, app_actions: bool = False) -> list[dict[str, Any]]:
    app: dict[str, Any] = {"name": "app", "path": "./app", "dependsOn": ["db"]}
    if app_actions:
        app["actions"] = {"pre": PRE}
    return [{"name": "db", "path": "./db"}, app]


def tenant_there(s: Scenario, remote_admin: KubeClient, remote: ControlPlane) -> None:
    """The same tenant on the remote cluster (edit in its namespace), and the kubeconfig Secret here."""
    install.create_tenant(remote_admin, namespace=s.ns, service_account=s.tenant.service_account)
    aggregate_cluster_roles(remote_admin)
    kubeconfig_secret(s.admin, s.ns, "prod", inline_kubeconfig(remote))


def on(admin: KubeClient, s: Scenario, kind: str, name: str) -> dict[str, Any] | None:
    path = f"/api/v1/namespaces/{s.ns}/configmaps/{name}" if kind == "cm" else \
        f"/apis/apps/v1/namespaces/{s.ns}/deployments/{name}"
    return get_or_none(admin, path)


def moved(s: Scenario, name: str, *, remote: bool) -> dict[str, Any]:
    """The StageSet Ready with every stage on the wanted cluster, and the move over."""
    def check() -> dict[str, Any] | None:
        obj = s.get(name)
        status = obj.get("status") or {}
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), None)
        if not ready or ready["status"] != "True" or status.get("previousTargets"):
            return None
        inventory = status.get("inventory") or []
        if not inventory or any(("target" in inv) is not remote for inv in inventory):
            return None
        return obj
    found: dict[str, Any] = wait_for(check, timeout=120, what=f"StageSet {name} moved, the move over")
    return found


def events(s: Scenario, reason: str) -> list[str]:
    items = s.admin.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
    return [str(e.get("message") or e.get("note")) for e in items if e.get("reason") == reason]


def deletes(plane: ControlPlane, since: int, user: str) -> list[str]:
    """Real DELETEs made as ``user`` after the first ``since`` audit events, as object paths."""
    def acting(event: dict[str, Any]) -> str:
        return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))
    found = [e for e in plane.audit_events()[since:] if e.get("verb") == "delete"
             and e.get("stage") == "ResponseComplete" and acting(e) == user]
    return [f"{e['objectRef']['resource']}/{e['objectRef']['name']}" for e in found]


def settle_audit() -> None:
    time.sleep(1)  # let the audit logs catch up with the last requests


FILES = {"db/d.yaml": cm("d"), "app/a.yaml": cm("a"), "pre/marker.yaml": cm("migrated")}


def test_a_move_to_another_cluster_and_back_is_make_before_break(
    controllers: Controllers, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    s = scenario(installed, git_server, make_tenant("move"), FILES)
    tenant_there(s, remote_admin, remote)
    controllers.start(s.ns)
    s.stageset("shop", stages(app_actions=True))
    moved(s, "shop", remote=False)
    assert on(installed, s, "cm", "migrated") is not None, "the pre action ran here"
    local_seen, remote_seen = len(control_plane.audit_events()), len(remote.audit_events())

    # This cluster -> the remote one: a value change.
    s.stageset("shop", stages(app_actions=True), kubeConfig={"secretRef": {"name": "prod"}})
    obj = moved(s, "shop", remote=True)
    for name in ("a", "d", "migrated"):
        assert on(remote_admin, s, "cm", name) is not None, f"{name} on the new cluster"
    assert on(remote_admin, s, "cm", "a")["metadata"]["labels"][LABEL] == "shop"  # type: ignore[index]
    assert on(installed, s, "cm", "a") is None, "no labelled copy is left on the old cluster"
    assert on(installed, s, "cm", "d") is None
    settle_audit()
    assert deletes(remote, remote_seen, s.tenant.username) == [], "nothing deleted on the new cluster"
    # Deleted on the old cluster as the identity that applied them, dependents first.
    assert deletes(control_plane, local_seen, s.tenant.username) == ["configmaps/a", "configmaps/d"]
    ledger = next(st["actions"] for st in obj["status"]["stages"] if st["name"] == "app")
    assert ledger["target"].startswith(remote.url), "the ledger says where the actions ran"
    # The action's object is outside the inventory (never pruned): the stages' two objects moved.
    assert events(s, "Retargeted") == [f"moved from this cluster to {remote.url}: 2 object(s) applied and "
                                       "ready there; on this cluster: 2 deleted, 0 released (prune: false)"]
    assert events(s, "DriftCorrected") == [], "what a move creates is not drift"
    record = obj["metadata"]["annotations"]["stages.metio.wtf/inventory-record"]
    assert "client-key" not in record, "never a credential"
    assert "BEGIN" not in record, "never a credential"

    # The pre action ran once on the new cluster: gone, it is not run again by a later pass.
    remote_admin.request("DELETE", f"/api/v1/namespaces/{s.ns}/configmaps/migrated")
    s.stageset("shop", stages(app_actions=True), kubeConfig={"secretRef": {"name": "prod"}},
               interval="5s")
    s.wait_ready("shop")
    time.sleep(6)
    assert on(remote_admin, s, "cm", "migrated") is None

    # And back: the remote cluster -> this one.
    local_seen, remote_seen = len(control_plane.audit_events()), len(remote.audit_events())
    s.stageset("shop", stages(app_actions=True))
    moved(s, "shop", remote=False)
    assert on(installed, s, "cm", "a") is not None
    assert on(remote_admin, s, "cm", "a") is None
    assert on(remote_admin, s, "cm", "d") is None
    settle_audit()
    assert deletes(control_plane, local_seen, s.tenant.username) == []
    assert deletes(remote, remote_seen, s.tenant.username) == ["configmaps/a", "configmaps/d"]


def test_a_restart_and_a_lost_status_mid_move_still_clean_the_old_cluster(
    controllers: Controllers, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    files = {"db/d.yaml": cm("d"), "app/web.yaml": deployment("web")}
    s = scenario(installed, git_server, make_tenant("midmove"), files)
    tenant_there(s, remote_admin, remote)
    first = controllers.start(s.ns)
    s.stageset("shop", stages())
    roll_out(installed, s)
    moved(s, "shop", remote=False)

    # Move; the Deployment there never rolls out (no controller-manager): the move stays in flight.
    s.stageset("shop", stages(), kubeConfig={"secretRef": {"name": "prod"}})
    wait_for(lambda: (s.get("shop").get("status") or {}).get("previousTargets"), what="a move in flight")
    wait_for(lambda: on(remote_admin, s, "deploy", "web"), what="web applied on the new cluster")
    assert on(installed, s, "cm", "d") is not None, "nothing deleted before every stage is Ready there"
    controllers.stop(first)

    # Status lost (a restore without it) and a new controller process: the record names the old cluster.
    installed.request("PATCH", f"{s.path('shop')}/status", content_type="application/merge-patch+json",
                      body={"status": None})
    assert not (s.get("shop").get("status") or {}).get("previousTargets")
    local_seen, remote_seen = len(control_plane.audit_events()), len(remote.audit_events())
    second = controllers.start(s.ns)
    roll_out(remote_admin, s)
    moved(s, "shop", remote=True)
    controllers.stop(second)  # its log is the test's
    assert on(installed, s, "cm", "d") is None
    assert on(installed, s, "deploy", "web") is None
    assert on(remote_admin, s, "deploy", "web") is not None
    settle_audit()
    assert deletes(remote, remote_seen, s.tenant.username) == []
    assert deletes(control_plane, local_seen, s.tenant.username) == ["deployments/web", "configmaps/d"], \
        "dependents first"


def test_a_lost_status_mid_move_still_cleans_the_stage_target_it_leaves(
    controllers: Controllers, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    """The durable record names the platform StageTarget a stage leaves (by reference, with the cluster
    id), so a status wiped mid-move still cleans it up, as the tenant, instead of giving it up."""
    files = {"db/d.yaml": cm("d"), "app/web.yaml": deployment("web")}
    s = scenario(installed, git_server, make_tenant("offtarget"), files)
    tenant_there(s, remote_admin, remote)
    first = controllers.start(s.ns, targets=True)
    put_secret(installed, "offtarget-kubeconfig", inline_kubeconfig(remote), namespace=TARGETS)
    put_target(installed, "offtarget", secret="offtarget-kubeconfig", allowed=[s.ns], namespace=TARGETS)
    s.stageset("shop", stages(), targetRef={"name": "offtarget", "namespace": TARGETS})
    roll_out(remote_admin, s)
    moved(s, "shop", remote=True)

    # Move here; web never rolls out here (no controller-manager): the move stays in flight.
    s.stageset("shop", stages())
    wait_for(lambda: (s.get("shop").get("status") or {}).get("previousTargets"), what="a move in flight")
    wait_for(lambda: on(installed, s, "deploy", "web"), what="web applied here")
    assert on(remote_admin, s, "cm", "d") is not None, "nothing deleted before every stage is Ready here"
    controllers.stop(first)
    record = s.get("shop")["metadata"]["annotations"]["stages.metio.wtf/inventory-record"]
    assert f'"st":["{TARGETS}","offtarget"]' in record, record
    assert "BEGIN" not in record, "references only, never a credential"
    assert "client-key" not in record

    # Status lost (wiped as the admin): only the record names the StageTarget the stages leave.
    installed.request("PATCH", f"{s.path('shop')}/status", content_type="application/merge-patch+json",
                      body={"status": None})
    assert not (s.get("shop").get("status") or {}).get("previousTargets")
    remote_seen = len(remote.audit_events())
    second = controllers.start(s.ns, targets=True)
    roll_out(installed, s)
    moved(s, "shop", remote=False)
    controllers.stop(second)  # its log is the test's
    assert on(remote_admin, s, "cm", "d") is None
    assert on(remote_admin, s, "deploy", "web") is None
    assert on(installed, s, "deploy", "web") is not None
    settle_audit()
    assert deletes(remote, remote_seen, s.tenant.username) == ["deployments/web", "configmaps/d"], \
        "the old copies deleted on the StageTarget's cluster, as the tenant, dependents first"
    assert events(s, "RetargetAbandoned") == []


def test_an_object_is_claimed_per_cluster_a_holder_on_another_is_no_conflict(
    controllers: Controllers, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    """Ownership is per cluster: a StageSet holding ``a`` on the remote cluster does not hold a copy of
    ``a`` here that carries its labels (left behind by a move given up, or copied), while a second
    StageSet writing ``a`` on that same remote cluster conflicts with it."""
    s = scenario(installed, git_server, make_tenant("claims"), {"app/a.yaml": cm("a")})
    tenant_there(s, remote_admin, remote)
    controllers.start(s.ns)
    app = [{"name": "app", "path": "./app"}]
    s.stageset("there", app, kubeConfig={"secretRef": {"name": "prod"}})
    moved(s, "there", remote=True)
    held = on(remote_admin, s, "cm", "a")
    assert held is not None
    owner_labels = {k: v for k, v in held["metadata"]["labels"].items() if k.startswith("stages.metio.wtf/")}
    assert owner_labels[LABEL] == "there"
    installed.apply(f"/api/v1/namespaces/{s.ns}/configmaps/a",
                    {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "a", "namespace": s.ns, "labels": owner_labels},
                     "data": {"k": "left"}},
                    field_manager="left-behind")
    uid = installed.get(f"/api/v1/namespaces/{s.ns}/configmaps/a")["metadata"]["uid"]

    # Here: "there" lists a only on the remote cluster, so "here" adopts the copy in place.
    s.stageset("here", app)
    moved(s, "here", remote=False)
    adopted = installed.get(f"/api/v1/namespaces/{s.ns}/configmaps/a")
    assert adopted["metadata"]["labels"][LABEL] == "here"
    assert adopted["metadata"]["uid"] == uid, "adopted in place, never re-created"

    # On the same remote cluster: a conflict, and nothing of it written there.
    s.stageset("also-there", app, kubeConfig={"secretRef": {"name": "prod"}})
    conflict = s.wait_reason("also-there", "OwnershipConflict", timeout=120)
    assert f"StageSet {s.ns}/there" in conflict["message"]
    remote_copy = on(remote_admin, s, "cm", "a")
    assert remote_copy is not None
    assert remote_copy["metadata"]["labels"][LABEL] == "there"


ROLLED_OUT = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
              "availableReplicas": 1}


def roll_out(admin: KubeClient, s: Scenario) -> None:
    """Report web rolled out, as the deployment controller and kubelet would."""
    wait_for(lambda: on(admin, s, "deploy", "web"), what="web")
    admin.request("PATCH", f"/apis/apps/v1/namespaces/{s.ns}/deployments/web/status",
                  content_type="application/merge-patch+json", body={"status": ROLLED_OUT})


def unreachable_kubeconfig(plane: ControlPlane) -> bytes:
    """A kubeconfig naming a cluster nobody answers for (a closed port), trusted by a real CA."""
    config = yaml.safe_load(inline_kubeconfig(plane))
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    return yaml.safe_dump(config).encode()


def test_an_unreachable_new_cluster_deletes_nothing_anywhere(
    controllers: Controllers, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane,
) -> None:
    s = scenario(installed, git_server, make_tenant("nowhere"), FILES)
    kubeconfig_secret(installed, s.ns, "gone", unreachable_kubeconfig(remote))
    controllers.start(s.ns)
    s.stageset("shop", stages())
    moved(s, "shop", remote=False)
    seen = len(control_plane.audit_events())
    s.stageset("shop", stages(), kubeConfig={"secretRef": {"name": "gone"}})
    ready = s.wait_reason("shop", "ClusterUnreachable")
    assert ready["status"] == "False"
    time.sleep(3)  # a few retries with backoff
    assert on(installed, s, "cm", "a") is not None
    assert on(installed, s, "cm", "d") is not None
    settle_audit()
    assert deletes(control_plane, seen, s.tenant.username) == []
    assert events(s, "Retargeted") == []


def test_an_unreachable_old_cluster_is_given_up_after_the_wait(
    controllers: Controllers, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: ControlPlane, remote_admin: KubeClient,
) -> None:
    """Last in this module: it stops the remote control plane."""
    s = scenario(installed, git_server, make_tenant("oldgone"), FILES)
    tenant_there(s, remote_admin, remote)
    controllers.start(s.ns)
    s.stageset("shop", stages(), kubeConfig={"secretRef": {"name": "prod"}})
    moved(s, "shop", remote=True)
    remote.stop()  # the old cluster is gone: connections are refused from now on

    moving = time.monotonic()
    s.stageset("shop", stages())
    def waiting_ready() -> bool:
        status = s.get("shop")["status"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        return bool(status.get("previousTargets")) and ready["status"] == "True"
    wait_for(waiting_ready, timeout=60, what="Ready here while the old cluster's cleanup waits")
    assert on(installed, s, "cm", "a") is not None
    wait_for(lambda: events(s, "RetargetAbandoned"), timeout=WAIT + 90, what="RetargetAbandoned")
    assert time.monotonic() - moving >= WAIT - 1, "given up only after --max-teardown-wait"
    [abandoned] = events(s, "RetargetAbandoned")
    assert abandoned.startswith(f"gave up cleaning up {remote.url} after {WAIT:.0f}s: "
                                "2 object(s) left behind")
    assert f"ConfigMap in {s.ns}: 2" in abandoned
    assert "connection refused" in abandoned
    moved(s, "shop", remote=False)
    assert json.dumps(s.get("shop")).count("previousTargets") == 0
    record = s.get("shop")["metadata"]["annotations"]["stages.metio.wtf/inventory-record"]
    assert '"prev"' not in record, "given up: the record no longer names the old cluster"
