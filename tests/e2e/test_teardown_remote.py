"""Teardown always ends: a StageSet whose remote cluster is gone is released after --max-teardown-wait.

A real remote control plane (``spec.kubeConfig``) is stopped before the StageSet is deleted;
the controller runs with the chart's multi-tenant RBAC and a short wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.kube.client import ClientPool, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, get_or_none, wait_for
from tests.e2e.remotes import inline_kubeconfig, kubeconfig_secret
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

WAIT = 15.0


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--max-teardown-wait", f"{WAIT:.0f}s"]


def test_a_stageset_whose_remote_cluster_is_gone_is_released_with_what_was_left(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant],
) -> None:
    remote = envtest.start()
    try:
        pool = ClientPool.from_kubeconfig(str(remote.kubeconfig))
        remote_admin = pool.client()
        tenant = make_tenant("gone", service_account="deployer")
        s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
        install.create_tenant(remote_admin, namespace=s.ns, service_account="deployer")
        aggregate_cluster_roles(remote_admin)
        kubeconfig_secret(installed, s.ns, "prod", inline_kubeconfig(remote))
        s.stageset("far", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "prod"}})
        s.wait_ready("far")
        assert remote_admin.get(f"/api/v1/namespaces/{s.ns}/configmaps/a")
    finally:
        pool.close()
        remote.stop()  # the remote cluster is gone: connections are refused from now on

    deleted = time.monotonic()
    installed.request("DELETE", s.path("far"))
    wait_for(lambda: get_or_none(installed, s.path("far")) is None, timeout=WAIT + 60,
             what="the StageSet released after --max-teardown-wait")
    released = time.monotonic() - deleted
    assert released >= WAIT - 1, f"released after {released:.1f}s, before the wait"
    # TeardownForced is told after the finalizer is removed (so it is told once), so the event may
    # land a moment after the StageSet is gone.
    def forced_events() -> list[dict[str, Any]]:
        items = installed.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
        return [e for e in items if e.get("reason") == "TeardownForced"]

    wait_for(lambda: forced_events() or None, timeout=30, what="the TeardownForced event")
    forced = forced_events()
    assert len(forced) == 1, forced
    message = forced[0]["message"]
    assert "2 object(s) left behind" in message
    assert f"ConfigMap in {s.ns}: 2" in message
    assert "connection refused" in message
    # The controller kept going: no traceback for the remote, and it is still alive.
    controller.check_alive()
    assert "Traceback" not in controller.output()
