"""Kinds a StageSet's ``spec.dependsOn`` waits for in the tests and ``bench.dependency_kinds``, as
CustomResourceDefinitions, and what their operators would write.

- ``Database`` (``db.example/v1``): a test CRD of an imagined database operator.  No status
  subresource, so a test creates one with its status in one request (as it would look after its
  operator's first pass): nothing in between that kstatus could take for ready.
- ``HelmRelease`` (``helm.toolkit.fluxcd.io/v2``): Flux's kind by its real group, version, kind,
  plural and scope, with a status subresource as Flux's CRD has.  A minimal fixture, not Flux's
  CRD: helm-controller's module (whose ``config/crd/bases`` holds the CRD) is not served by the Go
  module proxy here (403), only its ``api`` module (Go types, no CRD manifest); the group and
  version are those of ``github.com/fluxcd/helm-controller/api@v1.7.1`` ``v2/groupversion_info.go``.
  The schema keeps every field (what the controller reads is ``status.conditions``).

Identity: the admin client handed in installs them, grants tenants ``get``, ``list`` and ``watch``
on them (:func:`grant_reading`) and writes their objects and statuses, as their operators would.
"""

from __future__ import annotations

from typing import Any

from stageset.envtest.sourcecontroller import install_flux_crds
from stageset.kube.client import KubeClient

DB_GROUP, DB_VERSION = "db.example", "v1"
HELM_GROUP, HELM_VERSION = "helm.toolkit.fluxcd.io", "v2"
_MANAGER = "stageset-test-kinds"


def _crd(*, group: str, version: str, kind: str, plural: str, status_subresource: bool) -> dict[str, Any]:
    served: dict[str, Any] = {
        "name": version, "served": True, "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
    if status_subresource:
        served["subresources"] = {"status": {}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced", "versions": [served],
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                               "listKind": f"{kind}List"}}}


DATABASE_CRD = _crd(group=DB_GROUP, version=DB_VERSION, kind="Database", plural="databases",
                    status_subresource=False)
HELMRELEASE_CRD = _crd(group=HELM_GROUP, version=HELM_VERSION, kind="HelmRelease", plural="helmreleases",
                       status_subresource=True)


def install(admin: KubeClient) -> None:
    """Both CRDs, served (idempotent)."""
    install_flux_crds(admin, crds=[DATABASE_CRD, HELMRELEASE_CRD])


def grant_reading(admin: KubeClient, *, namespace: str, account: str, group: str, plural: str) -> None:
    """Let ServiceAccount ``account`` of ``namespace`` get, list and watch ``plural`` there (idempotent)."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    name = f"read-{plural}"
    admin.apply(f"{rbac}/roles/{name}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [{"apiGroups": [group], "resources": [plural], "verbs": ["get", "list", "watch"]}]},
        field_manager=_MANAGER)
    admin.apply(f"{rbac}/rolebindings/{name}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
        field_manager=_MANAGER)


def ready_condition(status: str, message: str = "", reason: str = "") -> dict[str, Any]:
    reason = reason or ("Succeeded" if status == "True" else "Progressing")
    return {"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2030-01-01T00:00:00Z"}


def database_path(namespace: str, name: str) -> str:
    return f"/apis/{DB_GROUP}/{DB_VERSION}/namespaces/{namespace}/databases/{name}"


def helmrelease_path(namespace: str, name: str) -> str:
    return f"/apis/{HELM_GROUP}/{HELM_VERSION}/namespaces/{namespace}/helmreleases/{name}"


def create_database(admin: KubeClient, namespace: str, name: str, *, status: dict[str, Any]) -> None:
    """A Database as its operator would show it after its first pass (status in the same request)."""
    admin.request("POST", f"/apis/{DB_GROUP}/{DB_VERSION}/namespaces/{namespace}/databases",
                  body={"apiVersion": f"{DB_GROUP}/{DB_VERSION}", "kind": "Database",
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {"engine": "postgres", "size": "1Gi"}, "status": status})


def set_database_status(admin: KubeClient, namespace: str, name: str, status: dict[str, Any]) -> None:
    admin.request("PATCH", database_path(namespace, name), content_type="application/merge-patch+json",
                  body={"status": status})


def create_helmrelease(admin: KubeClient, namespace: str, name: str, *, ready: dict[str, Any]) -> None:
    """A HelmRelease, then its status (through the subresource, as helm-controller writes it)."""
    admin.request("POST", f"/apis/{HELM_GROUP}/{HELM_VERSION}/namespaces/{namespace}/helmreleases",
                  body={"apiVersion": f"{HELM_GROUP}/{HELM_VERSION}", "kind": "HelmRelease",
                        "metadata": {"name": name, "namespace": namespace},
                        "spec": {"interval": "10m", "chart": {"spec": {"chart": "operator", "sourceRef": {
                            "kind": "HelmRepository", "name": "charts"}}}}})
    set_helmrelease_ready(admin, namespace, name, ready)


def set_helmrelease_ready(admin: KubeClient, namespace: str, name: str, ready: dict[str, Any]) -> None:
    admin.request("PATCH", f"{helmrelease_path(namespace, name)}/status",
                  content_type="application/merge-patch+json",
                  body={"status": {"observedGeneration": 1, "conditions": [ready]}})
