"""Build what the test node runs (kubelet, kube-proxy, kube-scheduler and a pause image) from the Go
module proxy, cached outside the checkout.  Its kube-controller-manager is the control plane's own
(:mod:`stageset.envtest.build`), run with the controllers a node needs.

The three Kubernetes commands come from the same release as the control plane's kube-apiserver
(:data:`stageset.envtest.build.KUBERNETES_VERSION`), through a checked-in wrapper module of their
own, ``hack/node``, which requires ``k8s.io/kubernetes`` and replaces its ``./staging`` modules with
the published ``v0.x.y`` of the same release exactly as ``hack/controlplane/kube-apiserver`` does
(``--update`` derives the replace lines from the control plane's wrapper, never by hand).  Keeping
them apart from the control plane's own build means a test that never starts a node never pays
for them; the Go build cache is shared, so the packages the apiserver already compiled are not
compiled again.

The pod sandbox image is ``hack/pause`` (a few lines of Go, no dependencies) built static and
packed by ``umoci`` (Debian's package) into a one-layer OCI archive: the node needs no registry.
containerd, runc and the CNI plugins are Debian packages (:mod:`stageset.envtest.nodeplane`
checks them; ``hack/bootstrap.sh`` installs them).

Everything lands in ``<cache>/node/kube-<version>_r<recipe>/``, published atomically under a lock
(parallel test workers), so a half-built directory is never taken for a cache hit.
``STAGESET_NODE_ASSETS`` naming a directory with every file uses it instead (nothing is built).

Identity: none.  Building touches no cluster.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stageset.build.kustomize import CHECKSUM_FAILURE, GoError, cache_root, run_go
from stageset.envtest.build import KUBERNETES_VERSION, WRAPPERS, version_ldflags

HACK = Path(__file__).resolve().parents[2] / "hack"
WRAPPER = HACK / "node"
PAUSE_SOURCE = HACK / "pause"
COMMANDS = ("kubelet", "kube-proxy", "kube-scheduler")
PAUSE_ARCHIVE = "pause.oci.tar"
PAUSE_IMAGE = "stageset.local/pause:1"
"""The sandbox image's name in containerd (``sandbox_image``); never pulled, always imported."""
# Bumped when the recipe changes what the files are.
_RECIPE = 1
_FILES = (*COMMANDS, PAUSE_ARCHIVE)
_NOSUMDB = "k8s.io,sigs.k8s.io,go.etcd.io"
_CREATED = "2023-11-14T22:13:20Z"


@dataclass(frozen=True)
class NodeAssets:
    """Where the node's binaries and its sandbox image archive live."""

    directory: Path

    def command(self, name: str) -> Path:
        if name not in COMMANDS:
            raise KeyError(name)
        return self.directory / name

    @property
    def pause_archive(self) -> Path:
        return self.directory / PAUSE_ARCHIVE


def assets_dir() -> Path:
    return cache_root() / "node" / f"kube-{KUBERNETES_VERSION}_r{_RECIPE}"


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in _FILES)


def _run(args: list[str], *, cwd: Path | None = None) -> None:
    result = subprocess.run(args, cwd=cwd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)[:300]} failed ({result.returncode}):\n"
                           f"{(result.stderr or result.stdout)[-3000:]}")


def _go_build(command: list[str], *, cwd: Path) -> None:
    try:
        run_go(command, cwd=cwd)
    except GoError as error:
        if not CHECKSUM_FAILURE.search(str(error)):
            raise
        run_go(command, cwd=cwd, extra_env={"GONOSUMDB": _NOSUMDB})


def pause_image(*, binary: Path, out: Path, work: Path) -> None:
    """A one-layer OCI archive holding ``/pause`` (root-owned, fixed timestamps), tagged ``1``."""
    one_file_image(binary=binary, file_name="pause", tag=PAUSE_IMAGE.rsplit(":", 1)[1], user="65535:65535",
                   out=out, work=work)


def one_file_image(*, binary: Path, file_name: str, tag: str, user: str, out: Path, work: Path) -> None:
    """A one-layer OCI archive holding ``/<file_name>`` as its entrypoint (root-owned, fixed
    timestamps: the same binary gives the same archive), run as ``user``, tagged ``tag``."""
    rootfs = work / "rootfs"
    rootfs.mkdir()
    shutil.copy2(binary, rootfs / file_name)
    os.utime(rootfs / file_name, (1700000000, 1700000000))
    layer = work / "layer.tar"
    _run(["tar", "--create", "--file", str(layer), "--directory", str(rootfs), "--numeric-owner",
          "--owner=0", "--group=0", "--mtime=@1700000000", file_name])
    layout = work / "oci"
    image = f"{layout}:{tag}"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", image])
    _run(["umoci", "raw", "add-layer", "--image", image, "--history.created", _CREATED, str(layer)])
    _run(["umoci", "config", "--image", image, "--no-history", "--created", _CREATED, "--os", "linux",
          "--architecture", "amd64", "--config.user", user, "--config.entrypoint", f"/{file_name}"])
    _run(["umoci", "gc", "--layout", str(layout)])
    _run(["tar", "--create", "--file", str(out), "--directory", str(layout), "--sort=name",
          "--numeric-owner", "--mtime=@1700000000", "."])


def _build_into(target: Path, *, log: bool) -> None:
    if shutil.which("umoci") is None:
        raise RuntimeError("umoci (Debian's package) is needed to pack the pause image; "
                           "hack/bootstrap.sh installs it")
    with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=target.parent) as tmp:
        staged = Path(tmp) / "bin"
        staged.mkdir()
        stamped = version_ldflags(KUBERNETES_VERSION)
        for name in COMMANDS:
            if log:
                print(f"building {name} {KUBERNETES_VERSION} from the Go module proxy ...", file=sys.stderr,
                      flush=True)
            _go_build(["build", "-mod=readonly", "-trimpath", "-buildvcs=false", "-ldflags",
                       f"-s -w {stamped}", "-o", str(staged / name), f"k8s.io/kubernetes/cmd/{name}"],
                      cwd=WRAPPER)
        pause = Path(tmp) / "pause"
        run_go(["build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", str(pause), "."],
               cwd=PAUSE_SOURCE)
        work = Path(tmp) / "pause-image"
        work.mkdir()
        pause_image(binary=pause, out=staged / PAUSE_ARCHIVE, work=work)
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)


def ensure_node_assets(*, log: bool = True) -> NodeAssets:
    """The node's binaries and pause image, built once into the cache if needed."""
    override = os.environ.get("STAGESET_NODE_ASSETS")
    if override:
        if _complete(Path(override)):
            return NodeAssets(Path(override))
        raise RuntimeError(f"STAGESET_NODE_ASSETS={override} lacks one of {', '.join(_FILES)}")
    target = assets_dir()
    if _complete(target):
        return NodeAssets(target)
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain is needed to build the test node's kubelet; install go")
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(target):
            _build_into(target, log=log)
    return NodeAssets(target)


def update_wrapper() -> None:
    """Regenerate ``hack/node``: the control plane wrapper's replace lines, then ``go mod tidy``."""
    replaces = re.findall(r"^replace .*$", (WRAPPERS / "kube-apiserver" / "go.mod").read_text(), re.MULTILINE)
    if not replaces:
        raise RuntimeError("hack/controlplane/kube-apiserver/go.mod has no replace lines: update it first")
    WRAPPER.mkdir(parents=True, exist_ok=True)
    (WRAPPER / "go.mod").write_text(
        "// Generated by `python -m stageset.envtest.node --update`; do not edit.\n"
        "module stageset.local/controlplane/node\n\ngo 1.24\n\n"
        f"require k8s.io/kubernetes {KUBERNETES_VERSION}\n\n" + "\n".join(replaces) + "\n")
    imports = "".join(f'\t_ "k8s.io/kubernetes/cmd/{name}"\n' for name in sorted(COMMANDS))
    (WRAPPER / "tools.go").write_text(
        "//go:build tools\n\n"
        "// Package tools pins the commands this module builds, so `go mod tidy` keeps go.sum whole.\n"
        f"package tools\n\nimport (\n{imports})\n")
    run_go(["mod", "tidy"], cwd=WRAPPER)


def main(argv: list[str]) -> int:
    if "--update" in argv:
        update_wrapper()
    print(ensure_node_assets().directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
