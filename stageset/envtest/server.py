"""Start etcd and kube-apiserver on loopback, wait until ready, and always tear them down.

On request (``controller_manager=True``) a kube-controller-manager of the same release joins them,
running only :data:`CONTROLLERS` — the namespace lifecycle, garbage collection and quota status
that tests of offboarding and quotas need — so those tests run against the real controllers, not
a simulation.  The shared control plane of the test suite runs none: without it a deleted
namespace stays ``Terminating`` and owner references are never followed, which the other tests
rely on.

Identity: the admin client certificate (``system:masters``) for our own readiness checks; the
controller manager authenticates as ``system:kube-controller-manager`` and runs each controller as
its own ServiceAccount in ``kube-system`` (``--use-service-account-credentials``, granted by the
apiserver's bootstrap RBAC policy), so the audit log names e.g.
``system:serviceaccount:kube-system:namespace-controller`` for what the namespace controller deletes.

Workload identity, between two planes (``tests/e2e/federated/``): ``start(serve_issuer=True)`` makes
the apiserver's ServiceAccount issuer its own URL (so its discovery document and keys are served
where the issuer says) and lets anyone read them (``system:service-account-issuer-discovery`` bound
to ``system:unauthenticated``, as a cluster publishing its issuer does); ``start(trust=[JwtIssuer(...)])``
starts an apiserver with a structured ``AuthenticationConfiguration`` whose JWT authenticators accept
those issuers' tokens (audience: that apiserver's own URL unless given; usernames prefixed).  The
default planes do neither.

Each process runs in its own session and is asked to die with its parent
(``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the test runner leaves no
apiserver behind.  Ports are picked free on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stageset.envtest.build import Assets, ensure_assets
from stageset.envtest.certs import Pki, write_pki

_READY_TIMEOUT = 120.0

CONTROLLERS = ("namespace-controller", "garbage-collector-controller", "resourcequota-controller")
"""What the controller manager runs, when it runs (``--controllers``)."""
CONTROLLER_ACCOUNTS = ("namespace-controller", "generic-garbage-collector", "resourcequota-controller")
"""The ``kube-system`` ServiceAccounts the controller manager creates as it starts each of
:data:`CONTROLLERS` (its credentials for that controller): all there, every controller started."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Linux only: SIGKILL this child when the process that started it exits.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class JwtIssuer:
    """Another cluster's ServiceAccount issuer a plane trusts (one JWT authenticator of its structured
    authentication configuration); ``audit_requests``: core resources (``serviceaccounts/token``)
    whose requests are audited with their bodies (level ``Request``: never an answer's)."""

    url: str
    """The issuer (its ``--service-account-issuer``), where its discovery document is served."""
    certificate_authority: Path
    """PEM of the CA the issuer's serving certificate is checked against."""
    username_prefix: str
    """Prepended to the token's ``sub`` (``system:serviceaccount:<ns>:<name>``)."""
    audiences: tuple[str, ...] = ()
    """The audiences accepted; empty: the trusting apiserver's own URL."""


def authentication_config(issuers: Sequence[JwtIssuer], *, own_url: str) -> dict[str, Any]:
    """A structured ``AuthenticationConfiguration`` trusting ``issuers`` (``apiserver.config.k8s.io/v1``)."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": {"url": issuer.url, "certificateAuthority": issuer.certificate_authority.read_text(),
                       "audiences": list(issuer.audiences or (own_url,)), "audienceMatchPolicy": "MatchAny"},
            "claimMappings": {"username": {"claim": "sub", "prefix": issuer.username_prefix}},
        } for issuer in issuers],
    }


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver pair and the admin credentials to reach it."""

    workdir: Path
    url: str
    pki: Pki
    kubeconfig: Path
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _owns_workdir: bool = True
    etcd_url: str = ""
    """etcd's client URL (plain HTTP on loopback): the fault tests compact it."""
    controller_manager: bool = False
    """Whether a kube-controller-manager runs :data:`CONTROLLERS` against this apiserver."""
    _apiserver: list[str] = field(default_factory=list, repr=False)
    """kube-apiserver's command line, to start it again (:meth:`start_apiserver`)."""
    issuer: str = "https://kubernetes.default.svc.cluster.local"
    """Its ServiceAccount issuer (``serve_issuer``: its own URL)."""

    def admin_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every request the apiserver has seen so far (metadata level), oldest first."""
        if not self.audit_log.exists():
            return []
        with self.audit_log.open() as log:
            return [json.loads(line) for line in log if line.strip()]

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        self._processes.clear()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone (etcd keeps every object): a cluster that goes away."""
        process = self._processes[1]
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)

    def start_apiserver(self) -> None:
        """Start kube-apiserver again after :meth:`stop_apiserver`: same flags, port, certificates and
        data (its audit log goes on); returns once it is ready."""
        assert self._apiserver, "not started by start()"
        assert self._processes[1].poll() is not None, "stop_apiserver() first"
        log = self.workdir / "kube-apiserver.restarted.log"
        self._processes[1] = _spawn(self._apiserver, log=log)
        _wait_ready(self, logs=[self.workdir / "etcd.log", log,
                                *([self.workdir / "kube-controller-manager.log"] if len(self._processes) > 2
                                  else [])])

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(args: list[str], *, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            args,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # no threads are started before fork here
        )


def _wait_ready(plane: ControlPlane, *, logs: list[Path]) -> None:
    context = plane.admin_ssl_context()
    deadline = time.monotonic() + _READY_TIMEOUT
    last_error = "no answer"
    while time.monotonic() < deadline:
        for process, log in zip(plane._processes, logs, strict=True):
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{log.stem} exited with {process.returncode}:\n{tail}")
        try:
            # The URL is our own https:// apiserver address.
            with urllib.request.urlopen(f"{plane.url}/readyz", context=context, timeout=5) as reply:  # noqa: S310
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last_error = str(error)
        time.sleep(0.25)
    raise RuntimeError(f"kube-apiserver not ready after {_READY_TIMEOUT:.0f}s: {last_error}")


def write_kubeconfig(*, path: Path, url: str, pki: Pki, context: str = "envtest",
                     client: tuple[Path, Path] | None = None) -> None:
    """A kubeconfig for ``url``, as the admin or as ``client`` (certificate, key)."""
    cert, key = client or (pki.admin_cert, pki.admin_key)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context,
                      "cluster": {"server": url, "certificate-authority": str(pki.ca_cert)}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": "admin"}}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


def _controller_manager_args(plane: ControlPlane, *, assets: Assets) -> list[str]:
    kubeconfig = plane.workdir / "controller-manager.kubeconfig"
    write_kubeconfig(path=kubeconfig, url=plane.url, pki=plane.pki,
                     client=(plane.pki.controller_manager_cert, plane.pki.controller_manager_key))
    return [
        str(assets.kube_controller_manager),
        f"--kubeconfig={kubeconfig}",
        f"--controllers={','.join(CONTROLLERS)}",
        "--use-service-account-credentials=true",
        "--leader-elect=false",
        "--secure-port=0",  # nothing scrapes it; readiness is read from the apiserver
        # Quota status and garbage collection pick up kinds installed after the start (our CRDs)
        # at their discovery resync (30s by default): a few seconds keeps the tests' waits short.
        "--resource-quota-sync-period=5s",
        "--v=1",
    ]


def _wait_controllers(plane: ControlPlane, *, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the controller manager has started every controller (their ServiceAccounts exist)."""
    context = plane.admin_ssl_context()
    deadline = time.monotonic() + _READY_TIMEOUT
    url = f"{plane.url}/api/v1/namespaces/kube-system/serviceaccounts"
    found: set[str] = set()
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"kube-controller-manager exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            # The URL is our own https:// apiserver address.
            with urllib.request.urlopen(url, context=context, timeout=5) as reply:  # noqa: S310
                found = {item["metadata"]["name"] for item in json.load(reply).get("items", [])}
            if found.issuperset(CONTROLLER_ACCOUNTS):
                return
        time.sleep(0.25)
    missing = sorted(set(CONTROLLER_ACCOUNTS) - found)
    raise RuntimeError(f"kube-controller-manager did not start {', '.join(missing)} in {_READY_TIMEOUT:.0f}s")


def _allow_issuer_discovery(plane: ControlPlane) -> None:
    """Anyone may read the issuer's discovery document and keys (another apiserver's JWT
    authenticator fetches them without credentials)."""
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "service-account-issuer-discovery-unauthenticated"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "system:service-account-issuer-discovery"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                             "name": "system:unauthenticated"}]}
    # The URL is our own https:// apiserver address.
    request = urllib.request.Request(f"{plane.url}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",  # noqa: S310
                                     data=json.dumps(binding).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    # The URL is our own https:// apiserver address.
    with urllib.request.urlopen(request, context=plane.admin_ssl_context(), timeout=10):  # noqa: S310
        pass


def start(*, assets: Assets | None = None, workdir: Path | None = None,
          apiserver_flags: Sequence[str] = (), controller_manager: bool = False,
          serve_issuer: bool = False, trust: Sequence[JwtIssuer] = (),
          audit_requests: Sequence[str] = ()) -> ControlPlane:
    """Start a fresh control plane; the caller must ``stop()`` it (or use it as a context manager).

    ``apiserver_flags`` win over the defaults (the fault tests turn API Priority and Fairness on,
    the test node turns the ServiceAccount admission back on): a default whose flag they name is
    left out, since list flags such as ``--disable-admission-plugins`` append rather than replace.
    ``controller_manager`` adds a kube-controller-manager running :data:`CONTROLLERS` and returns
    once each has started.  ``serve_issuer``: the ServiceAccount issuer is this apiserver's own URL,
    its discovery readable by anyone; ``trust``: other issuers whose tokens it accepts (a structured
    authentication configuration)."""
    assets = assets or ensure_assets(controller_manager=controller_manager)
    owns = workdir is None
    root = Path(tempfile.mkdtemp(prefix="stageset-envtest-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    pki = write_pki(root / "pki")
    etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{api_port}"
    plane = ControlPlane(workdir=root, url=url, pki=pki, kubeconfig=root / "kubeconfig",
                         _owns_workdir=owns, etcd_url=f"http://127.0.0.1:{etcd_port}",
                         controller_manager=controller_manager)
    if serve_issuer:
        plane.issuer = url
    federation = [f"--service-account-issuer={plane.issuer}"]
    if trust:
        config = root / "authentication-config.yaml"
        config.write_text(yaml.safe_dump(authentication_config(trust, own_url=url)))
        federation.append(f"--authentication-config={config}")
    write_kubeconfig(path=plane.kubeconfig, url=url, pki=pki)
    logs = [root / "etcd.log", root / "kube-apiserver.log"]
    # Metadata-level audit of every request: tests and benchmarks count writes from it.
    policy = root / "audit-policy.yaml"
    bodies = "".join(f"  - level: Request\n    resources: [{{group: \"\", resources: [{json.dumps(r)}]}}]\n"
                     for r in audit_requests)
    policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
                      f"rules:\n{bodies}  - level: Metadata\n")
    try:
        plane._processes.append(_spawn([
            str(assets.etcd),
            "--name=default",
            f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ], log=logs[0]))
        named = {flag.split("=", 1)[0] for flag in apiserver_flags}
        defaults = [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={root / 'certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            *federation,
            f"--service-account-key-file={pki.sa_public}",
            f"--service-account-signing-key-file={pki.sa_private}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--disable-admission-plugins=ServiceAccount",
            "--shutdown-delay-duration=0s",
            f"--audit-policy-file={policy}",
            # Reaching a kubelet (the test node's pods/log, exec): by the node's InternalIP (its
            # name resolves nowhere), presenting the admin's certificate, which the kubelet's
            # client CA (this plane's) accepts.  Unused where no node runs.
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--audit-log-path={plane.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxbackup=0",
            "--v=1",
        ]
        plane._apiserver = [
            str(assets.kube_apiserver),
            *(flag for flag in defaults if flag.split("=", 1)[0] not in named),
            *apiserver_flags,
        ]
        plane._processes.append(_spawn(plane._apiserver, log=logs[1]))
        _wait_ready(plane, logs=logs)
        if serve_issuer:
            _allow_issuer_discovery(plane)
        if controller_manager:
            log = root / "kube-controller-manager.log"
            plane._processes.append(_spawn(_controller_manager_args(plane, assets=assets), log=log))
            _wait_controllers(plane, process=plane._processes[-1], log=log)
    except BaseException:
        plane.stop()
        raise
    return plane


@contextlib.contextmanager
def running() -> Iterator[ControlPlane]:
    plane = start()
    try:
        yield plane
    finally:
        plane.stop()
