"""Playing the chart's hook Jobs on a control plane without a kubelet.

Helm creates a hook Job and waits until the job controller reports it Complete (or Failed).  There
is no kubelet here, so :func:`helm_with_hooks` plays each Job the release creates: it runs the Job's
own command in-process (``stageset ...``, the image's CLI) as the Job's own ServiceAccount (a token
of it from the TokenRequest API), then writes the Job's status as the job controller would -- Complete
when the command exited 0, Failed otherwise (so Helm fails as it would).  What this proves: the
hook's RBAC lets its command do its work, and Helm orders and waits for the hook; it does not prove a
kubelet can pull the image (tests/image runs the image's entrypoint).

Identity: helm and the set-up act as the control plane's admin (``system:masters``); each hook's
command as the hook's ServiceAccount.
"""

from __future__ import annotations

import datetime
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from stageset.cli.main import main as cli_main
from stageset.kube.client import KubeClient
from tests.helm.chart import Helm


@dataclass
class Plane:
    """What a hook's token kubeconfig needs of the control plane."""

    admin: KubeClient
    server: str
    ca_cert: Path
    workdir: Path


@dataclass
class Played:
    job: str
    account: str
    command: list[str]
    exit_code: int
    output: str


@dataclass
class HookedRun:
    result: subprocess.CompletedProcess[str]
    played: list[Played] = field(default_factory=list)


def account_kubeconfig(plane: Plane, namespace: str, account: str) -> Path:
    """A kubeconfig with a token of ServiceAccount ``namespace/account`` (the TokenRequest API)."""
    token = plane.admin.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={"spec": {"expirationSeconds": 3600}})["status"]["token"]
    path = plane.workdir / f"{namespace}-{account}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": plane.server,
                                               "certificate-authority": str(plane.ca_cert)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
    path.chmod(0o600)
    return path


def run_cli(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """``stageset ARGS`` in-process with ``KUBECONFIG`` set (exit code, stdout and stderr apart)."""
    result = CliRunner().invoke(cli_main, list(args), env={"KUBECONFIG": str(kubeconfig)},
                                catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def finish_job(admin: KubeClient, namespace: str, name: str, *, succeeded: bool) -> None:
    """What the job controller writes when the pod succeeded or failed (no kube-controller-manager here)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if succeeded:
        done = {"status": "True", "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods", "lastProbeTime": now,
                "lastTransitionTime": now}
        status = {"startTime": now, "completionTime": now, "succeeded": 1, "active": 0, "ready": 0,
                  "terminating": 0, "uncountedTerminatedPods": {},
                  "conditions": [{"type": "SuccessCriteriaMet", **done}, {"type": "Complete", **done}]}
    else:
        failed = {"status": "True", "reason": "BackoffLimitExceeded",
                  "message": "Job has reached the specified backoff limit", "lastProbeTime": now,
                  "lastTransitionTime": now}
        status = {"startTime": now, "failed": 1, "active": 0, "ready": 0, "terminating": 0,
                  "uncountedTerminatedPods": {},
                  "conditions": [{"type": "FailureTarget", **failed}, {"type": "Failed", **failed}]}
    admin.request("PATCH", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status",
                  content_type="application/merge-patch+json", body={"status": status})


def play_job(plane: Plane, job: dict[str, Any]) -> Played:
    meta, pod = job["metadata"], job["spec"]["template"]["spec"]
    account, command = pod["serviceAccountName"], list(pod["containers"][0]["command"])
    assert command[0] == "stageset", command  # the image's CLI
    ran = run_cli(*command[1:], kubeconfig=account_kubeconfig(plane, meta["namespace"], account))
    finish_job(plane.admin, meta["namespace"], meta["name"], succeeded=ran.returncode == 0)
    return Played(job=meta["name"], account=account, command=command, exit_code=ran.returncode,
                  output=ran.stdout + ran.stderr)


def helm_with_hooks(helm: Helm, plane: Plane, *args: str, namespace: str,
                    timeout: float = 240.0) -> HookedRun:
    """``helm ARGS`` (an install, upgrade or uninstall of a release in ``namespace``), playing every hook
    Job it creates there until it exits."""
    process = helm.start(*args)
    run = HookedRun(result=subprocess.CompletedProcess(list(args), -1))
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"helm {' '.join(args)} did not finish in {timeout:g}s")
            jobs = plane.admin.get(f"/apis/batch/v1/namespaces/{namespace}/jobs").get("items", [])
            for job in jobs:
                uid = job["metadata"]["uid"]
                hook = (job["metadata"].get("annotations") or {}).get("helm.sh/hook")
                if hook and uid not in seen and not (job.get("status") or {}).get("conditions"):
                    seen.add(uid)
                    run.played.append(play_job(plane, job))
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
    out, err = process.communicate(timeout=60)
    run.result = subprocess.CompletedProcess(list(args), process.returncode, out, err)
    return run
