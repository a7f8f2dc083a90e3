"""``--default-service-account``: a StageSet without ``serviceAccountName`` acts as that account of
its own namespace — the audit log shows every write impersonating it and none as the controller —
and where that account may not write, the stage fails ``RBACDenied`` naming it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, apply, condition, wait_for, writes_by
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--default-service-account", "deployer"]


def unnamed(namespace: str, name: str) -> dict[str, object]:
    """A StageSet that names no ServiceAccount, at any level."""
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"stages": [{"name": "app", "path": "./app", "sourceRef": {"name": "app"}}]}}


def test_a_stageset_without_an_account_acts_as_the_default_of_its_namespace(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane,
) -> None:
    tenant = make_tenant("defaultsa", service_account="deployer")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    apply(installed, unnamed(s.ns, "plain"))
    ready = s.wait_ready("plain")
    assert [i.get("serviceAccountName") for i in ready["status"]["inventory"]] == ["deployer"]
    assert s.configmap("a") is not None
    time.sleep(1)  # let the audit log catch up with the last requests
    events = control_plane.audit_events()
    configmaps = [e for e in writes_by(events, tenant.username)
                  if e["objectRef"].get("resource") == "configmaps"
                  and e["objectRef"].get("namespace") == s.ns]
    assert {e["objectRef"]["name"] for e in configmaps} == {"a", "b"}
    assert all(e["user"]["username"] == CONTROLLER for e in configmaps), "impersonated by the controller"
    # The controller itself wrote only our kinds (status, finalizer) and Events, nothing it applied.
    own = [e for e in writes_by(events, CONTROLLER) if e["objectRef"].get("namespace") == s.ns]
    assert "stagesets" in {e["objectRef"]["resource"] for e in own}, "its own writes are in the audit log"
    assert {e["objectRef"]["resource"] for e in own} <= {"stagesets", "gitrepositories", "events"}


def test_where_the_default_account_may_not_write_the_stage_is_denied_naming_it(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("norights", service_account="deployer")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a")}, role="view")
    apply(installed, unnamed(s.ns, "plain"))

    def denied() -> dict[str, str] | None:
        ready = condition(s.get("plain"))
        return ready if ready and ready.get("reason") == "RBACDenied" else None

    refused = wait_for(denied, what="RBACDenied")
    assert tenant.username in refused["message"]
    assert s.configmap("a") is None
