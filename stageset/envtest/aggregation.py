"""Fill aggregated ClusterRoles (``admin``, ``edit``, ``view``, ...) as kube-controller-manager would.

The local control plane runs no controller-manager, so the bootstrap roles that
are defined by ``aggregationRule`` stay empty.  Tests bind tenants to ``edit``
exactly as a platform team would, so we do the aggregation controller's one job:
union the rules of every ClusterRole matching the selectors.  Call it again after
installing ClusterRoles that carry ``aggregate-to-*`` labels.

Identity: the admin client handed in (``system:masters`` on the local control plane).
"""

from __future__ import annotations

from typing import Any

from stageset.kube.client import KubeClient

_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


def _matches(labels: dict[str, str], selector: dict[str, Any]) -> bool:
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return all(labels.get(key) == value for key, value in wanted.items())


def aggregate_cluster_roles(admin: KubeClient) -> None:
    """Fill every aggregated ClusterRole; repeats until stable, as aggregation nests (view -> edit)."""
    for _ in range(5):
        if not _aggregate_once(admin):
            return


def _aggregate_once(admin: KubeClient) -> bool:
    roles = admin.get(_ROLES)["items"]
    changed = False
    for role in roles:
        rule = role.get("aggregationRule")
        if not rule:
            continue
        selectors = rule.get("clusterRoleSelectors", [])
        rules: list[dict[str, Any]] = []
        for other in roles:
            if other["metadata"]["name"] == role["metadata"]["name"]:
                continue
            labels = other["metadata"].get("labels", {})
            if any(_matches(labels, selector) for selector in selectors):
                rules.extend(r for r in other.get("rules") or [] if r not in rules)
        if rules != (role.get("rules") or []):
            admin.request("PATCH", f"{_ROLES}/{role['metadata']['name']}",
                          body={"rules": rules}, content_type="application/merge-patch+json")
            role["rules"] = rules
            changed = True
    return changed
