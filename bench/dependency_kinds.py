"""How soon a StageSet starts once an object of another kind it waits for turns Ready (issue 49).

Run from the checkout's root::

    .venv/bin/python -m bench.dependency_kinds            # K = 12 of each (~2 min), writes docs/benchmarks.md
    .venv/bin/python -m bench.dependency_kinds --quick    # K = 4, prints only

One control plane (etcd + kube-apiserver from :mod:`stageset.envtest`), one controller process with
the chart's multi-tenant rights, one tenant namespace whose ServiceAccount has ``edit`` and may get,
list and watch the test CRD's ``Database`` objects (:mod:`stageset.envtest.dependencykinds`), one
GitRepository.  Every StageSet applies one ConfigMap and retries only every 10 minutes, so each one
measured is started by a wake, never by its retry.  Times are monotonic timestamps in this process:
the patch sent, and the moment a watch of every StageSet here (:class:`bench.common.StageSetTracker`)
first sees the StageSet Ready.

1. **Database** (K, one after another): StageSet ``db-i`` depends on ``Database db-i``, created
   ``Ready=False``; once the StageSet says ``DependencyNotReady`` ("is not Ready") and a random
   0.2-1 s has passed, the Database's ``Ready`` condition is patched ``True``.  Measured: patch ->
   StageSet Ready (the controller hears it through its held watch, as the tenant, reads it, applies).
2. **Peer: a StageSet dependency** (K pairs, one after another): ``b-i`` depends on StageSet
   ``a-i``, which holds a Deployment whose status the benchmark patches as a kubelet would.
   Measured: ``a-i`` Ready -> ``b-i`` Ready (the existing event-driven wake, ``bench.apply``'s unblock).
3. **Floor** (K, one after another): an independent StageSet of the same one ConfigMap, created:
   create -> Ready (one cold pass, started by the controller's own StageSet watch).
4. **Waiting costs** (K at once): K StageSets waiting for K Databases that are not Ready, for 10 s:
   the requests the controller and its tenants made meanwhile (from the audit log; the held watch's
   own stream is not a request made in the window), then every Database turned Ready at once: the
   time until all K StageSets are Ready.

Printed as Markdown; a default run (not ``--quick``, not ``--no-docs``) also writes it into
``docs/benchmarks.md`` between the ``bench.dependency_kinds`` markers.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    AuditCounts,
    AuditWindow,
    StageSetTracker,
    controller_kubeconfig,
    is_ready,
    machine,
    markdown_table,
    percentile,
    ready_condition,
    replace_section,
    revision,
)
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.envtest import dependencykinds as kinds
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.gitserve import serve_directory
from stageset.kube.client import ApiError, ClientPool, KubeClient
from stageset.kube.types import KubeObject

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
NS = "waits"
ACCOUNT = "deployer"
SOURCE = "app"
MANAGER = "stageset-bench"
Key = tuple[str, str]


def log(message: str) -> None:
    print(f"[bench.dependency_kinds] {message}", file=sys.stderr, flush=True)


@dataclass
class Results:
    k: int
    database: list[float] = field(default_factory=list)  # Database patched Ready -> StageSet Ready
    peer: list[float] = field(default_factory=list)  # StageSet a Ready -> b Ready
    peer_patch: list[float] = field(default_factory=list)  # Deployment patched -> b Ready
    floor: list[float] = field(default_factory=list)  # independent StageSet created -> Ready
    waiting_seconds: float = 0.0
    waiting: AuditCounts = field(default_factory=AuditCounts)
    all_at_once: float = 0.0  # K Databases patched Ready -> all K StageSets Ready


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": name}}


def deployment(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                         {"name": "app", "image": f"registry.invalid/{name}:1"}]}}}}


def write_repository(directory: Path, k: int) -> None:
    for prefix in ("db", "b", "free", "many"):
        for i in range(k):
            folder = directory / prefix / f"{i:02d}"
            folder.mkdir(parents=True)
            (folder / "cm.json").write_text(json.dumps(configmap(f"{prefix}-{i:02d}")))
    for i in range(k):
        folder = directory / "a" / f"{i:02d}"
        folder.mkdir(parents=True)
        (folder / "deploy.json").write_text(json.dumps(deployment(f"a-{i:02d}")))


def stageset(name: str, path: str, **spec: Any) -> KubeObject:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"serviceAccountName": ACCOUNT, "retryInterval": "10m",
                     "stages": [{"name": "main", "path": path, "sourceRef": {"name": SOURCE}}], **spec}}


def database_ref(name: str) -> dict[str, str]:
    return {"apiVersion": f"{kinds.DB_GROUP}/{kinds.DB_VERSION}", "kind": "Database", "name": name}


class Bench:
    def __init__(self, *, admin: KubeClient, tracker: StageSetTracker, controller: ControllerProcess,
                 audit: AuditWindow):
        self.admin = admin
        self.tracker = tracker
        self.controller = controller
        self.audit = audit
        self.jitter = random.Random(49)  # noqa: S311 - a reproducible spread of waits, not crypto

    def create(self, obj: KubeObject) -> Key:
        meta = obj["metadata"]
        self.admin.apply(STAGESETS.object_path(name=meta["name"], namespace=NS), obj, field_manager=MANAGER)
        return NS, str(meta["name"])

    def wait(self, keys: list[Key], check: Any, what: str, timeout: float = 60) -> float:
        return self.tracker.wait(keys, check, timeout=timeout, what=what, alive=self.controller.check_alive)

    def waiting_for(self, key: Key, text: str) -> None:
        def check(obj: KubeObject | None) -> bool:
            ready = ready_condition(obj) if obj is not None else {}
            return ready.get("reason") == "DependencyNotReady" and text in str(ready.get("message", ""))
        self.wait([key], check, f"{key[1]} waiting ({text})")

    def database(self, i: int) -> float:
        name = f"db-{i:02d}"
        kinds.create_database(self.admin, NS, name, status={"conditions": [
            kinds.ready_condition("False", "provisioning storage")]})
        key = self.create(stageset(name, f"./db/{i:02d}", dependsOn=[database_ref(name)]))
        self.waiting_for(key, "is not Ready")
        time.sleep(self.jitter.uniform(0.2, 1.0))
        start = time.monotonic()
        kinds.set_database_status(self.admin, NS, name, {"conditions": [kinds.ready_condition("True")]})
        self.wait([key], lambda obj: obj is not None and is_ready(obj), f"{name} Ready")
        ready = self.tracker.ready_since(key)
        assert ready is not None
        return ready - start

    def peer(self, i: int) -> tuple[float, float]:
        a = self.create(stageset(f"a-{i:02d}", f"./a/{i:02d}"))
        b = self.create(stageset(f"b-{i:02d}", f"./b/{i:02d}", dependsOn=[{"name": a[1]}]))
        deploy = f"/apis/apps/v1/namespaces/{NS}/deployments/a-{i:02d}"
        deadline = time.monotonic() + 60
        while True:
            self.controller.check_alive()
            try:
                self.admin.get(deploy)
                break
            except ApiError as error:
                if not error.not_found or time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        self.waiting_for(b, "is not Ready")
        time.sleep(self.jitter.uniform(0.2, 1.0))
        start = time.monotonic()
        self.admin.request("PATCH", f"{deploy}/status", content_type="application/merge-patch+json",
                           body={"status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                            "readyReplicas": 1, "availableReplicas": 1}})
        self.wait([a, b], lambda obj: obj is not None and is_ready(obj), f"pair {i} Ready")
        a_ready, b_ready = self.tracker.ready_since(a), self.tracker.ready_since(b)
        assert a_ready is not None
        assert b_ready is not None
        return b_ready - a_ready, b_ready - start

    def floor(self, i: int) -> float:
        time.sleep(self.jitter.uniform(0.2, 1.0))
        start = time.monotonic()
        key = self.create(stageset(f"free-{i:02d}", f"./free/{i:02d}"))
        self.wait([key], lambda obj: obj is not None and is_ready(obj), f"free-{i:02d} Ready")
        ready = self.tracker.ready_since(key)
        assert ready is not None
        return ready - start

    def many(self, k: int, into: Results) -> None:
        keys = []
        for i in range(k):
            name = f"many-{i:02d}"
            kinds.create_database(self.admin, NS, name, status={"conditions": [
                kinds.ready_condition("False", "provisioning storage")]})
            keys.append(self.create(stageset(name, f"./many/{i:02d}", dependsOn=[database_ref(name)])))
        for key in keys:
            self.waiting_for(key, "is not Ready")
        time.sleep(2.0)  # the held first waits (1 s) have been said
        self.audit.start()
        begun = time.monotonic()
        time.sleep(10.0)
        into.waiting = self.audit.finish(settle=0.0)
        into.waiting_seconds = time.monotonic() - begun
        start = time.monotonic()
        for i in range(k):
            kinds.set_database_status(self.admin, NS, f"many-{i:02d}",
                                      {"conditions": [kinds.ready_condition("True")]})
        done = self.wait(keys, lambda obj: obj is not None and is_ready(obj), "all Ready")
        into.all_at_once = max(self.tracker.ready_since(key) or done for key in keys) - start


def _ms(values: list[float]) -> str:
    p50, p95, top = percentile(values, 50), percentile(values, 95), max(values)
    return f"{p50 * 1000:.0f} / {p95 * 1000:.0f} / {top * 1000:.0f} ms"


def report(results: Results, elapsed: float) -> str:
    floor = percentile(results.floor, 50)
    rows = [
        [f"Database patched Ready -> dependent StageSet Ready ({results.k}, one at a time)",
         _ms(results.database), f"{percentile(results.database, 50) / floor:.2f}x"],
        [f"Peer: StageSet a Ready -> dependent StageSet b Ready ({results.k} pairs)", _ms(results.peer),
         f"{percentile(results.peer, 50) / floor:.2f}x"],
        [f"Peer: Deployment patched -> b Ready ({results.k} pairs)", _ms(results.peer_patch),
         f"{percentile(results.peer_patch, 50) / floor:.2f}x"],
        [f"Floor: independent StageSet created -> Ready ({results.k})", _ms(results.floor), "1.00x"],
        [f"{results.k} Databases patched Ready at once -> all {results.k} StageSets Ready",
         f"{results.all_at_once * 1000:.0f} ms", ""],
    ]
    table = markdown_table(["Measure", "p50 / p95 / max", "p50 vs floor"], rows)
    spent, counts = results.waiting_seconds, results.waiting
    verbs = ", ".join(f"{actor} {verb}: {count}" for (actor, verb), count in sorted(counts.by_verb.items()))
    return (f"Machine: {machine()}. Code: {revision(ROOT)}. Whole run: {elapsed:.0f} s. Every StageSet "
            f"retries only every 10 minutes: each one measured was started by a wake.\n\n{table}\n\n"
            f"While {results.k} StageSets waited for {results.k} Databases that were not Ready "
            f"({spent:.0f} s), the controller and its tenants made {counts.total()} requests "
            f"({verbs or 'none'}; one held watch of databases, as the tenant, stays open meanwhile).")


def parse(argv: list[str] | None) -> tuple[int, bool]:
    parser = argparse.ArgumentParser(prog="python -m bench.dependency_kinds",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="K = 4; prints only")
    parser.add_argument("-k", type=int, help="StageSets of each measure (default 12, 4 with --quick)")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)
    k = args.k or (4 if args.quick else 12)
    return k, not (args.quick or args.no_docs or args.k)


def main(argv: list[str] | None = None) -> int:
    k, write_docs = parse(argv)
    begun = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="stageset-bench-deps-"))
    repo = workdir / "repo"
    write_repository(repo, k)
    log(f"starting a control plane; work directory {workdir}")
    plane = envtest.start(workdir=workdir / "plane")
    tracker: StageSetTracker | None = None
    results = Results(k=k)
    try:
        admin = ClientPool.from_kubeconfig(str(plane.kubeconfig)).client()
        install.install(admin)
        kinds.install(admin)
        install.create_tenant(admin, namespace=NS, service_account=ACCOUNT)
        kinds.grant_reading(admin, namespace=NS, account=ACCOUNT, group=kinds.DB_GROUP, plural="databases")
        config = controller_kubeconfig(admin, plane, workdir / "controller.kubeconfig")
        tracker = StageSetTracker(admin)
        tracker.start()
        with serve_directory(repo, name="bench") as url:
            admin.apply(GITREPOSITORIES.object_path(namespace=NS, name=SOURCE),
                        {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                         "metadata": {"name": SOURCE, "namespace": NS},
                         "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"}},
                        field_manager=MANAGER)
            controller = ControllerProcess(kubeconfig=config, workdir=workdir / "controller",
                                           mirror_dir=workdir / "mirrors", log_level="warning")
            try:
                bench = Bench(admin=admin, tracker=tracker, controller=controller, audit=AuditWindow(plane))
                # The source is fetched before anything is timed (every StageSet here reads it).
                path = GITREPOSITORIES.object_path(namespace=NS, name=SOURCE)
                deadline = time.monotonic() + 120
                while not is_ready(admin.get(path)):
                    controller.check_alive()
                    if time.monotonic() > deadline:
                        raise TimeoutError("the GitRepository was not fetched")
                    time.sleep(0.1)
                for i in range(k):
                    results.floor.append(bench.floor(i))
                    log(f"floor {i}: {results.floor[-1] * 1000:.0f} ms")
                for i in range(k):
                    results.database.append(bench.database(i))
                    log(f"database {i}: {results.database[-1] * 1000:.0f} ms")
                for i in range(k):
                    unblock, from_patch = bench.peer(i)
                    results.peer.append(unblock)
                    results.peer_patch.append(from_patch)
                    log(f"peer {i}: {unblock * 1000:.0f} ms after a "
                        f"({from_patch * 1000:.0f} ms after the patch)")
                bench.many(k, results)
            finally:
                controller.stop()
    finally:
        if tracker is not None:
            tracker.stop()
        plane.stop()
    text = report(results, time.monotonic() - begun)
    print(text)
    if write_docs:
        replace_section(DOCS, marker="bench.dependency_kinds", skeleton="# Benchmarks\n",
                        body=f"Measured with `.venv/bin/python -m bench.dependency_kinds` on "
                        f"{time.strftime('%Y-%m-%d')}.\n\n{text}")
        log(f"wrote {DOCS.relative_to(ROOT)}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
