"""Our client layer against the real apiserver: impersonation, apply, dry-run, discovery."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from stageset.kube.mapping import RestMapper, UnknownKindError
from tests.conftest import Tenant

pytestmark = pytest.mark.apiserver


def config_map(namespace: str, name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": {"k": "v"}}


def test_tenant_writes_within_its_role_and_is_denied_outside(
    kube_pool: ClientPool, admin: KubeClient, installed: KubeClient, make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("imp")
    tenant.bind_cluster_role("edit")
    as_tenant = kube_pool.client(Identity.service_account(namespace=tenant.namespace,
                                                          name=tenant.service_account))
    assert kube_pool.client(Identity.service_account(namespace=tenant.namespace,
                                                     name=tenant.service_account)) is as_tenant
    path = f"/api/v1/namespaces/{tenant.namespace}/configmaps/c"
    applied = as_tenant.apply(path, config_map(tenant.namespace, "c"), field_manager="test")
    managers = {m["manager"] for m in applied["metadata"]["managedFields"]}
    assert managers == {"test"}

    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"{tenant.namespace}-x"}, "rules": []}
    with pytest.raises(ApiError) as denied:
        as_tenant.apply(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{tenant.namespace}-x", role,
                        field_manager="test", dry_run=True)
    assert denied.value.forbidden
    assert tenant.username in denied.value.message

    other = make_tenant("other")
    with pytest.raises(ApiError) as elsewhere:
        as_tenant.get(f"/api/v1/namespaces/{other.namespace}/configmaps")
    assert elsewhere.value.forbidden


def test_dry_run_writes_nothing(admin: KubeClient, make_namespace: Callable[..., str]) -> None:
    namespace = make_namespace("dry")
    path = f"/api/v1/namespaces/{namespace}/configmaps/dry"
    admin.apply(path, config_map(namespace, "dry"), field_manager="test", dry_run=True)
    with pytest.raises(ApiError) as missing:
        admin.get(path)
    assert missing.value.not_found


def test_rest_mapping_finds_kinds_and_refreshes_for_new_ones(installed: KubeClient) -> None:
    mapper = RestMapper(installed)
    deployments = mapper.resolve("apps/v1", "Deployment")
    assert (deployments.plural, deployments.namespaced) == ("deployments", True)
    assert mapper.resolve("v1", "Namespace").namespaced is False
    assert mapper.resolve("stages.metio.wtf/v1", "StageSet").plural == "stagesets"
    with pytest.raises(UnknownKindError):
        mapper.resolve("example.com/v1", "Nothing")
