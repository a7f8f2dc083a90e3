"""Memory after one huge stage: does the controller's RSS return near its idle level?

``python -m bench.memory`` (``--objects 5000``, ``--settle 30``, ``--no-docs``).  Not part of
the test command: it applies and prunes thousands of objects, twice.

One control plane and Git server (:class:`bench.peers.Bench`; the controller with cluster-admin,
as in ``bench.peers``).  For each allocator setting — the controller's own (arenas capped,
freed pages trimmed after work: ``stageset/controller/memory.py``) and glibc's defaults
(``STAGESET_ALLOCATOR=keep``) — a fresh controller process:

1. converges one small StageSet (5 ConfigMaps) and idles ``--settle`` seconds: *idle*;
2. converges one StageSet of ``--objects`` ConfigMaps in one stage: *peak* (VmHWM) and *Ready*;
3. idles ``--settle`` seconds: *after*;
4. deletes the huge StageSet (every object pruned) and idles again: *after prune*.

RSS is read from ``/proc/<pid>/status`` every second.  The table goes to docs/benchmarks.md
("Memory after a huge stage").
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import machine, markdown_table, replace_section, revision
from bench.peers import MANAGER, ROOT, Bench, gone, log, ready
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.envtest.controller import ControllerProcess, memory_mib
from stageset.kube.types import KubeObject

DOCS = ROOT / "docs" / "benchmarks.md"
SETTINGS = {"trimmed": {}, "glibc defaults": {"STAGESET_ALLOCATOR": "keep"}}


@dataclass
class Result:
    setting: str
    idle: float = 0.0
    peak: float = 0.0
    ready: float = 0.0
    converge: float = 0.0
    after: float = 0.0
    pruned: float = 0.0


def _rss(pid: int) -> float:
    return memory_mib(pid).get("VmRSS", 0.0)


def _idle(pid: int, seconds: float, alive: ControllerProcess) -> float:
    """RSS at the end of ``seconds`` of idling, read every second (the last reading)."""
    end = time.monotonic() + seconds
    value = _rss(pid)
    while time.monotonic() < end:
        alive.check_alive()
        time.sleep(1)
        value = _rss(pid)
    return value


def _stageset(namespace: str, name: str, source: str) -> tuple[str, KubeObject]:
    return STAGESETS.object_path(namespace=namespace, name=name), {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"interval": "1h", "stages": [{"name": "main", "path": "./", "sourceRef": {"name": source}}]},
    }


def _source(namespace: str, name: str, url: str) -> tuple[str, KubeObject]:
    return GITREPOSITORIES.object_path(namespace=namespace, name=name), {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"},
    }


def measure(bench: Bench, *, setting: str, objects: int, settle: float) -> Result:
    result = Result(setting=setting)
    namespace = "mem-" + setting.split()[0]
    bench._namespace(namespace)
    small_url, huge_url = bench.repo_url(0, 5), bench.repo_url(1, objects)
    saved = dict(os.environ)
    os.environ.update(SETTINGS[setting])
    try:
        controller = ControllerProcess(kubeconfig=bench.kubeconfigs["stageset-system/stageset-controller"],
                                       workdir=bench.workdir / f"controller-{namespace}", log_level="warning",
                                       extra=["--cluster-admin"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    pid = controller.process.pid
    try:
        for path, obj in (_source(namespace, "small", small_url), _source(namespace, "huge", huge_url),
                          _stageset(namespace, "small", "small")):
            bench.admin.apply(path, obj, field_manager=MANAGER)
        bench.stagesets.wait([(namespace, "small")], ready, timeout=300, what="small StageSet Ready",
                             alive=controller.check_alive)
        result.idle = _idle(pid, settle, controller)
        log(f"{setting}: idle {result.idle:.0f} MiB")
        path, obj = _stageset(namespace, "huge", "huge")
        start = time.monotonic()
        bench.admin.apply(path, obj, field_manager=MANAGER)
        bench.stagesets.wait([(namespace, "huge")], ready, timeout=600 + objects * 0.2,
                             what=f"a StageSet of {objects} objects Ready", alive=controller.check_alive)
        result.converge = time.monotonic() - start
        result.ready = _rss(pid)
        result.after = _idle(pid, settle, controller)
        result.peak = memory_mib(pid).get("VmHWM", 0.0)
        log(f"{setting}: {objects} objects Ready in {result.converge:.0f} s; RSS {result.ready:.0f} MiB, "
            f"{settle:g} s later {result.after:.0f} MiB, peak {result.peak:.0f} MiB")
        bench.admin.delete(path)
        bench.stagesets.wait([(namespace, "huge")], gone, timeout=600 + objects * 0.2,
                             what="the huge StageSet pruned", alive=controller.check_alive)
        result.pruned = _idle(pid, settle, controller)
        log(f"{setting}: after the prune {result.pruned:.0f} MiB")
    finally:
        controller.stop()
    return result


def report(results: list[Result], *, objects: int, settle: float) -> str:
    rows = [[r.setting, f"{r.idle:.0f}", f"{r.peak:.0f}", f"{r.ready:.0f}", f"{r.after:.0f}",
             f"{r.after - r.idle:+.0f}", f"{r.pruned:.0f}", f"{r.converge:.0f}"] for r in results]
    return "\n".join([
        f"`python -m bench.memory --objects {objects} --settle {settle:g}` on {machine()}, "
        f"{revision(ROOT)}: a fresh controller per row (cluster-admin, 4 workers), one small "
        f"StageSet Ready, then one StageSet of {objects} ConfigMaps in one stage, then that StageSet "
        f"deleted (every object pruned); RSS in MiB from `/proc/<pid>/status`, each idle level "
        f"read after {settle:g} s of quiet.",
        "",
        markdown_table(["allocator", "idle", "peak (VmHWM)", "at Ready", f"{settle:g} s after Ready",
                        "after - idle", "after the prune", "converge (s)"], rows),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--settings", type=lambda v: tuple(v.split(",")), default=tuple(SETTINGS))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--no-docs", action="store_true")
    options = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="stageset-memory-"))
    bench = Bench(workdir, sources="pairs", tenants=1)
    try:
        bench.repo_url(0, 5)  # the repositories are written before any controller runs
        bench.repo_url(1, options.objects)
        results = [measure(bench, setting=s, objects=options.objects, settle=options.settle)
                   for s in options.settings]
    finally:
        bench.close()
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    body = report(results, objects=options.objects, settle=options.settle)
    print(body)
    if not options.no_docs:
        replace_section(DOCS, marker="memory", body=body, skeleton="# Benchmarks\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
