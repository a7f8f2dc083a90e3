"""The fault lab: a control plane of its own, toxiproxy in front of it and of a Git server, a controller.

Everything here is module-scoped and private to ``tests/faults`` — destructive faults (an
apiserver unreachable for 30 s, etcd compacted) never touch the per-worker control plane
other test files share, and the module runs in parallel with them (``--dist loadfile``).

Network path of the controller (multi-tenant, exactly the chart's RBAC)::

    controller --TLS--> [api] --> [api-inner] --> kube-apiserver     (toxiproxy proxies)
    controller --HTTP-> [git] --> git http-backend

Faults are toxics on ``api`` and ``git``; ``api-inner`` is what ``api`` forwards to, so
disabling it makes the apiserver "down behind a load balancer": connections are accepted
(and logged by toxiproxy, which is how retries are counted) and closed at once.
The test's own admin client talks to the apiserver directly, never through the proxy.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE
from stageset.envtest import install, toxiproxy
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import ApiError, ClientPool, KubeClient
from tests.e2e.conftest import wait_for
from tests.gitserver import GitServer

STAGESETS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets"
GITREPOS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories"
RESYNC = 10.0
CONTROLLER_USER = "system:serviceaccount:stageset-system:stageset-controller"

# API Priority and Fairness on, with small in-flight limits, so a tiny priority level for the
# controller really sheds load; our kinds served from etcd without the watch cache, so an etcd
# compaction reaches the controller's watches as 410 Gone.
APISERVER_FLAGS = (
    "--enable-priority-and-fairness=true",
    "--max-requests-inflight=20",
    "--max-mutating-requests-inflight=10",
    "--watch-cache-sizes=stagesets.stages.metio.wtf#0,gitrepositories.stages.metio.wtf#0",
)


def cm(name: str, value: str = "v") -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                       "data": {"k": value}})


@dataclass
class Lab:
    plane: envtest.ControlPlane
    admin: KubeClient
    proxy: toxiproxy.Toxiproxy
    api: toxiproxy.Proxy
    api_inner: toxiproxy.Proxy
    git_proxy: toxiproxy.Proxy
    git: GitServer
    controller: ControllerProcess
    admin_pool: ClientPool
    counter: list[int] = field(default_factory=lambda: [0])

    # -- scenarios --------------------------------------------------------------------------

    def tenant(self, prefix: str) -> str:
        self.counter[0] += 1
        namespace = f"{prefix}-{self.counter[0]}"
        install.create_tenant(self.admin, namespace=namespace, service_account="deployer")
        return namespace

    def repo_url(self, name: str) -> str:
        """The repository's URL through the ``git`` proxy."""
        return self.git.url(name).replace(self.git.base_url, f"http://{self.git_proxy.listen}")

    def scenario(self, prefix: str, files: dict[str, str], *, stagesets: int = 1) -> Scenario:
        namespace = self.tenant(prefix)
        self.git.create_repo(namespace, files)
        self.admin.apply(f"{GITREPOS.format(ns=namespace)}/app", {
            "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"url": self.repo_url(namespace), "ref": {"branch": "main"}, "interval": "1m",
                     "timeout": "20s"}}, field_manager="faults")
        names = [f"set{i}" for i in range(stagesets)]
        for name in names:
            self.admin.apply(f"{STAGESETS.format(ns=namespace)}/{name}", {
                "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"serviceAccountName": "deployer", "interval": "10m", "retryInterval": "5s",
                         "stages": [{"name": "first", "sourceRef": {"name": "app"},
                                     "path": f"./{name}/first"},
                                    {"name": "second", "sourceRef": {"name": "app"},
                                     "path": f"./{name}/second"}]}}, field_manager="faults")
        return Scenario(lab=self, namespace=namespace, names=names)


@dataclass
class Scenario:
    lab: Lab
    namespace: str
    names: list[str]

    def get(self, name: str) -> dict[str, Any]:
        return self.lab.admin.get(f"{STAGESETS.format(ns=self.namespace)}/{name}")

    def commit(self, files: dict[str, str | None]) -> str:
        sha = self.lab.git.commit(self.namespace, files)
        stamp = f"{time.time():.6f}"
        self.lab.admin.request("PATCH", f"{GITREPOS.format(ns=self.namespace)}/app",
                               content_type="application/merge-patch+json",
                               body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": stamp}}})
        return sha

    def ready_at(self, name: str, sha: str | None) -> bool:
        try:
            obj = self.get(name)
        except ApiError:
            return False
        ready = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})
        if ready.get("status") != "True" or ready.get("observedGeneration") != obj["metadata"]["generation"]:
            return False
        return sha is None or str((obj.get("status") or {}).get("lastAppliedRevision", "")).endswith(sha)

    def owned(self) -> dict[str, str]:
        """Labelled ConfigMaps in the namespace: name -> value."""
        selector = f"{LABEL_NAMESPACE}={self.namespace}"
        items = self.lab.admin.request("GET", f"/api/v1/namespaces/{self.namespace}/configmaps",
                                       query={"labelSelector": selector})["items"]
        return {i["metadata"]["name"]: i.get("data", {}).get("k", "") for i in items
                if i["metadata"].get("labels", {}).get(LABEL_NAME) in self.names}

    def inventory(self) -> set[str]:
        names: set[str] = set()
        for name in self.names:
            for inv in (self.get(name).get("status") or {}).get("inventory", []):
                names.update(e["id"].split("_")[1] for e in inv["entries"])
        return names

    def converge(self, sha: str, expected: dict[str, str], *, timeout: float) -> float:
        """Wait until every StageSet is Ready at ``sha`` and exactly ``expected`` is owned; seconds taken."""
        started = time.monotonic()

        def done() -> bool:
            return all(self.ready_at(n, sha) for n in self.names) and self.owned() == expected

        wait_for(done, timeout=timeout,
                 what=f"{self.namespace} converged at {sha[:8]} with {sorted(expected)}")
        return time.monotonic() - started

    def deleted(self) -> list[str]:
        """ConfigMaps really deleted in the namespace (from the audit log)."""
        return sorted({e["objectRef"]["name"] for e in self.lab.plane.audit_events()
                       if e.get("verb") == "delete" and e.get("stage") == "ResponseComplete"
                       and (e.get("objectRef") or {}).get("namespace") == self.namespace
                       and (e.get("objectRef") or {}).get("resource") == "configmaps"
                       and "dryRun" not in e.get("requestURI", "")
                       and (e.get("responseStatus") or {}).get("code", 0) < 300})

    def check(self, expected: dict[str, str], *, removed: set[str]) -> None:
        """The invariants every fault must keep."""
        self.lab.controller.check_alive()
        assert set(self.deleted()) <= removed, f"deleted what Git still renders: {self.deleted()}"
        assert set(self.owned()) == set(expected)
        assert self.inventory() == set(expected), "nothing orphaned: every owned object is inventoried"


def etcd_call(plane: envtest.ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{plane.etcd_url}{path}", data=json.dumps(body).encode(),  # noqa: S310
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - our loopback etcd
        result: dict[str, Any] = json.loads(reply.read())
        return result


def compact(plane: envtest.ControlPlane) -> int:
    """Compact etcd at its current revision (physically): every older revision is gone."""
    header = etcd_call(plane, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
    revision = int(header["revision"])
    etcd_call(plane, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    workdir: Path = tmp_path_factory.mktemp("faults")
    plane = envtest.start(apiserver_flags=APISERVER_FLAGS)
    proxy = None
    git = GitServer().start()
    pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
    controller = None
    try:
        proxy = toxiproxy.start(workdir=workdir / "toxiproxy")
        admin = pool.client()
        install.install(admin)
        api_port = plane.url.rpartition(":")[2]
        inner = proxy.proxy("api-inner", upstream=f"127.0.0.1:{api_port}")
        api = proxy.proxy("api", upstream=inner.listen)
        git_proxy = proxy.proxy("git", upstream=git.base_url.removeprefix("http://"))
        config = install.controller_kubeconfig(admin, url=f"https://{api.listen}", ca=plane.pki.ca_cert,
                                               path=workdir / "controller.kubeconfig")
        controller = ControllerProcess(kubeconfig=config, workdir=workdir / "controller",
                                       extra=["--resync-period", f"{RESYNC:.0f}s", "--workers", "4"])
        yield Lab(plane=plane, admin=admin, proxy=proxy, api=api, api_inner=inner, git_proxy=git_proxy,
                  git=git, controller=controller, admin_pool=pool)
    finally:
        if controller is not None:
            controller.stop(timeout=20)
            import sys

            sys.stderr.write(f"\n--- controller log (tail) ---\n{controller.output()[-8000:]}\n")
        if proxy is not None:
            proxy.stop()
        pool.close()
        git.stop()
        plane.stop()


@pytest.fixture
def clean(lab: Lab) -> Iterator[Lab]:
    """Every test starts and ends with no toxic and every proxy enabled."""
    lab.proxy.reset()
    yield lab
    lab.proxy.reset()
