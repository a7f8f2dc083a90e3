"""Install our CRDs and tenant roles into a (local) cluster and wait until they serve.

Identity: the admin client handed in (``system:masters`` on the local control
plane).  Used by the demo and the test fixtures; production installs use Helm.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from stageset.api.rbac import (
    LEADER_ELECTION_RULES,
    NOTIFICATION_RULES,
    TARGET_RULES,
    TENANT_NOTIFICATION_RULES,
    TOKEN_REQUEST_RULES,
    WORKLOAD_TARGET_RULES,
    aggregated_cluster_roles,
    controller_cluster_role,
    tenant_cluster_roles,
)
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.kube.client import KubeClient

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


def crd_manifests() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


def install(admin: KubeClient, *, timeout: float = 60.0) -> None:
    """Apply the CRDs, the aggregated roles and the tenants' roles (as the chart's hook does); return
    once the CRDs are Established."""
    crds = crd_manifests()
    for crd in crds:
        admin.apply(f"{_CRDS}/{crd['metadata']['name']}", crd, field_manager="stageset-install")
    for role in [*aggregated_cluster_roles(), *tenant_cluster_roles()]:
        admin.apply(f"{_ROLES}/{role['metadata']['name']}", role, field_manager="stageset-install")
    aggregate_cluster_roles(admin)
    deadline = time.monotonic() + timeout
    for crd in crds:
        while True:
            live = admin.get(f"{_CRDS}/{crd['metadata']['name']}")
            conditions = {c["type"]: c["status"] for c in (live.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {crd['metadata']['name']} not established after {timeout}s")
            time.sleep(0.1)
    # Discovery catches up with a new CRD shortly after it is Established.
    for crd in crds:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = crd["spec"]["versions"][0]["name"]
        while True:
            served = admin.get(f"/apis/{group}/{version}").get("resources", [])
            if any(r.get("name") == plural for r in served):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{plural}.{group} not in discovery after {timeout}s")
            time.sleep(0.1)


def create_tenant(admin: KubeClient, *, namespace: str, service_account: str,
                  cluster_role: str = "edit") -> None:
    """A namespace whose ServiceAccount holds ``cluster_role`` there (idempotent)."""
    admin.apply(f"/api/v1/namespaces/{namespace}",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                field_manager="stageset-install")
    admin.apply(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}",
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": service_account, "namespace": namespace}},
                field_manager="stageset-install")
    binding = f"{service_account}-{cluster_role}"
    admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{binding}",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": binding, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]},
        field_manager="stageset-install")


def grant_notifications(admin: KubeClient, *, namespace: str, account: str = "stageset-controller",
                        account_namespace: str = "stageset-system") -> None:
    """``namespace`` as the controller's notification namespace: the Namespace, and a Role (the
    chart's ``<release>-notifications``) bound to the controller's account there only."""
    admin.apply(f"/api/v1/namespaces/{namespace}",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                field_manager="stageset-install")
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    name = f"{account}-notifications"
    admin.apply(f"{rbac}/roles/{name}", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                         "metadata": {"name": name, "namespace": namespace},
                                         "rules": NOTIFICATION_RULES}, field_manager="stageset-install")
    admin.apply(f"{rbac}/rolebindings/{name}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}]},
        field_manager="stageset-install")


def grant_tenant_notifications(admin: KubeClient, *, account: str = "stageset-controller",
                               account_namespace: str = "stageset-system") -> None:
    """What ``--tenant-notifications`` needs (the chart's ``<release>-tenant-notifications``):
    ``get``/``list`` of the two notification kinds in every namespace, bound to the controller's
    account.  No Secret: a tenant provider's Secret is read as its own ServiceAccount."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    name = f"{account}-tenant-notifications"
    admin.apply(f"{rbac}/clusterroles/{name}", {"apiVersion": "rbac.authorization.k8s.io/v1",
                                                "kind": "ClusterRole", "metadata": {"name": name},
                                                "rules": TENANT_NOTIFICATION_RULES},
                field_manager="stageset-install")
    admin.apply(f"{rbac}/clusterrolebindings/{name}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}]},
        field_manager="stageset-install")


def controller_kubeconfig(admin: KubeClient, *, url: str, ca: Path, path: Path,
                          namespace: str = "stageset-system",
                          account: str = "stageset-controller",
                          watch_namespaces: list[str] | None = None,
                          leader_election: bool = False, target_namespaces: list[str] | None = None,
                          workload_identity: bool = False) -> Path:
    """A kubeconfig for a ServiceAccount bound to exactly the chart's controller ClusterRole.

    Lets tests and benchmarks run the controller with the rights it has in a real
    multi-tenant install rather than as ``system:masters``.  With ``watch_namespaces``
    the role is bound by one RoleBinding per namespace, as the chart does for a shard; with
    ``leader_election`` the account may also use Leases in ``namespace``, as the chart's Role allows;
    with ``target_namespaces`` it may read StageTargets and Secrets (and write StageTargets' status)
    in each of them, by a Role there, as the chart's ``targets.namespaces`` grants; with
    ``workload_identity`` it may request ServiceAccount tokens where its ClusterRole is bound (and read
    ConfigMaps and request tokens in the target namespaces), as the chart's ``targets.workloadIdentity``
    grants.
    """
    admin.apply(f"/api/v1/namespaces/{namespace}",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                field_manager="stageset-install")
    admin.apply(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}",
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": account, "namespace": namespace}}, field_manager="stageset-install")
    role = controller_cluster_role()
    admin.apply(f"{_ROLES}/{role['metadata']['name']}", role, field_manager="stageset-install")
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    if watch_namespaces:
        for watched in watch_namespaces:
            admin.apply(f"{rbac}/namespaces/{watched}/rolebindings/{account}",
                        {**binding, "kind": "RoleBinding",
                         "metadata": {"name": account, "namespace": watched}},
                        field_manager="stageset-install")
    else:
        admin.apply(f"{rbac}/clusterrolebindings/{account}",
                    {**binding, "kind": "ClusterRoleBinding", "metadata": {"name": account}},
                    field_manager="stageset-install")
    if workload_identity:
        tokens = f"{account}-token-requests"
        admin.apply(f"{_ROLES}/{tokens}",
                    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": {"name": tokens}, "rules": TOKEN_REQUEST_RULES},
                    field_manager="stageset-install")
        token_binding = {**binding, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                "kind": "ClusterRole", "name": tokens}}
        for watched in watch_namespaces or ():
            admin.apply(f"{rbac}/namespaces/{watched}/rolebindings/{tokens}",
                        {**token_binding, "kind": "RoleBinding",
                         "metadata": {"name": tokens, "namespace": watched}},
                        field_manager="stageset-install")
        if not watch_namespaces:
            admin.apply(f"{rbac}/clusterrolebindings/{tokens}",
                        {**token_binding, "kind": "ClusterRoleBinding", "metadata": {"name": tokens}},
                        field_manager="stageset-install")
    if leader_election:
        admin.apply(f"{rbac}/namespaces/{namespace}/roles/{account}-leader-election",
                    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                     "metadata": {"name": f"{account}-leader-election", "namespace": namespace},
                     "rules": LEADER_ELECTION_RULES}, field_manager="stageset-install")
        admin.apply(f"{rbac}/namespaces/{namespace}/rolebindings/{account}-leader-election",
                    {**binding, "kind": "RoleBinding",
                     "metadata": {"name": f"{account}-leader-election", "namespace": namespace},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": f"{account}-leader-election"}},
                    field_manager="stageset-install")
    for target in target_namespaces or ():
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{account}-targets"}
        admin.apply(f"/api/v1/namespaces/{target}",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": target}},
                    field_manager="stageset-install")
        admin.apply(f"{rbac}/namespaces/{target}/roles/{account}-targets",
                    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                     "metadata": {"name": f"{account}-targets", "namespace": target},
                     "rules": [*TARGET_RULES, *(WORKLOAD_TARGET_RULES if workload_identity else [])]},
                    field_manager="stageset-install")
        admin.apply(f"{rbac}/namespaces/{target}/rolebindings/{account}-targets",
                    {**binding, "kind": "RoleBinding", "roleRef": role_ref,
                     "metadata": {"name": f"{account}-targets", "namespace": target}},
                    field_manager="stageset-install")
    token = admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                          body={"spec": {"expirationSeconds": 86400}})["status"]["token"]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "controller",
        "clusters": [{"name": "local", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "controller", "user": {"token": token}}],
        "contexts": [{"name": "controller", "context": {"cluster": "local", "user": "controller"}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
