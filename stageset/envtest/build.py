"""Build etcd and kube-apiserver from the Go module proxy, cached outside the checkout.

Nothing here downloads prebuilt binaries: the ordinary ``go`` client builds the
upstream commands from their modules.  ``k8s.io/kubernetes`` cannot be required
as-is, because its ``go.mod`` points the ``k8s.io/*`` staging modules at
``./staging`` directories that only exist in its own repository.  So we write a
small wrapper module that requires it and replaces every staging module with the
published ``v0.x.y`` of the same release — the list is read from the downloaded
``go.mod`` so a version bump needs no hand edits.

The result lives in ``$STAGESET_CACHE_DIR`` (default ``~/.cache/stageset``) under
a directory keyed by both versions, so fresh clones and CI reuse it.  When
``KUBEBUILDER_ASSETS`` names a directory with ``etcd`` and ``kube-apiserver``
those binaries win and nothing is built.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
BINARIES = ("etcd", "kube-apiserver")

_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.\-/]+)\s*=>\s*\./staging/", re.MULTILINE)


@dataclass(frozen=True)
class Assets:
    """Where the control-plane binaries live."""

    directory: Path

    @property
    def etcd(self) -> Path:
        return self.directory / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.directory / "kube-apiserver"


def cache_root() -> Path:
    configured = os.environ.get("STAGESET_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stageset"


def assets_dir() -> Path:
    return cache_root() / "controlplane" / f"kube-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}"


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The ``k8s.io/*`` modules that ``k8s.io/kubernetes`` replaces with ``./staging`` paths."""
    return sorted(set(_STAGING_REPLACE.findall(kubernetes_go_mod)))


def staging_version(kubernetes_version: str) -> str:
    """Staging modules are published as ``v0.<minor>.<patch>`` of the same release."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kubernetes_version)
    if not match:
        raise ValueError(f"not a Kubernetes release version: {kubernetes_version!r}")
    return f"v0.{match.group(1)}.{match.group(2)}"


def wrapper_go_mod(*, kubernetes_version: str, modules: list[str]) -> str:
    pinned = staging_version(kubernetes_version)
    lines = [
        "module stageset.local/controlplane",
        "",
        "go 1.24",
        "",
        f"require k8s.io/kubernetes {kubernetes_version}",
        "",
    ]
    lines += [f"replace {module} => {module} {pinned}" for module in modules]
    return "\n".join(lines) + "\n"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Modules are fetched only through the proxy; checksums are still verified
    # (the proxy serves the checksum database).  Should a checksum look-up fail
    # the user can scope GONOSUMDB to k8s.io/*,go.etcd.io/* themselves; we never
    # turn verification off globally.
    env.setdefault("GOFLAGS", "-mod=mod")
    env["CGO_ENABLED"] = "0"
    return env


def _go(args: list[str], *, cwd: Path) -> str:
    result = subprocess.run(
        ["go", *args], cwd=cwd, env=_go_env(), check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")
    return result.stdout


def _download_go_mod(*, module: str, version: str, workdir: Path) -> str:
    info = json.loads(_go(["mod", "download", "-json", f"{module}@{version}"], cwd=workdir))
    return Path(info["GoMod"]).read_text()


def _build_kube_apiserver(*, workdir: Path, out: Path, log: bool) -> None:
    module_dir = workdir / "kube-apiserver"
    module_dir.mkdir()
    (module_dir / "go.mod").write_text("module stageset.local/probe\n\ngo 1.24\n")
    kubernetes_go_mod = _download_go_mod(
        module="k8s.io/kubernetes", version=KUBERNETES_VERSION, workdir=module_dir
    )
    modules = staging_modules(kubernetes_go_mod)
    if not modules:
        raise RuntimeError("found no staging replace lines in k8s.io/kubernetes go.mod")
    (module_dir / "go.mod").write_text(
        wrapper_go_mod(kubernetes_version=KUBERNETES_VERSION, modules=modules)
    )
    if log:
        print(f"building kube-apiserver {KUBERNETES_VERSION} ({len(modules)} staging modules pinned)",
              file=sys.stderr, flush=True)
    _go(["build", "-trimpath", "-o", str(out / "kube-apiserver"),
         "k8s.io/kubernetes/cmd/kube-apiserver"], cwd=module_dir)


def _build_etcd(*, workdir: Path, out: Path, log: bool) -> None:
    module_dir = workdir / "etcd"
    module_dir.mkdir()
    (module_dir / "go.mod").write_text(
        f"module stageset.local/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    )
    if log:
        print(f"building etcd {ETCD_VERSION}", file=sys.stderr, flush=True)
    _go(["build", "-trimpath", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"], cwd=module_dir)


def ensure_assets(*, log: bool = True) -> Assets:
    """Return built control-plane binaries, building them once if needed."""
    override = os.environ.get("KUBEBUILDER_ASSETS")
    if override:
        assets = Assets(Path(override))
        if all((assets.directory / name).is_file() for name in BINARIES):
            return assets
        raise RuntimeError(f"KUBEBUILDER_ASSETS={override} lacks one of {', '.join(BINARIES)}")
    target = assets_dir()
    assets = Assets(target)
    if all((target / name).is_file() for name in BINARIES):
        return assets
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain is needed to build etcd and kube-apiserver; install go")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=target.parent) as tmp:
        workdir = Path(tmp)
        staged = workdir / "bin"
        staged.mkdir()
        _build_etcd(workdir=workdir, out=staged, log=log)
        _build_kube_apiserver(workdir=workdir, out=staged, log=log)
        # Publish atomically so a half-built directory is never mistaken for a cache hit.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    return assets


if __name__ == "__main__":
    print(ensure_assets().directory)
