"""Leader election, probes and shutdown of the controller process.

* Two controllers share one Lease; the leader is SIGKILLed in the middle of a pass (a stage
  waiting for a Deployment); the standby takes over within the lease duration, finishes the
  pass, and the audit log shows no write of the old leader after it lost the Lease.
* ``/healthz`` answers at once, ``/readyz`` once the caches synced; SIGTERM stops a running
  controller with exit code 0 and releases the Lease; SIGTERM during start-up (an apiserver
  that never answers) stops it within seconds, also with 0.

The two processes run as two ServiceAccounts with the same rights (the chart's ClusterRole and
Lease Role), so the audit log can tell their writes apart; in a cluster the replicas of a
release share one account.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane, free_port
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import WRITE_VERBS, get_or_none, start_controller, wait_for
from tests.e2e.stagesets import cm, deployment, scenario
from tests.e2e.test_ordering import roll_out
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
NAMESPACE = "stageset-system"
LEASE = "leader-test"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 8, 5, 1


def election_args(lease: str = LEASE) -> list[str]:
    return ["--leader-elect", f"--leader-election-namespace={NAMESPACE}", f"--leader-election-id={lease}",
            f"--leader-election-lease-duration={LEASE_SECONDS}s",
            f"--leader-election-renew-deadline={RENEW_SECONDS}s",
            f"--leader-election-retry-period={RETRY_SECONDS}s"]


def account_kubeconfig(installed: KubeClient, control_plane: ControlPlane, account: str, path: Path) -> Path:
    return install.controller_kubeconfig(installed, url=control_plane.url, ca=control_plane.pki.ca_cert,
                                         path=path, namespace=NAMESPACE, account=account,
                                         leader_election=True)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:  # noqa: S310 -- our own loopback port
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def holder(admin: KubeClient) -> str:
    lease = get_or_none(admin, LEASE_PATH)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def writes_of(events: list[dict[str, Any]], account: str) -> list[dict[str, Any]]:
    """Every completed write a process made, as itself or impersonating a tenant."""
    return [e for e in events if (e.get("user") or {}).get("username") == account
            and e.get("verb") in WRITE_VERBS and e.get("stage") == "ResponseComplete"
            and "dryRun=All" not in e.get("requestURI", "")]


def parse_time(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def processes() -> Iterator[list[ControllerProcess]]:
    started: list[ControllerProcess] = []
    yield started
    for handle in started:
        handle.stop(timeout=20)
        sys.stderr.write(f"\n--- controller log (tail) ---\n{handle.output()[-3000:]}\n")


def test_the_standby_takes_over_a_killed_leader_mid_pass_and_the_old_one_writes_nothing_after(
    installed: KubeClient, control_plane: ControlPlane, git_server: GitServer, make_tenant: TenantFactory,
    tmp_path: Path, processes: list[ControllerProcess],
) -> None:
    users = {}
    for name in ("a", "b"):
        account = f"stageset-leader-{name}"
        users[name] = f"system:serviceaccount:{NAMESPACE}:{account}"
        kubeconfig = account_kubeconfig(installed, control_plane, account, tmp_path / f"{name}.kubeconfig")
        processes.append(start_controller(kubeconfig=kubeconfig, workdir=tmp_path / name,
                                          extra=election_args()))
        if name == "a":  # a leads: it starts first and takes the free Lease
            wait_for(lambda: holder(installed), what="a Lease holder")
    first = holder(installed)
    leader, standby = processes
    wait_for(lambda: "acquired Lease" in leader.output(), what="controller a leading")
    wait_for(lambda: "waiting for the Lease" in standby.output(), what="controller b standing by")
    assert "acquired Lease" not in standby.output()

    # A pass that stops in the middle: app waits for a Deployment nobody rolls out yet.
    s = scenario(installed, git_server, make_tenant("leader"), {
        "config/cm.yaml": cm("config"), "app/d.yaml": deployment("web"), "after/cm.yaml": cm("after")})
    s.stageset("failover", [{"name": "config", "path": "./config"}, {"name": "app", "path": "./app"},
                            {"name": "after", "path": "./after"}])
    wait_for(lambda: get_or_none(installed, f"/apis/apps/v1/namespaces/{s.ns}/deployments/web"),
             what="the leader applying the Deployment")
    assert s.configmap("after") is None

    killed_at = time.time()
    leader.process.kill()
    leader.process.wait()
    wait_for(lambda: holder(installed) not in ("", first), timeout=LEASE_SECONDS + 10,
             what="the standby taking the Lease")
    took_over = time.time() - killed_at
    sys.stderr.write(f"\nfailover: the standby held the Lease {took_over:.1f}s after SIGKILL "
                     f"(lease {LEASE_SECONDS}s, retry {RETRY_SECONDS}s)\n")
    assert took_over <= LEASE_SECONDS + 2 * RETRY_SECONDS
    # The Lease is written before the standby logs that it holds it.
    wait_for(lambda: "acquired Lease" in standby.output(), timeout=10, what="the standby logging its Lease")

    roll_out(s, "web")
    s.wait_ready("failover")
    assert s.configmap("after") is not None

    events = control_plane.audit_events()
    old, new = writes_of(events, users["a"]), writes_of(events, users["b"])
    assert old, "the audit log has no write of the old leader: the evidence is missing"
    assert new, "the audit log has no write of the new leader"
    lease_taken = min(parse_time(e["requestReceivedTimestamp"]) for e in new)
    assert max(parse_time(e["stageTimestamp"]) for e in old) <= killed_at + 0.5
    assert max(parse_time(e["stageTimestamp"]) for e in old) < lease_taken
    # Every write of the new leader happened after the old one was gone.
    assert all(parse_time(e["requestReceivedTimestamp"]) >= killed_at for e in new)


def test_probes_a_clean_stop_exits_0_and_releases_the_lease(
    installed: KubeClient, control_plane: ControlPlane, tmp_path: Path, processes: list[ControllerProcess],
) -> None:
    kubeconfig = account_kubeconfig(installed, control_plane, "stageset-probes", tmp_path / "kubeconfig")
    probes, metrics = free_port(), free_port()
    handle = start_controller(kubeconfig=kubeconfig, workdir=tmp_path / "c", extra=[
        *election_args("probes-test"), f"--probe-address=127.0.0.1:{probes}",
        f"--metrics-address=127.0.0.1:{metrics}"])
    processes.append(handle)
    wait_for(lambda: http_get(f"http://127.0.0.1:{probes}/healthz")[0] == 200, what="/healthz")
    wait_for(lambda: http_get(f"http://127.0.0.1:{probes}/readyz")[0] == 200, what="/readyz")
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/probes-test"
    wait_for(lambda: ((get_or_none(installed, lease_path) or {}).get("spec") or {}).get("holderIdentity"),
             what="the Lease held")
    status, text = http_get(f"http://127.0.0.1:{metrics}/metrics")
    assert status == 200
    assert re.search(r"^stageset_leader 1(\.0)?$", text, re.MULTILINE)
    assert re.search(r"^stageset_caches_synced 1(\.0)?$", text, re.MULTILINE)
    assert http_get(f"http://127.0.0.1:{probes}/nope")[0] == 404

    started = time.monotonic()
    handle.process.terminate()
    assert handle.exit_code(timeout=20) == 0
    sys.stderr.write(f"\nSIGTERM of a running leader: exit 0 after {time.monotonic() - started:.1f}s\n")
    lease = installed.get(lease_path)
    assert lease["spec"]["holderIdentity"] == ""  # released, not left to expire
    assert "released Lease" in handle.output()


@contextlib.contextmanager
def silent_apiserver() -> Iterator[int]:
    """A TCP port that accepts connections and never answers: start-up hangs on the first list."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize("election", [False, True], ids=["plain", "leader-elect"])
def test_sigterm_during_start_up_stops_within_seconds_with_0(
    tmp_path: Path, control_plane: ControlPlane, election: bool,
) -> None:
    probes = free_port()
    with silent_apiserver() as port:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', "
            f"certificate-authority: '{control_plane.pki.ca_cert}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u}}]\n")
        handle = ControllerProcess(kubeconfig=kubeconfig, workdir=tmp_path / "c", extra=[
            f"--probe-address=127.0.0.1:{probes}", *(election_args() if election else [])])
        try:
            wait_for(lambda: http_get(f"http://127.0.0.1:{probes}/healthz")[0] == 200, what="/healthz")
            assert http_get(f"http://127.0.0.1:{probes}/readyz")[0] == 503  # caches never sync
            started = time.monotonic()
            handle.process.terminate()
            code = handle.process.wait(timeout=10)
            took = time.monotonic() - started
        finally:
            if handle.process.poll() is None:
                handle.process.kill()
                handle.process.wait()
    sys.stderr.write(f"\nSIGTERM during start-up: exit {code} after {took:.1f}s\n{handle.output()[-2000:]}\n")
    assert code == 0
    assert took < 5


def test_a_bad_leader_election_setting_is_a_usage_error(tmp_path: Path, control_plane: ControlPlane) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stageset.cli", "controller", "--kubeconfig", str(control_plane.kubeconfig),
         "--leader-elect", "--leader-election-namespace=x", "--leader-election-renew-deadline=20s"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "retry period < renew deadline < lease duration" in result.stderr


def test_a_leader_that_loses_its_lease_exits_at_once_with_1(
    installed: KubeClient, control_plane: ControlPlane, tmp_path: Path, processes: list[ControllerProcess],
) -> None:
    kubeconfig = account_kubeconfig(installed, control_plane, "stageset-lost", tmp_path / "kubeconfig")
    handle = start_controller(kubeconfig=kubeconfig, workdir=tmp_path / "c", extra=election_args("lost-test"))
    processes.append(handle)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/lost-test"
    wait_for(lambda: "acquired Lease" in handle.output(), what="the controller leading")
    # Someone else takes the Lease (as a partitioned leader would see it after expiry).
    lease = installed.get(path)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    installed.request("PUT", path, body={**lease, "spec": {**lease["spec"], "holderIdentity": "intruder",
                                                           "renewTime": stamp}})
    stolen = time.monotonic()
    assert handle.process.wait(timeout=RENEW_SECONDS + 10) == 1
    assert time.monotonic() - stolen <= RENEW_SECONDS + 2 * RETRY_SECONDS
    assert "leadership lost" in handle.output()
    assert installed.get(path)["spec"]["holderIdentity"] == "intruder"  # it does not fight back
