"""The floor, this controller and Flux side by side: one control plane, one Git server, one run.

Run from the checkout's root::

    .venv/bin/python -m bench.peers            # N = 10, 100                  (~6 min on 2 cores, Flux built)
    .venv/bin/python -m bench.peers --quick    # N = 10, 50; prints only      (~3 min)
    .venv/bin/python -m bench.peers --full     # adds N = 1000

What is compared, in one of two modes (``--mode``):

* **floor** — the same NxM ConfigMaps server-side-applied by a plain loop on 16 and on 4 threads
  (the faster counts), as a ServiceAccount bound to ``cluster-admin``: the apiserver's own cost.
* **stageset** — this controller (``python -m stageset.cli controller --cluster-admin``, default
  workers) as a subprocess, N StageSets of one stage each, applied with its own identity (no
  ``serviceAccountName``).
* **flux** — Flux's source-controller and kustomize-controller (:mod:`bench.flux`, the versions and
  flags printed with the results), out of cluster, N Kustomizations, each with ``prune: true``,
  ``targetNamespace`` its namespace and Flux's defaults otherwise (no ``wait``).

``--mode cluster-admin`` (default) is the above.  ``--mode multi-tenant`` is how platforms run it:
every tenant namespace has its own ServiceAccount ``deployer`` with a namespaced Role that may
write ConfigMaps and read our GitRepositories there, nothing else (:data:`TENANT_RULES`), and every
write goes through impersonation of that account, which the apiserver authorizes per request.  The
floor applies as ``deployer`` (its cluster-admin account impersonating); this controller runs *without*
``--cluster-admin``, as a ServiceAccount bound to exactly the chart's controller ClusterRole
(:func:`stageset.envtest.install.controller_kubeconfig`), its StageSets naming
``serviceAccountName: deployer``; Flux's Kustomizations name ``serviceAccountName: deployer`` and
its controllers run without ``cluster-admin``: kustomize-controller (``--default-service-account``
unset) on a ClusterRole that may manage Kustomizations, read sources, Secrets, ConfigMaps and
ServiceAccounts, record events and impersonate ServiceAccounts — no right on what it applies, so each
ConfigMap it writes or prunes is written as ``deployer`` — and source-controller on Flux's rights over
its own kinds (:mod:`bench.flux` says why these and not Flux's ``cluster-admin`` binding).  Both peers
pay for impersonation; ``tests/bench/test_peers_tenancy.py`` proves it from the audit log.

Sources (``--sources``):

* ``pairs`` (default, the issue's shape): N Git repositories of M files each, served by one
  loopback smart-HTTP server; each StageSet or Kustomization has its own GitRepository (ours, or
  Flux's) naming its own repository — the same fetches on both sides.
* ``shared``: one repository with a directory per set, one GitRepository per side, N StageSets or
  Kustomizations pointing at it (what a mono-repo user of either tool writes).

Each (N, peer) starts fresh processes.  The cold clock starts with the first create (sources and
sets, 8 threads) and stops when a watch of this process has seen every StageSet or Kustomization
``Ready=True`` at its generation.  Counted in that window: requests by the peer's identities
(from the apiserver's audit log, by verb; watches left out), CPU seconds of the peer's processes
and of kube-apiserver and etcd, and afterwards the peer's RSS (``VmRSS``, Flux's two processes
summed).  Then every set is deleted and the time until they are all gone (teardown: their objects
pruned) is taken.  ``--repeat R`` runs each (N, peer) R times (peers in rotating order) and
reports medians; ``os.getloadavg()`` is printed per measurement so a busy machine shows.

``--preflight AccessReview`` sets that field on every StageSet's stage (access reviews instead of
dry-runs before the first write; its SelfSubjectAccessReviews are counted as ``create (access
review)``, not as writes).

A default or ``--full`` run (one repeat, no overrides) writes its tables into ``docs/scale.md``
between the ``bench.peers`` markers; :mod:`bench.scale` runs the longer shapes into the same page.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dulwich.repo import Repo

from bench import flux
from bench.common import CpuMeter, machine, markdown_table, replace_section, revision
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.controller.conditions import ready_at_generation
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.sharding import SHARD_LABEL
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess, memory_mib
from stageset.envtest.gitserve import commit_directory
from stageset.envtest.server import free_port
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector
from tests.gitserver import GitServer as RealGitServer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "scale.md"
MANAGER = "stageset-bench"
Key = tuple[str, str]

FLUX_GITREPOSITORIES = Resource(
    group=flux.SOURCE_GROUP, version="v1", kind="GitRepository", plural="gitrepositories", namespaced=True
)
KUSTOMIZATIONS = Resource(
    group=flux.KUSTOMIZE_GROUP, version="v1", kind="Kustomization", plural="kustomizations", namespaced=True
)
SHARED_NS = "bench-src"
PEERS = ("floor", "stageset", "flux")
MODES = ("cluster-admin", "multi-tenant")
TENANT_ACCOUNT = "deployer"
# The multi-tenant mode's tenant Role, in its own namespace only: write the rendered ConfigMaps, and
# read the StageSet's GitRepository (this controller reads a named source as the tenant).
TENANT_RULES = [
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": ["stages.metio.wtf"], "resources": ["gitrepositories"], "verbs": ["get", "list", "watch"]},
]
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# Identities: peer -> (namespace, name), each a ServiceAccount bound to cluster-admin; in multi-tenant
# mode this controller's to the chart's ClusterRole and Flux's to :data:`FLUX_RULES` (the floor's stays
# cluster-admin, impersonating the tenant for every write).
ACCOUNTS = {
    "floor": [("bench", "floor")],
    "stageset": [("stageset-system", "stageset-controller")],
    "flux": [("flux-system", "source-controller"), ("flux-system", "kustomize-controller")],
}


FLUX_RULES = {
    "source-controller": flux.SOURCE_CONTROLLER_RULES,
    "kustomize-controller": flux.KUSTOMIZE_CONTROLLER_RULES,
}


def log(message: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def parallel(threads: int, action: Callable[[Any], object], items: Iterable[Any]) -> None:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()


# -- Git -------------------------------------------------------------------------------------------


def configmap(name: str, index: int) -> KubeObject:
    """One small ConfigMap (~300 bytes on the wire), the same as bench.apply's."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {
            "index": str(index),
            "greeting": "hello from stageset",
            "settings.json": json.dumps({"replicas": 3, "feature": f"f{index}", "ttl": 300}),
        },
    }


def object_names(k: int, m: int) -> list[str]:
    return [f"set-{k:04d}-cm-{j}" for j in range(m)]


def write_set(folder: Path, k: int, m: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for j, name in enumerate(object_names(k, m)):
        (folder / f"cm-{j}.yaml").write_text(json.dumps(configmap(name, j), indent=1))


class GitServer:
    """Repositories served by ``git http-backend`` on loopback (:class:`tests.gitserver.GitServer`, a
    real Git server: Flux's go-git and our dulwich both fetch from it).  Repositories are written with
    dulwich (a bare repository per set is a few milliseconds; the git CLI's plumbing would take
    minutes for thousands)."""

    def __init__(self, root: Path):
        self._server = RealGitServer(root=root).start()
        self._repos: dict[str, Repo] = {}

    def add(self, name: str, directory: Path) -> str:
        """Serve ``directory``'s files as repository ``name`` (committed again when it exists)."""
        repo = self._repos.get(name)
        if repo is None:
            bare = self._server.repo_path(name)
            bare.mkdir(parents=True)
            repo = self._repos[name] = Repo.init_bare(str(bare))
        commit_directory(repo, directory)
        return self.url(name)

    def has(self, name: str) -> bool:
        return name in self._repos

    def url(self, name: str) -> str:
        return self._server.url(name)

    def stop(self) -> None:
        for repo in self._repos.values():
            repo.close()
        self._server.stop()


# -- watching readiness ----------------------------------------------------------------------------


class Watcher:
    """The latest version of every object of one resource, from one cluster-wide watch."""

    def __init__(self, admin: KubeClient, resource: Resource):
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._seen: dict[Key, KubeObject] = {}
        self._reflector = Reflector(
            client=admin, resource=resource, namespace=None, handler=self._handle, stop=self._stop
        )

    def start(self) -> None:
        self._reflector.start()
        if not self._reflector.synced.wait(60):
            raise RuntimeError("watch did not sync")

    def stop(self) -> None:
        self._stop.set()

    def _handle(self, event: str, obj: KubeObject) -> None:
        meta = obj.get("metadata", {})
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        with self._cond:
            if event == "DELETED":
                self._seen.pop(key, None)
            else:
                self._seen[key] = obj
            self._cond.notify_all()

    def wait(
        self,
        keys: Iterable[Key],
        check: Callable[[KubeObject | None], bool],
        *,
        timeout: float,
        what: str,
        alive: Callable[[], None],
    ) -> float:
        pending = set(keys)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                pending = {k for k in pending if not check(self._seen.get(k))}
                if not pending:
                    return time.monotonic()
                if time.monotonic() > deadline:
                    sample = sorted(pending)[:3]
                    states = {f"{k[0]}/{k[1]}": (self._seen.get(k) or {}).get("status") for k in sample}
                    raise TimeoutError(
                        f"{what}: {len(pending)} not there after {timeout:.0f}s; e.g. "
                        f"{json.dumps(states)[:1500]}"
                    )
                self._cond.wait(0.5)
                alive()


def ready(obj: KubeObject | None) -> bool:
    return obj is not None and ready_at_generation(obj)


def gone(obj: KubeObject | None) -> bool:
    return obj is None


# -- identities, processes, memory -----------------------------------------------------------------


def admin_kubeconfig(
    admin: KubeClient,
    plane: envtest.ControlPlane,
    *,
    namespace: str,
    account: str,
    path: Path,
    rules: list[dict[str, list[str]]] | None = None,
) -> Path:
    """A token kubeconfig for ServiceAccount ``namespace/account``: bound to ``cluster-admin``, or with
    ``rules`` to a ClusterRole of exactly those rules (``bench-<namespace>-<account>``)."""
    admin.apply(
        f"/api/v1/namespaces/{namespace}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        field_manager=MANAGER,
    )
    admin.apply(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        field_manager=MANAGER,
    )
    binding = f"bench-{namespace}-{account}"
    role = "cluster-admin"
    if rules is not None:
        role = binding
        admin.apply(
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": rules,
            },
            field_manager=MANAGER,
        )
    admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
        field_manager=MANAGER,
    )
    token = admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={"spec": {"expirationSeconds": 86400}},
    )["status"]["token"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "bench",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {"server": plane.url, "certificate-authority": str(plane.pki.ca_cert)},
                    }
                ],
                "users": [{"name": "bench", "user": {"token": token}}],
                "contexts": [{"name": "bench", "context": {"cluster": "local", "user": "bench"}}],
            }
        )
    )
    path.chmod(0o600)
    return path


def wait_http(url: str, *, timeout: float, alive: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        alive()
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - our own http:// probe
                return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready after {timeout}s") from None
            time.sleep(0.2)


@dataclass
class Running:
    """A peer's processes for one measurement."""

    pids: dict[str, int]
    alive: Callable[[], None]
    stop: Callable[[], None]
    flags: dict[str, list[str]] = field(default_factory=dict)


# -- one measurement -------------------------------------------------------------------------------


@dataclass
class Measure:
    peer: str
    n: int
    m: int
    repeat: int
    cold: float = 0.0
    requests: Counter[str] = field(default_factory=Counter)  # verb (dry-run marked) -> count
    writes: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # peer, kube-apiserver, etcd, benchmark, others
    rss: float = 0.0  # MiB, the peer's processes summed, after the cold convergence
    hwm: float = 0.0
    teardown: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after
    shards: int = 0


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...] = (10, 100)
    objects: int = 5
    tenants: int = 10
    sources: str = "pairs"
    repeat: int = 1
    peers: tuple[str, ...] = PEERS
    workers: int | None = None
    flux_concurrent: int | None = None
    keep: bool = False
    mode: str = "default"
    write_docs: bool = False
    tenancy: str = "cluster-admin"
    preflight: str | None = None
    """``spec.stages[].preflight`` of this controller's StageSets (left out: the API's default)."""


class Bench:
    """One control plane, one Git server, the identities of every peer; measurements on demand."""

    def __init__(self, workdir: Path, *, sources: str, tenants: int, tenancy: str = "cluster-admin"):
        if tenancy not in MODES:
            raise ValueError(f"unknown mode {tenancy!r}; one of {', '.join(MODES)}")
        self.workdir = workdir
        self.sources = sources
        self.tenants = tenants
        self.tenancy = tenancy
        self.multi_tenant = tenancy == "multi-tenant"
        log(f"starting a control plane; work directory {workdir}")
        self.plane = envtest.start(workdir=workdir / "plane")
        self.admin = ClientPool.from_kubeconfig(str(self.plane.kubeconfig)).client()
        install.install(self.admin)
        flux.install_crds(self.admin)
        self.kubeconfigs = {
            f"{ns}/{sa}": admin_kubeconfig(
                self.admin,
                self.plane,
                namespace=ns,
                account=sa,
                path=workdir / f"{ns}-{sa}.kubeconfig",
                rules=FLUX_RULES.get(sa) if self.multi_tenant else None,
            )
            for peer, accounts in ACCOUNTS.items()
            for ns, sa in accounts
            if not (self.multi_tenant and peer == "stageset")
        }
        if self.multi_tenant:
            # The chart's multi-tenant RBAC: impersonate, read our kinds, write their status.
            ns, sa = ACCOUNTS["stageset"][0]
            self.kubeconfigs[f"{ns}/{sa}"] = install.controller_kubeconfig(
                self.admin, url=self.plane.url, ca=self.plane.pki.ca_cert,
                path=workdir / f"{ns}-{sa}.kubeconfig", namespace=ns, account=sa,
            )
        self.users = {
            f"system:serviceaccount:{ns}:{sa}": peer
            for peer, accounts in ACCOUNTS.items()
            for ns, sa in accounts
        }
        self.floor_pool = ClientPool.from_kubeconfig(str(self.kubeconfigs["bench/floor"]))
        self.floor_client = self.floor_pool.client()
        self.git = GitServer(workdir / "git")
        self.stagesets = Watcher(self.admin, STAGESETS)
        self.kustomizations = Watcher(self.admin, KUSTOMIZATIONS)
        self.stagesets.start()
        self.kustomizations.start()
        self._namespace(SHARED_NS)
        self._counter = 0
        self.flags: dict[str, list[str]] = {}
        self.stage_fields: dict[str, str] = {}
        """Fields added to every StageSet's stage (``--preflight``)."""

    def close(self) -> None:
        self.stagesets.stop()
        self.kustomizations.stop()
        self.floor_pool.close()
        self.git.stop()
        self.plane.stop()

    def _namespace(self, name: str) -> None:
        self.admin.apply(
            f"/api/v1/namespaces/{name}",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            field_manager=MANAGER,
        )

    # -- what a measurement applies -------------------------------------------------------------

    def repo_url(self, k: int, m: int) -> str:
        """Repository of set ``k`` (pairs), or the shared one; built on first use."""
        if self.sources == "pairs":
            name = f"m{m}-set-{k:04d}"
            if not self.git.has(name):
                folder = self.workdir / "sets" / f"m{m}" / f"{k:04d}"
                write_set(folder, k, m)
                self.git.add(name, folder)
            return self.git.url(name)
        return self.git.url(f"shared-m{m}")

    def prepare_shared(self, n: int, m: int) -> None:
        """The shared repository holds sets 0..n-1 at M objects (committed again when N grows)."""
        if self.sources != "shared":
            return
        folder = self.workdir / "shared" / f"m{m}"
        for k in range(n):
            if not (folder / "sets" / f"{k:04d}").exists():
                write_set(folder / "sets" / f"{k:04d}", k, m)
        self.git.add(f"shared-m{m}", folder)

    def placement(self, peer: str, n: int, tag: str) -> list[tuple[str, int]]:
        """(namespace, k) for each of the n sets, namespaces created (multi-tenant: each with its
        tenant account, Role and RoleBinding)."""
        count = min(n, self.tenants)
        namespaces = [f"{peer[:2]}-{tag}-t{j:02d}" for j in range(count)]
        parallel(8, self._tenant if self.multi_tenant else self._namespace, namespaces)
        return [(namespaces[k % count], k) for k in range(n)]

    def _tenant(self, namespace: str) -> None:
        """A tenant namespace: ServiceAccount ``deployer`` and a Role of :data:`TENANT_RULES` bound to it."""
        self._namespace(namespace)
        self.admin.apply(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{TENANT_ACCOUNT}",
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": TENANT_ACCOUNT, "namespace": namespace}},
            field_manager=MANAGER,
        )
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        self.admin.apply(
            f"{rbac}/roles/{TENANT_ACCOUNT}",
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": TENANT_ACCOUNT, "namespace": namespace}, "rules": TENANT_RULES},
            field_manager=MANAGER,
        )
        self.admin.apply(
            f"{rbac}/rolebindings/{TENANT_ACCOUNT}",
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": TENANT_ACCOUNT, "namespace": namespace},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TENANT_ACCOUNT},
             "subjects": [{"kind": "ServiceAccount", "name": TENANT_ACCOUNT, "namespace": namespace}]},
            field_manager=MANAGER,
        )

    def floor_for(self, namespace: str) -> KubeClient:
        """The floor's client for ``namespace``: itself, or (multi-tenant) impersonating its tenant."""
        if not self.multi_tenant:
            return self.floor_client
        return self.floor_pool.client(Identity.service_account(namespace=namespace, name=TENANT_ACCOUNT))

    def tenant_spec(self) -> dict[str, str]:
        """What a StageSet or Kustomization adds in this mode: the tenant account, or nothing."""
        return {"serviceAccountName": TENANT_ACCOUNT} if self.multi_tenant else {}

    def path_of(self, k: int) -> str:
        return "./" if self.sources == "pairs" else f"./sets/{k:04d}"

    # -- the floor ------------------------------------------------------------------------------

    def floor(self, n: int, m: int, repeat: int) -> Measure:
        tag = self._tag(n, m, repeat)
        placement = self.placement("floor", n, tag)
        plan: list[tuple[str, KubeObject]] = []
        for namespace, k in placement:
            for j, name in enumerate(object_names(k, m)):
                obj = configmap(name, j)
                obj["metadata"].update(
                    namespace=namespace,
                    labels={LABEL_NAME: f"set-{k:04d}", LABEL_NAMESPACE: namespace, LABEL_STAGE: "main"},
                )
                plan.append((namespace, obj))

        def apply(item: tuple[str, KubeObject]) -> None:
            namespace, obj = item
            self.floor_for(namespace).apply(
                f"/api/v1/namespaces/{namespace}/configmaps/{obj['metadata']['name']}",
                obj,
                field_manager="stageset-controller",
            )

        # Connections opened first (as a running controller has them; one pool per identity).
        warm = sorted({ns for ns, _ in placement}) if self.multi_tenant else [ns for ns, _ in placement[:16]]
        parallel(
            16,
            lambda ns: self.floor_for(ns).request(
                "GET", f"/api/v1/namespaces/{ns}/configmaps", query={"limit": 1}
            ),
            warm,
        )
        best = None
        for threads, suffix in ((16, ""), (4, "-b")):
            renamed = [
                (ns, {**obj, "metadata": {**obj["metadata"], "name": obj["metadata"]["name"] + suffix}})
                for ns, obj in plan
            ]
            meter = CpuMeter(self._processes({}))
            offset = self._audit_offset()
            load = os.getloadavg()[0]
            meter.start()
            start = time.perf_counter()
            parallel(threads, apply, renamed)
            elapsed = time.perf_counter() - start
            cpu = meter.finish()
            if best is None or elapsed < best.cold:
                best = Measure(
                    peer="floor",
                    n=n,
                    m=m,
                    repeat=repeat,
                    cold=elapsed,
                    cpu=cpu,
                    load=(load, os.getloadavg()[0]),
                )
                best.requests, best.writes = self._audit(offset, "floor")
        assert best is not None
        result = best
        start = time.monotonic()
        for namespace in {ns for ns, _ in placement}:
            self.floor_client.request(
                "DELETE", f"/api/v1/namespaces/{namespace}/configmaps", query={"labelSelector": LABEL_STAGE}
            )
        result.teardown = time.monotonic() - start
        return result

    # -- this controller ----------------------------------------------------------------------------

    @contextmanager
    def stageset_controller(
        self, label: str, *, shards: int = 0, workers: int | None = None
    ) -> Iterator[Running]:
        """This controller, or ``shards`` of it (``--watch-label-selector sharding.fluxcd.io/key=shardI``)."""
        handles: list[ControllerProcess] = []
        probes: list[str] = []
        for index in range(max(1, shards)):
            probe = f"127.0.0.1:{free_port()}"
            extra = [*([] if self.multi_tenant else ["--cluster-admin"]), "--probe-address", probe]
            if workers:
                extra += ["--workers", str(workers)]
            if shards:
                extra += ["--watch-label-selector", f"{SHARD_LABEL}=shard{index}"]
            handles.append(
                ControllerProcess(
                    kubeconfig=self.kubeconfigs["stageset-system/stageset-controller"],
                    workdir=self.workdir / label / f"shard{index}",
                    log_level="warning",
                    extra=extra,
                )
            )
            probes.append(probe)

        def alive() -> None:
            for handle in handles:
                handle.check_alive()

        def stop() -> None:
            for handle in handles:
                handle.stop()

        try:
            for probe in probes:
                wait_http(f"http://{probe}/readyz", timeout=120, alive=alive)
            flags = [
                "controller",
                *([] if self.multi_tenant else ["--cluster-admin"]),
                "--allow-insecure-sources",
                "--log-level=warning",
                *([f"--workers={workers}"] if workers else []),
                *(["--watch-label-selector=sharding.fluxcd.io/key=shard<i>"] if shards else []),
            ]
            yield Running(
                pids={f"stageset-{i}": h.process.pid for i, h in enumerate(handles)},
                alive=alive,
                stop=stop,
                flags={"stageset": flags},
            )
        finally:
            stop()

    def stageset_objects(
        self, placement: list[tuple[str, int]], m: int, *, shards: int
    ) -> list[tuple[str, KubeObject]]:
        items: list[tuple[str, KubeObject]] = []
        shared_source = f"shared-src-{m}"
        for namespace, k in placement:
            labels = {SHARD_LABEL: f"shard{k % shards}"} if shards else {}
            if self.sources == "pairs":
                source = {"name": f"src-{k:04d}"}
                items.append(
                    (
                        GITREPOSITORIES.object_path(namespace=namespace, name=f"src-{k:04d}"),
                        {
                            "apiVersion": "stages.metio.wtf/v1",
                            "kind": "GitRepository",
                            "metadata": {"name": f"src-{k:04d}", "namespace": namespace, "labels": labels},
                            "spec": {"url": self.repo_url(k, m), "ref": {"branch": "main"}, "interval": "1h"},
                        },
                    )
                )
            else:
                source = {
                    "name": f"{shared_source}-{k % shards}" if shards else shared_source,
                    "namespace": SHARED_NS,
                }
            items.append(
                (
                    STAGESETS.object_path(namespace=namespace, name=f"set-{k:04d}"),
                    {
                        "apiVersion": "stages.metio.wtf/v1",
                        "kind": "StageSet",
                        "metadata": {"name": f"set-{k:04d}", "namespace": namespace, "labels": labels},
                        "spec": {
                            "interval": "1h",
                            **self.tenant_spec(),
                            "stages": [{"name": "main", "path": self.path_of(k), "sourceRef": source,
                                        **self.stage_fields}],
                        },
                    },
                )
            )
        return items

    def shared_sources(self, m: int, *, shards: int, group: str) -> list[tuple[str, KubeObject]]:
        """The shared mode's GitRepositories (one, or one per shard, labelled)."""
        if self.sources != "shared":
            return []
        url = self.repo_url(0, m)
        found = []
        for index in range(max(1, shards)):
            name = f"shared-src-{m}" + (f"-{index}" if shards else "")
            labels = {SHARD_LABEL: f"shard{index}"} if shards else {}
            if group == "stageset":
                found.append(
                    (
                        GITREPOSITORIES.object_path(namespace=SHARED_NS, name=name),
                        {
                            "apiVersion": "stages.metio.wtf/v1",
                            "kind": "GitRepository",
                            "metadata": {"name": name, "namespace": SHARED_NS, "labels": labels},
                            "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"},
                        },
                    )
                )
            else:
                found.append(
                    (
                        FLUX_GITREPOSITORIES.object_path(namespace=SHARED_NS, name=name),
                        {
                            "apiVersion": f"{flux.SOURCE_GROUP}/v1",
                            "kind": "GitRepository",
                            "metadata": {"name": name, "namespace": SHARED_NS},
                            "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"},
                        },
                    )
                )
        return found

    def stageset(
        self, n: int, m: int, repeat: int, *, shards: int = 0, workers: int | None = None
    ) -> Measure:
        tag = self._tag(n, m, repeat)
        placement = self.placement("stageset", n, tag)
        objects = self.stageset_objects(placement, m, shards=shards)
        sources = self.shared_sources(m, shards=shards, group="stageset")
        keys = [(ns, f"set-{k:04d}") for ns, k in placement]
        with self.stageset_controller(f"stageset-{tag}-s{shards}", shards=shards, workers=workers) as running:
            self.flags = {**self.flags, **running.flags}
            result = self._cold("stageset", n, m, repeat, running, sources + objects, self.stagesets, keys)
            result.shards = shards
            self._teardown(
                result, [p for p, o in objects if o["kind"] == "StageSet"], self.stagesets, keys, running
            )
            self._remove_sources([path for path, _ in [*objects, *sources] if "/gitrepositories/" in path],
                                 running)
        return result

    # -- Flux -----------------------------------------------------------------------------------------

    @contextmanager
    def flux_controllers(self, label: str, *, concurrent: int | None) -> Iterator[Running]:
        peer = flux.FluxPeer(
            source_kubeconfig=self.kubeconfigs["flux-system/source-controller"],
            kustomize_kubeconfig=self.kubeconfigs["flux-system/kustomize-controller"],
            workdir=self.workdir / label,
            kustomize_concurrent=concurrent,
            source_concurrent=concurrent,
        )
        try:
            peer.wait_ready()
            yield Running(
                pids={"source-controller": peer.source.pid, "kustomize-controller": peer.kustomize.pid},
                alive=peer.check_alive,
                stop=peer.stop,
                flags=peer.flags,
            )
        finally:
            peer.stop()

    def flux(self, n: int, m: int, repeat: int, *, concurrent: int | None = None) -> Measure:
        tag = self._tag(n, m, repeat)
        placement = self.placement("flux", n, tag)
        sources = self.shared_sources(m, shards=0, group="flux")
        objects: list[tuple[str, KubeObject]] = []
        for namespace, k in placement:
            if self.sources == "pairs":
                ref = {"kind": "GitRepository", "name": f"src-{k:04d}"}
                objects.append(
                    (
                        FLUX_GITREPOSITORIES.object_path(namespace=namespace, name=f"src-{k:04d}"),
                        {
                            "apiVersion": f"{flux.SOURCE_GROUP}/v1",
                            "kind": "GitRepository",
                            "metadata": {"name": f"src-{k:04d}", "namespace": namespace},
                            "spec": {"url": self.repo_url(k, m), "ref": {"branch": "main"}, "interval": "1h"},
                        },
                    )
                )
            else:
                ref = {"kind": "GitRepository", "name": f"shared-src-{m}", "namespace": SHARED_NS}
            objects.append(
                (
                    KUSTOMIZATIONS.object_path(namespace=namespace, name=f"set-{k:04d}"),
                    {
                        "apiVersion": f"{flux.KUSTOMIZE_GROUP}/v1",
                        "kind": "Kustomization",
                        "metadata": {"name": f"set-{k:04d}", "namespace": namespace},
                        "spec": {
                            "interval": "1h",
                            "path": self.path_of(k),
                            "prune": True,
                            "sourceRef": ref,
                            "targetNamespace": namespace,
                            **self.tenant_spec(),
                        },
                    },
                )
            )
        keys = [(ns, f"set-{k:04d}") for ns, k in placement]
        with self.flux_controllers(f"flux-{tag}", concurrent=concurrent) as running:
            self.flags = {**self.flags, **running.flags}
            result = self._cold("flux", n, m, repeat, running, sources + objects, self.kustomizations, keys)
            self._teardown(
                result,
                [p for p, o in objects if o["kind"] == "Kustomization"],
                self.kustomizations,
                keys,
                running,
            )
            self._remove_sources([path for path, _ in [*objects, *sources] if "/gitrepositories/" in path],
                                 running)
        return result

    # -- shared steps ------------------------------------------------------------------------------------

    def _tag(self, n: int, m: int, repeat: int) -> str:
        self._counter += 1
        return f"n{n}m{m}r{repeat}x{self._counter}"

    def _processes(self, peer: dict[str, int]) -> dict[str, int]:
        etcd, apiserver = (p.pid for p in self.plane._processes)
        return {**peer, "kube-apiserver": apiserver, "etcd": etcd, "benchmark": os.getpid()}

    def _cold(
        self,
        peer: str,
        n: int,
        m: int,
        repeat: int,
        running: Running,
        objects: list[tuple[str, KubeObject]],
        watcher: Watcher,
        keys: list[Key],
    ) -> Measure:
        log(f"{peer}: N={n} M={m} cold (repeat {repeat})")
        result = Measure(peer=peer, n=n, m=m, repeat=repeat)
        meter = CpuMeter(self._processes(running.pids))
        load = os.getloadavg()[0]
        offset = self._audit_offset()
        meter.start()
        start = time.monotonic()
        parallel(8, lambda item: self.admin.apply(item[0], item[1], field_manager=MANAGER), objects)
        done = watcher.wait(
            keys,
            ready,
            timeout=180 + 2.0 * n * max(1, m // 5),
            what=f"{peer} cold convergence",
            alive=running.alive,
        )
        result.cold = done - start
        used = meter.finish()
        result.cpu = {
            "peer": sum(used[name] for name in running.pids),
            **{k: v for k, v in used.items() if k not in running.pids},
        }
        result.requests, result.writes = self._audit(offset, peer)
        result.load = (load, os.getloadavg()[0])
        memory = [memory_mib(pid) for pid in running.pids.values()]
        result.rss = sum(mem.get("VmRSS", 0.0) for mem in memory)
        result.hwm = sum(mem.get("VmHWM", 0.0) for mem in memory)
        log(
            f"{peer}: N={n} M={m}: {result.cold:.2f} s, {sum(result.requests.values())} requests, "
            f"{result.cpu['peer']:.1f} CPU-s, {result.rss:.0f} MiB (load {load:.1f})"
        )
        return result

    def _teardown(
        self, result: Measure, paths: list[str], watcher: Watcher, keys: list[Key], running: Running
    ) -> None:
        start = time.monotonic()
        parallel(8, self._delete, paths)
        # Pruning is per object: Flux deleting 10 x 1000 ConfigMaps took longer than 320 s.
        timeout = 300 + 2.0 * len(keys) + 0.1 * result.n * result.m
        watcher.wait(keys, gone, timeout=timeout, what=f"{result.peer} teardown", alive=running.alive)
        result.teardown = time.monotonic() - start

    def _remove_sources(self, paths: list[str], running: Running) -> None:
        """Delete the sources and wait until they are gone, while their controller still runs to
        release its finalizers (not timed: a leftover would be the next measurement's work)."""
        parallel(8, self._delete, paths)
        deadline = time.monotonic() + 300 + len(paths)

        def gone(path: str) -> None:
            while True:
                try:
                    self.admin.get(path)
                except ApiError as error:
                    if error.not_found:
                        return
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} still there")
                running.alive()
                time.sleep(0.2)

        parallel(8, gone, paths)

    def _delete(self, path: str) -> None:
        try:
            self.admin.request("DELETE", path)
        except Exception as error:
            if "404" not in str(error) and "NotFound" not in str(error):
                raise

    def _audit_offset(self) -> tuple[int, int]:
        """Where the audit log is now: (inode, size) of ``audit.log``."""
        log_path = self.plane.audit_log
        if not log_path.exists():
            return (0, 0)
        stat = log_path.stat()
        return (stat.st_ino, stat.st_size)

    def _audit_data(self, mark: tuple[int, int]) -> bytes:
        """Everything logged since ``mark``, across rotations: kube-apiserver renames a full log
        (100 MB) to ``audit-<time>.log`` and starts a new one, so a long window spans files."""
        inode, offset = mark
        log_path = self.plane.audit_log
        files = [*sorted(log_path.parent.glob("audit-*.log")), log_path]
        chunks: list[bytes] = []
        started = inode == 0
        for path in files:
            if not path.exists():
                continue
            here = path.stat().st_ino == inode
            if not (started or here):
                continue
            with path.open("rb") as audit:
                if here:
                    audit.seek(offset)
                chunks.append(audit.read())
            started = True
        if not started:
            raise RuntimeError(f"the audit log of the window (inode {inode}) is gone")
        return b"".join(chunks)

    def _audit(self, offset: tuple[int, int], peer: str, *, settle: float = 1.0) -> tuple[Counter[str], int]:
        """Requests by ``peer``'s identities since ``offset``: by verb (dry-runs marked), and real writes."""
        time.sleep(settle)  # the audit backend writes after the response
        counts: Counter[str] = Counter()
        writes = 0
        data = self._audit_data(offset)
        for line in data.splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete" or event.get("verb") == "watch":
                continue
            user = str((event.get("user") or {}).get("username", ""))
            if self.users.get(user) != peer:
                continue
            verb = str(event.get("verb"))
            if (event.get("objectRef") or {}).get("resource") == "selfsubjectaccessreviews":
                counts[f"{verb} (access review)"] += 1  # stores nothing: not a write
                continue
            dry = "dryRun=" in str(event.get("requestURI", ""))
            # Flux's two controllers told apart ("source-controller patch").
            who = f"{user.rsplit(':', 1)[-1]} " if len(ACCOUNTS[peer]) > 1 else ""
            counts[f"{who}{verb} (dry-run)" if dry else f"{who}{verb}"] += 1
            if not dry and verb in WRITE_VERBS:
                writes += 1
        if not counts:
            raise RuntimeError(f"no requests by {peer} in the audit log: is it being written?")
        return counts, writes


# -- reporting -------------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    found = list(values)
    return statistics.median(found) if found else float("nan")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b else "-"


def summarize(measures: list[Measure]) -> dict[tuple[str, int, int, int], dict[str, float]]:
    """Medians per (peer, N, M, shards)."""
    groups: dict[tuple[str, int, int, int], list[Measure]] = {}
    for each in measures:
        groups.setdefault((each.peer, each.n, each.m, each.shards), []).append(each)
    return {
        key: {
            "cold": median(m.cold for m in group),
            "requests": median(sum(m.requests.values()) for m in group),
            "writes": median(m.writes for m in group),
            "cpu": median(m.cpu.get("peer", 0.0) for m in group),
            "apiserver": median(m.cpu.get("kube-apiserver", 0.0) + m.cpu.get("etcd", 0.0) for m in group),
            "others": median(m.cpu.get("others", 0.0) for m in group),
            "rss": median(m.rss for m in group),
            "teardown": median(m.teardown for m in group),
            "load": median(m.load[0] for m in group),
            "runs": float(len(group)),
        }
        for key, group in groups.items()
    }


def side_by_side(measures: list[Measure], *, m: int | None = None) -> str:
    """One row per (N, M): every figure of the three peers, and the ratios."""
    table = summarize(measures)
    rows = []
    pairs = sorted({(key[1], key[2]) for key in table if key[3] == 0 and (m is None or key[2] == m)})
    for n, objects in pairs:
        got = {peer: table.get((peer, n, objects, 0)) for peer in PEERS}
        floor, ours, theirs = got["floor"], got["stageset"], got["flux"]

        def cell(values: dict[str, float] | None, name: str, fmt: str) -> str:
            return "-" if values is None else fmt.format(values[name])

        def ratio(a: dict[str, float] | None, b: dict[str, float] | None, name: str) -> str:
            return "-" if a is None or b is None else _ratio(a[name], b[name])

        for name, label, fmt in (
            ("cold", "cold convergence (s)", "{:.2f}"),
            ("requests", "requests", "{:.0f}"),
            ("cpu", "CPU of the peer (s)", "{:.2f}"),
            ("apiserver", "CPU of kube-apiserver + etcd (s)", "{:.2f}"),
            ("rss", "RSS after cold (MiB)", "{:.0f}"),
            ("teardown", "teardown (s)", "{:.2f}"),
            ("load", "load average (1 min) at the start", "{:.1f}"),
        ):
            rows.append(
                [
                    str(n),
                    str(objects),
                    label,
                    "-" if name in ("rss", "cpu") else cell(floor, name, fmt),
                    cell(ours, name, fmt),
                    cell(theirs, name, fmt),
                    "-" if name in ("rss", "cpu", "load") else ratio(ours, floor, name),
                    "-" if name in ("rss", "cpu", "load") else ratio(theirs, floor, name),
                    "-" if name == "load" else ratio(theirs, ours, name),
                ]
            )
    return markdown_table(
        [
            "N",
            "M",
            "measure",
            "floor",
            "stageset",
            "Flux",
            "stageset / floor",
            "Flux / floor",
            "Flux / stageset",
        ],
        rows,
    )


def by_verb(measures: list[Measure]) -> str:
    """Requests per set by verb (medians over repeats), each peer."""
    groups: dict[tuple[str, int, int, int], list[Measure]] = {}
    for each in measures:
        groups.setdefault((each.peer, each.n, each.m, each.shards), []).append(each)
    rows = []
    for (peer, n, m, shards), group in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], PEERS.index(kv[0][0]))
    ):
        verbs = sorted({verb for each in group for verb in each.requests})
        text = ", ".join(
            f"{verb}: {median(each.requests.get(verb, 0) for each in group) / n:.2f}" for verb in verbs
        )
        total = median(sum(each.requests.values()) for each in group) / n
        rows.append([str(n), str(m), peer + (f" ({shards} shards)" if shards else ""), f"{total:.2f}", text])
    return markdown_table(["N", "M", "peer", "requests per set", "by verb (per set)"], rows)


def raw(measures: list[Measure]) -> str:
    rows = [
        [
            m.peer,
            str(m.n),
            str(m.m),
            str(m.shards or "-"),
            str(m.repeat),
            f"{m.cold:.2f}",
            str(sum(m.requests.values())),
            str(m.writes),
            f"{m.cpu.get('peer', 0):.2f}",
            f"{m.cpu.get('kube-apiserver', 0):.2f}",
            f"{m.cpu.get('etcd', 0):.2f}",
            f"{m.cpu.get('benchmark', 0):.2f}",
            f"{m.cpu.get('others', 0):.2f}",
            f"{m.rss:.0f}",
            f"{m.teardown:.2f}",
            f"{m.load[0]:.1f} / {m.load[1]:.1f}",
        ]
        for m in measures
    ]
    return markdown_table(
        [
            "peer",
            "N",
            "M",
            "shards",
            "repeat",
            "cold (s)",
            "requests",
            "writes",
            "peer CPU",
            "apiserver CPU",
            "etcd CPU",
            "benchmark CPU",
            "other processes CPU",
            "RSS (MiB)",
            "teardown (s)",
            "load before / after",
        ],
        rows,
    )


def describe(options: Options, flags: dict[str, list[str]], elapsed: float) -> str:
    shape = {
        "pairs": "each set with its own GitRepository and Git repository (N repositories of M files)",
        "shared": "one Git repository with a directory per set, one GitRepository per side",
    }[options.sources]
    commands = "; ".join(f"`{name} {' '.join(args)}`" for name, args in sorted(flags.items()))
    peers = f"{flux.versions()} and this controller" if "source-controller" in flags else "this controller"
    rights = {
        "cluster-admin": "every one with cluster-admin",
        "multi-tenant": (
            "multi-tenant: every write as the namespace's ServiceAccount `deployer` (a Role that may write "
            "ConfigMaps and read GitRepositories there), impersonated; this controller with the chart's "
            "multi-tenant ClusterRole, StageSets and Kustomizations naming `serviceAccountName: deployer`, "
            "the floor impersonating it, Flux's controllers without cluster-admin (kustomize-controller may "
            "manage Kustomizations, read sources, Secrets, ConfigMaps and ServiceAccounts and impersonate "
            "ServiceAccounts, nothing else; `--default-service-account` unset)"
        ),
    }[options.tenancy]
    return (
        f"Sources: {shape}. At most {options.tenants} namespaces per N and peer. Peers: {peers}, {rights}, "
        f"leader election off, default concurrency unless a flag says otherwise "
        f"({commands}). Git: `git http-backend` on loopback. Machine: {machine()}. Code: {revision(ROOT)}. "
        f"Repeats: {options.repeat} (medians). Whole run: {elapsed:.0f} s."
        + (f" This controller's stages: `preflight: {options.preflight}`." if options.preflight else "")
    )


# -- main ------------------------------------------------------------------------------------------


def run(bench: Bench, options: Options) -> list[Measure]:
    measures: list[Measure] = []
    for n in options.sizes:
        bench.prepare_shared(n, options.objects)
        for repeat in range(options.repeat):
            order = list(options.peers)
            order = (
                order[repeat % len(order) :] + order[: repeat % len(order)]
            )  # rotate: no peer always first
            for peer in order:
                if peer == "floor":
                    measures.append(bench.floor(n, options.objects, repeat))
                elif peer == "stageset":
                    measures.append(bench.stageset(n, options.objects, repeat, workers=options.workers))
                else:
                    measures.append(
                        bench.flux(n, options.objects, repeat, concurrent=options.flux_concurrent)
                    )
    return measures


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="N = 10, 50; prints only")
    group.add_argument("--full", action="store_true", help="adds N = 1000")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")), help="N values")
    parser.add_argument("--objects", type=int, default=5, help="ConfigMaps per set (M)")
    parser.add_argument("--tenants", type=int, default=10, help="namespaces per N and peer")
    parser.add_argument("--sources", choices=("pairs", "shared"), default="pairs")
    parser.add_argument(
        "--mode", choices=MODES, default="cluster-admin", dest="tenancy",
        help="cluster-admin (every peer), or multi-tenant (every write impersonating a tenant account)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--peers",
        type=lambda v: tuple(v.split(",")),
        default=PEERS,
        help="comma-separated subset of floor,stageset,flux",
    )
    parser.add_argument("--workers", type=int, help="this controller's --workers (default: its own)")
    parser.add_argument(
        "--flux-concurrent", type=int, help="--concurrent of both Flux controllers (default: theirs, 2 and 4)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/scale.md")
    parser.add_argument("--preflight", choices=("DryRun", "AccessReview"),
                        help="spec.stages[].preflight of this controller's StageSets")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full" if args.full else "default"
    overridden = (
        args.sizes is not None
        or args.objects != 5
        or args.tenants != 10
        or args.sources != "pairs"
        or args.repeat != 1
        or args.peers != PEERS
        or args.workers
        or args.flux_concurrent
        or args.preflight
    )
    sizes = args.sizes or {"quick": (10, 50), "default": (10, 100), "full": (10, 100, 1000)}[mode]
    return Options(
        sizes=sizes,
        objects=args.objects,
        tenants=args.tenants,
        sources=args.sources,
        repeat=args.repeat,
        peers=args.peers,
        workers=args.workers,
        flux_concurrent=args.flux_concurrent,
        keep=args.keep,
        mode=mode,
        write_docs=not (args.quick or args.no_docs or overridden),
        tenancy=args.tenancy,
        preflight=args.preflight,
    )


def report(measures: list[Measure], options: Options, flags: dict[str, list[str]], elapsed: float) -> str:
    return "\n\n".join(
        [
            describe(options, flags, elapsed),
            side_by_side(measures),
            by_verb(measures),
            "Every measurement\n\n" + raw(measures),
        ]
    )


SKELETON = "# Scale: the floor, this controller and Flux\n"


def docs_marker(base: str, tenancy: str) -> str:
    """The docs section of a table: cluster-admin keeps the historical marker, other modes add theirs."""
    return base if tenancy == "cluster-admin" else f"{base}.{tenancy}"


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    if "flux" in options.peers:
        flux.ensure_binaries()  # before the clock: a first build takes minutes
    begun = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="stageset-peers-"))
    bench = Bench(workdir, sources=options.sources, tenants=options.tenants, tenancy=options.tenancy)
    if options.preflight:
        bench.stage_fields["preflight"] = options.preflight
    try:
        measures = run(bench, options)
        flags = bench.flags
    finally:
        bench.close()
    text = report(measures, options, flags, time.monotonic() - begun)
    print(text)
    if options.write_docs:
        command = ".venv/bin/python -m bench.peers" + {"default": "", "full": " --full"}.get(options.mode, "")
        if options.tenancy != "cluster-admin":
            command += f" --mode {options.tenancy}"
        replace_section(
            DOCS,
            marker=docs_marker("bench.peers", options.tenancy),
            skeleton=SKELETON,
            body=f"Measured with `{command}` on {time.strftime('%Y-%m-%d')}.\n\n{text}",
        )
        log(f"wrote {DOCS.relative_to(ROOT)}")
    if options.keep:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
