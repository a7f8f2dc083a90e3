"""What ``stageset create tenant`` makes: the objects of one tenant, built without any I/O.

Identity: none (pure; :mod:`stageset.cli.tenant` applies the objects as the user).

A tenant is a set of namespaces labelled ``stages.metio.wtf/tenant: NAME``: the workload
namespaces (``--with-namespace``) and, optionally, one control-plane namespace that holds the
tenant's StageSets and sources.  Each namespace gets:

- a deployer ServiceAccount (the identity its StageSets name in ``serviceAccountName``);
- a RoleBinding of the cluster role (default ``edit``) to that deployer and, in a workload
  namespace, also to the control-plane namespace's deployer;
- NetworkPolicies: default-deny (ingress and egress), allow within the tenant's namespaces
  (selected by the tenant label, which only the platform can set on a Namespace), allow DNS;
- with ``--quota``, a ResourceQuota (``stagesets`` counts StageSets); with ``--limit-range``,
  a Container LimitRange.

Invariants: nothing cluster-scoped is granted — the only cluster-scoped objects are the
Namespaces themselves, and every binding is a namespaced RoleBinding.  The output is a pure
function of the arguments (same flags, same bytes), so it can live in the platform's Git.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from stageset.api.common import GROUP
from stageset.api.tenancy import TENANT_LABEL
from stageset.kube.mapping import Resource
from stageset.kube.quantity import parse_quantity

DEFAULT_SERVICE_ACCOUNT: Final = "stageset-deployer"
DEFAULT_CLUSTER_ROLE: Final = "edit"
OBJECT_NAME: Final = "stageset-tenant"
"""The name of the tenant's RoleBinding, ResourceQuota and LimitRange in each namespace."""
DENY_ALL: Final = "stageset-tenant-deny-all"
SAME_TENANT: Final = "stageset-tenant-same-tenant"
ALLOW_DNS: Final = "stageset-tenant-allow-dns"

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
SERVICE_ACCOUNTS = Resource(group="", version="v1", kind="ServiceAccount", plural="serviceaccounts",
                            namespaced=True)
ROLE_BINDINGS = Resource(group="rbac.authorization.k8s.io", version="v1", kind="RoleBinding",
                         plural="rolebindings", namespaced=True)
NETWORK_POLICIES = Resource(group="networking.k8s.io", version="v1", kind="NetworkPolicy",
                            plural="networkpolicies", namespaced=True)
RESOURCE_QUOTAS = Resource(group="", version="v1", kind="ResourceQuota", plural="resourcequotas",
                           namespaced=True)
LIMIT_RANGES = Resource(group="", version="v1", kind="LimitRange", plural="limitranges", namespaced=True)
RESOURCES: Final = {r.kind: r for r in (NAMESPACES, SERVICE_ACCOUNTS, ROLE_BINDINGS, NETWORK_POLICIES,
                                        RESOURCE_QUOTAS, LIMIT_RANGES)}

# The resource names a ResourceQuota's `hard` accepts: a standard name (cpu, pods, requests.memory,
# services.loadbalancers, ...), count/<resource>[.<group>], or <class>.storageclass.storage.k8s.io/...
_QUOTA_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9._]*[a-z0-9])?$")


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
    ]


def tenant_objects(spec: TenantSpec) -> list[dict[str, Any]]:
    """Every object of the tenant, in the order to apply them: Namespaces, then each namespace's."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(spec, namespace)}
        for namespace in spec.all_namespaces]
    for namespace in spec.all_namespaces:
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": _meta(spec, spec.service_account, namespace)})
        objects.append(_role_binding(spec, namespace))
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
