"""Drift by watch at scale: what the drift watches cost a warm controller, and how fast they correct.

Run from the checkout's root (long at N = 1000: run it on a quiet machine)::

    .venv/bin/python -m bench.drift                 # N = 100, 1000; writes docs/scale.md (bench.drift)
    .venv/bin/python -m bench.drift --quick         # N = 10, 50; prints only (~6 min on 2 cores)
    .venv/bin/python -m bench.drift --sizes 100 --tenants 10 --interval 30 --no-docs

One control plane, one Git server (one repository, a directory per StageSet), one shared
GitRepository.  For each N, two fresh controllers one after the other, on the same shape: **off**
(``--max-drift-watches 0``: drift is noticed at each StageSet's interval, as before issue 45) and
**on** (a bound with room for every watch the shape needs: ``max(500, 2N)``).  Each runs as the
chart's multi-tenant controller; N StageSets of one
stage of ``--objects`` ConfigMaps spread over ``--tenants`` tenant namespaces (default: one per
StageSet, the most watches a shape can need: one per namespace and kind), each applying as its
tenant's ServiceAccount, every ``--interval`` seconds.

Measured per (N, mode), after every StageSet is Ready:

* **watches** — ``stageset_drift_watches`` and ``stageset_drift_unwatched_stagesets`` from the
  controller's ``/metrics``;
* **memory** — the controller's ``VmRSS`` at the end of the warm window;
* **warm requests** — every request the controller made, as itself and as the tenants, in a window
  of ``--windows`` intervals of routine passes (``ResponseComplete`` in the audit log; a watch that
  starts in the window counts as one), per StageSet per interval; and the watches opened during the
  cold convergence (drift watches start where the pass left off: no list);
* **correction** (on only) — ``--edits`` ConfigMaps of different StageSets edited by an admin
  (``kubectl edit``'s field manager): seconds until each is restored, p50 and max.  With the
  watches off a change waits for the interval.

And, first, what one watch costs (``--watch-memory K``, default 1000; 0 skips it): this process
opens K held watches of the shared pool (:meth:`stageset.kube.watches.WatchPool.hold`, as the
controller's drift watches are, metadata only, each in its own namespace), waits until each has
delivered an event, and reports its ``VmRSS`` and thread count before and after, per watch.

A default run (no ``--quick``, no ``--no-docs``) writes its tables into ``docs/scale.md`` between
the ``bench.drift`` markers; ``docs/sizing.md`` states the arithmetic they support.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    CONTROLLER_USER,
    StageSetTracker,
    controller_kubeconfig,
    is_ready,
    machine,
    markdown_table,
    replace_section,
    revision,
    role_binding,
)
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.gitserve import serve_directory
from stageset.kube.client import ClientPool, KubeClient
from stageset.kube.types import KubeObject

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "scale.md"
SOURCE_NS = "bench-src"
SOURCE = "app"
ACCOUNT = "deployer"
MANAGER = "stageset-bench"
MODES = ("off", "on")
Key = tuple[str, str]


@dataclass(frozen=True)
class Options:
    watch_memory: int
    sizes: tuple[int, ...]
    objects: int
    tenants: int
    """Tenant namespaces (0: one per StageSet)."""
    interval: int
    windows: int
    edits: int
    workers: int
    write_docs: bool


@dataclass
class Measure:
    n: int
    mode: str
    tenants: int
    cold: float = 0.0
    watches: float = 0.0
    unwatched: float = 0.0
    rss: float = 0.0
    window: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    cold_watches: int = 0
    corrected: list[float] = field(default_factory=list)


def log(message: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def configmap(name: str, index: int) -> KubeObject:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"index": str(index), "greeting": "hello from stageset"}}


def write_repository(directory: Path, *, sets: int, m: int) -> None:
    for k in range(sets):
        folder = directory / "sets" / f"{k:04d}"
        folder.mkdir(parents=True)
        for j in range(m):
            (folder / f"cm-{j}.yaml").write_text(json.dumps(configmap(f"set-{k:04d}-cm-{j}", j)))


def stageset(namespace: str, k: int, interval: int) -> KubeObject:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": f"set-{k:04d}", "namespace": namespace},
            "spec": {"serviceAccountName": ACCOUNT, "interval": f"{interval}s",
                     "stages": [{"name": "main", "path": f"./sets/{k:04d}",
                                 "sourceRef": {"name": SOURCE, "namespace": SOURCE_NS}}]}}


def parallel(threads: int, action: Any, items: list[Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()


def scrape(url: str) -> dict[str, float]:
    """Unlabelled gauges and counters of the controller's ``/metrics``."""
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - loopback, our own process
        text = reply.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                found[sample.name] = sample.value
    return found


SERVING = re.compile(r"serving /metrics on ([0-9.]+):(\d+)")


def metrics_url(controller: ControllerProcess) -> str:
    """Where the controller serves ``/metrics`` (it binds port 0 and logs the address)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in controller.output().splitlines():
            with contextlib.suppress(ValueError):
                if match := SERVING.search(str(json.loads(line).get("message", ""))):
                    return f"http://{match[1]}:{match[2]}/metrics"
        time.sleep(0.2)
    raise TimeoutError("the controller did not say where it serves /metrics")


class Audit:
    """Requests of the controller (as itself and as tenants) between two offsets of the audit log."""

    def __init__(self, plane: envtest.ControlPlane):
        self._path = plane.audit_log
        self._offset = 0

    def start(self) -> None:
        self._offset = self._path.stat().st_size

    def read(self) -> list[dict[str, Any]]:
        time.sleep(1.0)
        with self._path.open("rb") as log_file:
            log_file.seek(self._offset)
            data = log_file.read()
        return [json.loads(line) for line in data.splitlines() if line.strip()]


def ours(event: dict[str, Any]) -> str | None:
    if (event.get("user") or {}).get("username") != CONTROLLER_USER:
        return None
    return "tenant" if (event.get("impersonatedUser") or {}).get("username") else "controller"


def requests(events: list[dict[str, Any]]) -> dict[str, int]:
    """Completed requests by actor (watches: counted when they start)."""
    counted: dict[str, int] = {}
    for event in events:
        actor = ours(event)
        if actor is None:
            continue
        watch = event.get("verb") == "watch"
        if (watch and event.get("stage") == "ResponseStarted") or \
                (not watch and event.get("stage") == "ResponseComplete"):
            counted[actor] = counted.get(actor, 0) + 1
    return counted


def watch_starts(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if ours(e) == "tenant" and e.get("verb") == "watch"
               and e.get("stage") == "ResponseStarted")


class Harness:
    def __init__(self, *, plane: envtest.ControlPlane, admin: KubeClient, tracker: StageSetTracker,
                 config: Path, workdir: Path, options: Options):
        self.plane, self.admin, self.tracker = plane, admin, tracker
        self.config, self.workdir, self.options = config, workdir, options
        self.audit = Audit(plane)

    @contextlib.contextmanager
    def controller(self, label: str, mode: str, n: int) -> Iterator[ControllerProcess]:
        extra = ["--workers", str(self.options.workers), "--metrics-address", "127.0.0.1:0",
                 "--log-format", "json"]
        # Off: none; on: room for every watch the shape needs (one per tenant namespace and kind),
        # so what is measured is every StageSet watched, not the default bound.
        extra += ["--max-drift-watches", "0" if mode == "off" else str(max(500, 2 * n))]
        handle = ControllerProcess(kubeconfig=self.config, workdir=self.workdir / label,
                                   mirror_dir=self.workdir / "mirrors", log_level="info", extra=extra)
        try:
            yield handle
        finally:
            handle.stop()

    def measure(self, n: int, mode: str) -> Measure:
        options = self.options
        count = n if options.tenants <= 0 else min(n, options.tenants)
        namespaces = [f"d{n}-{mode}-t{j:04d}" for j in range(count)]
        log(f"N={n} {mode}: {count} tenants")
        parallel(8, lambda ns: install.create_tenant(self.admin, namespace=ns, service_account=ACCOUNT),
                 namespaces)
        role_binding(self.admin, namespace=SOURCE_NS, name=f"d{n}-{mode}-readers", role="view",
                     subjects=[(ns, ACCOUNT) for ns in namespaces])
        keys = [(namespaces[k % count], f"set-{k:04d}") for k in range(n)]
        found = Measure(n=n, mode=mode, tenants=count)
        with self.controller(f"n{n}-{mode}", mode, n) as controller:
            url = metrics_url(controller)
            self.audit.start()
            start = time.monotonic()
            def create(k: int) -> None:
                namespace, name = keys[k]
                self.admin.apply(STAGESETS.object_path(namespace=namespace, name=name),
                                 stageset(namespace, k, options.interval), field_manager=MANAGER)

            parallel(8, create, list(range(n)))
            self.tracker.wait(keys, lambda obj: obj is not None and is_ready(obj), timeout=120 + 3 * n,
                              what="cold convergence", alive=controller.check_alive)
            found.cold = time.monotonic() - start
            found.cold_watches = watch_starts(self.audit.read())
            log(f"N={n} {mode}: converged in {found.cold:.1f}s; warm window of {options.windows} intervals")
            time.sleep(2)
            self.audit.start()
            begun = time.monotonic()
            time.sleep(options.windows * options.interval)
            found.window = time.monotonic() - begun
            found.requests = requests(self.audit.read())
            metrics = scrape(url)
            found.watches = metrics.get("stageset_drift_watches", 0.0)
            found.unwatched = metrics.get("stageset_drift_unwatched_stagesets", 0.0)
            found.rss = controller.memory_mib().get("VmRSS", 0.0)
            if mode == "on" and options.edits:
                found.corrected = self.corrections(keys, controller)
            log(f"N={n} {mode}: tearing down")
            parallel(8, lambda key: self.admin.request("DELETE", STAGESETS.object_path(namespace=key[0],
                                                                                         name=key[1])), keys)
            self.tracker.wait(keys, lambda obj: obj is None, timeout=300 + 2 * n, what="teardown",
                              alive=controller.check_alive)
        return found

    def corrections(self, keys: list[Key], controller: ControllerProcess) -> list[float]:
        """Seconds from an admin's edit of one ConfigMap of each of ``--edits`` StageSets until restored."""
        step = max(1, len(keys) // self.options.edits)
        chosen = [(k, keys[k]) for k in range(0, len(keys), step)][:self.options.edits]
        times: list[float] = []
        lock = threading.Lock()

        def one(item: tuple[int, Key]) -> None:
            k, (namespace, _) = item
            path = f"/api/v1/namespaces/{namespace}/configmaps/set-{k:04d}-cm-0"
            start = time.monotonic()
            self.admin.request("PATCH", path, content_type="application/merge-patch+json",
                               body={"data": {"greeting": "edited by hand"}},
                               query={"fieldManager": "kubectl-edit"})
            deadline = start + 2 * self.options.interval + 30
            while time.monotonic() < deadline:
                if (self.admin.get(path).get("data") or {}).get("greeting") == "hello from stageset":
                    with lock:
                        times.append(time.monotonic() - start)
                    return
                time.sleep(0.1)
            controller.check_alive()

        parallel(4, one, chosen)
        return sorted(times)


def watch_memory(admin: KubeClient, count: int) -> str:
    """What ``count`` held watches cost this process (RSS, threads), each in a namespace of its own."""
    from stageset.envtest.controller import memory_mib
    from stageset.kube.mapping import Resource
    from stageset.kube.watches import WatchPool

    configmaps = Resource(group="", version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)
    namespaces = [f"w{j:05d}" for j in range(count)]
    parallel(8, lambda ns: admin.apply(f"/api/v1/namespaces/{ns}", {"apiVersion": "v1", "kind": "Namespace",
                                                                    "metadata": {"name": ns}},
                                       field_manager=MANAGER), namespaces)
    heard: set[str] = set()
    lock = threading.Lock()

    def handler(_event: str, obj: KubeObject) -> None:
        with lock:
            heard.add(str((obj.get("metadata") or {}).get("namespace")))

    import os
    pid = os.getpid()
    time.sleep(1)
    before, threads = memory_mib(pid)["VmRSS"], threading.active_count()
    pool = WatchPool()
    listed = admin.get("/api/v1/namespaces/default/configmaps")
    version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
    for ns in namespaces:
        pool.hold("bench", admin, configmaps, ns, handler=handler, label_selector="bench",
                  resource_version=version)
    parallel(8, lambda ns: admin.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body={
        "metadata": {"name": "x", "labels": {"bench": "1"}}, "data": {"k": "v"}}), namespaces)
    deadline = time.monotonic() + 120
    while len(heard) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    after, more = memory_mib(pid)["VmRSS"], threading.active_count()
    pool.close()
    rows = [[str(count), str(len(heard)), f"{before:.0f}", f"{after:.0f}",
             f"{(after - before) * 1024 / count:.0f}", str(more - threads)]]
    return ("What held watches cost the process holding them (each a thread and a connection, metadata "
            "only):\n\n" + markdown_table(["watches", "streaming", "RSS before MiB", "RSS after MiB",
                                             "KiB per watch", "threads added"], rows) + "\n")


def report(measures: list[Measure], options: Options) -> str:
    rows = []
    for m in measures:
        per = m.n * m.window / options.interval
        tenant, controller = m.requests.get("tenant", 0), m.requests.get("controller", 0)
        corrected = (f"{statistics.median(m.corrected):.2f} / {max(m.corrected):.2f} s "
                     f"({len(m.corrected)} of {options.edits})") if m.corrected else \
            ("at the interval" if m.mode == "off" else "-")
        rows.append([str(m.n), str(m.tenants), m.mode, f"{m.watches:.0f}", f"{m.unwatched:.0f}",
                     f"{m.rss:.0f}", f"{(tenant + controller) / per:.2f}", f"{tenant / per:.2f}",
                     f"{controller / per:.2f}", str(m.cold_watches), f"{m.cold:.1f} s", corrected])
    table = markdown_table(["N", "tenants", "drift watches", "held", "unwatched", "RSS MiB",
                            "requests / set / interval", "as tenants", "as controller",
                            "watches opened (cold)", "cold", "edit corrected p50 / max"], rows)
    return (f"{machine()}; {revision(ROOT)}; {options.objects} ConfigMaps per StageSet, interval "
            f"{options.interval}s, warm window {options.windows} intervals, {options.workers} workers.\n\n"
            f"{table}\n")


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.drift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch-memory", type=int, default=1000,
                        help="held watches to measure (0: skip)")
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--quick", action="store_true", help="N = 10, 50; print only")
    parser.add_argument("--objects", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=0, help="tenant namespaces (0: one per StageSet)")
    parser.add_argument("--interval", type=int, default=60)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    sizes = (10, 50) if args.quick else tuple(int(s) for s in args.sizes.split(",") if s)
    return Options(watch_memory=100 if args.quick else args.watch_memory, sizes=sizes, objects=args.objects,
                   tenants=args.tenants, interval=args.interval,
                   windows=args.windows, edits=args.edits, workers=args.workers,
                   write_docs=not args.quick and not args.no_docs)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    workdir = Path(tempfile.mkdtemp(prefix="stageset-bench-drift-"))
    repo = workdir / "repo"
    write_repository(repo, sets=max(options.sizes, default=0), m=options.objects)
    log(f"starting a control plane; work directory {workdir}")
    plane = envtest.start(workdir=workdir / "plane")
    tracker: StageSetTracker | None = None
    measures: list[Measure] = []
    memory = ""
    try:
        admin = ClientPool.from_kubeconfig(str(plane.kubeconfig)).client()
        install.install(admin)
        config = controller_kubeconfig(admin, plane, workdir / "controller.kubeconfig")
        admin.apply(f"/api/v1/namespaces/{SOURCE_NS}",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SOURCE_NS}},
                    field_manager=MANAGER)
        if options.watch_memory:
            log(f"{options.watch_memory} held watches: what they cost")
            memory = watch_memory(admin, options.watch_memory)
        if not options.sizes:
            return _finish(memory, measures, options)
        tracker = StageSetTracker(admin)
        tracker.start()
        with serve_directory(repo, name="bench") as url:
            admin.apply(GITREPOSITORIES.object_path(namespace=SOURCE_NS, name=SOURCE),
                        {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                         "metadata": {"name": SOURCE, "namespace": SOURCE_NS},
                         "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"}},
                        field_manager=MANAGER)
            harness = Harness(plane=plane, admin=admin, tracker=tracker, config=config, workdir=workdir,
                              options=options)
            for n in options.sizes:
                for mode in MODES:
                    measures.append(harness.measure(n, mode))
    finally:
        if tracker is not None:
            tracker.stop()
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return _finish(memory, measures, options)


def _finish(memory: str, measures: list[Measure], options: Options) -> int:
    text = memory + "\n" + report(measures, options) if measures else memory
    print(text)
    if options.write_docs:
        when = time.strftime("%Y-%m-%d")
        replace_section(DOCS, marker="bench.drift", skeleton="# Scale\n",
                        body=f"Measured with `.venv/bin/python -m bench.drift` on {when}.\n\n{text}")
        log(f"wrote {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
