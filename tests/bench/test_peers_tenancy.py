"""The benchmark's multi-tenant mode measures what platforms run: every write impersonates a tenant.

A real control plane (the benchmark's own, :class:`bench.peers.Bench`) and this controller as a
subprocess, N = 2 in two tenant namespaces.  The audit log is the evidence: the controller's account
holds only the chart's ClusterRole (no cluster-admin binding), it writes ConfigMaps only as the
namespace's ``deployer``, and the floor's applies impersonate the same account.

Flux beside it (source-controller and kustomize-controller as subprocesses): neither of its accounts
holds ``cluster-admin``, every ConfigMap write of kustomize-controller (dry-runs, applies, and the
prune when its Kustomizations are deleted) impersonates the namespace's ``deployer``, and the
apiserver refused neither controller anything (its narrow ClusterRoles are enough).
kustomize-controller is built by ``python -m bench.flux``, which the test command runs in the same
build lane as source-controller; where it is not built the Flux test skips, except under ``CI=true``,
where a missing binary is a failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import flux
from bench.peers import ACCOUNTS, TENANT_ACCOUNT, Bench

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"
FLOOR = "system:serviceaccount:bench:floor"
FLUX = {f"system:serviceaccount:{ns}:{sa}" for ns, sa in ACCOUNTS["flux"]}
KUSTOMIZE_CONTROLLER = "system:serviceaccount:flux-system:kustomize-controller"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    bench = Bench(tmp_path_factory.mktemp("bench"), sources="pairs", tenants=2, tenancy="multi-tenant")
    try:
        yield bench
    finally:
        bench.close()


def _events(bench: Bench) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(bench.plane.audit_log).read_text().splitlines() if line.strip()]


def _configmap_writes(
    bench: Bench, user: str, *, verbs: tuple[str, ...] = ("create", "update", "patch")
) -> list[dict[str, Any]]:
    return [
        e for e in _events(bench)
        if e.get("stage") == "ResponseComplete"
        and (e.get("user") or {}).get("username") == user
        and (e.get("objectRef") or {}).get("resource") == "configmaps"
        and e.get("verb") in verbs
    ]


def _held_cluster_roles(bench: Bench, namespace: str, account: str) -> set[str]:
    bindings = bench.admin.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")["items"]
    return {
        b["roleRef"]["name"] for b in bindings
        if any(s.get("name") == account and s.get("namespace") == namespace for s in b.get("subjects") or [])
    }


def _assert_impersonates_the_tenant(writes: list[dict[str, Any]]) -> None:
    for event in writes:
        namespace = event["objectRef"]["namespace"]
        assert event.get("impersonatedUser", {}).get("username") == (
            f"system:serviceaccount:{namespace}:{TENANT_ACCOUNT}"
        ), event


def test_the_controller_holds_only_the_charts_role(bench: Bench) -> None:
    held = _held_cluster_roles(bench, "stageset-system", "stageset-controller")
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
        _assert_impersonates_the_tenant(writes)


def _kustomize_controller_built() -> None:
    """Skip where kustomize-controller is not built (``python -m bench.flux``; the test command builds
    it); fail under CI, where a skip would hide the Flux half of the mode."""
    if os.environ.get(flux.KUSTOMIZE_CONTROLLER.env_override) or os.access(
        flux.KUSTOMIZE_CONTROLLER.cached_binary(), os.X_OK
    ):
        return
    missing = (f"kustomize-controller {flux.KUSTOMIZE_CONTROLLER_VERSION} is not built "
               "(`python -m bench.flux` builds it, as the test command does)")
    if os.environ.get("CI") == "true":
        pytest.fail(missing, pytrace=False)
    pytest.skip(missing)


def test_flux_holds_no_cluster_admin_and_writes_only_as_the_tenant(bench: Bench) -> None:
    _kustomize_controller_built()
    theirs = bench.flux(2, 2, 0)
    assert theirs.cold > 0
    assert theirs.teardown > 0
    for ns, sa in ACCOUNTS["flux"]:
        held = _held_cluster_roles(bench, ns, sa)
        assert held == {f"bench-{ns}-{sa}"}, (sa, held)
    writes = _configmap_writes(bench, KUSTOMIZE_CONTROLLER, verbs=("create", "update", "patch"))
    applied = [e for e in writes if "dryRun=" not in e.get("requestURI", "")]
    assert len(applied) >= 4, f"kustomize-controller applied {len(applied)} ConfigMaps, expected 2 x 2"
    pruned = _configmap_writes(bench, KUSTOMIZE_CONTROLLER, verbs=("delete",))
    assert len(pruned) >= 4, f"kustomize-controller pruned {len(pruned)} ConfigMaps, expected 2 x 2"
    _assert_impersonates_the_tenant(writes + pruned)
    refused = [
        (e["user"]["username"], e.get("verb"), e.get("requestURI"))
        for e in _events(bench)
        if e.get("stage") == "ResponseComplete"
        and (e.get("user") or {}).get("username") in FLUX
        and (e.get("responseStatus") or {}).get("code") == 403
    ]
    assert not refused, refused


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        Bench(tmp_path, sources="pairs", tenants=1, tenancy="root")
