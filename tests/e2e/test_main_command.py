"""The README's main command, as a new user runs it: ``make run`` (``stageset run``).

- ``--once`` reconciles the example to Ready and cleans up;
- the first run teaches: it keeps a kubeconfig while it runs, prints the commands to look around
  (which work), shows the source's first fetch as waiting rather than failing, and an edit saved
  under the examples (``make demo-change``) is the next poll's revision, applied;
- ``--kubeconfig`` installs missing CRDs (or says clearly that it may not) and passes controller
  flags through.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from stageset.cli.demo import demo_change
from stageset.envtest import server
from stageset.kube.client import ClientPool
from tests.cli.conftest import run_cli, user_kubeconfig
from tests.conftest import started_control_plane

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]


def test_run_reconciles_the_example_to_ready_and_cleans_up(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stageset.cli", "run", "--once"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "STAGESET_RUN_DIR": str(tmp_path / "run")},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for stage in ("config", "backend", "frontend"):
        assert f"stage {stage:<10} Ready" in output, output
    assert "StageSet shop/shop: Ready=True (Succeeded)" in output, output
    assert "stopped the controller and the control plane" in output
    # The source's first fetch is a wait, not a failure.
    assert "Ready=False" not in output
    assert " Failed" not in output
    # One stream: no Python-shaped log line (`2026-... WARNING name: ...`) among the progress lines.
    assert not re.search(r"^\d{4}-\d\d-\d\d[ T].* (WARNING|ERROR|INFO) ", output, re.MULTILINE), output
    assert not (tmp_path / "run" / "kubeconfig").exists(), "the kubeconfig is removed at the end"


class Demo:
    """``stageset run`` in the background, its output collected line by line."""

    def __init__(self, args: list[str], *, env: dict[str, str], log: Path):
        self.log = log
        self._sink: IO[bytes] = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stageset.cli", "run", *args],
            cwd=ROOT,
            stdout=self._sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, *, timeout: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output(), re.MULTILINE)
            if found:
                return found
            if self.process.poll() is not None:
                pytest.fail(f"stageset run exited with {self.process.returncode}:\n{self.output()}")
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {pattern!r} in:\n{self.output()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._sink.close()
        return self.process.returncode


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A copy of examples/ (a test must not edit the checkout)."""
    copy = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", copy)
    return copy


def test_the_first_run_teaches(tmp_path: Path, examples: Path) -> None:
    run_dir = tmp_path / "run"
    demo = Demo(
        ["--examples", str(examples)], env={"STAGESET_RUN_DIR": str(run_dir)}, log=tmp_path / "run.log"
    )
    try:
        first = demo.wait_for(r"Ready=True \(Succeeded\) applied 3 stage\(s\) at (main@sha1:[0-9a-f]{40})")
        output = demo.output()
        kubeconfig = run_dir / "kubeconfig"
        assert f"export KUBECONFIG={kubeconfig}" in output
        assert kubeconfig.exists(), "the kubeconfig is kept while it runs"
        for command in (
            "get -n shop",
            "tree shop -n shop",
            "diff shop -n shop",
            "kubectl get stages,configmaps,services -n shop",
            "make demo-change",
        ):
            assert command in output, command
        # The source's first fetch is shown as waiting, never as a failure.
        assert "Ready=False" not in output
        assert " Failed" not in output

        # The commands it prints work, with the kubeconfig it keeps.
        got = run_cli("get", "shop", "-n", "shop", "-o", "json", kubeconfig=kubeconfig)
        assert got.exit_code == 0, got.output
        assert json.loads(got.stdout)["status"]["lastAppliedRevision"] == first.group(1)
        tree = run_cli("tree", "shop", "-n", "shop", kubeconfig=kubeconfig)
        assert "ConfigMap/shop/shop-settings  Current" in tree.stdout
        assert run_cli("diff", "shop", "-n", "shop", kubeconfig=kubeconfig).exit_code == 0
        # As printed, from another terminal in another directory: the CLI's path is absolute.
        printed = re.search(r"^  (\S+) history shop -n shop ", output, re.MULTILINE)
        assert printed is not None, output
        assert Path(printed.group(1)).is_absolute()
        elsewhere = subprocess.run(
            [printed.group(1), "history", "shop", "-n", "shop"],
            cwd=tmp_path,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert elsewhere.returncode == 0, elsewhere.stderr
        assert "config" in elsewhere.stdout

        # GitOps: an edit saved under the examples is the next poll's revision (the example polls
        # every 15s), applied by the controller.
        assert "EUR -> USD" in demo_change(examples)
        second = demo.wait_for(
            r"Ready=True \(Succeeded\) applied 3 stage\(s\) at (main@sha1:(?!"
            + first.group(1).split(":")[1]
            + r")[0-9a-f]{40})",
            timeout=90,
        )
        client = ClientPool.from_kubeconfig(str(kubeconfig))
        try:
            live = client.client().get("/api/v1/namespaces/shop/configmaps/shop-settings")
        finally:
            client.close()
        assert live["data"]["currency"] == "USD"
        assert second.group(1) != first.group(1)
        # The progress log names whose stage changed, and a new revision is a line of its own.
        short = second.group(1).split(":")[1][:12]
        for stage in ("config", "backend", "frontend"):
            assert re.search(rf"shop/shop: stage {stage} +Ready +at main@sha1:{short}", demo.output()), stage
    finally:
        code = demo.stop()
    assert code == 0, demo.output()
    assert not (run_dir / "kubeconfig").exists()
    assert "stopped the controller and the control plane" in demo.output()


@pytest.fixture(scope="module")
def bare_plane() -> Iterator[server.ControlPlane]:
    """A control plane without our CRDs (the shared one has them installed)."""
    yield from started_control_plane()


def test_run_against_a_cluster_says_clearly_when_it_may_not_install_the_crds(
    bare_plane: server.ControlPlane,
    tmp_path: Path,
) -> None:
    pool = ClientPool.from_kubeconfig(str(bare_plane.kubeconfig))
    try:
        admin = pool.client()
        admin.apply(
            "/api/v1/namespaces/team",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}},
            field_manager="test",
        )
        nobody = user_kubeconfig(admin, bare_plane, namespace="team", account="nobody", path=tmp_path / "k")
    finally:
        pool.close()
    result = subprocess.run(
        [sys.executable, "-m", "stageset.cli", "run", "--kubeconfig", str(nobody)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert (
        "the cluster has no stagesets.stages.metio.wtf CRD and your kubeconfig may not create it"
        in result.stderr
    )
    assert "stageset crds | kubectl apply --server-side -f -" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_against_a_cluster_installs_the_crds_and_passes_flags_through(
    bare_plane: server.ControlPlane,
    tmp_path: Path,
) -> None:
    demo = Demo(
        [
            "--kubeconfig",
            str(bare_plane.kubeconfig),
            "--workers",
            "2",
            "--cluster-admin",
            "--runbook-base-url",
            "https://docs.example/rb/",
        ],
        env={},
        log=tmp_path / "run.log",
    )
    pool = ClientPool.from_kubeconfig(str(bare_plane.kubeconfig))
    try:
        demo.wait_for(r"installed the CRDs: stagesets.stages.metio.wtf, gitrepositories.stages.metio.wtf")
        demo.wait_for(r"running the controller in cluster-admin \(single-tenant\) mode")
        admin = pool.client()
        stagesets = "/apis/stages.metio.wtf/v1/namespaces/default/stagesets"
        admin.apply(
            f"{stagesets}/flags",
            {
                "apiVersion": "stages.metio.wtf/v1",
                "kind": "StageSet",
                "metadata": {"name": "flags"},
                "spec": {"stages": [{"name": "app", "sourceRef": {"name": "missing"}}]},
            },
            field_manager="test",
        )

        def ready() -> dict[str, Any]:
            conditions = (admin.get(f"{stagesets}/flags").get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "Ready" and c["status"] == "False"), {})

        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.2)
        condition = ready()
        # --runbook-base-url reached the controller: the message ends with our link, and the
        # StageSet without serviceAccountName got as far as its source (--cluster-admin).
        assert condition.get("reason") == "SourceNotReady", condition
        assert condition["message"].endswith("; runbook: https://docs.example/rb/sourcenotready/")
    finally:
        pool.close()
        code = demo.stop()
    assert code == 0, demo.output()
    # Run again: the CRDs are there now and are left alone.
    again = Demo(["--kubeconfig", str(bare_plane.kubeconfig)], env={}, log=tmp_path / "again.log")
    try:
        again.wait_for("the CRDs are installed")
        again.wait_for(r"running the controller in multi-tenant mode")
    finally:
        assert again.stop() == 0
    pool = ClientPool.from_kubeconfig(str(bare_plane.kubeconfig))
    try:
        crd = pool.client().get(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/stagesets.stages.metio.wtf"
        )
    finally:
        pool.close()
    assert crd["spec"]["names"]["categories"] == ["stages"]
