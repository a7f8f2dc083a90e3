"""Cross-namespace references: refused by flag, and otherwise bounded by the tenant's rights."""

from __future__ import annotations

from collections.abc import Callable

import pytest

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
