"""`stageset create tenant`'s NetworkPolicies, enforced: packets between real pods on the test node,
with kube-router's network policy controller (:mod:`stageset.envtest.netpol`) programming the
host's iptables and ipsets.

Two tenants from ``create tenant --export`` applied as printed: ``alpha`` (two namespaces, ingress
allowed from namespaces labelled ``platform.example/ingress=true``) and ``beta`` (one).  A server in
``alpha-web``; an agent pod in ``alpha-db``, ``beta-web`` and a labelled ``ingress-sim`` namespace,
each asked over HTTP (from the host, which kube-router lets reach local pods) to connect elsewhere
from inside its pod; a DNS server in ``kube-system`` labelled ``k8s-app: kube-dns``.

What the packets show: same tenant allowed (across its namespaces) and DNS allowed; the other
tenant refused; the labelled namespace allowed; and then, with the policies deleted by the
platform's admin — the other tenant's first (still refused: the server's own ingress policy holds),
then the server's — the refused connection goes through: the refusal was the policies', not a
missing route.

Identity: the test acts as the control plane's ``system:masters`` admin (applying the export as a
platform would, deleting the policies); the pods as their namespaces' ``default`` ServiceAccounts.
Traffic stays on the node's bridge (addresses the node's network namespaces hold).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import yaml

from stageset.cli.tenantobjects import object_path
from stageset.envtest import netpol
from stageset.envtest.netpol import NETCHECK_IMAGE
from stageset.envtest.nodeplane import Node
from stageset.kube.client import ApiError, KubeClient
from tests.cli.conftest import run_cli
from tests.node.conftest import _unavailable

pytestmark = [pytest.mark.node]

_WAIT = 180.0
_SYNC = 60.0
"""How long a change of pods or policies may take to reach the host's iptables (kube-router syncs on
each event, and fully every 5 s here)."""
INGRESS_LABEL = "platform.example/ingress"
T = TypeVar("T")


def _until(what: str, check: Callable[[], T | None], *, node: Node, timeout: float = _WAIT) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what} not reached in {timeout:.0f}s (last: {last!r}); the node's logs "
                         f"(kube-router.log among them) are in {node.workdir}")


@dataclass
class Cluster:
    node: Node
    admin: KubeClient
    ips: dict[str, str]
    """Pod name -> its address on the bridge."""

    def ask(self, agent: str, path: str) -> dict[str, Any]:
        """One request to an agent pod: what happened when it tried from inside its network namespace."""
        try:
            with urllib.request.urlopen(f"http://{self.ips[agent]}:8081{path}", timeout=10) as reply:
                result: dict[str, Any] = json.loads(reply.read())
                return result
        except (urllib.error.URLError, OSError) as error:
            return {"ok": False, "error": f"agent unreachable: {error}"}

    def tcp(self, agent: str, server: str) -> dict[str, Any]:
        return self.ask(agent, f"/tcp?to={self.ips[server]}:8080")

    def succeeds(self, what: str, ask: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Succeeds within the sync window (policies and new pods take a moment to be programmed)."""
        def attempt() -> dict[str, Any] | None:
            result = ask()
            return result if result.get("ok") else None
        return _until(what, attempt, node=self.node, timeout=_SYNC)

    def connects(self, agent: str, server: str) -> dict[str, Any]:
        return self.succeeds(f"{agent} connecting to {server}", lambda: self.tcp(agent, server))

    def refused(self, agent: str, server: str) -> list[dict[str, Any]]:
        """Refused within the sync window (a policy takes a moment to be programmed for new pods,
        as :meth:`succeeds` allows for), then three more attempts from a running agent, none
        connecting."""
        def attempt() -> dict[str, Any] | None:
            result = self.tcp(agent, server)
            return None if result.get("ok") else result
        _until(f"{agent} refused by {server}'s policies", attempt, node=self.node, timeout=_SYNC)
        results = [self.tcp(agent, server) for _ in range(3)]
        assert not any(r.get("ok") for r in results), (agent, server, results)
        assert all("agent unreachable" not in str(r.get("error")) for r in results), results
        return results

    def delete_policies(self, namespace: str) -> None:
        path = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
        for policy in self.admin.get(path)["items"]:
            self.admin.delete(f"{path}/{policy['metadata']['name']}")
        assert self.admin.get(path)["items"] == []


def _export(*args: str) -> list[dict[str, Any]]:
    result = run_cli("create", "tenant", *args, "--export", env={"HOME": "/nonexistent"})
    assert result.exit_code == 0, result.output + result.stderr
    return list(yaml.safe_load_all(result.stdout))


def _pod(name: str, namespace: str, role: str, *, labels: dict[str, str] | None = None,
         extra: tuple[str, ...] = ()) -> dict[str, Any]:
    containers = [{"name": r, "image": NETCHECK_IMAGE, "imagePullPolicy": "Never", "args": [r]}
                  for r in (role, *extra)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
            "spec": {"containers": containers, "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False}}


@pytest.fixture(scope="module")
def cluster(node: Node, admin: KubeClient) -> Cluster:
    reason = netpol.unavailable()
    if reason:  # skipped with the reason; under CI=true a failure
        _unavailable(f"no NetworkPolicy enforcer here: {reason}")
    node.enforce_network_policies()
    node.import_image(netpol.ensure_netcheck_image(), name=NETCHECK_IMAGE)
    objects = [*_export("alpha", "--with-namespace", "alpha-web", "--with-namespace", "alpha-db",
                        "--allow-from-namespace-label", f"{INGRESS_LABEL}=true"),
               *_export("beta", "--with-namespace", "beta-web")]
    for obj in objects:
        admin.apply(object_path(obj), obj, field_manager="platform-git")
    admin.apply("/api/v1/namespaces/ingress-sim",
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "ingress-sim", "labels": {INGRESS_LABEL: "true"}}},
                field_manager="test")
    pods = [_pod("dns", "kube-system", "dns", labels={"k8s-app": "kube-dns"}),
            _pod("server", "alpha-web", "serve"),
            _pod("alpha-agent", "alpha-db", "agent"),
            _pod("beta-agent", "beta-web", "agent"),
            _pod("ingress-agent", "ingress-sim", "agent", extra=("serve",))]
    for pod in pods:
        namespace = pod["metadata"]["namespace"]

        def created(pod: dict[str, Any] = pod, namespace: str = namespace) -> bool:
            try:  # the ServiceAccount admission waits for the namespace's `default` account
                admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
            except ApiError as error:
                if error.forbidden or error.invalid:
                    return False
                raise
            return True

        _until(f"pod {namespace}/{pod['metadata']['name']} created", created, node=node)
    ips: dict[str, str] = {}
    for pod in pods:
        path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

        def running(path: str = path) -> str | None:
            status = admin.get(path)["status"]
            ready = all(c.get("ready") for c in status.get("containerStatuses") or [{}])
            up = status.get("phase") == "Running" and ready and status.get("podIP")
            return str(status["podIP"]) if up else None

        ips[pod["metadata"]["name"]] = _until(f"{path} running", running, node=node)
    return Cluster(node=node, admin=admin, ips=ips)


def test_packets_follow_the_tenants_policies(cluster: Cluster) -> None:
    # Evidence the enforcer runs and has programmed the pods it selects (else every "refused" below
    # could be a dead process or an unknown pod).
    enforcer = cluster.node.processes()["kube-router"]
    assert enforcer.poll() is None, cluster.node.log("kube-router").read_text()[-3000:]

    # Same tenant, across its two namespaces: allowed, and the server answers as itself.
    assert cluster.connects("alpha-agent", "server")["reply"] == "hello from server\n"
    # DNS: the tenant's pods may ask the cluster DNS (kube-system, k8s-app: kube-dns, port 53).
    dns = cluster.succeeds("a DNS answer in alpha-db", lambda: cluster.ask(
        "alpha-agent", f"/dns?server={cluster.ips['dns']}:53&name=app.alpha-web.svc.cluster.local"))
    assert dns["address"] == "192.0.2.53"
    # A namespace labelled for the platform's ingress: allowed in (--allow-from-namespace-label).
    assert cluster.connects("ingress-agent", "server")["reply"] == "hello from server\n"
    # The other tenant: no connection — nor may it reach anything but its own and DNS (egress).
    cluster.refused("beta-agent", "server")
    cluster.refused("beta-agent", "ingress-agent")
    # Nor the tenant itself, out to a namespace that is not its own (its egress is fenced too).
    cluster.refused("alpha-agent", "ingress-agent")

    # The platform's admin removes beta's policies: beta may now reach an open namespace (its egress
    # fence is gone) but still not alpha's server, whose own ingress policy refuses it ...
    cluster.delete_policies("beta-web")
    assert cluster.connects("beta-agent", "ingress-agent")["reply"] == "hello from ingress-agent\n"
    cluster.refused("beta-agent", "server")
    # ... and once alpha-web's are gone too, the same connection goes through: the refusals above
    # were the policies' doing, not a missing route.
    cluster.delete_policies("alpha-web")
    assert cluster.connects("beta-agent", "server")["reply"] == "hello from server\n"
