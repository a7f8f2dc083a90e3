"""The benchmark's multi-tenant mode measures what platforms run: every write impersonates a tenant.

A real control plane (the benchmark's own, :class:`bench.peers.Bench`) and this controller as a
subprocess, N = 2 in two tenant namespaces.  The audit log is the evidence: the controller's account
holds only the chart's ClusterRole (no cluster-admin binding), it writes ConfigMaps only as the
namespace's ``deployer``, and the floor's applies impersonate the same account.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.peers import TENANT_ACCOUNT, Bench

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"
FLOOR = "system:serviceaccount:bench:floor"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    bench = Bench(tmp_path_factory.mktemp("bench"), sources="pairs", tenants=2, tenancy="multi-tenant")
    try:
        yield bench
    finally:
        bench.close()


def _events(bench: Bench) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(bench.plane.audit_log).read_text().splitlines() if line.strip()]


def _configmap_writes(bench: Bench, user: str) -> list[dict[str, Any]]:
    return [
        e for e in _events(bench)
        if e.get("stage") == "ResponseComplete"
        and (e.get("user") or {}).get("username") == user
        and (e.get("objectRef") or {}).get("resource") == "configmaps"
        and e.get("verb") in ("create", "update", "patch")
    ]


def test_the_controller_holds_only_the_charts_role(bench: Bench) -> None:
    bindings = bench.admin.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")["items"]
    held = {
        b["roleRef"]["name"] for b in bindings
        if any(s.get("name") == "stageset-controller" and s.get("namespace") == "stageset-system"
               for s in b.get("subjects") or [])
    }
    assert held, "the controller's account is bound to nothing"
    assert "cluster-admin" not in held


def test_every_write_of_the_controller_and_the_floor_impersonates_the_tenant(bench: Bench) -> None:
    ours = bench.stageset(2, 2, 0)
    floor = bench.floor(2, 2, 0)
    assert ours.cold > 0
    assert sum(ours.requests.values()) > 0
    assert floor.writes >= 4
    assert "--cluster-admin" not in bench.flags["stageset"]
    for user in (CONTROLLER, FLOOR):
        writes = _configmap_writes(bench, user)
        assert writes, f"no ConfigMap writes by {user}"
        for event in writes:
            namespace = event["objectRef"]["namespace"]
            assert event.get("impersonatedUser", {}).get("username") == (
                f"system:serviceaccount:{namespace}:{TENANT_ACCOUNT}"
            ), event


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        Bench(tmp_path, sources="pairs", tenants=1, tenancy="root")
