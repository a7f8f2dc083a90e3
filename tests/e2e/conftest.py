"""End-to-end fixtures: the controller as a real subprocess, a real Git server, a second ("remote")
control plane, waiting helpers."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, KubeClient
from tests.gitserver import GitServer

STAGESETS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets"
GITREPOS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories"


def wait_for(condition: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.2,
             what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def condition(obj: dict[str, Any], type_: str = "Ready") -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), None)


@pytest.fixture(scope="module")
def git_server() -> Iterator[GitServer]:
    with GitServer() as server:
        yield server


def controller_kubeconfig(admin: KubeClient, *, control_plane: ControlPlane, path: Path) -> Path:
    """The e2e controller runs with exactly the Helm chart's rights in a multi-tenant install,
    so a test passes only if every tenant read and write really goes through impersonation."""
    return install.controller_kubeconfig(admin, url=control_plane.url, ca=control_plane.pki.ca_cert,
                                         path=path)


def start_controller(*, kubeconfig: Path, workdir: Path, extra: list[str] | None = None) -> ControllerProcess:
    return ControllerProcess(kubeconfig=kubeconfig, workdir=workdir, extra=extra or [])


def stop_controller(handle: ControllerProcess) -> None:
    handle.stop(timeout=20)
    sys.stderr.write(f"\n--- controller log (tail) ---\n{handle.output()[-6000:]}\n")


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    """Extra controller flags; a test module overrides this fixture to change them."""
    return []


@pytest.fixture(scope="module")
def controller(installed: KubeClient, control_plane: ControlPlane, controller_args: list[str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    """``stageset controller`` as a subprocess: cluster-wide, multi-tenant, with the chart's rights."""
    workdir = tmp_path_factory.mktemp("controller")
    kubeconfig = controller_kubeconfig(installed, control_plane=control_plane,
                                       path=workdir / "kubeconfig")
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir, extra=controller_args)
    try:
        yield handle
    finally:
        stop_controller(handle)


@pytest.fixture(scope="module")
def remote() -> Iterator[ControlPlane]:
    """A second control plane, the "remote" cluster of ``spec.kubeConfig`` and StageTargets: one per
    test module that asks for it (a module may stop it: the next module starts its own).  Its
    kubeconfig as a tenant would store it: :func:`tests.e2e.remotes.inline_kubeconfig`."""
    plane = envtest.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def remote_admin(remote: ControlPlane) -> Iterator[KubeClient]:
    """The remote cluster's admin (``system:masters``), through our own client layer."""
    pool = ClientPool.from_kubeconfig(str(remote.kubeconfig))
    try:
        yield pool.client()
    finally:
        pool.close()


def apply(admin: KubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    collection = STAGESETS if obj["kind"] == "StageSet" else GITREPOS
    return admin.apply(f"{collection.format(ns=meta['namespace'])}/{meta['name']}", obj,
                       field_manager="e2e-test")


def get_or_none(admin: KubeClient, path: str) -> dict[str, Any] | None:
    try:
        return admin.get(path)
    except ApiError as error:
        if error.not_found:
            return None
        raise


def stageset(admin: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return admin.get(f"{STAGESETS.format(ns=namespace)}/{name}")


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def writes_by(events: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    """Audit events of real (not dry-run) writes made as ``user`` (directly or impersonated)."""
    def acting(event: dict[str, Any]) -> str:
        return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))
    return [e for e in events if e.get("verb") in WRITE_VERBS and acting(e) == user
            and "dryRun=All" not in e.get("requestURI", "") and e.get("stage") == "ResponseComplete"]
