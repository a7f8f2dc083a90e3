"""ClusterRoles that let tenants use our kinds, aggregated into the built-in roles.

With these installed, a ServiceAccount bound to ``edit`` (or ``admin``) in its
namespace may manage StageSets and GitRepositories there, and ``view`` may read
them — the same way built-in kinds work.  Both may also read Flux's source kinds
(:data:`FLUX_SOURCE_RULE`): a stage's Flux source is read as the tenant.  Rules for a group
nobody serves grant nothing and fail nothing, so the same roles install with or without Flux.
The Helm chart ships the same objects (``helm/stageset/templates/aggregate-roles.yaml``; a test
keeps the two equal).
"""

from __future__ import annotations

from typing import Any

from stageset.api.common import GROUP

_RESOURCES = ["stagesets", "gitrepositories"]
FLUX_GROUP = "source.toolkit.fluxcd.io"
FLUX_RESOURCES = ["externalartifacts", "gitrepositories", "ocirepositories", "buckets"]
FLUX_SOURCE_RULE: dict[str, Any] = {"apiGroups": [FLUX_GROUP], "resources": FLUX_RESOURCES,
                                    "verbs": ["get", "list", "watch"]}
"""Read access to Flux's source kinds: for tenants (aggregated into view, edit and admin) and for the
controller (it watches them for triggers)."""


def aggregated_cluster_roles() -> list[dict[str, Any]]:
    def role(name: str, verbs: list[str], *aggregate_to: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {
                "name": name,
                "labels": {f"rbac.authorization.k8s.io/aggregate-to-{to}": "true"
                           for to in aggregate_to},
            },
            "rules": [
                {"apiGroups": [GROUP], "resources": _RESOURCES, "verbs": verbs},
                {"apiGroups": [GROUP], "resources": [f"{r}/status" for r in _RESOURCES],
                 "verbs": ["get", "list", "watch"]},
                FLUX_SOURCE_RULE,
            ],
        }

    return [
        role("stageset-edit", ["get", "list", "watch", "create", "update", "patch", "delete",
                               "deletecollection"], "admin", "edit"),
        role("stageset-view", ["get", "list", "watch"], "view"),
    ]


def controller_cluster_role(name: str = "stageset-controller") -> dict[str, Any]:
    """The controller's own rights in multi-tenant mode (the Helm chart's ClusterRole).

    Impersonate ServiceAccounts; read and watch our kinds and Flux's source kinds (triggers only:
    a stage's source is read again as the tenant); write our status and finalizers; events.  No
    write to any other kind, no Secret or ConfigMap read: everything a tenant's StageSet does goes
    through impersonation.
    """
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": CONTROLLER_RULES,
    }


CONTROLLER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
    {"apiGroups": [GROUP], "resources": _RESOURCES, "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": [GROUP],
     "resources": ["stagesets/status", "gitrepositories/status", "stagesets/finalizers"],
     "verbs": ["get", "patch", "update"]},
    # FleetRollouts (cluster-scoped, the platform's): read them, write their status only.  On
    # members the controller writes one annotation, with the StageSet patch right above.
    {"apiGroups": [GROUP], "resources": ["fleetrollouts"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": ["fleetrollouts/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    FLUX_SOURCE_RULE,
    # Namespaces' labels (read metadata-only): which tenant a namespace belongs to, for metrics.
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
]

# Platform targets (``--target-namespaces``): StageTargets and the kubeconfig Secrets beside them,
# granted by a Role in each target namespace only (the chart's "<release>-targets" Roles), never
# cluster-wide, and never aggregated into a tenant's admin/edit/view: only the controller reads a
# target's credentials, and only the platform creates targets.
TARGET_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": ["stagetargets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": ["stagetargets/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]},
]

# Workload identity (``--workload-identity``, the chart's ``targets.workloadIdentity``): the controller
# requests tokens for the ServiceAccounts that act on a workload-identity remote (``kubeConfig.
# configMapRef``).  Bound where its ClusterRole is (one ClusterRoleBinding, or a RoleBinding per watched
# namespace: only tenants' namespaces it serves), never in cluster-admin mode (which has it), and in
# each target namespace through the targets Role (the StageTargets' platform accounts).  No more than
# ``impersonate serviceaccounts`` already allows there; which account a token is requested for is
# decided in stageset/controller/targets/workload.py.
TOKEN_REQUEST_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
]
# ... and in each target namespace, the workload-identity ConfigMaps beside the StageTargets (read and
# watched metadata-only by the controller itself), added to the targets Role.
WORKLOAD_TARGET_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
    *TOKEN_REQUEST_RULES,
]

# Leader election: the release's Lease, granted by a Role in the release namespace only (the
# chart's "<release>-leader-election" Role), not cluster-wide; label shards' hand-off records are
# Leases there too, deleted once their hand-off is complete (stageset/controller/handoff.py).
LEADER_ELECTION_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "create", "update", "delete"]},
]

# Notifications: the providers, alerts and the providers' Secrets, granted by a Role in the one
# platform namespace the controller reads them from (``--notification-namespace``; the chart's
# "<release>-notifications" Role), never cluster-wide: the controller reads no tenant's Secret.
NOTIFICATION_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["stages.metio.wtf"], "resources": ["notificationproviders", "notificationalerts"],
     "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
]
