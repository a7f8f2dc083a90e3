"""A stage of thousands of objects, and an inventory that survives a controller restart."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import start_controller, stop_controller, wait_for, writes_by
from tests.e2e.stagesets import cm, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

OBJECTS = 2000


def test_thousands_of_objects_and_a_restart(
    installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: Callable[..., Tenant], tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tenant = make_tenant("scale")
    s = scenario(installed, git_server, tenant, {"big/README.md": "many ConfigMaps"})
    git_server.import_files(s.repo, ((f"big/cm-{i:05}.yaml", cm(f"cm-{i:05}").encode())
                                     for i in range(OBJECTS)))
    workdir = tmp_path_factory.mktemp("scale")
    kubeconfig = install.controller_kubeconfig(installed, url=control_plane.url,
                                               ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig")
    (workdir / "first").mkdir()
    (workdir / "second").mkdir()
    first = start_controller(kubeconfig=kubeconfig, workdir=workdir / "first")
    try:
        s.stageset("big", [{"name": "big", "path": "./big"}])
        ready = s.wait_ready("big", timeout=300)
    finally:
        stop_controller(first)
    (inventory,) = ready["status"]["inventory"]
    assert len(inventory["entries"]) == OBJECTS
    assert ready["status"]["stages"][0]["objects"] == OBJECTS

    # A new controller process (fresh mirror, fresh caches) reads the inventory back from
    # status: a requested pass finds everything in place and writes nothing.
    seen = len(control_plane.audit_events())
    second = start_controller(kubeconfig=kubeconfig, workdir=workdir / "second")
    try:
        stamp = poke(installed, s.path("big"))
        wait_for(lambda: s.get("big")["status"].get("lastHandledReconcileAt") == stamp, timeout=300,
                 what="a pass by the restarted controller")
        s.wait_ready("big", timeout=300)
    finally:
        stop_controller(second)
    time.sleep(1)  # let the audit log catch up with the last requests
    # Evidence first: an empty or missing audit log must fail, not read as "zero writes".
    assert control_plane.audit_log.exists(), "the apiserver wrote no audit log"
    later = control_plane.audit_events()[seen:]
    dry_runs = [e for e in later if e.get("verb") == "patch" and "dryRun=All" in e.get("requestURI", "")
                and (e.get("impersonatedUser") or {}).get("username") == tenant.username]
    assert len(dry_runs) >= OBJECTS, "the audit log shows the restarted controller's dry-runs"
    assert writes_by(later, tenant.username) == []
    assert len(s.get("big")["status"]["inventory"][0]["entries"]) == OBJECTS
