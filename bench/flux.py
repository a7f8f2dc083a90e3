"""Flux beside us in the benchmarks: source-controller and kustomize-controller, built and run out of cluster.

Benchmark only — never needed by the test command or at run time.

* **source-controller** is the one the e2e tests build (:mod:`stageset.envtest.sourcecontroller`,
  v1.9.6 from ``hack/source-controller``).
* **kustomize-controller** is built the same way (:class:`~stageset.envtest.gotool.GoTool`) from the
  checked-in wrapper ``hack/kustomize-controller``, into
  ``~/.cache/stageset/tools/kustomize-controller-<version>/``.  ``STAGESET_KUSTOMIZE_CONTROLLER``
  naming an executable uses that binary instead.

Version: kustomize-controller **v1.9.6**, the release of the same Flux line as source-controller
v1.9.6 (both require ``fluxcd/pkg/apis/meta`` v1.30.2 and ``fluxcd/pkg/runtime`` v0.110.3, and it
reads ``source.toolkit.fluxcd.io/v1`` through ``fluxcd/source-controller/api`` v1.9.0, whose
GitRepository and artifact types v1.9.6 serves unchanged); its go.mod asks for Go 1.26, which this
project's toolchain is; v1.10.x asks for Go 1.27 (and source-controller/api v1.10).  The wrapper
repeats the module's own ``replace`` lines that matter for a build as a dependency: go-digest at the
commit Flux pins for BLAKE3, and ``sigs.k8s.io/kustomize/{api,kyaml}`` at v0.21.1.

Running (:class:`FluxPeer`): both processes use the kubeconfig handed to them (the benchmark gives
each its own ServiceAccount, so the audit log tells them apart), leader election off, metrics and
health on loopback ports, no notification-controller (``--events-addr=``), source-controller's
artifact storage served and advertised on a loopback port, every namespace watched.  Concurrency is
each binary's default unless asked (``--concurrent``: source-controller 2, kustomize-controller 4).
``--default-service-account`` is never passed (it stays unset): a Kustomization without
``serviceAccountName`` is applied as the controller itself, one with it as that account.

Identity: none for building; the running processes act as the identity of their kubeconfig, which
the benchmark binds by mode:

* ``cluster-admin`` mode: each account bound to ``cluster-admin``.
* ``multi-tenant`` mode: each account bound to its own narrow ClusterRole, no ``cluster-admin``
  anywhere (:data:`KUSTOMIZE_CONTROLLER_RULES`, :data:`SOURCE_CONTROLLER_RULES`).  Flux's own
  manifests give both controllers a ClusterRole over Flux's kinds and read access to Secrets and
  ConfigMaps, and bind kustomize-controller to ``cluster-admin`` as well; its multi-tenancy docs keep
  that binding and rely on impersonation (``serviceAccountName``, or the lockdown's
  ``--default-service-account``).  The benchmark goes narrower than that, as this controller's
  chart does: kustomize-controller may read and write Kustomizations, read sources, read Secrets,
  ConfigMaps and ServiceAccounts, record events and *impersonate ServiceAccounts* — nothing else,
  so every object it applies or prunes is written as the Kustomization's ``serviceAccountName``
  (the tenant's ``deployer``; the apiserver would refuse it as itself).  source-controller, which
  never impersonates, keeps Flux's rights over its own kinds, reads Secrets and ConfigMaps, and
  records events.

``python -m bench.flux [--update]`` prints the kustomize-controller binary's path (building it).
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from stageset.build.kustomize import run_go
from stageset.envtest.gotool import GoTool
from stageset.envtest.server import free_port
from stageset.envtest.sourcecontroller import (
    SOURCE_CONTROLLER_VERSION,
    FluxProcess,
    ensure_source_controller,
    flux_crds,
    install_flux_crds,
)
from stageset.kube.client import KubeClient

KUSTOMIZE_CONTROLLER_VERSION = "v1.9.6"
_MODULE = "github.com/fluxcd/kustomize-controller"
KUSTOMIZE_CONTROLLER = GoTool(
    name="kustomize-controller",
    version=KUSTOMIZE_CONTROLLER_VERSION,
    module=_MODULE,
    package=_MODULE,
    binary="kustomize-controller",
    env_override="STAGESET_KUSTOMIZE_CONTROLLER",
    ldflags="",
    nosumdb="github.com/fluxcd",
    replaces=(
        "github.com/opencontainers/go-digest => github.com/opencontainers/go-digest "
        "v1.0.1-0.20220411205349-bde1400a84be",
        "sigs.k8s.io/kustomize/api => sigs.k8s.io/kustomize/api v0.21.1",
        "sigs.k8s.io/kustomize/kyaml => sigs.k8s.io/kustomize/kyaml v0.21.1",
    ),
    tidy_args=("-e",),
)

SOURCE_GROUP = "source.toolkit.fluxcd.io"
COMMON_FLAGS = (
    "--enable-leader-election=false",
    "--watch-all-namespaces",
    "--events-addr=",
    "--log-level=error",
)
KUSTOMIZE_GROUP = "kustomize.toolkit.fluxcd.io"
_READ = ["get", "list", "watch"]
# Both controllers: record events, and probe the apiserver's liveness (``HEAD /livez/ping``, which
# the default discovery roles do not allow; Flux's own ClusterRole grants it too).
_COMMON = [
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"nonResourceURLs": ["/livez/ping"], "verbs": ["head"]},
]
# multi-tenant mode: kustomize-controller's own identity.  Its Kustomizations (and their status and
# finalizers); the sources it watches (GitRepository, OCIRepository, Bucket, ExternalArtifact); the
# label-selected metadata watches of ConfigMaps and Secrets it opens at start (postBuild
# substitutions); ServiceAccounts read (it checks the named account exists before pruning as it)
# and impersonated.  No right on any object it applies: those go through impersonation.
KUSTOMIZE_CONTROLLER_RULES: list[dict[str, list[str]]] = [
    {
        "apiGroups": [KUSTOMIZE_GROUP],
        "resources": ["kustomizations", "kustomizations/status", "kustomizations/finalizers"],
        "verbs": [*_READ, "update", "patch"],
    },
    {
        "apiGroups": [SOURCE_GROUP],
        "resources": ["gitrepositories", "ocirepositories", "buckets", "externalartifacts"],
        "verbs": _READ,
    },
    {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": [*_READ, "impersonate"]},
    *_COMMON,
]
# multi-tenant mode: source-controller's own identity, as Flux ships it: every right on its own kinds,
# Secrets and ConfigMaps read (credentials, CA bundles), events.
SOURCE_CONTROLLER_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [SOURCE_GROUP], "resources": ["*"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": _READ},
    *_COMMON,
]


def versions() -> str:
    """The exact peers, for the reports."""
    return (
        f"Flux source-controller {SOURCE_CONTROLLER_VERSION} and kustomize-controller "
        f"{KUSTOMIZE_CONTROLLER_VERSION}"
    )


def ensure_binaries(*, log: bool = True) -> tuple[Path, Path]:
    """(source-controller, kustomize-controller), built once into the cache."""
    return ensure_source_controller(log=log), KUSTOMIZE_CONTROLLER.ensure(log=log)


@cache
def kustomize_crds() -> list[dict[str, Any]]:
    """Flux's Kustomization CRD, from the pinned module in the Go module cache (never committed)."""
    found = json.loads(
        run_go(
            ["mod", "download", "-json", f"{_MODULE}@{KUSTOMIZE_CONTROLLER_VERSION}"],
            cwd=KUSTOMIZE_CONTROLLER.wrapper,
        )
    )
    bases = Path(found["Dir"]) / "config" / "crd" / "bases"
    crds = [yaml.safe_load(path.read_text()) for path in sorted(bases.glob("*.yaml"))]
    if not crds:
        raise RuntimeError(f"no CRDs in {bases}")
    return crds


def install_crds(admin: KubeClient, *, timeout: float = 60.0) -> None:
    """Flux's source and kustomize CRDs (idempotent), waited for until served."""
    install_flux_crds(admin, timeout=timeout, crds=[*flux_crds(), *kustomize_crds()])


class _Process(FluxProcess):
    """One Flux controller of the benchmark: the common flags added, and the flags as shown."""

    def __init__(self, *, name: str, command: list[str], kubeconfig: Path, log: Path):
        super().__init__(name=name, command=[*command, *COMMON_FLAGS], kubeconfig=kubeconfig, log=log)
        self.args = [
            *command[1:],
            "--health-addr=127.0.0.1:<port>",
            "--metrics-addr=127.0.0.1:<port>",
            *COMMON_FLAGS,
        ]


class FluxPeer:
    """source-controller and kustomize-controller, each with its own kubeconfig (identity)."""

    def __init__(
        self,
        *,
        source_kubeconfig: Path,
        kustomize_kubeconfig: Path,
        workdir: Path,
        source_concurrent: int | None = None,
        kustomize_concurrent: int | None = None,
    ):
        source_bin, kustomize_bin = ensure_binaries()
        workdir.mkdir(parents=True, exist_ok=True)
        storage = workdir / "storage"
        storage.mkdir(exist_ok=True)
        address = f"127.0.0.1:{free_port()}"
        source_args = [
            str(source_bin),
            f"--storage-path={storage}",
            f"--storage-addr={address}",
            f"--storage-adv-addr={address}",
        ]
        shown = [
            "--storage-path=<work dir>",
            "--storage-addr=127.0.0.1:<port>",
            "--storage-adv-addr=127.0.0.1:<port>",
        ]
        if source_concurrent:
            source_args.append(f"--concurrent={source_concurrent}")
        kustomize_args = [str(kustomize_bin)]
        if kustomize_concurrent:
            kustomize_args.append(f"--concurrent={kustomize_concurrent}")
        self.source = _Process(
            name="source-controller",
            command=source_args,
            kubeconfig=source_kubeconfig,
            log=workdir / "source-controller.log",
        )
        self.kustomize = _Process(
            name="kustomize-controller",
            command=kustomize_args,
            kubeconfig=kustomize_kubeconfig,
            log=workdir / "kustomize-controller.log",
        )
        self.flags = {
            "source-controller": [*shown, *self.source.args[3:]],
            "kustomize-controller": self.kustomize.args,
        }

    def wait_ready(self) -> None:
        self.source.wait_ready()
        self.kustomize.wait_ready()

    def check_alive(self) -> None:
        self.source.check_alive()
        self.kustomize.check_alive()

    def stop(self) -> None:
        self.kustomize.stop()
        self.source.stop()


if __name__ == "__main__":
    sys.exit(KUSTOMIZE_CONTROLLER.main(sys.argv[1:], generator="python -m bench.flux"))
