"""Rebuilding a lost inventory from the cluster: the objects that carry a StageSet's owner labels.

Where to look comes from the durable record (:mod:`stageset.apply.record`) plus the kinds the
stages render now; what to take is every object there labelled for this StageSet *and* stage.
A view that is not complete — a list the identity may not make, a cluster that fails — is
reported as such, and the caller prunes nothing from it: an object we cannot see is an object
we might wrongly keep, never one we wrongly delete.

Identity: every list is made as the identity that applied the stage (its recorded
ServiceAccount; the controller itself only in single-tenant mode), on the StageSet's target
cluster, through the ``client_for`` the caller hands in — the same rule as prune and
teardown.  Discovery goes through the applier's mapper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stageset.api import InventoryEntry, StageInventory
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId, entry, stage_inventory
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE, owned_by
from stageset.apply.prune import Owner
from stageset.apply.record import KindRef, StageRecord
from stageset.kube.client import ApiError, KubeClient, QueryValue, UnreachableError, how_failed
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

ClientFor = Callable[[str | None], KubeClient | None]


@dataclass
class Rebuilt:
    inventories: dict[str, StageInventory] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Why the view is not complete (empty: it is)."""
    lists: int = 0

    @property
    def complete(self) -> bool:
        return not self.problems


def _list(client: KubeClient, path: str, selector: str) -> list[KubeObject]:
    query: dict[str, QueryValue] = {"labelSelector": selector, "limit": 500}
    page = client.request("GET", path, query=query)
    items = list(page.get("items") or [])
    while (page.get("metadata") or {}).get("continue"):
        page = client.request("GET", path, query={**query, "continue": page["metadata"]["continue"]})
        items.extend(page.get("items") or [])
    return items


def rebuild(*, stages: Mapping[str, StageRecord], owner: Owner, applier: StageApplier,
            client_for: ClientFor) -> Rebuilt:
    """The inventories of ``stages`` as the cluster has them (see the module docstring)."""
    result = Rebuilt()
    selector = f"{LABEL_NAME}={owner.name},{LABEL_NAMESPACE}={owner.namespace}"
    for name, stage in sorted(stages.items()):
        client = client_for(stage.service_account)
        if client is None:
            result.problems.append(f"stage {name!r}: no identity may list its objects "
                                   "(applied as the controller, which multi-tenant mode forbids)")
            continue
        entries: dict[ObjectId, InventoryEntry] = {}
        for kind, namespaces in sorted(stage.kinds.items()):
            problem = _collect(client, applier, kind=kind, namespaces=namespaces, owner=owner, stage=name,
                               selector=f"{selector},{LABEL_STAGE}={name}", into=entries, result=result)
            if problem:
                result.problems.append(f"stage {name!r}: {problem}")
        if entries:
            result.inventories[name] = stage_inventory(name, stage.service_account, entries.values())
    for problem in result.problems:
        log.warning("rebuilding the inventory of StageSet %s/%s: %s", owner.namespace, owner.name, problem)
    return result


def _collect(client: KubeClient, applier: StageApplier, *, kind: KindRef, namespaces: frozenset[str],
             owner: Owner, stage: str, selector: str, into: dict[ObjectId, InventoryEntry],
             result: Rebuilt) -> str | None:
    stub = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": "x"}}
    try:
        resource = applier.resolve(stub, owner.namespace)[1]
    except (ApiError, UnreachableError) as error:
        return f"discovery of {kind.kind} in {kind.api_version} failed ({how_failed(error)})"
    if resource is None:
        return None  # the kind is not served: no object of it can exist
    scopes = sorted({n for n in namespaces if n} or {owner.namespace}) if resource.namespaced else [""]
    for namespace in scopes:
        where = f"in {namespace}" if namespace else "cluster-wide"
        try:
            result.lists += 1
            items = _list(client, resource.collection_path(namespace or None), selector)
        except ApiError as error:
            if error.not_found:
                continue
            return f"{client.identity.describe()} may not list {kind.kind} {where}" if error.forbidden \
                else f"listing {kind.kind} {where} failed ({how_failed(error)})"
        except UnreachableError as error:
            return f"listing {kind.kind} {where} failed ({how_failed(error)})"
        for item in items:
            labels = (item.get("metadata") or {}).get("labels") or {}
            if labels.get(LABEL_STAGE) != stage or not owned_by(item, namespace=owner.namespace,
                                                                 name=owner.name):
                continue
            oid = _object_id(item, resource)
            into[oid] = entry(oid, version=resource.api_version, digest=None)
    return None


def _object_id(item: KubeObject, resource: Resource) -> ObjectId:
    metadata = item.get("metadata") or {}
    return ObjectId(namespace=str(metadata.get("namespace") or "") if resource.namespaced else "",
                    name=str(metadata.get("name")), group=resource.group, kind=resource.kind)
