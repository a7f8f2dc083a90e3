"""Controller memory while tenants publish Flux artifacts at every documented limit (issue 30).

``python -m bench.artifacts`` (``--tenants 5``, ``--settle 10``, ``--no-docs``).  Not part of the test
command; ``tests/e2e/test_artifact_attacks.py`` asserts the same bound on every run.

One control plane (:class:`bench.peers.Bench`, Flux's CRDs installed), a loopback artifact server
and a fresh controller (cluster-admin, default artifact and build limits, 4 workers, 4 source
workers).  Each tenant publishes an ExternalArtifact of :func:`tests.artifactload.at_the_limits`
(ten files of 9.9 MiB of zeros, about 100 KiB compressed) and, all at once, two StageSets on it:
``app`` builds its small kustomization (Ready), ``zeros`` reads three zero files as manifests
(the most the build limits allow) and fails.  RSS from ``/proc/<pid>/status``: idle before,
peak (``VmHWM``) once every StageSet settled, and after ``--settle`` seconds; the store's bytes
on disk.  The table goes to docs/benchmarks.md ("Flux artifacts at the limits"); the bound it
checks is docs/sizing.md's ("Flux artifacts").
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import machine, markdown_table, replace_section, revision
from bench.peers import MANAGER, ROOT, Bench, log, ready
from stageset.controller.kinds import STAGESETS
from stageset.envtest.controller import ControllerProcess, memory_mib
from stageset.kube.types import KubeObject
from tests.artifactload import ZERO_FILE_BYTES, ZERO_FILES, at_the_limits
from tests.artifactserver import ArtifactServer
from tests.e2e.flux import publish

DOCS = ROOT / "docs" / "benchmarks.md"


@dataclass
class Result:
    tenants: int
    idle: float = 0.0
    peak: float = 0.0
    after: float = 0.0
    settled: float = 0.0
    disk: int = 0


def _failed(obj: KubeObject | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "False" and c.get("reason") == "StageFailed"
               for c in conditions)


def _stageset(namespace: str, name: str, stage_path: str) -> tuple[str, KubeObject]:
    return STAGESETS.object_path(namespace=namespace, name=name), {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"interval": "1h", "stages": [{"name": "main", "path": stage_path,
                                                "sourceRef": {"kind": "ExternalArtifact", "name": "big"}}]},
    }


def measure(bench: Bench, server: ArtifactServer, *, tenants: int, settle: float) -> Result:
    result = Result(tenants=tenants)
    namespaces = [f"artifacts-{index}" for index in range(tenants)]
    for namespace in namespaces:
        bench._namespace(namespace)
        publish(bench.admin, server, "ExternalArtifact", namespace, "big", body=at_the_limits(name=namespace))
    workdir = bench.workdir / "controller-artifacts"
    controller = ControllerProcess(kubeconfig=bench.kubeconfigs["stageset-system/stageset-controller"],
                                   workdir=workdir, log_level="warning", extra=["--cluster-admin"])
    pid = controller.process.pid
    try:
        time.sleep(settle)
        controller.check_alive()
        result.idle = memory_mib(pid)["VmRSS"]
        start = time.monotonic()
        for namespace in namespaces:
            for name, stage_path in (("app", "app"), ("zeros", "zeros")):
                bench.admin.apply(*_stageset(namespace, name, stage_path), field_manager=MANAGER)
        bench.stagesets.wait([(namespace, "app") for namespace in namespaces], ready, timeout=600,
                             what="every app StageSet Ready", alive=controller.check_alive)
        bench.stagesets.wait([(namespace, "zeros") for namespace in namespaces], _failed, timeout=600,
                             what="every zeros StageSet StageFailed", alive=controller.check_alive)
        result.settled = time.monotonic() - start
        result.peak = memory_mib(pid)["VmHWM"]
        time.sleep(settle)
        controller.check_alive()
        result.after = memory_mib(pid)["VmRSS"]
        result.disk = sum(path.stat().st_size for path in (workdir / "artifacts").glob("*.tree"))
        log(f"{tenants} tenants: idle {result.idle:.0f} MiB, peak {result.peak:.0f} MiB, "
            f"after {result.after:.0f} MiB, settled in {result.settled:.0f} s, "
            f"{result.disk >> 20} MiB stored")
    finally:
        controller.stop()
    return result


def report(result: Result, *, settle: float) -> str:
    inflated = ZERO_FILES * ZERO_FILE_BYTES / (1 << 20)
    return "\n".join([
        f"`python -m bench.artifacts --tenants {result.tenants} --settle {settle:g}` on {machine()}, "
        f"{revision(ROOT)}: a fresh controller (cluster-admin, default limits, 4 workers, 4 source "
        f"workers); {result.tenants} tenants at once, each an artifact of {ZERO_FILES} files of zeros "
        f"({inflated:.0f} MiB inflated, about 100 KiB compressed) and two StageSets on it (one builds a "
        "small kustomization and is Ready, one reads three zero files as manifests and fails); RSS in "
        "MiB from `/proc/<pid>/status`. Bound: docs/sizing.md (\"Flux artifacts\"); before issue 30 the "
        "same attack peaked at 560-628 MiB.",
        "",
        markdown_table(["tenants", "idle", "peak (VmHWM)", f"{settle:g} s after", "settled (s)",
                        "stored on disk (MiB)"],
                       [[str(result.tenants), f"{result.idle:.0f}", f"{result.peak:.0f}",
                         f"{result.after:.0f}", f"{result.settled:.0f}", f"{result.disk >> 20}"]]),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.artifacts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--no-docs", action="store_true")
    options = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="stageset-artifacts-bench-"))
    bench = Bench(workdir, sources="pairs", tenants=1)
    try:
        with ArtifactServer() as server:
            result = measure(bench, server, tenants=options.tenants, settle=options.settle)
    finally:
        bench.close()
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    body = report(result, settle=options.settle)
    print(body)
    if not options.no_docs:
        replace_section(DOCS, marker="artifacts", body=body, skeleton="# Benchmarks\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
