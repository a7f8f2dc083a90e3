"""Benchmark of the apply engine and the controller against a real kube-apiserver on loopback.

Run from the checkout's root::

    .venv/bin/python -m bench.apply            # N = 10, 100 StageSets; 20 dependency pairs (~2.5 min)
    .venv/bin/python -m bench.apply --quick    # N = 10, 50; 8 pairs (~1.2 min), does not touch docs/
    .venv/bin/python -m bench.apply --full     # adds N = 1000 (~5.5 min)

on a 2-core machine.

Everything runs in ONE process against ONE control plane (etcd + kube-apiserver from
:mod:`stageset.envtest`), and every controller number is put next to a floor measured in
the same run, on the same apiserver:

1. **Cold convergence**: N StageSets, each one stage of M ConfigMaps (its own directory of
   one Git repository, served on loopback, reached through one shared GitRepository),
   spread over tenant namespaces, each StageSet applying as its tenant's ServiceAccount.
   Timed from the first StageSet create until every StageSet is Ready (seen by a watch).
   The **floor** is a plain loop that server-side-applies the same N x M objects (same
   labels, same size, other names) as the same impersonated tenants through the same
   client code, with no controller logic, on ``workers x apply parallelism`` threads (the
   most requests the controller may have in flight) and on ``workers`` threads; the ratio
   is against the faster of the two.
2. **Warm no-op**: every converged StageSet is poked (``reconcile.fluxcd.io/requestedAt``);
   once each has handled it and is Ready again, the audit log of that window is counted:
   requests made by the controller and by the tenants it impersonates, and real writes
   (non-dry-run create/update/patch/delete) split into writes to the applied objects
   (target: zero), StageSet status writes (``lastHandledReconcileAt`` must be written
   once, so at least one per StageSet is expected) and others.
3. **Dependency unblock**: K pairs, StageSet ``b-i`` ``dependsOn`` ``a-i``; ``a-i`` holds a
   Deployment (nothing runs it: the benchmark patches its status as a kubelet and
   deployment controller would). Pairs run one after the other; even pairs are patched
   while ``a-i`` is in its first readiness wait ("early"), odd pairs after ``a-i`` has
   given its worker back and is re-checked in its ``Waiting`` loop ("late", at a random
   point of that loop; the loop's own requests are counted meanwhile). Measured from the
   status patch: until ``a-i`` is Ready (the floor: the controller's readiness polling)
   and until ``b-i`` is Ready; p50/p95 of each and of the difference (the unblock itself).
4. **Controller memory**: ``VmRSS``/``VmHWM`` of the controller subprocess after the cold
   convergence and after the warm pass of each N (a fresh controller per N).

A fresh controller process is started for each N (it watches the whole cluster; the
previous N's StageSets have been deleted — that teardown is timed too). Results are
printed as Markdown; a default or ``--full`` run (no overrides, no ``--no-docs``) also
writes them into ``docs/benchmarks.md`` between the ``bench.apply`` markers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    AuditCounts,
    AuditWindow,
    CpuMeter,
    StageSetTracker,
    controller_kubeconfig,
    is_ready,
    machine,
    markdown_table,
    percentile,
    poke,
    ready_condition,
    replace_section,
    revision,
    role_binding,
)
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.apply.settings import ApplySettings
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.settings import ControllerSettings
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.gitserve import serve_directory
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from stageset.kube.types import KubeObject

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
SOURCE_NS = "bench-src"
SOURCE = "app"
ACCOUNT = "deployer"
MANAGER = "stageset-bench"
Key = tuple[str, str]


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...]
    objects: int
    pairs: int
    tenants: int
    workers: int
    parallelism: int
    mode: str
    keep: bool = False
    write_docs: bool = False
    repository_sets: int = 0
    """StageSet directories in the Git repository (at least the largest N): a monorepo's size."""


@dataclass
class Round:
    """Results for one N."""

    n: int
    m: int
    tenants: int
    floor_wide: float = 0.0  # seconds, workers x parallelism threads
    floor_narrow: float = 0.0  # seconds, workers threads
    created: float = 0.0  # seconds until every StageSet was created
    cold: float = 0.0
    cold_audit: AuditCounts = field(default_factory=AuditCounts)
    warm: float = 0.0
    warm_audit: AuditCounts = field(default_factory=AuditCounts)
    warm_flaps: int = 0  # StageSets seen leaving Ready during the warm pass
    memory_cold: dict[str, float] = field(default_factory=dict)
    memory_warm: dict[str, float] = field(default_factory=dict)
    teardown: float = 0.0
    teardown_audit: AuditCounts = field(default_factory=AuditCounts)
    # CPU seconds per process (controller, kube-apiserver, etcd, benchmark) in each phase
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def floor(self) -> float:
        return min(self.floor_wide, self.floor_narrow)


@dataclass
class Latencies:
    to_a: list[float] = field(default_factory=list)  # status patch -> A Ready
    to_b: list[float] = field(default_factory=list)  # status patch -> B Ready
    unblock: list[float] = field(default_factory=list)  # A Ready -> B Ready


@dataclass
class Dependencies:
    """Early pairs: the Deployment turns ready while A's first readiness wait is still running.
    Late pairs: only after A gave its worker back and is in the ``Waiting`` requeue loop."""

    pairs: int
    early: Latencies = field(default_factory=Latencies)
    late: Latencies = field(default_factory=Latencies)
    # What the controller did while one StageSet was Waiting (late pairs), and for how long
    waiting_audit: AuditCounts = field(default_factory=AuditCounts)
    waiting_seconds: float = 0.0


def log(message: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# -- fixtures ---------------------------------------------------------------------------------------


def configmap(name: str, index: int) -> KubeObject:
    """One small ConfigMap (~300 bytes on the wire); its namespace is defaulted by whoever applies it."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"index": str(index), "greeting": "hello from stageset",
                     "settings.json": json.dumps({"replicas": 3, "feature": f"f{index}", "ttl": 300})}}


def deployment(name: str) -> KubeObject:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                         {"name": "app", "image": f"registry.invalid/{name}:1"}]}}}}


def set_name(k: int) -> str:
    return f"set-{k:04d}"


def object_names(prefix: str, k: int, m: int) -> list[str]:
    return [f"{prefix}-{k:04d}-cm-{j}" for j in range(m)]


def write_repository(directory: Path, *, sets: int, m: int, pairs: int) -> None:
    """``sets/<k>/`` holds StageSet k's M ConfigMaps; ``deps/a<i>``, ``deps/b<i>`` the dependency pairs."""
    for k in range(sets):
        folder = directory / "sets" / f"{k:04d}"
        folder.mkdir(parents=True)
        for j, name in enumerate(object_names("set", k, m)):
            (folder / f"cm-{j}.yaml").write_text(json.dumps(configmap(name, j), indent=1))
    for i in range(pairs):
        (directory / "deps" / f"a{i:02d}").mkdir(parents=True)
        (directory / "deps" / f"a{i:02d}" / "db.yaml").write_text(json.dumps(deployment(f"db-{i:02d}")))
        (directory / "deps" / f"b{i:02d}").mkdir(parents=True)
        (directory / "deps" / f"b{i:02d}" / "app.yaml").write_text(json.dumps(configmap(f"app-{i:02d}", i)))


def stageset(namespace: str, name: str, path: str, **spec: Any) -> KubeObject:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"serviceAccountName": ACCOUNT, "interval": "1h",
                     "stages": [{"name": "main", "path": path,
                                 "sourceRef": {"name": SOURCE, "namespace": SOURCE_NS}}],
                     **spec}}


def waiting(obj: KubeObject | None) -> bool:
    """A stage of this StageSet is in the ``Waiting`` phase (its readiness wait is re-checked)."""
    return obj is not None and any(stage.get("phase") == "Waiting"
                                   for stage in (obj.get("status") or {}).get("stages", []))


def stageset_path(key: Key) -> str:
    return STAGESETS.object_path(namespace=key[0], name=key[1])


def parallel(threads: int, action: Callable[[Any], object], items: list[Any]) -> None:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()


def tenants(admin: KubeClient, namespaces: list[str]) -> None:
    """Each namespace gets a ``deployer`` ServiceAccount with ``edit`` there and ``view`` on the source."""
    parallel(8, lambda ns: install.create_tenant(admin, namespace=ns, service_account=ACCOUNT), namespaces)
    role_binding(admin, namespace=SOURCE_NS, name=f"{namespaces[0]}-readers", role="view",
                 subjects=[(ns, ACCOUNT) for ns in namespaces])


# -- the controller ----------------------------------------------------------------------------------


class Harness:
    def __init__(self, *, plane: envtest.ControlPlane, admin: KubeClient, tracker: StageSetTracker,
                 controller_config: Path, workdir: Path, options: Options):
        self.plane = plane
        self.admin = admin
        self.tracker = tracker
        self.controller_config = controller_config
        self.workdir = workdir
        self.options = options
        self.audit = AuditWindow(plane)
        # The floor's clients: the controller's own token, impersonating the tenants.
        self.floor_pool = ClientPool.from_kubeconfig(str(controller_config))

    @contextlib.contextmanager
    def controller(self, label: str) -> Iterator[ControllerProcess]:
        """A fresh controller process, returned once it is synced and has reconciled the source."""
        handle = ControllerProcess(kubeconfig=self.controller_config, workdir=self.workdir / label,
                                   mirror_dir=self.workdir / "mirrors", log_level="warning",
                                   extra=["--workers", str(self.options.workers)])
        try:
            path = GITREPOSITORIES.object_path(namespace=SOURCE_NS, name=SOURCE)
            stamp = poke(self.admin, path)
            deadline = time.monotonic() + 120
            while True:
                handle.check_alive()
                status = self.admin.get(path).get("status") or {}
                if status.get("lastHandledReconcileAt") == stamp and is_ready(self.admin.get(path)):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"controller did not reconcile the GitRepository: {status}")
                time.sleep(0.1)
            yield handle
        finally:
            handle.stop()

    def processes(self, controller: ControllerProcess | None = None) -> dict[str, int]:
        etcd, apiserver = (p.pid for p in self.plane._processes)
        found = {"controller": controller.process.pid} if controller else {}
        return {**found, "kube-apiserver": apiserver, "etcd": etcd, "benchmark": os.getpid()}

    def warm_up(self, namespaces: list[str], threads: int) -> None:
        """Open the floor clients' connections (one pool per identity, as in the controller)."""
        def get(namespace: str) -> None:
            client = self.floor_pool.client(Identity.service_account(namespace=namespace, name=ACCOUNT))
            client.request("GET", f"/api/v1/namespaces/{namespace}/configmaps", query={"limit": 1})

        parallel(threads, get, [ns for ns in namespaces for _ in range(threads)])

    def floor(self, plan: list[tuple[str, KubeObject]], threads: int) -> float:
        """Seconds to server-side-apply every ``(namespace, object)`` on ``threads`` threads."""
        def apply(item: tuple[str, KubeObject]) -> None:
            namespace, obj = item
            client = self.floor_pool.client(Identity.service_account(namespace=namespace, name=ACCOUNT))
            client.apply(f"/api/v1/namespaces/{namespace}/configmaps/{obj['metadata']['name']}", obj,
                         field_manager="stageset-controller")

        start = time.perf_counter()
        parallel(threads, apply, plan)
        return time.perf_counter() - start

    def floor_plan(self, placement: list[tuple[Key, int]], prefix: str) -> list[tuple[str, KubeObject]]:
        """The objects the controller will apply for ``placement``, renamed with ``prefix``."""
        plan = []
        m = self.options.objects
        for (namespace, _), k in placement:
            owner = f"{prefix}-{k:04d}"
            for j, name in enumerate(object_names(prefix, k, m)):
                obj = configmap(name, j)
                obj["metadata"].update(namespace=namespace, labels={
                    LABEL_NAME: owner, LABEL_NAMESPACE: namespace, LABEL_STAGE: "main"})
                plan.append((namespace, obj))
        return plan

    def delete_all(self, keys: list[Key], controller: ControllerProcess) -> float:
        start = time.monotonic()
        parallel(8, lambda key: self.admin.request("DELETE", stageset_path(key)), keys)
        done = self.tracker.wait(keys, lambda obj: obj is None, timeout=900, what="teardown",
                                 alive=controller.check_alive)
        return done - start

    # -- 1, 2, 4: one N ---------------------------------------------------------------------------

    def round(self, n: int) -> Round:
        options = self.options
        count = min(n, options.tenants)
        namespaces = [f"n{n}-t{j:02d}" for j in range(count)]
        result = Round(n=n, m=options.objects, tenants=count)
        tenants(self.admin, namespaces)
        placement = [((namespaces[k % count], set_name(k)), k) for k in range(n)]
        keys = [key for key, _ in placement]

        wide = options.workers * options.parallelism
        log(f"N={n}: floor, {n * options.objects} objects on {wide} and {options.workers} threads")
        self.warm_up(namespaces, wide)
        meter = CpuMeter(self.processes())
        meter.start()
        result.floor_wide = self.floor(self.floor_plan(placement, "raw"), wide)
        result.cpu["floor"] = meter.finish()
        result.floor_narrow = self.floor(self.floor_plan(placement, "rw4"), options.workers)

        with self.controller(f"controller-n{n}") as controller:
            log(f"N={n}: cold convergence")
            meter = CpuMeter(self.processes(controller))
            meter.start()
            self.audit.start()
            start = time.monotonic()
            parallel(8, lambda item: self.admin.apply(
                stageset_path(item[0]), stageset(item[0][0], item[0][1], f"./sets/{item[1]:04d}"),
                field_manager=MANAGER), placement)
            result.created = time.monotonic() - start
            ready = self.tracker.wait(keys, lambda obj: obj is not None and is_ready(obj),
                                      timeout=60 + 3 * n, what="cold convergence",
                                      alive=controller.check_alive)
            result.cold = ready - start
            result.cpu["cold"] = meter.finish()
            result.cold_audit = self.audit.finish()
            result.memory_cold = controller.memory_mib()

            log(f"N={n}: warm no-op")
            stamp = f"{time.time():.6f}"
            flaps = self.tracker.flaps(keys)
            self.audit.start()
            meter.start()
            start = time.monotonic()
            parallel(8, lambda key: poke(self.admin, stageset_path(key), stamp), keys)

            def handled(obj: KubeObject | None) -> bool:
                return obj is not None and is_ready(obj) and \
                    (obj.get("status") or {}).get("lastHandledReconcileAt") == stamp

            done = self.tracker.wait(keys, handled, timeout=60 + 2 * n, what="warm no-op",
                                     alive=controller.check_alive)
            result.warm = done - start
            result.cpu["warm"] = meter.finish()
            result.warm_flaps = self.tracker.flaps(keys) - flaps
            result.warm_audit = self.audit.finish(settle=2.0)
            result.memory_warm = controller.memory_mib()

            log(f"N={n}: teardown")
            self.audit.start()
            meter.start()
            result.teardown = self.delete_all(keys, controller)
            result.cpu["teardown"] = meter.finish()
            result.teardown_audit = self.audit.finish()
        return result

    # -- 3: dependency pairs ------------------------------------------------------------------------

    def dependencies(self, pairs: int) -> Dependencies:
        namespace = "deps"
        tenants(self.admin, [namespace])
        result = Dependencies(pairs=pairs)
        keys: list[Key] = []
        jitter = random.Random(4)  # noqa: S311 - a reproducible spread of waits, not crypto
        with self.controller("controller-deps") as controller:
            for i in range(pairs):
                a, b = (namespace, f"a-{i:02d}"), (namespace, f"b-{i:02d}")
                keys += [a, b]
                self.admin.apply(stageset_path(a), stageset(namespace, a[1], f"./deps/a{i:02d}"),
                                 field_manager=MANAGER)
                # b retries only every 10 minutes: reaching Ready proves it was woken by a's change.
                self.admin.apply(stageset_path(b), stageset(namespace, b[1], f"./deps/b{i:02d}",
                                                            dependsOn=[{"name": a[1]}], retryInterval="10m"),
                                 field_manager=MANAGER)
                deploy = f"/apis/apps/v1/namespaces/{namespace}/deployments/db-{i:02d}"
                deadline = time.monotonic() + 60
                while True:
                    controller.check_alive()
                    try:
                        self.admin.get(deploy)
                        break
                    except ApiError as error:
                        if not error.not_found or time.monotonic() > deadline:
                            raise
                    time.sleep(0.05)
                self.tracker.wait([b], lambda obj: obj is not None and
                                  ready_condition(obj).get("reason") == "DependencyNotReady",
                                  timeout=60, what="b waiting for a", alive=controller.check_alive)
                late = i % 2 == 1
                if late:
                    # a's first wait ran out: it gave its worker back and is re-checked in a loop;
                    # count what that loop costs while nothing changes.
                    self.tracker.wait([a], waiting, timeout=60, what="a Waiting",
                                      alive=controller.check_alive)
                    self.audit.start()
                    begun = time.monotonic()
                    # At a random point of the re-check cycle (slice + requeue), not in step with it.
                    time.sleep(jitter.uniform(4.0, 8.0))
                    counts = self.audit.finish(settle=0.0)
                    result.waiting_seconds += time.monotonic() - begun
                    result.waiting_audit.requests.update(counts.requests)
                    result.waiting_audit.by_verb.update(counts.by_verb)
                    result.waiting_audit.writes.update(counts.writes)
                else:
                    time.sleep(0.2)  # a is now in its first readiness wait
                start = time.monotonic()
                self.admin.request("PATCH", f"{deploy}/status", content_type="application/merge-patch+json",
                                   body={"status": {"observedGeneration": 1, "replicas": 1,
                                                    "updatedReplicas": 1, "readyReplicas": 1,
                                                    "availableReplicas": 1}})
                self.tracker.wait([a, b], lambda obj: obj is not None and is_ready(obj), timeout=120,
                                  what=f"pair {i}", alive=controller.check_alive)
                a_ready, b_ready = self.tracker.ready_since(a), self.tracker.ready_since(b)
                if a_ready is None or b_ready is None:
                    raise RuntimeError(f"pair {i}: Ready but no time recorded")
                into = result.late if late else result.early
                into.to_a.append(a_ready - start)
                into.to_b.append(b_ready - start)
                into.unblock.append(b_ready - a_ready)
                log(f"pair {i} ({'late' if late else 'early'}): a {a_ready - start:.3f}s, "
                    f"b {b_ready - start:.3f}s")
            self.delete_all(keys, controller)
        return result


# -- reporting -------------------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def _per(value: int, n: int) -> str:
    return f"{value} ({value / n:.1f}/StageSet)"


def _ms(values: list[float]) -> str:
    return f"{percentile(values, 50) * 1000:.0f} / {percentile(values, 95) * 1000:.0f} ms"


def summary_table(rounds: list[Round], deps: Dependencies | None) -> str:
    rows: list[list[str]] = []
    for r in rounds:
        rows.append([f"Cold convergence, {r.n} StageSets x {r.m} ConfigMaps", _seconds(r.cold),
                     f"{_seconds(r.floor)} raw SSA", f"{r.cold / r.floor:.1f}x"])
    for r in rounds:
        applied = r.warm_audit.writes.get("applied objects", 0)
        status = r.warm_audit.writes.get("StageSet status", 0)
        rows.append([f"Warm no-op, {r.n} StageSets: writes to applied objects", str(applied), "target 0",
                     "ok" if applied == 0 else "MISSED"])
        rows.append([f"Warm no-op, {r.n} StageSets: StageSet status writes", _per(status, r.n),
                     f"{r.n} (1/StageSet: lastHandledReconcileAt)", f"{status / r.n:.1f}x"])
        rows.append([f"Warm no-op, {r.n} StageSets: API requests (controller + tenants)",
                     _per(r.warm_audit.total(), r.n), "", ""])
    if deps is not None:
        for label, lat in (("early", deps.early), ("late", deps.late)):
            if not lat.to_b:
                continue
            rows.append([f"Dependency unblock ({label}, {len(lat.to_b)} pairs): status patch -> B Ready, "
                         "p50 / p95", _ms(lat.to_b), f"{_ms(lat.to_a)} (patch -> A Ready)",
                         f"{percentile(lat.to_b, 50) / percentile(lat.to_a, 50):.2f}x"])
            rows.append([f"Dependency unblock ({label}): A Ready -> B Ready, p50 / p95", _ms(lat.unblock),
                         "budget ~1 s", "ok" if percentile(lat.unblock, 95) < 1.0 else "MISSED"])
    for r in rounds:
        memory = r.memory_warm
        rows.append([f"Controller memory at {r.n} StageSets, VmHWM / VmRSS",
                     f"{memory.get('VmHWM', 0):.0f} / {memory.get('VmRSS', 0):.0f} MiB", "", ""])
    return markdown_table(["Measure", "Result", "Floor / target", "Ratio"], rows)


def detail_tables(rounds: list[Round], options: Options) -> str:
    cold_rows = []
    for r in rounds:
        a = r.cold_audit
        cold_rows.append([
            str(r.n), str(r.tenants), _seconds(r.created), _seconds(r.cold),
            _seconds(r.floor_wide), _seconds(r.floor_narrow), f"{r.cold / r.floor:.1f}x",
            f"{r.n / r.cold:.1f}", f"{a.total() / r.n:.1f}", f"{a.requests['tenant'] / r.n:.1f}",
            f"{a.writes.get('StageSet status', 0) / r.n:.1f}",
            f"{a.writes.get('applied objects', 0) / r.n:.1f}",
            f"{_seconds(r.teardown)} ({r.teardown_audit.total() / r.n:.0f} req/StageSet)"])
    cold = markdown_table(
        ["N", "tenants", "creates sent", "cold to all Ready",
         f"floor {options.workers * options.parallelism} thr", f"floor {options.workers} thr", "ratio",
         "StageSets/s", "requests/StageSet", "of which tenant", "status writes/StageSet",
         "object writes/StageSet", "teardown"], cold_rows)
    verbs_rows = [[str(r.n), ", ".join(f"{actor} {verb}: {count / r.n:.1f}"
                                       for (actor, verb), count in sorted(r.cold_audit.by_verb.items()))]
                  for r in rounds]
    cold_verbs = markdown_table(["N", "cold: requests per StageSet by identity and verb"], verbs_rows)
    warm_rows = []
    for r in rounds:
        a = r.warm_audit
        verbs = ", ".join(f"{actor} {verb}: {count}" for (actor, verb), count in sorted(a.by_verb.items()))
        others = {k: v for k, v in a.writes.items() if k not in ("applied objects", "StageSet status")}
        warm_rows.append([str(r.n), _seconds(r.warm), str(a.total()), str(a.writes.get("applied objects", 0)),
                          str(a.writes.get("StageSet status", 0)), str(r.warm_flaps),
                          ", ".join(f"{k}: {v}" for k, v in sorted(others.items())) or "0", verbs])
    warm = markdown_table(["N", "pass", "requests", "object writes", "status writes", "Ready flaps",
                           "other writes", "requests by identity and verb"], warm_rows)
    memory_rows = [[str(r.n), f"{r.memory_cold.get('VmRSS', 0):.0f}", f"{r.memory_cold.get('VmHWM', 0):.0f}",
                    f"{r.memory_warm.get('VmRSS', 0):.0f}", f"{r.memory_warm.get('VmHWM', 0):.0f}"]
                   for r in rounds]
    memory = markdown_table(["N", "VmRSS after cold (MiB)", "VmHWM after cold", "VmRSS after warm",
                             "VmHWM after warm"], memory_rows)
    cpu_rows = []
    for r in rounds:
        walls = {"floor": r.floor_wide, "cold": r.cold, "warm": r.warm, "teardown": r.teardown}
        for phase, used in r.cpu.items():
            mine = used.get("controller")
            cpu_rows.append([str(r.n), phase, _seconds(walls[phase]),
                             "-" if mine is None else f"{mine:.2f} s ({mine / r.n * 1000:.0f} ms/StageSet)",
                             f"{used['kube-apiserver']:.2f} s", f"{used['etcd']:.2f} s",
                             f"{used['benchmark']:.2f} s", f"{used['others']:.2f} s"])
    cpu = markdown_table(["N", "phase", "wall", "controller CPU", "kube-apiserver CPU", "etcd CPU",
                          "benchmark CPU", "other processes"], cpu_rows)
    return (f"Cold convergence\n\n{cold}\n\n{cold_verbs}\n\nWarm no-op pass\n\n{warm}"
            f"\n\nController memory\n\n{memory}"
            f"\n\nCPU time per phase (2 cores = 2 CPU-seconds per wall second)\n\n{cpu}")


def deps_table(deps: Dependencies) -> str:
    rows = []
    for label, lat in (("early", deps.early), ("late", deps.late)):
        if not lat.to_b:
            continue
        rows += [[label, str(len(lat.to_b)), "status patch -> A Ready (floor)", _ms(lat.to_a),
                  f"{max(lat.to_a) * 1000:.0f} ms"],
                 [label, str(len(lat.to_b)), "status patch -> B Ready", _ms(lat.to_b),
                  f"{max(lat.to_b) * 1000:.0f} ms"],
                 [label, str(len(lat.to_b)), "A Ready -> B Ready (unblock)", _ms(lat.unblock),
                  f"{max(lat.unblock) * 1000:.0f} ms"]]
    table = markdown_table(["pairs", "count", "interval", "p50 / p95", "max"], rows)
    if deps.waiting_seconds:
        a, spent = deps.waiting_audit, deps.waiting_seconds
        verbs = ", ".join(f"{actor} {verb}: {count / spent:.2f}"
                          for (actor, verb), count in sorted(a.by_verb.items()))
        writes = ", ".join(f"{target}: {count / spent:.2f}"
                           for target, count in sorted(a.writes.items())) or "none"
        table += (f"\n\nWhile one StageSet is `Waiting` for its Deployment (late pairs, "
                  f"{spent:.0f} s in all), the controller and its tenants made "
                  f"{a.total() / spent:.1f} requests/s ({verbs}); writes/s: {writes}.")
    return "Dependency pairs, one after another\n\n" + table


def report(rounds: list[Round], deps: Dependencies | None, options: Options, elapsed: float) -> str:
    parts = [f"Mode `{options.mode}`: {options.objects} ConfigMaps per StageSet, "
             f"{options.workers} controller workers, apply parallelism {options.parallelism}, "
             f"StageSets spread over up to {options.tenants} tenant namespaces. "
             f"Machine: {machine()}. Code: {revision(ROOT)}. Whole run: {elapsed:.0f} s.",
             summary_table(rounds, deps), detail_tables(rounds, options)]
    if deps is not None:
        parts.append(deps_table(deps))
    return "\n\n".join(parts)


# -- main ----------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.apply", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="N = 10, 50 and 8 pairs; prints only")
    group.add_argument("--full", action="store_true", help="adds N = 1000")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        help="comma-separated N values, overriding the mode's")
    parser.add_argument("--objects", type=int, default=5, help="ConfigMaps per StageSet (M)")
    parser.add_argument("--pairs", type=int, help="dependency pairs (K); 0 skips them")
    parser.add_argument("--tenants", type=int, default=10, help="tenant namespaces per N")
    parser.add_argument("--workers", type=int, default=ControllerSettings().workers,
                        help="controller workers (--workers)")
    parser.add_argument("--repository-sets", type=int, default=0,
                        help="StageSet directories in the Git repository (default: the largest N); "
                        "e.g. 1000 with --sizes 10 measures a small rollout from a large monorepo")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (audit log, logs)")
    parser.add_argument("--no-docs", action="store_true",
                        help="do not write docs/benchmarks.md (never written with --quick or overrides)")
    args = parser.parse_args(argv)
    overridden = args.sizes is not None or args.pairs is not None or args.objects != 5 or \
        args.tenants != 10 or args.workers != ControllerSettings().workers or args.repository_sets
    mode = "quick" if args.quick else "full" if args.full else "default"
    sizes = args.sizes or {"quick": (10, 50), "default": (10, 100), "full": (10, 100, 1000)}[mode]
    pairs = args.pairs if args.pairs is not None else (8 if args.quick else 20)
    return Options(sizes=sizes, objects=args.objects, pairs=pairs, tenants=args.tenants, workers=args.workers,
                   parallelism=ApplySettings().parallelism, mode=mode, keep=args.keep,
                   write_docs=not (args.quick or args.no_docs or overridden),
                   repository_sets=args.repository_sets)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    begun = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="stageset-bench-"))
    repo = workdir / "repo"
    write_repository(repo, sets=max(*options.sizes, options.repository_sets), m=options.objects,
                     pairs=options.pairs)
    log(f"starting a control plane; work directory {workdir}")
    plane = envtest.start(workdir=workdir / "plane")
    tracker: StageSetTracker | None = None
    try:
        admin = ClientPool.from_kubeconfig(str(plane.kubeconfig)).client()
        install.install(admin)
        config = controller_kubeconfig(admin, plane, workdir / "controller.kubeconfig")
        admin.apply(f"/api/v1/namespaces/{SOURCE_NS}",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SOURCE_NS}},
                    field_manager=MANAGER)
        tracker = StageSetTracker(admin)
        tracker.start()
        with serve_directory(repo, name="bench") as url:
            admin.apply(GITREPOSITORIES.object_path(namespace=SOURCE_NS, name=SOURCE),
                        {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                         "metadata": {"name": SOURCE, "namespace": SOURCE_NS},
                         "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"}},
                        field_manager=MANAGER)
            harness = Harness(plane=plane, admin=admin, tracker=tracker, controller_config=config,
                              workdir=workdir, options=options)
            rounds = [harness.round(n) for n in options.sizes]
            deps = harness.dependencies(options.pairs) if options.pairs else None
    finally:
        if tracker is not None:
            tracker.stop()
        plane.stop()
    text = report(rounds, deps, options, time.monotonic() - begun)
    print(text)
    if options.write_docs:
        command = ".venv/bin/python -m bench.apply" + {"default": "", "full": " --full"}.get(options.mode, "")
        replace_section(DOCS, marker="bench.apply", skeleton="# Benchmarks\n",
                        body=f"Measured with `{command}` on {time.strftime('%Y-%m-%d')}.\n\n{text}")
        log(f"wrote {DOCS.relative_to(ROOT)}")
    if options.keep:
        log(f"kept {workdir} (audit log: {plane.audit_log}; controller logs: controller-*/)")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
