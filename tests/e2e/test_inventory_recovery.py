"""An inventory that survives losing status, against the real apiserver with the chart's RBAC.

A Ready StageSet's status is wiped (as a restore from a backup without status leaves it), a
file is removed in Git: the removed object is pruned, and nothing else is deleted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stageset.apply.record import ANNOTATION
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, wait_for
from tests.e2e.stagesets import cm, deployment, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]


def test_wiped_status_then_a_removed_file_prunes_exactly_that_object(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, control_plane: ControlPlane,
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("restored")
    s = scenario(installed, git_server, tenant, {
        "app/a.yaml": cm("a"), "app/b.yaml": cm("b"), "web/web.yaml": deployment("web")})
    s.stageset("shop", [{"name": "app", "path": "./app"}, {"name": "web", "path": "./web", "readyChecks":
                                                            {"wait": False}}])
    s.wait_ready("shop")
    assert ANNOTATION in s.get("shop")["metadata"]["annotations"]
    # Not ours: an unlabelled ConfigMap beside them.
    installed.request("POST", f"/api/v1/namespaces/{s.ns}/configmaps",
                      body={"metadata": {"name": "bystander"}, "data": {"k": "v"}})

    # Status gone, as a restore without status leaves the object.
    installed.request("PATCH", s.path("shop") + "/status", content_type="application/merge-patch+json",
                      body={"status": None})
    assert not s.get("shop").get("status")
    s.commit({"app/b.yaml": None})

    wait_for(lambda: s.configmap("b") is None, timeout=60, what="b pruned after the status was wiped")
    s.wait_ready("shop")
    assert s.configmap("a") is not None
    assert s.configmap("bystander") is not None
    assert installed.get(f"/apis/apps/v1/namespaces/{s.ns}/deployments/web")
    assert "status had no inventory; rebuilt" in controller.output()
    deletes = [e for e in control_plane.audit_events()
               if e.get("verb") == "delete" and f"/namespaces/{s.ns}/" in e.get("requestURI", "")
               and e.get("stage") == "ResponseComplete" and "dryRun" not in e.get("requestURI", "")]
    assert [e["objectRef"]["name"] for e in deletes] == ["b"], deletes
    assert deletes[0]["impersonatedUser"]["username"] == tenant.username
