"""A NetworkPolicy enforcer for the test node: kube-router's network policy controller, built from the
Go module proxy, and the one image the packet tests run (``hack/netcheck``).

Why kube-router: it enforces NetworkPolicies with iptables and ipset alone (per-pod chains in the
filter table, ``physdev`` matches for bridged traffic, ipsets of the selected pods' addresses), so it
works on the test node's plain Linux bridge with no CNI of its own.  This machine's kernel has what
it needs built in (``CONFIG_IP_SET``, ``CONFIG_NETFILTER_XT_SET``, ``..._MATCH_PHYSDEV``,
``..._MATCH_CONNTRACK``, ``..._MATCH_COMMENT``, ``..._TARGET_NFLOG``, ``CONFIG_BRIDGE_NETFILTER``; no
loadable modules at all); :func:`unavailable` says why it cannot run where one is missing.  The
nftables-only enforcers (kube-network-policies) need ``CONFIG_NFT_QUEUE``, which this kernel lacks.

Build (as every Go tool of the tests, :mod:`stageset.envtest.gotool`): the checked-in wrapper module
``hack/kube-router`` requires ``github.com/cloudnativelabs/kube-router/v2`` at
:data:`KUBE_ROUTER_VERSION` (the only version the module proxy serves here; security flaws are
reported against it — acceptable for a test fixture that programs only the test node's own bridge
and reads only the test's objects, never for a cluster) and ``cmd/kube-router``
is built into ``<cache>/tools/kube-router-<version>/kube-router`` once; ``STAGESET_KUBE_ROUTER``
names a binary to use instead.  ``hack/netcheck`` (a few dozen lines of Go, no dependencies) is
packed like the pause image into ``<cache>/node/netcheck-r<recipe>/netcheck.oci.tar``.

Run: :func:`start_enforcer` runs ``kube-router --run-firewall`` (no routing, no service proxy) for a
:class:`~stageset.envtest.nodeplane.Node`, as the node's admin (the module's identity note there);
the node stops it with its other processes and then :func:`cleanup` removes its chains and ipsets.

Identity: kube-router reads pods, namespaces and NetworkPolicies as the node's admin (the control
plane's ``system:masters``: the node is a fixture).  Building touches no cluster.
"""

from __future__ import annotations

import fcntl
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stageset.build.kustomize import cache_root, run_go
from stageset.envtest.gotool import HACK, GoTool
from stageset.envtest.node import one_file_image

KUBE_ROUTER_VERSION = "v2.1.0"
KUBE_ROUTER_MODULE = "github.com/cloudnativelabs/kube-router/v2"
KUBE_ROUTER = GoTool(name="kube-router", version=KUBE_ROUTER_VERSION, module=KUBE_ROUTER_MODULE,
                     package=f"{KUBE_ROUTER_MODULE}/cmd/kube-router", binary="kube-router",
                     env_override="STAGESET_KUBE_ROUTER",
                     ldflags=f"-X {KUBE_ROUTER_MODULE}/pkg/version.Version={KUBE_ROUTER_VERSION}",
                     nosumdb="github.com/cloudnativelabs")
NETCHECK_SOURCE = HACK / "netcheck"
NETCHECK_IMAGE = "stageset.local/netcheck:1"
_NETCHECK_RECIPE = 1
_NETCHECK_ARCHIVE = "netcheck.oci.tar"
_KERNEL = ("CONFIG_IP_SET", "CONFIG_IP_SET_HASH_IP", "CONFIG_IP_SET_HASH_NET", "CONFIG_NETFILTER_XT_SET",
           "CONFIG_NETFILTER_XT_MATCH_PHYSDEV", "CONFIG_NETFILTER_XT_MATCH_CONNTRACK",
           "CONFIG_NETFILTER_XT_MATCH_COMMENT", "CONFIG_NETFILTER_XT_TARGET_NFLOG", "CONFIG_BRIDGE_NETFILTER")


def ensure_kube_router(*, log: bool = True) -> Path:
    """The kube-router binary, built once into the cache if needed."""
    return KUBE_ROUTER.ensure(log=log)


def netcheck_archive() -> Path:
    return cache_root() / "node" / f"netcheck-r{_NETCHECK_RECIPE}" / _NETCHECK_ARCHIVE


def ensure_netcheck_image() -> Path:
    """The netcheck image's OCI archive (``/netcheck`` as root: the DNS role binds port 53)."""
    archive = netcheck_archive()
    if archive.is_file():
        return archive
    if shutil.which("umoci") is None:
        raise RuntimeError("umoci (Debian's package) is needed to pack the netcheck image; "
                           "hack/bootstrap.sh installs it")
    archive.parent.parent.mkdir(parents=True, exist_ok=True)
    with (archive.parent.parent / f".netcheck-r{_NETCHECK_RECIPE}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file():
            return archive
        with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=archive.parent.parent) as tmp:
            binary = Path(tmp) / "netcheck"
            run_go(["build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", str(binary), "."],
                   cwd=NETCHECK_SOURCE)
            staged = Path(tmp) / "out"
            staged.mkdir()
            work = Path(tmp) / "image"
            work.mkdir()
            one_file_image(binary=binary, file_name="netcheck", tag=NETCHECK_IMAGE.rsplit(":", 1)[1],
                           user="0:0", out=staged / _NETCHECK_ARCHIVE, work=work)
            if archive.parent.exists():
                shutil.rmtree(archive.parent)
            staged.rename(archive.parent)
    return archive


def unavailable() -> str | None:
    """Why kube-router cannot enforce NetworkPolicies here, or None (the node's own reasons aside)."""
    if shutil.which("ipset") is None:
        return "the NetworkPolicy enforcer needs Debian's ipset (hack/bootstrap.sh installs it)"
    config = Path("/proc/config.gz")
    if config.is_file():
        import gzip

        built = {line.split("=", 1)[0] for line in gzip.decompress(config.read_bytes()).decode().splitlines()
                 if line.endswith(("=y", "=m"))}
        missing = [option for option in _KERNEL if option not in built]
        if missing:
            return ("this kernel lacks what kube-router's iptables/ipset enforcement needs: "
                    f"{', '.join(missing)}")
    probe = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"ipset cannot reach the kernel here: {probe.stderr.strip()[:300]}"
    return None


def enforcer_args(*, binary: Path, kubeconfig: Path, node_name: str, service_cidr: str) -> list[str]:
    """kube-router as a network policy controller only, for one node."""
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--hostname-override={node_name}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--enable-ipv4=true", "--enable-ipv6=false", f"--service-cluster-ip-range={service_cidr}",
            "--iptables-sync-period=5s", "--metrics-port=0", "--health-port=0", "--v=1"]


_CHAINS = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
_IPSETS = ("KUBE-SRC-", "KUBE-DST-")


def cleanup() -> None:
    """Remove what kube-router's policy controller programmed: the jumps from INPUT, FORWARD and
    OUTPUT, its chains (``KUBE-ROUTER-*``, ``KUBE-POD-FW-*``, ``KUBE-NWPLCY-*``) and its ipsets
    (``KUBE-SRC-*``, ``KUBE-DST-*``) — what its controller's own ``Cleanup`` removes, and nothing
    else (``kube-router --cleanup-config`` would also flush IPVS and routing state it never made
    here)."""
    saved = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True,
                           check=False).stdout
    chains = [line[1:].split()[0] for line in saved.splitlines()
              if line.startswith(":") and line[1:].startswith(_CHAINS)]
    for line in saved.splitlines():
        parts = shlex.split(line) if line.startswith("-A ") else []
        target = parts[parts.index("-j") + 1] if "-j" in parts[:-1] else ""
        if parts[:1] == ["-A"] and parts[1] in ("INPUT", "FORWARD", "OUTPUT") and target.startswith(_CHAINS):
            subprocess.run(["iptables", "-t", "filter", "-D", *parts[1:]], capture_output=True, check=False)
    for chain in chains:
        subprocess.run(["iptables", "-t", "filter", "-F", chain], capture_output=True, check=False)
    for chain in chains:
        subprocess.run(["iptables", "-t", "filter", "-X", chain], capture_output=True, check=False)
    listed = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False).stdout
    for name in listed.split():
        if name.startswith(_IPSETS):
            subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)


def main(argv: list[str]) -> int:
    """``python -m stageset.envtest.netpol [--update]``: build (or find) kube-router and the image."""
    if "--update" in argv:
        KUBE_ROUTER.update_wrapper(generator="python -m stageset.envtest.netpol")
    print(ensure_kube_router())
    print(ensure_netcheck_image())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
