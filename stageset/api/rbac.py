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
# Tenant-owned alerts (``--tenant-notifications``): the two kinds, listed where the controller
# watches (the chart's "<release>-tenant-notifications" ClusterRole, bound like the controller's own
# role); no Secret: a tenant provider's Secret is read as its serviceAccountName (impersonated).
TENANT_NOTIFICATION_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "resources": ["notificationproviders", "notificationalerts"],
     "verbs": ["get", "list"]},
]

NOTIFICATION_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["stages.metio.wtf"], "resources": ["notificationproviders", "notificationalerts"],
     "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
]


# -- the tenants' roles: what `stageset create tenant` binds ---------------------------------------

TENANT_DEPLOYER_ROLE = "stageset-tenant-deployer"
"""The ClusterRole a tenant's deployer is bound to in each of its namespaces (by a RoleBinding)."""
TENANT_ADMIN_ROLE = "stageset-tenant-admin"
"""The ClusterRole a tenant's admins (``--admin-user``/``--admin-group``) are bound to there."""

_READ = ["get", "list", "watch"]
_WRITE = ["create", "update", "patch", "delete", "deletecollection"]

GUARDRAILS: tuple[tuple[str, str], ...] = (
    ("networking.k8s.io", "networkpolicies"), ("extensions", "networkpolicies"),
    ("", "resourcequotas"), ("", "limitranges"),
    ("rbac.authorization.k8s.io", "roles"), ("rbac.authorization.k8s.io", "rolebindings"),
)
"""(group, resource) of the objects that fence a tenant in: network isolation, its share of the
cluster, and who may do what.  Only the platform writes them; the tenant's roles may read the first
four (``view`` does) and never write any."""


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


# Kubernetes' `view` (system:aggregate-to-view) as of the control plane's release (1.35): reads of
# the non-escalating namespaced kinds, the guardrails included (a tenant may see its fences).
_VIEW_RULES: list[dict[str, Any]] = [
    _rule([""], ["pods", "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts",
                 "services", "services/status", "endpoints", "persistentvolumeclaims",
                 "persistentvolumeclaims/status", "configmaps"], _READ),
    _rule([""], ["limitranges", "resourcequotas", "bindings", "pods/status", "resourcequotas/status",
                 "namespaces/status", "replicationcontrollers/status", "pods/log"], _READ),
    _rule([""], ["namespaces"], _READ),
    _rule(["", "events.k8s.io"], ["events"], _READ),
    _rule(["discovery.k8s.io"], ["endpointslices"], _READ),
    _rule(["apps"], ["controllerrevisions", "statefulsets", "statefulsets/status", "statefulsets/scale",
                     "daemonsets", "daemonsets/status", "deployments", "deployments/status",
                     "deployments/scale", "replicasets", "replicasets/status", "replicasets/scale"], _READ),
    _rule(["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"], _READ),
    _rule(["batch"], ["jobs", "cronjobs", "cronjobs/status", "jobs/status"], _READ),
    _rule(["extensions"], ["daemonsets", "daemonsets/status", "deployments", "deployments/scale",
                           "deployments/status", "ingresses", "ingresses/status", "replicasets",
                           "replicasets/scale", "replicasets/status", "replicationcontrollers/scale",
                           "networkpolicies"], _READ),
    _rule(["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"], _READ),
    _rule(["networking.k8s.io"], ["networkpolicies", "ingresses", "ingresses/status"], _READ),
    _rule(["resource.k8s.io"], ["resourceclaims", "resourceclaims/status", "resourceclaimtemplates"], _READ),
]

# Kubernetes' `edit` (system:aggregate-to-edit, 1.35) with `networkpolicies` left out of both of its
# write rules: everything else a deployer applies, exactly as `edit` allows it.
_EDIT_RULES_WITHOUT_GUARDRAILS: list[dict[str, Any]] = [
    _rule([""], ["pods/attach", "pods/proxy", "pods/exec", "pods/portforward", "secrets", "services/proxy"],
          _READ),
    _rule([""], ["serviceaccounts"], ["impersonate"]),
    _rule([""], ["pods", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward"], _WRITE),
    _rule([""], ["pods/eviction"], ["create"]),
    _rule([""], ["replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services",
                 "services/proxy", "persistentvolumeclaims", "configmaps", "secrets"], _WRITE),
    _rule([""], ["serviceaccounts/token"], ["create"]),
    _rule(["", "events.k8s.io"], ["events"], _WRITE),
    _rule(["apps"], ["statefulsets", "statefulsets/scale", "daemonsets", "deployments", "deployments/scale",
                     "deployments/rollback", "replicasets", "replicasets/scale"], _WRITE),
    _rule(["autoscaling"], ["horizontalpodautoscalers"], _WRITE),
    _rule(["batch"], ["jobs", "cronjobs"], _WRITE),
    _rule(["extensions"], ["daemonsets", "deployments", "deployments/scale", "deployments/rollback",
                           "ingresses", "replicasets", "replicasets/scale", "replicationcontrollers/scale"],
          _WRITE),
    _rule(["policy"], ["poddisruptionbudgets"], _WRITE),
    _rule(["networking.k8s.io"], ["ingresses"], _WRITE),
    _rule(["coordination.k8s.io"], ["leases"], [*_READ, *_WRITE]),
    _rule(["resource.k8s.io"], ["resourceclaims", "resourceclaimtemplates"], _WRITE),
]

# What the chart aggregates into `edit` for our kinds (stageset-edit above), so a deployer keeps
# what `edit` gave it there: its StageSets' own reads (dependsOn, sources) run as it.
_OUR_KINDS_RULES: list[dict[str, Any]] = [
    _rule([GROUP], list(_RESOURCES), [*_READ, *_WRITE]),
    _rule([GROUP], [f"{r}/status" for r in _RESOURCES], _READ),
    FLUX_SOURCE_RULE,
]

TENANT_DEPLOYER_RULES: list[dict[str, Any]] = [
    *_VIEW_RULES, *_EDIT_RULES_WITHOUT_GUARDRAILS, *_OUR_KINDS_RULES]
"""``stageset-tenant-deployer``: what ``edit`` allows (view's reads, edit's writes, our kinds), minus
every write to the :data:`GUARDRAILS` — the apiserver's own authorizer refuses them, so a commit
in the tenant's repository cannot loosen its isolation, quota, limits or bindings."""

TENANT_ADMIN_RULES: list[dict[str, Any]] = [
    *TENANT_DEPLOYER_RULES,
    _rule(["authorization.k8s.io"], ["localsubjectaccessreviews"], ["create"]),
    _rule(["rbac.authorization.k8s.io"], ["roles", "rolebindings"], _READ),
]
"""``stageset-tenant-admin``: ``admin`` minus writes to the :data:`GUARDRAILS` — the deployer's
rights, plus asking what someone may do in the namespace and reading who may.  Granting rights
(Roles, RoleBindings) stays the platform's: a new tenant admin is a ``create tenant`` flag."""


def tenant_cluster_roles() -> list[dict[str, Any]]:
    """The two ClusterRoles, as ``create tenant`` (and ``--export``) and the chart's hook apply them.

    Fixed names, not a release's: every tenant's RoleBindings name them, whichever controller
    release (or none) serves its namespaces.  They grant nothing until a RoleBinding binds them in
    a namespace."""
    def role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "stageset"}},
                "rules": rules}

    return [role(TENANT_DEPLOYER_ROLE, TENANT_DEPLOYER_RULES), role(TENANT_ADMIN_ROLE, TENANT_ADMIN_RULES)]
