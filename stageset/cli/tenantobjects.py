"""What ``stageset create tenant`` makes: the objects of one tenant, built without any I/O.

Identity: none (pure; :mod:`stageset.cli.tenant` applies the objects as the user).

A tenant is a set of namespaces labelled ``stages.metio.wtf/tenant: NAME``: the workload
namespaces (``--with-namespace``) and, optionally, one control-plane namespace that holds the
tenant's StageSets and sources.  Each namespace gets:

- a deployer ServiceAccount (the identity its StageSets name in ``serviceAccountName``);
- a RoleBinding of the cluster role (default ``stageset-tenant-deployer``: ``edit`` minus writes to
  the guardrails, :data:`stageset.api.rbac.GUARDRAILS`) to that deployer and, in a workload
  namespace, also to the control-plane namespace's deployer;
- with ``--admin-user``/``--admin-group``, a RoleBinding of ``stageset-tenant-admin`` (``admin``
  minus the same writes) to those people;
- NetworkPolicies: default-deny (ingress and egress), allow within the tenant's namespaces
  (selected by the tenant label, which only the platform can set on a Namespace), allow DNS, and
  with ``--allow-from-namespace-label``/``--allow-to-namespace-label`` ingress from / egress to
  the namespaces carrying one of those labels (an ingress controller, monitoring, shared services);
- with ``--quota``, a ResourceQuota (``stagesets`` counts StageSets); with ``--limit-range``,
  a Container LimitRange.

Before them come the two shared ClusterRoles (``stageset-tenant-deployer`` and
``stageset-tenant-admin``, :func:`stageset.api.rbac.tenant_cluster_roles`) when a binding names
them: the same objects the chart's hook applies, with the same field manager, so applying them again
changes nothing.  They carry no tenant label: every tenant shares them.

Invariants: nothing cluster-wide is granted — the ClusterRoles grant nothing by themselves, the
only other cluster-scoped objects are the Namespaces, and every binding is a namespaced
RoleBinding.  No binding of the tenant's may write a guardrail unless ``--cluster-role`` names a
role that may (``edit``: the documented trade-off).  The output is a pure function of the
arguments (same flags, same bytes), so it can live in the platform's Git.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from stageset.api.common import GROUP
from stageset.api.rbac import TENANT_ADMIN_ROLE, TENANT_DEPLOYER_ROLE, tenant_cluster_roles
from stageset.api.tenancy import TENANT_LABEL
from stageset.kube.mapping import Resource
from stageset.kube.quantity import parse_quantity

DEFAULT_SERVICE_ACCOUNT: Final = "stageset-deployer"
DEFAULT_CLUSTER_ROLE: Final = TENANT_DEPLOYER_ROLE
OBJECT_NAME: Final = "stageset-tenant"
"""The name of the tenant's deployer RoleBinding, ResourceQuota and LimitRange in each namespace."""
ADMINS: Final = "stageset-tenant-admins"
"""The RoleBinding of the tenant's admins in each namespace."""
DENY_ALL: Final = "stageset-tenant-deny-all"
SAME_TENANT: Final = "stageset-tenant-same-tenant"
ALLOW_DNS: Final = "stageset-tenant-allow-dns"
ALLOW_FROM: Final = "stageset-tenant-allow-from-namespaces"
ALLOW_TO: Final = "stageset-tenant-allow-to-namespaces"

STAGESET_COUNT: Final = f"count/stagesets.{GROUP}"
"""The ResourceQuota key ``--quota stagesets=N`` becomes (object-count quota on our CRD)."""

LIMIT_RANGE_KEYS: Final = {
    "default-cpu": ("default", "cpu"),
    "default-memory": ("default", "memory"),
    "request-cpu": ("defaultRequest", "cpu"),
    "request-memory": ("defaultRequest", "memory"),
}
"""``--limit-range`` keys: the Container LimitRange's default limits and default requests."""

NAMESPACES = Resource(group="", version="v1", kind="Namespace", plural="namespaces", namespaced=False)
CLUSTER_ROLES = Resource(group="rbac.authorization.k8s.io", version="v1", kind="ClusterRole",
                         plural="clusterroles", namespaced=False)
SERVICE_ACCOUNTS = Resource(group="", version="v1", kind="ServiceAccount", plural="serviceaccounts",
                            namespaced=True)
ROLE_BINDINGS = Resource(group="rbac.authorization.k8s.io", version="v1", kind="RoleBinding",
                         plural="rolebindings", namespaced=True)
NETWORK_POLICIES = Resource(group="networking.k8s.io", version="v1", kind="NetworkPolicy",
                            plural="networkpolicies", namespaced=True)
RESOURCE_QUOTAS = Resource(group="", version="v1", kind="ResourceQuota", plural="resourcequotas",
                           namespaced=True)
LIMIT_RANGES = Resource(group="", version="v1", kind="LimitRange", plural="limitranges", namespaced=True)
RESOURCES: Final = {r.kind: r for r in (CLUSTER_ROLES, NAMESPACES, SERVICE_ACCOUNTS, ROLE_BINDINGS,
                                        NETWORK_POLICIES, RESOURCE_QUOTAS, LIMIT_RANGES)}

# The resource names a ResourceQuota's `hard` accepts: a standard name (cpu, pods, requests.memory,
# services.loadbalancers, ...), count/<resource>[.<group>], or <class>.storageclass.storage.k8s.io/...
_QUOTA_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")
# A label key (optional DNS-subdomain prefix, then a name of at most 63 characters) and value.
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def parse_pairs(text: str, *, what: str) -> dict[str, str]:
    """``k=v,k=v`` as a dict; raises ValueError naming ``what`` for a malformed or repeated pair."""
    pairs: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"{what}: {item!r} is not KEY=VALUE")
        if key in pairs:
            raise ValueError(f"{what}: {key!r} given twice")
        pairs[key] = value
    return pairs


def _quantity(value: str, *, what: str) -> str:
    try:
        if parse_quantity(value) < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{what}: {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 8Gi)") from None
    return value


def quota_hard(pairs: dict[str, str]) -> dict[str, str]:
    """``--quota`` as a ResourceQuota's ``hard`` (sorted keys): ``stagesets`` is the StageSet count."""
    hard: dict[str, str] = {}
    for key, value in pairs.items():
        name = STAGESET_COUNT if key == "stagesets" else key
        if _QUOTA_KEY.fullmatch(name) is None:
            raise ValueError(f"--quota: {key!r} is not a resource name (e.g. requests.cpu, pods, stagesets)")
        hard[name] = _quantity(value, what=f"--quota {key}")
    return dict(sorted(hard.items()))


def limit_range_limits(pairs: dict[str, str]) -> dict[str, dict[str, str]]:
    """``--limit-range`` as a Container limit's ``default`` and ``defaultRequest``."""
    limits: dict[str, dict[str, str]] = {}
    for key, value in sorted(pairs.items()):
        if key not in LIMIT_RANGE_KEYS:
            known = ", ".join(LIMIT_RANGE_KEYS)
            raise ValueError(f"--limit-range: unknown key {key!r} (known: {known})")
        field, resource = LIMIT_RANGE_KEYS[key]
        limits.setdefault(field, {})[resource] = _quantity(value, what=f"--limit-range {key}")
    return dict(sorted(limits.items()))


def namespace_label(text: str, *, what: str) -> tuple[str, str]:
    """``KEY=VALUE`` as a label selector's one pair; raises ValueError naming ``what`` when it is not one."""
    key, sep, value = text.partition("=")
    prefix, slash, name = key.rpartition("/")
    valid_key = (bool(name) and len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None
                 and (not slash or (len(prefix) <= 253 and _LABEL_PREFIX.fullmatch(prefix) is not None)))
    valid_value = len(value) <= 63 and (value == "" or _LABEL_NAME.fullmatch(value) is not None)
    if not sep or not valid_key or not valid_value:
        raise ValueError(f"{what}: {text!r} is not a label KEY=VALUE "
                         "(e.g. kubernetes.io/metadata.name=ingress-nginx)")
    return key, value


@dataclass(frozen=True, kw_only=True)
class TenantSpec:
    """One tenant as the flags describe it (validated by the command before it gets here)."""

    name: str
    namespaces: tuple[str, ...]
    control_plane_namespace: str | None = None
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    cluster_role: str = DEFAULT_CLUSTER_ROLE
    quota: dict[str, str] | None = None
    limit_range: dict[str, dict[str, str]] | None = None
    admin_users: tuple[str, ...] = ()
    admin_groups: tuple[str, ...] = ()
    allow_from: tuple[tuple[str, str], ...] = ()
    """Namespace labels whose namespaces' pods may connect to the tenant's (ingress)."""
    allow_to: tuple[tuple[str, str], ...] = ()
    """Namespace labels whose namespaces' pods the tenant's may connect to (egress)."""

    @property
    def all_namespaces(self) -> tuple[str, ...]:
        """The control-plane namespace first, then the workload namespaces, sorted."""
        first = (self.control_plane_namespace,) if self.control_plane_namespace else ()
        return first + tuple(sorted(set(self.namespaces)))


def _meta(spec: TenantSpec, name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {TENANT_LABEL: spec.name}
    return meta


def _deployer(spec: TenantSpec, namespace: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": spec.service_account, "namespace": namespace}


def _role_binding(spec: TenantSpec, namespace: str) -> dict[str, Any]:
    subjects = [_deployer(spec, namespace)]
    if spec.control_plane_namespace and namespace != spec.control_plane_namespace:
        subjects.append(_deployer(spec, spec.control_plane_namespace))
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(spec, OBJECT_NAME, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": spec.cluster_role},
            "subjects": subjects}


def _admins_binding(spec: TenantSpec, namespace: str) -> dict[str, Any]:
    group = "rbac.authorization.k8s.io"
    subjects = ([{"apiGroup": group, "kind": "User", "name": user} for user in sorted(set(spec.admin_users))]
                + [{"apiGroup": group, "kind": "Group", "name": name}
                   for name in sorted(set(spec.admin_groups))])
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(spec, ADMINS, namespace),
            "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": TENANT_ADMIN_ROLE},
            "subjects": subjects}


def _namespaces_labelled(pairs: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """One peer per label (any of them allows), in a stable order."""
    return [{"namespaceSelector": {"matchLabels": {key: value}}} for key, value in sorted(set(pairs))]


def _network_policies(spec: TenantSpec, namespace: str) -> list[dict[str, Any]]:
    def policy(name: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta(spec, name, namespace), "spec": {"podSelector": {}, **body}}

    same_tenant = [{"namespaceSelector": {"matchLabels": {TENANT_LABEL: spec.name}}}]
    dns = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    return [
        # Selects every pod and allows nothing: all traffic not allowed below is refused.
        policy(DENY_ALL, {"policyTypes": ["Ingress", "Egress"]}),
        policy(SAME_TENANT, {"policyTypes": ["Ingress", "Egress"],
                             "ingress": [{"from": same_tenant}], "egress": [{"to": same_tenant}]}),
        policy(ALLOW_DNS, {"policyTypes": ["Egress"],
                           "egress": [{"to": dns, "ports": [{"protocol": "UDP", "port": 53},
                                                            {"protocol": "TCP", "port": 53}]}]}),
    ] + ([policy(ALLOW_FROM, {"policyTypes": ["Ingress"],
                              "ingress": [{"from": _namespaces_labelled(spec.allow_from)}]})]
         if spec.allow_from else []) + (
        [policy(ALLOW_TO, {"policyTypes": ["Egress"],
                           "egress": [{"to": _namespaces_labelled(spec.allow_to)}]})]
        if spec.allow_to else [])


def tenant_objects(spec: TenantSpec) -> list[dict[str, Any]]:
    """Every object of the tenant, in the order to apply them: the shared ClusterRoles its bindings
    name, the Namespaces, then each namespace's objects."""
    admins = bool(spec.admin_users or spec.admin_groups)
    wanted = {TENANT_DEPLOYER_ROLE} if spec.cluster_role == TENANT_DEPLOYER_ROLE else set()
    if admins:
        wanted.add(TENANT_ADMIN_ROLE)
    objects: list[dict[str, Any]] = [role for role in tenant_cluster_roles()
                                     if role["metadata"]["name"] in wanted]
    objects += [{"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(spec, namespace)}
                for namespace in spec.all_namespaces]
    for namespace in spec.all_namespaces:
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": _meta(spec, spec.service_account, namespace)})
        objects.append(_role_binding(spec, namespace))
        if admins:
            objects.append(_admins_binding(spec, namespace))
        objects += _network_policies(spec, namespace)
        if spec.quota:
            objects.append({"apiVersion": "v1", "kind": "ResourceQuota",
                            "metadata": _meta(spec, OBJECT_NAME, namespace),
                            "spec": {"hard": dict(spec.quota)}})
        if spec.limit_range:
            objects.append({"apiVersion": "v1", "kind": "LimitRange",
                            "metadata": _meta(spec, OBJECT_NAME, namespace),
                            "spec": {"limits": [{"type": "Container", **spec.limit_range}]}})
    return objects


def object_path(obj: dict[str, Any]) -> str:
    """The object's own URL (where it is applied)."""
    meta = obj["metadata"]
    return RESOURCES[obj["kind"]].object_path(name=meta["name"], namespace=meta.get("namespace"))
