"""The local control plane: how it is built, that it starts with RBAC on, and that it never leaks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stageset.envtest import build
from stageset.envtest import server as envtest

SAMPLE_GO_MOD = """\
module k8s.io/kubernetes

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/cri-api => ./staging/src/k8s.io/cri-api
)

require (
\tk8s.io/klog/v2 v2.130.1
)
"""


def test_staging_modules_are_read_from_the_replace_lines() -> None:
    assert build.staging_modules(SAMPLE_GO_MOD) == ["k8s.io/api", "k8s.io/client-go", "k8s.io/cri-api"]


def test_staging_modules_are_pinned_to_the_matching_v0_release() -> None:
    assert build.staging_version("v1.35.4") == "v0.35.4"
    with pytest.raises(ValueError, match="not a Kubernetes release"):
        build.staging_version("1.35")
    wrapper = build.wrapper_go_mod(kubernetes_version="v1.35.4", modules=["k8s.io/api"])
    assert "require k8s.io/kubernetes v1.35.4" in wrapper
    assert "replace k8s.io/api => k8s.io/api v0.35.4" in wrapper


def test_checked_in_wrapper_pins_every_staging_module_of_the_release() -> None:
    """The wrapper go.mod must match the downloaded k8s.io/kubernetes go.mod (regenerate with --update)."""
    wrapper = (build.WRAPPERS / "kube-apiserver" / "go.mod").read_text()
    info = json.loads(subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{build.KUBERNETES_VERSION}"],
        cwd=build.WRAPPERS / "kube-apiserver", capture_output=True, text=True, check=True).stdout)
    modules = build.staging_modules(Path(info["GoMod"]).read_text())
    assert modules, "no staging modules found"
    pinned = build.staging_version(build.KUBERNETES_VERSION)
    for module in modules:
        assert f"{module} => {module} {pinned}" in wrapper, module
    assert f"k8s.io/kubernetes {build.KUBERNETES_VERSION}" in wrapper


def test_kubebuilder_assets_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in build.BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    assert build.ensure_assets().directory == tmp_path
    (tmp_path / "etcd").unlink()
    with pytest.raises(RuntimeError, match="lacks one of"):
        build.ensure_assets()


def test_a_cache_from_before_the_controller_manager_builds_only_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("STAGESET_CACHE_DIR", str(tmp_path))
    target = build.assets_dir()
    target.mkdir(parents=True)
    for name in build.REQUIRED:
        (target / name).write_text("built before")
    built: list[tuple[str, str]] = []

    def go_build(args: list[str], *, cwd: Path) -> None:
        output = Path(args[args.index("-o") + 1])
        output.write_text("built now")
        built.append((output.name, cwd.name))

    monkeypatch.setattr(build, "_go_build", go_build)
    monkeypatch.setattr(build.shutil, "which", lambda _name: "/usr/bin/go")
    assert build.ensure_assets(log=False, controller_manager=False).directory == target
    assert built == [], "a control plane without a controller manager needs none built"
    assets = build.ensure_assets(log=False)
    # From the kube-apiserver wrapper: the same k8s.io/kubernetes release, the same go.sum.
    assert built == [("kube-controller-manager", "kube-apiserver")]
    assert assets.kube_controller_manager.read_text() == "built now"
    assert {name: (target / name).read_text() for name in build.REQUIRED} == {
        name: "built before" for name in build.REQUIRED}
    assert sorted(p.name for p in tmp_path.joinpath("controlplane").iterdir()) == [".build.lock", target.name]


def test_kubebuilder_assets_without_a_controller_manager_serve_all_but_its_tests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in build.REQUIRED:
        (tmp_path / name).write_text("#!/bin/sh\n")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    assets = build.ensure_assets()
    assert assets.directory == tmp_path
    with pytest.raises(RuntimeError, match="holds no kube-controller-manager"):
        _ = assets.kube_controller_manager


@pytest.mark.apiserver
def test_rbac_is_enforced(control_plane: envtest.ControlPlane, kube_pool: object) -> None:
    from stageset.kube.client import ApiError, ClientPool, Identity

    assert isinstance(kube_pool, ClientPool)
    stranger = kube_pool.client(Identity(user="system:serviceaccount:nowhere:nobody"))
    with pytest.raises(ApiError) as denied:
        stranger.get("/api/v1/namespaces/default/configmaps")
    assert denied.value.forbidden


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if _alive(pid)]


@pytest.mark.apiserver
def test_stop_leaves_no_process() -> None:
    plane = envtest.start()
    pids = [p.pid for p in plane._processes]
    assert all(_alive(pid) for pid in pids)
    workdir = plane.workdir
    plane.stop()
    assert _wait_gone(pids) == []
    assert not workdir.exists()


STARTER = """
import sys, time
from stageset.envtest import server
plane = server.start()
print(" ".join(str(p.pid) for p in plane._processes), flush=True)
time.sleep(600)
"""


@pytest.mark.apiserver
def test_killed_parent_takes_the_control_plane_with_it() -> None:
    """Even ``kill -9`` of the process that started it leaves no apiserver behind."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    pids = [int(pid) for pid in starter.stdout.readline().split()]
    assert len(pids) == 2
    assert all(_alive(pid) for pid in pids)
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    assert _wait_gone(pids) == []
