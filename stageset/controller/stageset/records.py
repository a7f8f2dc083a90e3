"""The durable inventory record on each StageSet, and rebuilding an inventory status lost.

- :meth:`Records.recover` — before anything is applied or pruned: when status holds no
  inventory but the record names stages (a StageSet restored from a backup without status,
  re-created, replaced), rebuild each stage's inventory from the objects on the cluster that
  carry its owner labels, looking where the record and the rendered manifests say;
- :meth:`Records.grow` — before applying: the record covers every kind and namespace the
  stages are about to write (so a crash right after the write still leaves them findable);
- :meth:`Records.settle` — after a complete prune: the record shrinks to what is still owned.

Identity: the record is an annotation on the StageSet, written with the controller's own
identity (its ClusterRole already patches StageSets, for the finalizer); the lists are made
as each stage's recorded identity on the target cluster (:mod:`stageset.apply.rebuild`).  A
write that would change nothing is skipped: a quiet pass writes nothing here either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from stageset.api import StageInventory, StageSet
from stageset.apply.inventory import merged
from stageset.apply.prune import Owner
from stageset.apply.rebuild import rebuild
from stageset.apply.record import ANNOTATION, Record, StageRecord, of_inventories, of_objects, parse
from stageset.controller.identity import IdentityPolicy
from stageset.controller.stageset import plan
from stageset.controller.stageset.rendering import Rendered
from stageset.controller.stageset.targets import Target, inventory_clients
from stageset.kube.client import ApiError, ClientPool
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, metadata

log = logging.getLogger(__name__)


class Records:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, resource: Resource):
        self._clients = clients
        self._identities = identities
        self._resource = resource

    def recover(self, obj: KubeObject, *, inventories: Mapping[str, StageInventory],
                wanted: Mapping[str, StageRecord], target: Target
                ) -> tuple[dict[str, StageInventory], str | None]:
        """``inventories`` (from status) with what the cluster holds when status lost them, and
        why that view is incomplete (``None``: complete, or nothing to rebuild)."""
        record = parse(obj)
        if not plan.needs_rebuild(inventories, record, status_lost=plan.status_lost(obj.get("status"))):
            return dict(inventories), None
        namespace = str(metadata(obj)["namespace"])
        stages = Record(record.stages).grown(wanted).stages
        found = rebuild(stages=stages, owner=Owner(namespace, str(metadata(obj)["name"])),
                        applier=target.applier, client_for=inventory_clients(
                            clients=self._clients, identities=self._identities, namespace=namespace,
                            target=target))
        log.info("StageSet %s/%s: status had no inventory; rebuilt %d object(s) of %d stage(s) from the "
                 "cluster with %d list(s)%s", namespace, metadata(obj)["name"],
                 sum(len(i.entries) for i in found.inventories.values()), len(found.inventories), found.lists,
                 "" if found.complete else " (incomplete: nothing will be pruned)")
        result: dict[str, StageInventory] = dict(inventories)
        for name, inv in found.inventories.items():
            result[name] = merged(result.get(name), inv)
        problem = "; ".join(found.problems[:3]) if found.problems else None
        self._write(obj, replace(record.grown(wanted), rebuild=problem is not None))
        return result, problem

    def wanted(self, stageset: StageSet, rendered: Mapping[str, Rendered]) -> dict[str, StageRecord]:
        """What the stages are about to apply, as record entries (namespaces as the apiserver
        will store them: defaulted for namespaced kinds, none for cluster-scoped ones)."""
        namespace = str(stageset.metadata["namespace"])
        wanted: dict[str, StageRecord] = {}
        for name, item in rendered.items():
            pairs = []
            for manifest in item.objects:
                resolved, resource = item.target.applier.resolve(manifest, namespace)
                ns = str((resolved.get("metadata") or {}).get("namespace") or "") if resource is not None \
                    else str((manifest.get("metadata") or {}).get("namespace") or namespace)
                pairs.append((ns, manifest))
            wanted[name] = of_objects(item.account, pairs)
        return wanted

    def grow(self, obj: KubeObject, wanted: Mapping[str, StageRecord]) -> None:
        """Before applying: the record must cover what is about to be written."""
        record = parse(obj)
        if not record.covers(wanted):
            self._write(obj, record.grown(wanted))

    def settle(self, obj: KubeObject, inventories: list[StageInventory]) -> None:
        """After a complete prune: exactly what is still owned."""
        self._write(obj, of_inventories(inventories))

    def _write(self, obj: KubeObject, record: Record) -> None:
        value = record.encode() if record.stages or record.rebuild else None
        meta = metadata(obj)
        if (meta.get("annotations") or {}).get(ANNOTATION) == value:
            return
        path = self._resource.object_path(name=meta["name"], namespace=meta.get("namespace"))
        try:
            written = self._clients.client().request(
                "PATCH", path, content_type="application/merge-patch+json",
                body={"metadata": {"annotations": {ANNOTATION: value}}})
        except ApiError as error:
            if error.not_found:
                return
            raise
        annotations = {**(meta.get("annotations") or {})}
        if value is None:
            annotations.pop(ANNOTATION, None)
        else:
            annotations[ANNOTATION] = value
        obj["metadata"]["annotations"] = annotations
        if version := metadata(written).get("resourceVersion"):
            obj["metadata"]["resourceVersion"] = version
