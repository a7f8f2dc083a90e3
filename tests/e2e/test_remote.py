"""spec.kubeConfig: stages applied to another (real) cluster, as the tenant's ServiceAccount there."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.kube.client import ApiError, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, get_or_none, wait_for
from tests.e2e.remotes import inline_kubeconfig, kubeconfig_secret
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]


def test_stages_apply_to_the_remote_cluster_as_the_tenant_there(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane, remote_admin: KubeClient,
) -> None:
    tenant = make_tenant("remote", service_account="payments-deployer")
    s = scenario(installed, git_server, tenant, {"app/cm.yaml": cm("on-prod"),
                                                 "app/role.yaml": "apiVersion: rbac.authorization.k8s.io/v1\n"
                                                 "kind: ClusterRole\nmetadata: {name: remote-escalation}\n"
                                                 "rules: []\n"})
    # On the remote cluster, the same tenant exists, bound to edit in its namespace.
    install.create_tenant(remote_admin, namespace=s.ns, service_account="payments-deployer")
    aggregate_cluster_roles(remote_admin)
    kubeconfig_secret(installed, s.ns, "prod-eu-kubeconfig", inline_kubeconfig(remote))
    # DESIGN.md's third StageSet: serviceAccountName + kubeConfig.secretRef, key defaulting to "value".
    s.stageset("payments", [{"name": "app", "path": "./app"}],
               kubeConfig={"secretRef": {"name": "prod-eu-kubeconfig"}})

    # The tenant may not write a ClusterRole on the remote cluster either: nothing is applied there.
    denied = s.wait_reason("payments", "RBACDenied")
    assert f"system:serviceaccount:{s.ns}:payments-deployer" in denied["message"]
    assert get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/on-prod") is None

    s.commit({"app/role.yaml": None})
    s.wait_ready("payments")
    on_prod = remote_admin.get(f"/api/v1/namespaces/{s.ns}/configmaps/on-prod")
    assert on_prod["metadata"]["labels"]["stages.metio.wtf/stage"] == "app"
    assert "stageset-controller" in {m["manager"] for m in on_prod["metadata"]["managedFields"]}
    assert s.configmap("on-prod") is None, "nothing may land on the local cluster"

    # Deleting the StageSet tears down on the remote cluster.
    installed.request("DELETE", s.path("payments"))
    wait_for(lambda: get_or_none(remote_admin, f"/api/v1/namespaces/{s.ns}/configmaps/on-prod") is None,
             what="remote teardown")


def test_a_kubeconfig_that_would_run_a_command_is_refused(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], remote: envtest.ControlPlane,
) -> None:
    s = scenario(installed, git_server, make_tenant("exec"), {"app/cm.yaml": cm("x")})
    evil = inline_kubeconfig(remote, exec={"apiVersion": "client.authentication.k8s.io/v1",
                                           "command": "/bin/sh", "args": ["-c", "touch /tmp/pwned"]})
    kubeconfig_secret(installed, s.ns, "evil", evil)
    s.stageset("evil", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "evil"}})
    refused = s.wait_reason("evil", "InvalidSpec")
    assert "'exec' is not allowed" in refused["message"]
    with pytest.raises(ApiError):
        installed.get(f"/api/v1/namespaces/{s.ns}/configmaps/x")
