"""The durable inventory record on each StageSet, and rebuilding an inventory status lost.

- :meth:`Records.recover` — before anything is applied or pruned: when status holds no
  inventory but the record names stages (a StageSet restored from a backup without status,
  re-created, replaced), rebuild each stage's inventory from the objects on the cluster that
  carry its owner labels, looking where the record and the rendered manifests say;
- :func:`grown` — before applying: the record covers every kind and namespace the stages are
  about to write (so a crash right after the write still leaves them findable);
- :func:`settled` — after a complete prune: the record shrinks to what is still owned.

Each returns the record to write; the writing is :meth:`PassWriter.record
<stageset.controller.stageset.writer.PassWriter.record>`'s (as the controller, skipped when
the annotation already says so: a quiet pass writes nothing here either).  Identity: the lists
of a rebuild are made as each stage's recorded identity on the target cluster
(:mod:`stageset.apply.rebuild`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from stageset.api import AppliedTarget, PreviousTargets, SecretKeyRef, StageInventory, StageSet, TargetRef
from stageset.api.common import LocalObjectRef
from stageset.apply.inventory import merged
from stageset.apply.prune import Owner
from stageset.apply.rebuild import rebuild
from stageset.apply.record import Previous, Record, StageRecord, of_inventories, of_objects, parse
from stageset.controller.identity import IdentityPolicy
from stageset.controller.stageset import plan
from stageset.controller.stageset.rendering import Rendered
from stageset.controller.targets.clusters import Target, inventory_clients
from stageset.kube.client import ClientPool
from stageset.kube.types import KubeObject, metadata

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """The inventories before a pass, with what the cluster holds when status lost them."""

    inventories: dict[str, StageInventory]
    problem: str | None = None
    """Why that view is incomplete (``None``: complete, or nothing to rebuild)."""
    record: Record | None = None
    """The record to write (``None``: nothing was rebuilt)."""


class Records:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy):
        self._clients = clients
        self._identities = identities

    def recover(self, obj: KubeObject, *, inventories: Mapping[str, StageInventory],
                wanted: Mapping[str, StageRecord], target: Target, now: str) -> Recovered:
        """``inventories`` (from status), rebuilt from ``target`` when status lost them: the stages
        the record names on it (a stage recorded on another cluster is left to the move's cleanup,
        :mod:`~stageset.controller.stageset.moves`)."""
        record = parse(obj).rebased(target.id, now=now)
        if not plan.needs_rebuild(inventories, record, status_lost=plan.status_lost(obj.get("status"))):
            return Recovered(dict(inventories))
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
            found_here = on_target(inv, target, stageset=None, recorded=stages[name])
            result[name] = merged(result.get(name), found_here)
        problem = "; ".join(found.problems[:3]) if found.problems else None
        return Recovered(result, problem, replace(record.grown(wanted), rebuild=problem is not None))


def on_target(inventory: StageInventory, target: Target, *, stageset: StageSet | None,
              recorded: StageRecord | None) -> StageInventory:
    """``inventory`` naming the cluster it was applied on (nothing for this cluster, as before
    targets were recorded), and how it was reached: ``stageset``'s kubeConfig Secret or StageTarget,
    or what ``recorded`` (the stage's durable record) names, or the platform StageTarget ``target``
    is."""
    if not target.remote:
        return inventory if inventory.target is None else inventory.model_copy(update={"target": None})
    if stageset is not None:
        spec = stageset.spec
        ref = spec.kube_config.secret_ref if spec.kube_config is not None else None
        secret = SecretKeyRef(name=ref.name, key=ref.key) if ref is not None else None
        config_map = spec.kube_config.config_map_ref if spec.kube_config is not None else None
        applied = AppliedTarget(id=target.id, target_ref=spec.target_ref, kube_config=secret,
                                config_map_ref=LocalObjectRef(name=config_map.name) if config_map else None)
    elif recorded is not None:
        applied = applied_target(recorded, cluster_id=target.id)
    else:
        applied = AppliedTarget(id=target.id)
    if applied.target_ref is None and applied.kube_config is None and applied.config_map_ref is None \
            and target.name:
        namespace, _, name = target.name.partition("/")
        applied = applied.model_copy(update={"target_ref": TargetRef(namespace=namespace, name=name)})
    return inventory.model_copy(update={"target": applied})


def applied_target(record: StageRecord, *, cluster_id: str | None = None) -> AppliedTarget:
    """The remote cluster ``record`` names (``cluster_id``: the one it turned out to be), and how it
    was reached: references only (a Secret of the StageSet's namespace, or a StageTarget)."""
    via, platform = record.via, record.stage_target
    return AppliedTarget(id=cluster_id or record.target,
                         kube_config=SecretKeyRef(name=via[0], key=via[1]) if via is not None else None,
                         config_map_ref=LocalObjectRef(name=record.config_map) if record.config_map else None,
                         target_ref=TargetRef(namespace=platform[0], name=platform[1])
                         if platform is not None else None)


def wanted(stageset: StageSet, rendered: Mapping[str, Rendered]) -> dict[str, StageRecord]:
    """What the stages are about to apply, as record entries (namespaces as the apiserver
    will store them: defaulted for namespaced kinds, none for cluster-scoped ones)."""
    namespace = str(stageset.metadata["namespace"])
    found: dict[str, StageRecord] = {}
    for name, item in rendered.items():
        pairs = []
        for manifest in item.objects:
            resolved, resource = item.target.applier.resolve(manifest, namespace)
            ns = str((resolved.get("metadata") or {}).get("namespace") or "") if resource is not None \
                else str((manifest.get("metadata") or {}).get("namespace") or namespace)
            pairs.append((ns, manifest))
        ref = stageset.spec.kube_config.secret_ref if stageset.spec.kube_config else None
        config_map = stageset.spec.kube_config.config_map_ref if stageset.spec.kube_config else None
        platform = stageset.spec.target_ref
        found[name] = of_objects(item.account, pairs, target=item.target.id,
                                 via=(ref.name, ref.key) if ref is not None else None,
                                 stage_target=(platform.namespace, platform.name) if platform else None,
                                 config_map=config_map.name if config_map is not None else None)
    return found


def grown(obj: KubeObject, wanted: Mapping[str, StageRecord], *, target: str, now: str) -> Record | None:
    """Before applying: the record must cover what is about to be written on ``target``, and name
    the stages recorded on another cluster as ones to clean up there (``None``: it does both)."""
    record = parse(obj)
    rebased = record.rebased(target, now=now)
    if rebased == record and record.covers(wanted):
        return None
    return rebased.grown(wanted)


def settled(inventories: list[StageInventory], *, previous: PreviousTargets | None, unlisted: Previous
            ) -> Record:
    """After a complete prune: exactly what is still owned, here and on previous targets (listed in
    status, or ``unlisted``: named by the record only, not found there yet)."""
    settled = of_inventories(inventories, previous=previous.inventory if previous else (),
                             since=previous.since if previous else None)
    if not unlisted:
        return settled
    # Stage records hold mappings (not hashable): duplicates are dropped by equality.
    both: list[tuple[str, StageRecord]] = []
    for item in (*settled.previous, *unlisted):
        if item not in both:
            both.append(item)
    return replace(settled, previous=tuple(sorted(both, key=lambda item: (item[0], item[1].target))),
                   since=settled.since or (previous.since if previous else None))
