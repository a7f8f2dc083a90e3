"""A single real node for the tests: containerd, kubelet, kube-proxy, kube-scheduler and
kube-controller-manager beside a control plane of :mod:`stageset.envtest.server`.

What runs, and where:

- **Network.** A Linux bridge the node creates (``stgs<pid>``, a free ``10.213.N.0/24``; the host
  side holds ``.1``) is the whole pod network: the CNI ``bridge`` plugin (Debian's
  ``containernetworking-plugins``) attaches every pod to it, ``host-local`` hands out addresses,
  no masquerading and no forwarding, so a pod reaches only the bridge's host address.  The
  kube-apiserver stays on loopback and advertises the bridge address; a :class:`Relay` in the test
  process carries the bridge address's port to loopback, so the ``kubernetes`` Service (kube-proxy
  in iptables mode, NodePorts only on the bridge) reaches it from a pod.  :meth:`Node.expose` does
  the same for any loopback server a test runs (a Git server, for example).
- **Runtime.** containerd and runc from Debian, with root, state, socket and CNI configuration in
  the node's own directories (never ``/etc/containerd`` or ``/var/lib/containerd``), sandbox image
  :data:`~stageset.envtest.node.PAUSE_IMAGE` imported from the locally built archive; images reach
  the node by :meth:`Node.import_image` (``ctr images import``) or are pulled from a loopback
  registry the test runs and names with :meth:`Node.trust_registry` (plain HTTP, a ``hosts.toml``
  in the node's own ``certs.d``); nothing is pulled from anywhere else.
- **Node.** kubelet with the cgroupfs driver, ``failCgroupV1: false`` (these machines mount the v1
  controllers), image GC and disk eviction off (a full disk elsewhere must not evict the test's
  pods), its API on the bridge address only, its read-only port off.

Identity: every component (kubelet, kube-proxy, scheduler, controller-manager) acts as the control
plane's ``system:masters`` admin: the node is a test fixture, not a model of node authorization.
The pods act as their ServiceAccounts (the ServiceAccount admission is on, tokens are projected).

- **NetworkPolicies**, where a test asks (:meth:`Node.enforce_network_policies`): kube-router's
  network policy controller (:mod:`stageset.envtest.netpol`) programs per-pod iptables chains and
  ipsets; bridged pod-to-pod packets pass the host's FORWARD chain (``br_netfilter``), where it
  matches them.  Without it, policies are stored and change nothing, as on a cluster whose network
  plugin does not enforce them.

Invariants: everything the node starts is stopped by :meth:`Node.stop` (processes in their own
sessions, asked to die with the test process), the bridge is deleted and kube-proxy's iptables
chains are removed (``kube-proxy --cleanup``), and kube-router's chains and ipsets too; the
pods' cgroups go with their containers.
:func:`unavailable` says, before anything starts, why a node cannot run here (not root, a
missing package, no usable cgroup controllers), so callers skip with that reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from stageset.envtest import netpol
from stageset.envtest.build import ensure_assets
from stageset.envtest.node import PAUSE_IMAGE, NodeAssets, ensure_node_assets
from stageset.envtest.server import ControlPlane, _die_with_parent, free_port
from stageset.envtest.server import start as start_plane

CNI_BIN = Path("/usr/lib/cni")
SERVICE_CIDR = "10.0.0.0/24"  # the control plane's --service-cluster-ip-range
NAMESPACE = "k8s.io"  # containerd's namespace for the CRI
_DEBIAN_TOOLS = {"containerd": "containerd", "ctr": "containerd", "containerd-shim-runc-v2": "containerd",
                 "runc": "runc", "iptables": "iptables", "conntrack": "conntrack", "ip": "iproute2",
                 "umoci": "umoci"}
_CNI_PLUGINS = ("bridge", "host-local", "loopback")
_CGROUP_V1 = Path("/sys/fs/cgroup")
_CONTROLLERS = ("cpu", "memory", "pids")
_READY_TIMEOUT = 180.0
_LOCK = Path(tempfile.gettempdir()) / "stageset-node.lock"


def unavailable() -> str | None:
    """Why a node cannot start on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "the test node needs root (containerd, cgroups, a bridge, iptables)"
    missing = sorted({package for tool, package in _DEBIAN_TOOLS.items() if shutil.which(tool) is None}
                     | {"containernetworking-plugins" for plugin in _CNI_PLUGINS
                        if not (CNI_BIN / plugin).is_file()})
    if missing:
        return (f"the test node needs the Debian packages {', '.join(missing)} "
                "(hack/bootstrap.sh installs them)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the test node needs the overlay filesystem (containerd's overlayfs snapshotter)"
    return _cgroup_problem()


def _cgroup_problem() -> str | None:
    unified = _CGROUP_V1 / "cgroup.controllers"
    if unified.is_file():  # cgroup v2 alone: the controllers must be delegable from the root
        enabled = set(unified.read_text().split())
        lacking = [name for name in _CONTROLLERS if name not in enabled]
        return f"cgroup v2 without the {', '.join(lacking)} controllers" if lacking else None
    lacking = [name for name in _CONTROLLERS if not os.access(_CGROUP_V1 / name, os.W_OK)]
    if lacking:
        return f"no writable cgroup v1 hierarchy for {', '.join(lacking)} under {_CGROUP_V1}"
    return None


# --------------------------------------------------------------------------- the relay


class Relay:
    """A TCP relay from ``listen`` to ``target``, in threads of the test process.

    Used to carry a port of the bridge's host address to a server on loopback: the server stays
    unreachable from anywhere but the pod network the test made."""

    def __init__(self, *, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(listen)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"relay-{self.address[1]}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
            finished = threading.Semaphore(0)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink, finished), daemon=True).start()
            threading.Thread(target=self._reap, args=(client, upstream, finished), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, finished: threading.Semaphore) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            finished.release()

    def _reap(self, client: socket.socket, upstream: socket.socket, finished: threading.Semaphore) -> None:
        """Close a connection's two ends once both directions have ended."""
        finished.acquire()
        finished.acquire()
        with self._lock:
            self._open.difference_update((client, upstream))
        for end in (client, upstream):
            with contextlib.suppress(OSError):
                end.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ends = list(self._open)
            self._open.clear()
        with contextlib.suppress(OSError):
            self._server.close()
        for end in ends:
            with contextlib.suppress(OSError):
                end.close()


# --------------------------------------------------------------------------- the node


@dataclass
class Node:
    """A running node registered with ``plane``; :meth:`stop` ends everything it started."""

    plane: ControlPlane
    name: str
    workdir: Path
    bridge: str
    network: ipaddress.IPv4Network
    assets: NodeAssets
    controller_manager: Path
    """The control plane's kube-controller-manager binary (run here with a node's controllers)."""
    _processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list, repr=False)
    _relays: list[Relay] = field(default_factory=list, repr=False)
    _cleanups: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _owns_plane: bool = False
    _lock: IO[str] | None = field(default=None, repr=False)

    @property
    def host_ip(self) -> str:
        """The bridge's host address: what pods reach, and all they reach."""
        return str(self.network.network_address + 1)

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        """The containers' logs (``<namespace>_<pod>_<uid>/<container>/<restart>.log``), kept here
        rather than in the host's ``/var/log/pods``."""
        return self.workdir / "pod-logs"

    def log(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def ctr(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
                                capture_output=True, text=True, check=False, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {result.stderr[-2000:]}")
        return result.stdout

    def import_image(self, archive: Path, *, name: str) -> str:
        """Import an OCI archive under ``name`` (``repo:tag``; the archive's one tag is replaced)."""
        base, tag = name.rsplit(":", 1)
        self.ctr("images", "import", "--base-name", base, str(archive))
        refs = [line.split()[0] for line in self.ctr("images", "list").splitlines()[1:] if line.strip()]
        imported = [ref for ref in refs if ref.startswith(f"{base}:")]
        if not imported:
            raise RuntimeError(f"importing {archive} produced no {base}:* image (found {refs})")
        if f"{base}:{tag}" not in imported:
            self.ctr("images", "tag", "--force", imported[0], name)
        return name

    def trust_registry(self, host: str) -> None:
        """Let containerd pull from the plain-HTTP registry ``host`` (``127.0.0.1:<port>``): a
        ``hosts.toml`` in the node's own ``certs.d``, read on every pull.  containerd runs on the
        host, so a loopback registry is reached as it is (the kubelet asks, containerd pulls);
        the pods never talk to the registry."""
        _write(self.workdir / "certs.d" / host / "hosts.toml",
               f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n')

    def expose(self, port: int) -> tuple[str, int]:
        """Carry the bridge address's ``port`` to ``127.0.0.1:port``: a loopback server, reached
        from the pod network only (the bridge is not routed anywhere else)."""
        relay = Relay(listen=(self.host_ip, port), target=("127.0.0.1", port))
        self._relays.append(relay)
        return relay.address

    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        return dict(self._processes)

    def enforce_network_policies(self) -> None:
        """Run kube-router's network policy controller for this node (:mod:`stageset.envtest.netpol`);
        stopped, and its chains and ipsets removed, by :meth:`stop`.  Raises with the reason where
        it cannot run."""
        reason = netpol.unavailable()
        if reason:
            raise RuntimeError(reason)
        binary = netpol.ensure_kube_router(log=False)
        self._cleanups.append(netpol.cleanup)
        args = netpol.enforcer_args(binary=binary, kubeconfig=_kubeconfig(self), node_name=self.name,
                                    service_cidr=SERVICE_CIDR)
        self._processes.append(("kube-router", _spawn(args, log=self.log("kube-router"))))

    def stop(self) -> None:
        for _, process in reversed(self._processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for _, process in reversed(self._processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        self._processes.clear()
        for cleanup in self._cleanups:
            cleanup()
        self._cleanups.clear()
        _kill_shims(self.workdir)
        for relay in self._relays:
            relay.close()
        self._relays.clear()
        subprocess.run([str(self.assets.command("kube-proxy")), "--cleanup", "--v=0"],
                       capture_output=True, check=False, timeout=60)
        _remove_kubelet_chains()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        _unmount_under(self.workdir)
        if self._owns_plane:
            self.plane.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()  # releases the machine's node lock
            self._lock = None

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_shims(workdir: Path) -> None:
    """containerd's shims outlive containerd on purpose; ours (started with our socket) do not."""
    marker = str(workdir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if b"containerd-shim" in cmdline and marker in cmdline:
                os.kill(int(proc.name), signal.SIGKILL)


# What the kubelet adds to the host's iptables (kube-proxy --cleanup leaves it): its canaries, the
# backend hint and KUBE-FIREWALL (drops non-loopback packets to 127/8), hooked into INPUT and OUTPUT.
_KUBELET_CHAINS = (("filter", "KUBE-FIREWALL"), ("filter", "KUBE-KUBELET-CANARY"),
                   ("nat", "KUBE-KUBELET-CANARY"), ("mangle", "KUBE-KUBELET-CANARY"),
                   ("mangle", "KUBE-IPTABLES-HINT"))


def _remove_kubelet_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        for hook in ("INPUT", "OUTPUT"):
            subprocess.run([tool, "-t", "filter", "-D", hook, "-j", "KUBE-FIREWALL"], capture_output=True,
                           check=False)
        for table, chain in _KUBELET_CHAINS:
            subprocess.run([tool, "-t", table, "-F", chain], capture_output=True, check=False)
            subprocess.run([tool, "-t", table, "-X", chain], capture_output=True, check=False)


def _unmount_under(directory: Path) -> None:
    """The kubelet and containerd mount volumes and root filesystems under the node's directory."""
    prefix = str(directory)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)


def _free_network() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for third in range(256):
        network = ipaddress.IPv4Network(f"10.213.{third}.0/24")
        if f" 10.213.{third}." not in used:
            return network
    raise RuntimeError("no free 10.213.N.0/24 for the test node's bridge")


def _spawn(args: list[str], *, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent, env=env)


def _containerd_config(node: Node) -> str:
    root = node.workdir
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root / 'containerd' / 'root'}"
state = "{root / 'containerd' / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / 'containerd' / 'opt'}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  enable_selinux = false
  # No pod below containerd's own OOM score: lowering it needs CAP_SYS_RESOURCE, which root lacks in
  # some sandboxes (these machines), and the kubelet asks -998 for every pod sandbox.
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{os.environ.get('STAGESET_NODE_RUNC') or shutil.which('runc') or 'runc'}"
[{cri}.registry]
  # hosts.toml per registry (Node.trust_registry): a plain-HTTP registry on loopback is pulled from.
  config_path = "{root / 'certs.d'}"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{root / 'cni'}"
  max_conf_num = 1
"""


def _cni_config(node: Node) -> dict[str, Any]:
    return {
        "cniVersion": "0.4.0",
        "name": "stageset-test",
        "plugins": [{
            "type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(node.workdir / "ipam"),
                     "ranges": [[{"subnet": str(node.network), "gateway": node.host_ip}]],
                     "routes": [{"dst": "0.0.0.0/0"}]},
        }],
    }


def _kubeconfig(node: Node) -> Path:
    """The admin's credentials for the node's components (see the module's identity note)."""
    return node.plane.kubeconfig


def _kubelet_config(node: Node) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": node.host_ip,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(node.plane.pki.ca_cert)}},
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "resolvConf": str(node.workdir / "resolv.conf"),
        "podLogsDir": str(node.pod_logs),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                         "imagefs.available": "0%", "imagefs.inodesFree": "0%"},
        "serializeImagePulls": False,
        "maxPods": 30,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
    }


def _proxy_config(node: Node) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(_kubeconfig(node))},
        "hostnameOverride": node.name,
        "bindAddress": node.host_ip,
        "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        "clusterCIDR": str(node.network),
        "nodePortAddresses": [f"{node.host_ip}/32"],
        "iptables": {"localhostNodePorts": False, "syncPeriod": "5s", "minSyncPeriod": "0s"},
        # Leave the host's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _components(node: Node) -> list[tuple[str, list[str]]]:
    kubeconfig = str(_kubeconfig(node))
    pki = node.plane.pki
    return [
        ("kube-controller-manager", [
            str(node.controller_manager), f"--kubeconfig={kubeconfig}",
            "--leader-elect=false", "--use-service-account-credentials=false",
            f"--root-ca-file={pki.ca_cert}", f"--service-account-private-key-file={pki.sa_private}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--controllers=*,-nodeipam,-bootstrapsigner,-tokencleaner,-csrsigning,-csrapproving",
            "--node-monitor-grace-period=40s", "--v=1"]),
        ("kube-scheduler", [
            str(node.assets.command("kube-scheduler")), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--v=1"]),
        ("kubelet", [
            str(node.assets.command("kubelet")), f"--config={node.workdir / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}", f"--root-dir={node.workdir / 'kubelet'}",
            f"--cert-dir={node.workdir / 'kubelet-pki'}", f"--hostname-override={node.name}",
            f"--node-ip={node.host_ip}", "--v=1"]),
        ("kube-proxy", [
            str(node.assets.command("kube-proxy")), f"--config={node.workdir / 'kube-proxy.yaml'}", "--v=1"]),
    ]


def _check_alive(node: Node) -> None:
    for name, process in node._processes:
        if process.poll() is not None:
            tail = node.log(name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")


def _api_get(node: Node, path: str, context: ssl.SSLContext) -> dict[str, Any]:
    with urllib.request.urlopen(f"{node.plane.url}{path}", context=context, timeout=5) as reply:  # noqa: S310
        return json.loads(reply.read())  # type: ignore[no-any-return]


def _wait(node: Node, what: str, check: Any) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    last = "no answer"
    while time.monotonic() < deadline:
        _check_alive(node)
        try:
            if check():
                return
        except (urllib.error.URLError, OSError, RuntimeError) as error:
            last = str(error)
        time.sleep(0.5)
    raise RuntimeError(f"{what} not reached after {_READY_TIMEOUT:.0f}s ({last}); logs in {node.workdir}")


def node_ready(node: Node, context: ssl.SSLContext) -> bool:
    obj = _api_get(node, f"/api/v1/nodes/{node.name}", context)
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def start(*, name: str = "stageset-node") -> Node:
    """Start a control plane and a node beside it, and wait for the node Ready; the caller must
    :meth:`Node.stop` it (or use :func:`running`).

    The control plane is the tests' usual one (:func:`stageset.envtest.server.start`) but advertises
    the bridge address (the ``kubernetes`` Service's endpoint, relayed to loopback) and has the
    ServiceAccount admission on, so pods get their tokens as on any cluster."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    # One node per machine at a time: kube-proxy programs the host's iptables for the Service range
    # every control plane here shares, and its clean-up would remove another node's rules.
    lock = _LOCK.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assets = ensure_node_assets(log=False)
        control = ensure_assets(log=False)  # with its kube-controller-manager
        network = _free_network()
        host_ip = str(network.network_address + 1)
        plane = start_plane(assets=control, apiserver_flags=[
            f"--advertise-address={host_ip}", "--disable-admission-plugins=",
            "--service-account-extend-token-expiration=false"])
    except BaseException:
        lock.close()
        raise
    # Unix socket paths are short (108 bytes): the node lives in a short directory of its own.
    workdir = Path(tempfile.mkdtemp(prefix="stageset-node-", dir="/tmp"))
    node = Node(plane=plane, name=name, workdir=workdir, bridge=f"stgs{os.getpid() % 100000}",
                network=network, assets=assets, controller_manager=control.kube_controller_manager,
                _owns_plane=True, _lock=lock)
    try:
        _bring_up(node)
    except BaseException:
        node.stop()
        raise
    return node


def _bring_up(node: Node) -> None:
    subprocess.run(["ip", "link", "add", node.bridge, "type", "bridge"], check=True, capture_output=True)
    subprocess.run(["ip", "addr", "add", f"{node.host_ip}/{node.network.prefixlen}", "dev", node.bridge],
                   check=True, capture_output=True)
    subprocess.run(["ip", "link", "set", node.bridge, "up"], check=True, capture_output=True)
    # The apiserver's port on the bridge address: the `kubernetes` Service's endpoint.
    port = int(node.plane.url.rsplit(":", 1)[1])
    node.expose(port)
    _write(node.workdir / "resolv.conf", "# the test node has no DNS\noptions ndots:1\n")
    _write(node.workdir / "cni" / "10-stageset.conflist", json.dumps(_cni_config(node), indent=2))
    config = _write(node.workdir / "containerd.toml", _containerd_config(node))
    node._processes.append(("containerd", _spawn(["containerd", "--config", str(config)],
                                                 log=node.log("containerd"))))
    _wait(node, "containerd's socket", lambda: node.socket.exists() and bool(node.ctr("version", timeout=10)))
    node.import_image(node.assets.pause_archive, name=PAUSE_IMAGE)
    _write(node.workdir / "kubelet.yaml", yaml.safe_dump(_kubelet_config(node)))
    _write(node.workdir / "kube-proxy.yaml", yaml.safe_dump(_proxy_config(node)))
    for component, args in _components(node):
        node._processes.append((component, _spawn(args, log=node.log(component))))
    context = node.plane.admin_ssl_context()
    _wait(node, f"node {node.name} Ready", lambda: node_ready(node, context))


@contextlib.contextmanager
def running(*, name: str = "stageset-node") -> Iterator[Node]:
    node = start(name=name)
    try:
        yield node
    finally:
        node.stop()
