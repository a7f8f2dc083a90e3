"""Flux's source-controller, built from the Go module proxy and run out of cluster, for the end-to-end tests.

Built as every Go tool of the tests (:mod:`stageset.envtest.gotool`): the checked-in wrapper
``hack/source-controller`` requires ``github.com/fluxcd/source-controller`` at
:data:`SOURCE_CONTROLLER_VERSION` and the command is built once into
``<cache>/tools/source-controller-<version>/``.  ``STAGESET_SOURCE_CONTROLLER`` naming an
executable uses that binary instead.

Version: v1.9.6, the newest release that serves ``ExternalArtifact`` in ``v1`` and builds with
the Go toolchain the project uses (1.26; v1.10 needs Go 1.27).  The wrapper repeats the two
``replace`` lines the module's own go.mod needs (they do not apply to a dependency) —
``opencontainers/go-digest`` at the commit Flux pins for BLAKE3, and ``fluxcd/pkg/artifact``
at v0.18.0 because the module proxy here does not serve v0.18.3, whose go.mod differs from
v0.18.0's only in dependency versions.

Flux's CRDs are taken from the same module at test time (``config/crd/bases`` of the module
zip, from the Go module cache): nothing of Flux's is committed here.

The process runs against the test control plane with the admin kubeconfig (Flux's identity,
not ours), leader election off, its artifact storage served on a free loopback port and
advertised at that address, metrics and health on loopback too.

Identity: none for building; the running process uses the kubeconfig handed to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from stageset.build.kustomize import run_go
from stageset.envtest.gotool import GoTool
from stageset.envtest.server import _die_with_parent, free_port
from stageset.kube.client import KubeClient

SOURCE_CONTROLLER_VERSION = "v1.9.6"
_MODULE = "github.com/fluxcd/source-controller"
SOURCE_CONTROLLER = GoTool(
    name="source-controller", version=SOURCE_CONTROLLER_VERSION, module=_MODULE, package=_MODULE,
    binary="source-controller", env_override="STAGESET_SOURCE_CONTROLLER", ldflags="",
    nosumdb="github.com/fluxcd",
    replaces=("github.com/opencontainers/go-digest => github.com/opencontainers/go-digest "
              "v1.0.1-0.20220411205349-bde1400a84be",
              "github.com/fluxcd/pkg/artifact => github.com/fluxcd/pkg/artifact v0.18.0"),
    tidy_args=("-e",))
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def ensure_source_controller(*, log: bool = True) -> Path:
    return SOURCE_CONTROLLER.ensure(log=log)


@cache
def flux_crds() -> list[dict[str, Any]]:
    """Flux's source CRDs (``source.toolkit.fluxcd.io``), from the pinned module in the Go module cache."""
    found = json.loads(run_go(["mod", "download", "-json", f"{_MODULE}@{SOURCE_CONTROLLER_VERSION}"],
                              cwd=SOURCE_CONTROLLER.wrapper))
    bases = Path(found["Dir"]) / "config" / "crd" / "bases"
    crds = [yaml.safe_load(path.read_text()) for path in sorted(bases.glob("*.yaml"))]
    if not crds:
        raise RuntimeError(f"no CRDs in {bases}")
    return crds


def install_flux_crds(admin: KubeClient, *, timeout: float = 60.0,
                      crds: list[dict[str, Any]] | None = None) -> None:
    """Apply Flux's source CRDs (or ``crds``; idempotent) and wait until they are served."""
    crds = flux_crds() if crds is None else crds
    for crd in crds:
        name = crd["metadata"]["name"]
        admin.apply(f"{_CRDS}/{name}", crd, field_manager="flux-crds", force=True)
    deadline = time.monotonic() + timeout
    for crd in crds:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
        while True:
            try:
                served = admin.get(f"/apis/{group}/{version}").get("resources", [])
                if any(r.get("name") == plural for r in served):
                    break
            except Exception:  # noqa: S110 - not served yet; retried until the deadline
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{plural}.{group} not served after {timeout}s")
            time.sleep(0.1)


class FluxProcess:
    """One Flux controller out of cluster: health and metrics on free loopback ports, its output in
    ``log``, killed with this process (the tests' source-controller, the benchmark's pair)."""

    def __init__(self, *, name: str, command: list[str], kubeconfig: Path, log: Path):
        self.name = name
        self.log = log
        self._health = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "RUNTIME_NAMESPACE": "flux-system"}
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                [*command, f"--health-addr={self._health}", f"--metrics-addr=127.0.0.1:{free_port()}"],
                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()[-4000:]}")

    def wait_ready(self, *, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"http://{self._health}/readyz", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} not ready after {timeout}s:\n"
                                       f"{self.output()[-4000:]}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class SourceControllerProcess(FluxProcess):
    """``source-controller`` out of cluster: storage on loopback, leader election off."""

    def __init__(self, *, kubeconfig: Path, workdir: Path, binary: Path | None = None):
        binary = binary or ensure_source_controller()
        workdir.mkdir(parents=True, exist_ok=True)
        self.storage = workdir / "storage"
        self.storage.mkdir(exist_ok=True)
        self.storage_address = f"127.0.0.1:{free_port()}"
        super().__init__(
            name="source-controller", kubeconfig=kubeconfig, log=workdir / "source-controller.log",
            command=[str(binary), f"--storage-path={self.storage}", f"--storage-addr={self.storage_address}",
                     f"--storage-adv-addr={self.storage_address}", "--enable-leader-election=false",
                     "--watch-all-namespaces", "--events-addr=", "--log-level=debug", "--concurrent=2"])


if __name__ == "__main__":
    sys.exit(SOURCE_CONTROLLER.main(sys.argv[1:], generator="python -m stageset.envtest.sourcecontroller"))
