"""End-to-end fixtures: the controller as a real subprocess, a real Git server, waiting helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stageset.kube.client import ApiError, KubeClient
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


class ControllerProcess:
    def __init__(self, process: subprocess.Popen[bytes], log: Path):
        self.process = process
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def controller(installed: KubeClient, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[ControllerProcess]:
    """``stageset controller`` as a subprocess, cluster-wide, multi-tenant mode."""
    workdir = tmp_path_factory.mktemp("controller")
    log = workdir / "controller.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "stageset.cli", "controller", "--kubeconfig", str(kubeconfig),
             "--allow-insecure-sources", "--mirror-dir", str(workdir / "mirrors"),
             "--log-level", "debug"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    handle = ControllerProcess(process, log)
    try:
        yield handle
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        sys.stderr.write(f"\n--- controller log (tail) ---\n{handle.output()[-6000:]}\n")


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
