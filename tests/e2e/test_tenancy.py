"""Cross-namespace references: refused by flag, and otherwise bounded by the tenant's rights."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--no-cross-namespace-refs"]


def test_references_into_other_namespaces_are_refused_without_reading_them(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    owner = scenario(installed, git_server, make_tenant("owner"), {"app/cm.yaml": cm("secret-plan")})
    s = scenario(installed, git_server, make_tenant("thief"), {"app/cm.yaml": cm("mine")})
    s.stageset("steal", [{"name": "app", "path": "./app",
                          "sourceRef": {"name": "app", "namespace": owner.ns}}])
    refused = s.wait_reason("steal", "ResolveFailed")
    assert "another namespace" in refused["message"]
    assert owner.ns not in refused["message"]
    assert "secret-plan" not in str(s.get("steal"))
    s.stageset("wait-on-other", [{"name": "app", "path": "./app"}],
               dependsOn=[{"name": "anything", "namespace": owner.ns}])
    waiting = s.wait_reason("wait-on-other", "DependencyNotReady")
    assert "another namespace" in waiting["message"]
    assert owner.ns not in waiting["message"]
    assert s.configmap("mine") is None


def test_a_dependency_on_another_kind_in_another_namespace_is_refused_without_reading_it(
    controller: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    owner = scenario(installed, git_server, make_tenant("owner2"), {"app/cm.yaml": cm("plan")})
    s = scenario(installed, git_server, make_tenant("waiter"), {"app/cm.yaml": cm("mine")})
    s.stageset("wait-on-object", [{"name": "app", "path": "./app"}],
               dependsOn=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "plan", "namespace": owner.ns}])
    waiting = s.wait_reason("wait-on-object", "DependencyNotReady")
    assert waiting["message"].startswith("dependsOn names an object in another namespace")
    assert owner.ns not in waiting["message"]
    assert s.configmap("mine") is None
    # Refused before anything of the other namespace was asked for, as anyone.
    events = control_plane.audit_events()
    controller = "system:serviceaccount:stageset-system:stageset-controller"
    asked = [e for e in events if (e.get("objectRef") or {}).get("namespace") == owner.ns
             and (e.get("objectRef") or {}).get("name") == "plan"
             and (e.get("user") or {}).get("username") == controller]
    assert asked == []
    # The evidence is there to be seen: the status write that refused it is in the same log.
    assert any((e.get("objectRef") or {}).get("namespace") == s.ns
               and (e.get("objectRef") or {}).get("subresource") == "status"
               and (e.get("user") or {}).get("username") == controller for e in events)
