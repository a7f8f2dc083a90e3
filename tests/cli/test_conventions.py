"""kubectl's and flux's conventions in the CLI, against the real apiserver (no controller: the test
writes what the controller would, so each flag's effect is the only thing that changes).

``--as``/``--as-group`` (impersonation, checked in the apiserver's audit log), ``get -l``,
``-o wide``/``-o name``, ``get -w`` and ``events --watch``/``-A`` (a real process, ended with
Ctrl-C), ``--all`` on ``reconcile``/``suspend``/``resume``, completion of StageSet, stage and
namespace names from the cluster, and ``check`` naming why the controller's pod is not ready.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.cli.conftest import bind, complete, namespaces, run_cli, viewer_kubeconfig
from tests.e2e.conftest import STAGESETS, apply, stageset

pytestmark = [pytest.mark.apiserver]

SUFFIX = uuid.uuid4().hex[:6]
NS, ELSEWHERE = f"conv-{SUFFIX}", f"conv-other-{SUFFIX}"
REVISION = "main@sha1:" + "ab" * 20


@dataclass
class World:
    admin: KubeClient
    plane: ControlPlane
    viewer: Path
    """A user who may read ``NS`` (ClusterRole view) and impersonate nothing."""


def _stageset(name: str, labels: dict[str, str], stages: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "stages.metio.wtf/v1",
        "kind": "StageSet",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"stages": [{"name": s, "sourceRef": {"name": "app"}} for s in stages]},
    }


def _status(admin: KubeClient, name: str, stages: list[str]) -> None:
    admin.request(
        "PATCH",
        f"{STAGESETS.format(ns=NS)}/{name}/status",
        body={
            "status": {
                "observedGeneration": 1,
                "lastAppliedRevision": REVISION,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Succeeded",
                        "message": "every stage is Ready",
                        "observedGeneration": 1,
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "stages": [{"name": s, "phase": "Ready", "revision": REVISION, "objects": 1} for s in stages],
            }
        },
        content_type="application/merge-patch+json",
    )


@pytest.fixture(scope="module")
def world(
    installed: KubeClient, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> World:
    admin = installed
    namespaces(admin, NS, ELSEWHERE)
    for name, labels, stages in (
        ("shop", {"team": "shop"}, ["config", "backend"]),
        ("blog", {"team": "blog"}, ["web"]),
    ):
        apply(admin, _stageset(name, labels, stages))
        _status(admin, name, stages)
    viewer = viewer_kubeconfig(admin, control_plane, namespace=NS,
                               path=tmp_path_factory.mktemp("viewer") / "kubeconfig")
    # Group "readers-b" may read StageSets in ELSEWHERE; "readers-a" nothing.
    bind(
        admin,
        ELSEWHERE,
        "readers-b-view",
        "view",
        {"kind": "Group", "name": "readers-b", "apiGroup": "rbac.authorization.k8s.io"},
    )
    return World(admin=admin, plane=control_plane, viewer=viewer)


# -- --as / --as-group ------------------------------------------------------------------------------------


def _impersonated(plane: ControlPlane, since: int) -> list[dict[str, Any]]:
    return [e for e in plane.audit_events()[since:] if e.get("impersonatedUser")]


def test_as_impersonates_the_user_and_the_apiserver_decides(world: World) -> None:
    since = len(world.plane.audit_events())
    viewer = f"system:serviceaccount:{NS}:viewer"
    allowed = run_cli("get", "-n", NS, "--as", viewer, kubeconfig=world.plane.kubeconfig)
    assert allowed.exit_code == 0, allowed.stderr
    assert "shop" in allowed.stdout
    denied = run_cli("get", "-n", ELSEWHERE, "--as", viewer, kubeconfig=world.plane.kubeconfig)
    assert denied.exit_code == 3
    assert viewer in denied.stderr  # the apiserver's refusal names whom it judged
    seen = _impersonated(world.plane, since)
    assert {e["impersonatedUser"]["username"] for e in seen} == {viewer}
    # The viewer may impersonate nobody: --as is the apiserver's to refuse, not ours to skip.
    refused = run_cli("get", "-n", NS, "--as", "someone", kubeconfig=world.viewer)
    assert refused.exit_code == 3
    assert "impersonate" in refused.stderr


def test_as_group_sends_every_group(world: World) -> None:
    since = len(world.plane.audit_events())
    args = ("get", "-n", ELSEWHERE, "--as", "jane")
    assert run_cli(*args, "--as-group", "readers-a", kubeconfig=world.plane.kubeconfig).exit_code == 3
    # Only the second group may read there: each group is its own header line.
    both = run_cli(
        *args, "--as-group", "readers-a", "--as-group", "readers-b", kubeconfig=world.plane.kubeconfig
    )
    assert both.exit_code == 0, both.stderr
    groups = [e["impersonatedUser"].get("groups") for e in _impersonated(world.plane, since)]
    assert any({"readers-a", "readers-b"} <= set(g or ()) for g in groups), groups
    alone = run_cli("get", "--as-group", "readers-b", kubeconfig=world.plane.kubeconfig)
    assert alone.exit_code == 2
    assert "--as-group needs --as" in alone.stderr


# -- get -l, -o wide, -o name ------------------------------------------------------------------------------


def test_get_by_label_selector(world: World) -> None:
    shop = run_cli("get", "-n", NS, "-l", "team=shop", kubeconfig=world.viewer)
    assert shop.exit_code == 0, shop.stderr
    assert "shop" in shop.stdout
    assert "blog" not in shop.stdout
    not_shop = run_cli(
        "get", "-n", NS, "--selector", "team notin (shop)", "-o", "name", kubeconfig=world.viewer
    )
    assert not_shop.stdout == "stageset.stages.metio.wtf/blog\n"
    nothing = run_cli("get", "-n", NS, "-l", "team=none", kubeconfig=world.viewer)
    assert nothing.exit_code == 0
    assert "No StageSets found in namespace" in nothing.stderr
    assert "with labels team=none" in nothing.stderr
    assert run_cli("get", "shop", "-l", "team=shop", kubeconfig=world.viewer).exit_code == 2
    assert run_cli("get", "-l", "a=b=c", kubeconfig=world.viewer).exit_code == 2


def test_get_wide_and_name(world: World) -> None:
    wide = run_cli("get", "-n", NS, "-o", "wide", kubeconfig=world.viewer)
    assert wide.exit_code == 0, wide.stderr
    header = wide.stdout.splitlines()[0].split()
    assert {"GENERATION", "PHASES", "SOURCES"} <= set(header)
    assert "config=Ready,backend=Ready" in wide.stdout
    assert "GitRepository/app" in wide.stdout
    narrow = run_cli("get", "-n", NS, kubeconfig=world.viewer)
    assert "PHASES" not in narrow.stdout
    one = run_cli("get", "shop", "-n", NS, "-o", "wide", kubeconfig=world.viewer)
    assert "LAST APPLIED" in one.stdout
    assert "sources: GitRepository/app" in one.stdout
    names = run_cli("get", "-n", NS, "-o", "name", kubeconfig=world.viewer)
    assert names.stdout.splitlines() == ["stageset.stages.metio.wtf/blog", "stageset.stages.metio.wtf/shop"]
    assert run_cli("get", "shop", "-n", NS, "-o", "name", kubeconfig=world.viewer).stdout == (
        "stageset.stages.metio.wtf/shop\n"
    )


# -- get -w and events --watch: real processes, ended as a user ends them ----------------------------------


@dataclass
class Running:
    process: subprocess.Popen[str]
    lines: queue.Queue[str]


@contextmanager
def cli_process(*args: str, kubeconfig: Path) -> Iterator[Running]:
    """``stageset ARGS`` as a process, its output read line by line on a thread."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stageset.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        yield Running(process, lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def read_until(running: Running, wanted: str, *, guard: float = 60.0) -> list[str]:
    """Lines of its output until one contains ``wanted`` (``guard``: only so a broken test ends)."""
    lines: list[str] = []
    deadline = time.monotonic() + guard
    while time.monotonic() < deadline:
        try:
            line = running.lines.get(timeout=0.5)
        except queue.Empty:
            if running.process.poll() is not None:
                break
            continue
        lines.append(line)
        if wanted in line:
            return lines
    stderr = (
        running.process.stderr.read() if running.process.stderr and running.process.poll() is not None else ""
    )
    raise AssertionError(f"never printed {wanted!r}: {lines} {stderr}")


def interrupt(running: Running) -> int:
    running.process.send_signal(signal.SIGINT)
    return running.process.wait(timeout=30)


def test_get_watch_prints_the_list_then_each_change(world: World) -> None:
    with cli_process("get", "-n", NS, "-w", kubeconfig=world.viewer) as process:
        first = read_until(process, "shop")
        assert first[0].split()[:2] == ["NAME", "READY"]
        world.admin.request(
            "PATCH",
            f"{STAGESETS.format(ns=NS)}/blog",
            body={"spec": {"suspend": True}},
            content_type="application/merge-patch+json",
        )
        changed = read_until(process, "blog")
        assert changed[-1].split()[5] == "true"  # SUSPENDED: one line, for the StageSet that changed
        assert not any("shop" in line for line in changed)
        assert interrupt(process) == 0
    world.admin.request(
        "PATCH",
        f"{STAGESETS.format(ns=NS)}/blog",
        body={"spec": {"suspend": False}},
        content_type="application/merge-patch+json",
    )


def _event(name: str, namespace: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "name": name,
            "namespace": namespace,
        },
        "type": "Normal",
        "reason": reason,
        "message": message,
        "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "source": {"component": "test"},
    }


def test_events_all_namespaces_and_watch(world: World) -> None:
    for namespace, name in ((NS, "shop"), (ELSEWHERE, "far")):
        world.admin.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/events",
            body=_event(name, namespace, "Kept", f"kept {name}"),
        )
    every = run_cli("events", "-A", kubeconfig=world.plane.kubeconfig)
    assert every.exit_code == 0, every.stderr
    assert every.stdout.splitlines()[0].split()[0] == "NAMESPACE"
    assert "kept shop" in every.stdout
    assert "kept far" in every.stdout
    here = run_cli("events", "-n", NS, kubeconfig=world.viewer)
    assert "kept shop" in here.stdout
    assert "kept far" not in here.stdout
    assert run_cli("events", "-A", kubeconfig=world.viewer).exit_code == 3  # may not list events everywhere
    assert run_cli("events", "shop", "-A", kubeconfig=world.viewer).exit_code == 2

    with cli_process("events", "shop", "-n", NS, "--watch", kubeconfig=world.viewer) as process:
        read_until(process, "kept shop")
        world.admin.request(
            "POST", f"/api/v1/namespaces/{NS}/events", body=_event("blog", NS, "Other", "not shop")
        )
        world.admin.request(
            "POST", f"/api/v1/namespaces/{NS}/events", body=_event("shop", NS, "Fresh", "fresh shop")
        )
        lines = read_until(process, "fresh shop")
        assert not any("not shop" in line for line in lines)  # another StageSet's event
        assert interrupt(process) == 0


# -- --all --------------------------------------------------------------------------------------------------


def test_all_suspends_resumes_and_reconciles_every_stageset_of_the_namespace(world: World) -> None:
    admin = world.admin
    suspended = run_cli("suspend", "--all", "-n", NS, kubeconfig=world.plane.kubeconfig)
    assert suspended.exit_code == 0, suspended.stderr
    assert suspended.stdout.splitlines() == [f"suspended StageSet {NS}/blog", f"suspended StageSet {NS}/shop"]
    assert all(stageset(admin, NS, n)["spec"]["suspend"] for n in ("blog", "shop"))
    skipped = run_cli("reconcile", "--all", "-n", NS, kubeconfig=world.plane.kubeconfig)
    assert skipped.exit_code == 0, skipped.stderr
    assert f"skipped StageSet {NS}/shop: suspended" in skipped.stdout
    resumed = run_cli("resume", "--all", "-n", NS, kubeconfig=world.plane.kubeconfig)
    assert resumed.exit_code == 0, resumed.stderr
    assert not any(stageset(admin, NS, n)["spec"]["suspend"] for n in ("blog", "shop"))
    reconciled = run_cli("reconcile", "--all", "-n", NS, kubeconfig=world.plane.kubeconfig)
    assert reconciled.exit_code == 0, reconciled.stderr
    stamps = {
        stageset(admin, NS, n)["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"]
        for n in ("blog", "shop")
    }
    assert len(stamps) == 1  # one request, for both
    assert f"requested a reconcile of StageSet {NS}/blog" in reconciled.stdout
    for command in ("reconcile", "suspend", "resume"):
        assert run_cli(command, "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 2  # neither
        assert run_cli(command, "shop", "--all", "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 2
    denied = run_cli("suspend", "--all", "-n", NS, kubeconfig=world.viewer)
    assert denied.exit_code == 3
    assert "you may not patch StageSet" in denied.stderr
    assert not stageset(admin, NS, "blog")["spec"]["suspend"]


# -- completion of names from the cluster -------------------------------------------------------------------


def test_names_complete_from_the_cluster_as_the_user(world: World) -> None:
    assert complete(f"stageset get -n {NS} ", kubeconfig=world.viewer) == ["blog", "shop"]
    assert complete(f"stageset tree -n {NS} s", kubeconfig=world.viewer) == ["shop"]
    assert complete("stageset reconcile b", kubeconfig=world.viewer) == ["blog"]  # the context's namespace
    assert complete(f"stageset promote shop -n {NS} --stage ", kubeconfig=world.viewer) == [
        "backend",
        "config",
    ]
    assert complete(f"stageset get -n conv-{SUFFIX}", kubeconfig=world.plane.kubeconfig) == [NS]
    # Nothing the user may not list (the viewer may list no namespaces), and never an error in the shell.
    assert complete("stageset get -n conv", kubeconfig=world.viewer) == []
    assert complete(f"stageset get -n {ELSEWHERE} ", kubeconfig=world.viewer) == []
    assert complete(f"stageset get -n {NS} ", kubeconfig=world.viewer, protocol="powershell") == [
        "blog",
        "shop",
    ]


# -- check names why the controller's pod is not ready ------------------------------------------------------


def test_check_names_an_image_that_cannot_be_pulled(world: World) -> None:
    admin = world.admin
    labels = {"app.kubernetes.io/name": "stageset", "app.kubernetes.io/instance": f"broken-{SUFFIX}"}
    admin.apply(
        f"/apis/apps/v1/namespaces/{ELSEWHERE}/deployments/broken",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "broken",
                "namespace": ELSEWHERE,
                "labels": {
                    **labels,
                    "app.kubernetes.io/part-of": "stageset",
                    "app.kubernetes.io/component": "controller",
                },
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [{"name": "controller", "image": "registry.invalid/stageset:none"}]
                    },
                },
            },
        },
        field_manager="test",
    )
    pod = f"/api/v1/namespaces/{ELSEWHERE}/pods/broken-1"
    admin.apply(
        pod,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "broken-1", "namespace": ELSEWHERE, "labels": labels},
            "spec": {"containers": [{"name": "controller", "image": "registry.invalid/stageset:none"}]},
        },
        field_manager="test",
    )
    # What the kubelet reports when the image cannot be pulled.
    admin.request(
        "PATCH",
        f"{pod}/status",
        body={
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "controller",
                        "ready": False,
                        "restartCount": 0,
                        "image": "registry.invalid/stageset:none",
                        "imageID": "",
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "registry.invalid/stageset:none"',
                            }
                        },
                    }
                ],
            }
        },
        content_type="application/merge-patch+json",
    )
    result = run_cli("check", "-n", ELSEWHERE, kubeconfig=world.plane.kubeconfig)
    assert result.exit_code == 3
    line = next(line for line in result.stdout.splitlines() if "deployment:" in line)
    assert line.startswith(
        "✗ deployment: 0/1 replicas ready: pod broken-1 container controller: ImagePullBackOff"
    )
    assert 'Back-off pulling image "registry.invalid/stageset:none"' in line
