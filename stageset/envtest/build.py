"""Build etcd, kube-apiserver and kube-controller-manager from the Go module proxy, cached outside
the checkout.

Nothing here downloads prebuilt binaries: the ordinary ``go`` client builds the
upstream commands from their modules.  ``k8s.io/kubernetes`` cannot be required
as-is, because its ``go.mod`` points the ``k8s.io/*`` staging modules at
``./staging`` directories that only exist in its own repository.  So the wrapper
module in ``hack/controlplane/kube-apiserver`` requires it and replaces every
staging module with the published ``v0.x.y`` of the same release.  The same wrapper
builds ``kube-controller-manager`` (same module, same release, one ``go.sum``), right
after kube-apiserver in the same step, so the second build reuses the Go build cache
the first filled.  The replace
list is derived from the downloaded ``go.mod`` by ``--update`` (never typed by
hand), and the wrappers' ``go.sum`` is checked in so builds are reproducible.

The result lives in ``$STAGESET_CACHE_DIR`` (default ``~/.cache/stageset``) under
a directory keyed by both versions, so fresh clones and CI reuse it.  Each binary is
published into it on its own (atomically), so a cache that holds etcd and kube-apiserver
from before kube-controller-manager joined builds only the controller manager.  When
``KUBEBUILDER_ASSETS`` names a directory with ``etcd`` and ``kube-apiserver`` those
binaries win and nothing is built (such directories seldom hold a controller manager:
only the tests that start one then fail, saying so).

Identity: none.  Building touches no cluster.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# One cache for every tool the project builds (the controller's kustomize lives there too).
from stageset.build.kustomize import cache_root

KUBERNETES_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
CONTROLLER_MANAGER = "kube-controller-manager"
REQUIRED = ("etcd", "kube-apiserver")
"""What every control plane runs (and a ``KUBEBUILDER_ASSETS`` directory must hold)."""
BINARIES = (*REQUIRED, CONTROLLER_MANAGER)
"""What the build produces: the controller manager only for the tests that opt in to it."""
# Bumped when the build recipe changes what the binaries are (2: the apiserver reports its version).
# Adding a binary is no bump: the existing ones stay as they were, and only the new one is built.
_RECIPE = 2
# The checked-in wrapper modules (go.mod + go.sum) that build the commands.
WRAPPERS = Path(__file__).resolve().parents[2] / "hack" / "controlplane"

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

    @property
    def kube_controller_manager(self) -> Path:
        """The controller manager; raises when these assets have none (a ``KUBEBUILDER_ASSETS``
        directory without it)."""
        binary = self.directory / CONTROLLER_MANAGER
        if not binary.is_file():
            raise RuntimeError(f"{self.directory} holds no {CONTROLLER_MANAGER} (KUBEBUILDER_ASSETS "
                               f"without it: unset it, or add a {CONTROLLER_MANAGER} of the same release)")
        return binary


def assets_dir() -> Path:
    return cache_root() / "controlplane" / f"kube-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}_r{_RECIPE}"


def version_ldflags(kubernetes_version: str) -> str:
    """What the Kubernetes release build stamps into its binaries (``hack/lib/version.sh``), so
    ``/version`` reports the release, not ``v0.0.0-master``: Helm's ``kubeVersion`` and
    ``stageset check`` read it."""
    major, minor = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", kubernetes_version).groups()  # type: ignore[union-attr]
    stamp = {"gitVersion": kubernetes_version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    return " ".join(f"-X k8s.io/component-base/version.{key}={value}" for key, value in stamp.items())


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
        "// Generated by `python -m stageset.envtest.build --update`; do not edit.",
        "module stageset.local/controlplane/kube-apiserver",
        "",
        "go 1.24",
        "",
        f"require k8s.io/kubernetes {kubernetes_version}",
        "",
    ]
    lines += [f"replace {module} => {module} {pinned}" for module in modules]
    return "\n".join(lines) + "\n"


def _tools_go(*packages: str) -> str:
    if len(packages) == 1:
        return (
            "//go:build tools\n\n"
            "// Package tools pins the command this module builds, so `go mod tidy` keeps go.sum whole.\n"
            "package tools\n\n"
            f'import _ "{packages[0]}"\n'
        )
    imports = "".join(f'\t_ "{package}"\n' for package in packages)
    return (
        "//go:build tools\n\n"
        "// Package tools pins the commands this module builds, so `go mod tidy` keeps go.sum whole.\n"
        "package tools\n\n"
        f"import (\n{imports})\n"
    )


def _go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.pop("GOFLAGS", None)
    env.update(extra or {})
    return env


def _go(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["go", *args], cwd=cwd, env=_go_env(env), check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise GoError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")
    return result.stdout


class GoError(RuntimeError):
    pass


_CHECKSUM_FAILURE = re.compile(r"verifying ([\w.\-/]+)@|sum\.golang\.org|checksum database")
_SUMDB_SCOPE = "k8s.io,sigs.k8s.io,go.etcd.io"


def _go_build(args: list[str], *, cwd: Path) -> None:
    """``go build``; if only the checksum database is unreachable, retry with it scoped off.

    The wrappers' go.sum is checked in, so a normal build never asks the checksum
    database.  Should a look-up still fail (a proxy that does not relay it), we
    retry with GONOSUMDB limited to the Kubernetes and etcd module paths rather
    than turning verification off for everything.
    """
    try:
        _go(args, cwd=cwd)
    except GoError as error:
        if not _CHECKSUM_FAILURE.search(str(error)):
            raise
        _go(args, cwd=cwd, env={"GONOSUMDB": _SUMDB_SCOPE, "GOFLAGS": "-mod=mod"})


def update_wrappers(*, log: bool = True) -> None:
    """Regenerate the checked-in wrapper modules (go.mod, go.sum) for the pinned versions."""
    kube = WRAPPERS / "kube-apiserver"
    kube.mkdir(parents=True, exist_ok=True)
    (kube / "go.mod").write_text("module stageset.local/controlplane/kube-apiserver\n\ngo 1.24\n")
    info = json.loads(_go(["mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
                          cwd=kube))
    modules = staging_modules(Path(info["GoMod"]).read_text())
    if not modules:
        raise RuntimeError("found no staging replace lines in k8s.io/kubernetes go.mod")
    (kube / "go.mod").write_text(wrapper_go_mod(kubernetes_version=KUBERNETES_VERSION, modules=modules))
    (kube / "tools.go").write_text(_tools_go(*(package for _, package, _ in _commands()
                                                 if package.startswith("k8s.io/kubernetes/"))))
    if log:
        print(f"kube-apiserver wrapper: {len(modules)} staging modules pinned", file=sys.stderr)
    _go(["mod", "tidy"], cwd=kube)

    etcd = WRAPPERS / "etcd"
    etcd.mkdir(parents=True, exist_ok=True)
    (etcd / "go.mod").write_text(
        "// Generated by `python -m stageset.envtest.build --update`; do not edit.\n"
        "module stageset.local/controlplane/etcd\n\ngo 1.24\n\n"
        f"require go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    )
    (etcd / "tools.go").write_text(_tools_go("go.etcd.io/etcd/server/v3"))
    _go(["mod", "tidy"], cwd=etcd)


def _commands() -> tuple[tuple[str, str, str], ...]:
    """Each binary: its name (also its wrapper's directory, but the controller manager's, which
    shares kube-apiserver's), its Go package and its ``-ldflags``, in build order."""
    stamped = version_ldflags(KUBERNETES_VERSION)
    return (("etcd", "go.etcd.io/etcd/server/v3", ""),
            ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", stamped),
            (CONTROLLER_MANAGER, "k8s.io/kubernetes/cmd/kube-controller-manager", stamped))


def _wrapper(name: str) -> Path:
    return WRAPPERS / ("kube-apiserver" if name == CONTROLLER_MANAGER else name)


def _build_into(target: Path, *, names: tuple[str, ...], log: bool) -> None:
    """Build ``names`` and publish each into ``target`` atomically (a rename), so a half-built
    binary is never mistaken for a cache hit and the binaries already there stay untouched."""
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=target.parent) as tmp:
        for name, package, ldflags in _commands():
            if name not in names:
                continue
            if log:
                print(f"building {name} from the Go module proxy ...", file=sys.stderr, flush=True)
            staged = Path(tmp) / name
            _go_build(["build", "-mod=readonly", "-trimpath", "-ldflags", ldflags, "-o", str(staged),
                       package], cwd=_wrapper(name))
            staged.rename(target / name)


def ensure_assets(*, log: bool = True, controller_manager: bool = True) -> Assets:
    """Return built control-plane binaries, building the missing ones once.

    ``controller_manager=False`` (the demo, a control plane without one) neither needs nor builds
    kube-controller-manager; the test command builds all three up front."""
    wanted = BINARIES if controller_manager else REQUIRED
    override = os.environ.get("KUBEBUILDER_ASSETS")
    if override:
        assets = Assets(Path(override))
        if all((assets.directory / name).is_file() for name in REQUIRED):
            return assets
        raise RuntimeError(f"KUBEBUILDER_ASSETS={override} lacks one of {', '.join(REQUIRED)}")
    target = assets_dir()
    assets = Assets(target)
    if all((target / name).is_file() for name in wanted):
        return assets
    if shutil.which("go") is None:
        raise RuntimeError(f"the Go toolchain is needed to build {', '.join(wanted)}; install go")
    target.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time per cache (parallel test workers, a demo started meanwhile).
    with (target.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = tuple(name for name in wanted if not (target / name).is_file())
        if missing:
            _build_into(target, names=missing, log=log)
    return assets


def main(argv: list[str]) -> int:
    if "--update" in argv:
        update_wrappers()
    print(ensure_assets().directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
