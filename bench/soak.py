"""Soak: a few hundred StageSets changing every minute for an hour; does anything keep growing?

``python -m bench.soak`` (defaults: 300 StageSets in 10 namespaces, 60 minutes, a sample every
30 s; ``--minutes``, ``--stagesets``, ``--namespaces``, ``--no-write`` to leave the docs alone).
Not part of the test command: it takes the hour it measures.

Set-up: a real control plane (etcd + kube-apiserver), a real Git server (``git http-backend``
on loopback, :mod:`tests.gitserver`), one GitRepository per namespace (``interval: 1m``), and
the controller as a subprocess with exactly the chart's multi-tenant RBAC.  Each StageSet has
two stages of two ConfigMaps.  Every minute a commit to every repository changes a tenth of
the StageSets (a value changed, an object added or removed: applies and prunes) and each
GitRepository is asked to reconcile at once.

Sampled from ``/proc/<controller pid>``: resident memory (VmRSS), open file descriptors,
threads; and the mirror directory's size on disk.  "Keeps growing": over the second half of
the run, the last quarter is above the second quarter by more than the metric's tolerance
*and* every sample of the last quarter is above the second quarter's largest — a level that
settles after warm-up passes, a climb that does not stop fails (exit 1).

The table and the verdict go to docs/benchmarks.md ("Soak").
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    StageSetTracker,
    controller_kubeconfig,
    is_ready,
    machine,
    markdown_table,
    poke,
    replace_section,
    revision,
)
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import ClientPool, KubeClient
from tests.gitserver import GitServer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
ACCOUNT = "deployer"
MIB = 2**20

# Metric -> (tolerance in its unit, unit) for "keeps growing".
TOLERANCE = {"rss_mib": (16.0, "MiB"), "fds": (8.0, ""), "threads": (4.0, ""), "mirror_mib": (2.0, "MiB")}


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def configmap(name: str, value: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: \"{value}\"\n"


@dataclass
class Sample:
    minute: float
    rss_mib: float
    fds: int
    threads: int
    mirror_mib: float
    ready: int


@dataclass
class Soak:
    plane: envtest.ControlPlane
    admin: KubeClient
    git: GitServer
    workdir: Path
    stagesets: int
    namespaces: int
    rng: random.Random = field(default_factory=lambda: random.Random(7))  # noqa: S311 - which to change
    extra: dict[str, int] = field(default_factory=dict)  # per StageSet: extra ConfigMaps now present

    def namespace(self, i: int) -> str:
        return f"soak-{i:02d}"

    def sets(self) -> list[tuple[str, str]]:
        return [(self.namespace(k % self.namespaces), f"s{k:04d}") for k in range(self.stagesets)]

    def files(self, name: str, generation: int) -> dict[str, str | None]:
        files: dict[str, str | None] = {
            f"{name}/base/a.yaml": configmap(f"{name}-a", f"g{generation}"),
            f"{name}/base/b.yaml": configmap(f"{name}-b", "fixed"),
            f"{name}/app/c.yaml": configmap(f"{name}-c", f"g{generation}"),
            f"{name}/app/d.yaml": configmap(f"{name}-d", "fixed"),
        }
        return files

    def set_up(self) -> None:
        install.install(self.admin)
        by_ns: dict[str, list[str]] = {}
        for ns, name in self.sets():
            by_ns.setdefault(ns, []).append(name)
        for ns, names in by_ns.items():
            install.create_tenant(self.admin, namespace=ns, service_account=ACCOUNT)
            files: dict[str, str | None] = {}
            for name in names:
                files.update(self.files(name, 0))
            url = self.git.create_repo(ns, {k: v for k, v in files.items() if v is not None})
            self.admin.apply(GITREPOSITORIES.object_path(namespace=ns, name="app"), {
                "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                "metadata": {"name": "app", "namespace": ns},
                "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m"}}, field_manager="soak")
            for name in names:
                self.admin.apply(STAGESETS.object_path(namespace=ns, name=name), {
                    "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"serviceAccountName": ACCOUNT, "interval": "10m", "stages": [
                        {"name": "base", "sourceRef": {"name": "app"}, "path": f"./{name}/base"},
                        {"name": "app", "sourceRef": {"name": "app"}, "path": f"./{name}/app"}]}},
                    field_manager="soak")

    def change(self, minute: int) -> int:
        """Change a tenth of the StageSets in every repository; returns how many changed."""
        by_ns: dict[str, dict[str, str | None]] = {}
        changed = 0
        for ns, name in self.sets():
            if self.rng.random() >= 0.1:
                continue
            changed += 1
            files = by_ns.setdefault(ns, {})
            files.update(self.files(name, minute))
            # An object added, or the one added earlier removed (a prune).
            if self.extra.get(name):
                files[f"{name}/app/extra.yaml"] = None
                self.extra[name] = 0
            else:
                files[f"{name}/app/extra.yaml"] = configmap(f"{name}-extra", f"m{minute}")
                self.extra[name] = 1
        for ns, files in by_ns.items():
            self.git.commit(ns, files, message=f"minute {minute}")
            poke(self.admin, GITREPOSITORIES.object_path(namespace=ns, name="app"))
        return changed


def _proc(pid: int) -> tuple[float, int, int]:
    rss, threads = 0.0, 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                rss = int(value.split()[0]) / 1024
            elif key == "Threads":
                threads = int(value)
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def _disk_mib(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total / MIB


def growing(samples: list[Sample], metric: str) -> tuple[bool, float, float]:
    """(keeps growing, second-quarter mean, last-quarter mean)."""
    n = len(samples)
    second = [float(getattr(s, metric)) for s in samples[n // 4: n // 2]]
    last = [float(getattr(s, metric)) for s in samples[3 * n // 4:]]
    if not second or not last:
        return False, 0.0, 0.0
    tolerance, _ = TOLERANCE[metric]
    climbing = statistics.fmean(last) - statistics.fmean(second) > tolerance and min(last) > max(second)
    return climbing, statistics.fmean(second), statistics.fmean(last)


def report(samples: list[Sample], *, options: argparse.Namespace, converge: float) -> tuple[str, bool]:
    every = max(1, len(samples) // 13)
    rows = [[f"{s.minute:.0f}", f"{s.rss_mib:.0f}", str(s.fds), str(s.threads), f"{s.mirror_mib:.1f}",
             f"{s.ready}/{options.stagesets}"] for s in samples[::every]]
    if samples and samples[-1] is not samples[::every][-1]:
        s = samples[-1]
        rows.append([f"{s.minute:.0f}", f"{s.rss_mib:.0f}", str(s.fds), str(s.threads), f"{s.mirror_mib:.1f}",
                     f"{s.ready}/{options.stagesets}"])
    ran = samples[-1].minute if samples else 0.0
    stopped = (f", stopped by hand after {ran:.0f} minutes" if ran < options.minutes - 1 else "")
    verdicts = []
    failed = False
    for metric, (tolerance, unit) in TOLERANCE.items():
        climbing, second, last = growing(samples, metric)
        failed |= climbing
        verdicts.append(f"- {metric}: second quarter {second:.1f}{unit}, last quarter {last:.1f}{unit} "
                        f"(tolerance {tolerance:g}{unit}): {'KEEPS GROWING' if climbing else 'flat'}")
    body = "\n".join([
        f"`python -m bench.soak --minutes {options.minutes:g} --stagesets {options.stagesets} "
        f"--namespaces {options.namespaces}` on {machine()}, {revision(ROOT)}{stopped}: "
        f"{options.stagesets} StageSets "
        f"(2 stages of 2 ConfigMaps each) in {options.namespaces} namespaces, one Git repository and "
        f"GitRepository per namespace; every minute a tenth of the StageSets change (a value, and an "
        f"object added or removed); cold convergence of all of them took {converge:.0f} s.",
        "",
        markdown_table(["minute", "controller RSS (MiB)", "open fds", "threads", "mirror disk (MiB)",
                        "Ready"], rows),
        "",
        *verdicts,
        "",
        f"Verdict: {'FAIL — a metric keeps growing' if failed else 'pass — nothing keeps growing'}.",
    ])
    return body, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--stagesets", type=int, default=300)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--no-write", action="store_true", help="print the result; leave docs/ alone")
    options = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="stageset-soak-"))
    log(f"workdir {workdir}")
    with envtest.running() as plane, GitServer() as git:
        pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
        admin = pool.client()
        soak = Soak(plane=plane, admin=admin, git=git, workdir=workdir, stagesets=options.stagesets,
                    namespaces=options.namespaces)
        soak.set_up()
        config = controller_kubeconfig(admin, plane, workdir / "controller.kubeconfig")
        mirrors = workdir / "mirrors"
        tracker = StageSetTracker(admin)
        tracker.start()
        controller = ControllerProcess(kubeconfig=config, workdir=workdir / "controller", mirror_dir=mirrors,
                                       log_level="warning", extra=["--workers", "4"])
        keys = [(ns, name) for ns, name in soak.sets()]
        started = time.monotonic()
        tracker.wait(keys, is_ready, timeout=900, what="every StageSet Ready", alive=controller.check_alive)
        converge = time.monotonic() - started
        log(f"{len(keys)} StageSets Ready in {converge:.0f}s; soaking for {options.minutes:g} minutes")
        samples: list[Sample] = []
        start = time.monotonic()
        next_change = start + 60
        minute = 0
        try:
            while (elapsed := time.monotonic() - start) < options.minutes * 60:
                controller.check_alive()
                if time.monotonic() >= next_change:
                    minute += 1
                    changed = soak.change(minute)
                    next_change += 60
                    log(f"minute {minute}: changed {changed} StageSets")
                rss, fds, threads = _proc(controller.process.pid)
                ready = sum(1 for key in keys if is_ready(tracker.get(key)))
                disk = _disk_mib(mirrors)
                samples.append(Sample(elapsed / 60, rss, fds, threads, disk, ready))
                log(f"sample {elapsed / 60:.1f} min: rss {rss:.1f} MiB, {fds} fds, {threads} threads, "
                    f"mirrors {disk:.2f} MiB, {ready}/{len(keys)} Ready")
                time.sleep(options.sample_seconds)
        except KeyboardInterrupt:  # Ctrl-C (SIGINT): stop early and report what was measured
            log(f"interrupted after {(time.monotonic() - start) / 60:.0f} of {options.minutes:g} minutes")
        finally:
            controller.stop()
            tracker.stop()
            pool.close()
    body, failed = report(samples, options=options, converge=converge)
    print(body)
    if not options.no_write:
        replace_section(DOCS, marker="soak", body=body, skeleton="# Benchmarks\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
