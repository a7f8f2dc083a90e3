"""Inventories: which objects each stage owns, and what a finished pass may prune.  Pure.

The inventory *is* the status model :class:`stageset.api.StageInventory` (one class for
the wire and the logic); this module adds object identities and the rules over them.

Safety rules, each a known failure of other tools that we must not repeat:

- An object that moved from one stage to another of the same StageSet is never
  stale: staleness is computed against the union of every stage's new objects.
- The previous inventory is kept (merged with the new one) until prune really ran,
  so a pass that fails half-way never forgets an object it applied.
- Two stages rendering the same object is refused before anything is applied.
- A stage with ``prune: false`` never loses objects to prune.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from stageset.api import AppliedTarget, InventoryEntry, PreviousTargets, StageInventory
from stageset.kube.types import KubeObject


@dataclass(frozen=True, order=True)
class ObjectId:
    namespace: str
    name: str
    group: str
    kind: str

    def encode(self) -> str:
        return f"{self.namespace}_{self.name}_{self.group}_{self.kind}"

    @classmethod
    def decode(cls, value: str) -> ObjectId:
        namespace, name, group, kind = value.split("_", 3)
        return cls(namespace=namespace, name=name, group=group, kind=kind)

    def describe(self) -> str:
        """``Kind namespace/name`` (``Kind name`` when cluster-scoped): how messages name objects."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


def object_id(obj: KubeObject) -> ObjectId:
    """The identity of a manifest (namespace as the manifest says; defaulting is the caller's)."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    metadata = obj.get("metadata") or {}
    return ObjectId(namespace=str(metadata.get("namespace") or ""), name=str(metadata.get("name")),
                    group=group, kind=str(obj.get("kind")))


def describe(obj: KubeObject) -> str:
    """A manifest or live object named as messages name it (see :meth:`ObjectId.describe`)."""
    return object_id(obj).describe()


def manifest_hash(obj: KubeObject) -> str:
    """A short digest of the manifest as we apply it (tells drift from a new revision)."""
    encoded = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def entry(oid: ObjectId, *, version: str, digest: str | None) -> InventoryEntry:
    return InventoryEntry(id=oid.encode(), v=version, h=digest or None)


def entry_id(item: InventoryEntry) -> ObjectId:
    return ObjectId.decode(item.id)


def by_id(inventory: StageInventory | None) -> dict[ObjectId, InventoryEntry]:
    """The inventory's entries keyed by object identity."""
    return {entry_id(e): e for e in inventory.entries} if inventory else {}


def stage_inventory(name: str, service_account: str | None, entries: Iterable[InventoryEntry], *,
                    target: AppliedTarget | None = None) -> StageInventory:
    """A stage's inventory with its entries in a stable order (sorted by identity), on ``target``
    (``None``: this cluster)."""
    ordered = sorted({e.id: e for e in entries}.values(), key=lambda e: entry_id(e))
    return StageInventory(name=name, service_account_name=service_account, entries=ordered, target=target)


def by_stage(inventories: Iterable[StageInventory]) -> dict[str, StageInventory]:
    return {inv.name: inv for inv in inventories}


def ordered(inventories: Mapping[str, StageInventory]) -> list[StageInventory]:
    """As status lists them: by stage name."""
    return [inventories[name] for name in sorted(inventories)]


def duplicates(rendered: Mapping[str, Iterable[ObjectId]]) -> dict[ObjectId, list[str]]:
    """Objects rendered by more than one stage, with the stages (an InvalidSpec)."""
    owners: dict[ObjectId, list[str]] = {}
    for stage, ids in rendered.items():
        for oid in set(ids):
            owners.setdefault(oid, []).append(stage)
    return {oid: sorted(stages) for oid, stages in owners.items() if len(stages) > 1}


def merged(old: StageInventory | None, new: StageInventory) -> StageInventory:
    """Old and new entries together: written before prune so nothing is ever forgotten."""
    entries = by_id(old)
    entries.update(by_id(new))
    return stage_inventory(new.name, new.service_account_name, entries.values(), target=new.target)


@dataclass(frozen=True)
class Stale:
    stage: str
    service_account: str | None
    entry: InventoryEntry

    @property
    def id(self) -> ObjectId:
        return entry_id(self.entry)


def stale(*, old: Mapping[str, StageInventory], new: Mapping[str, StageInventory],
          prune_disabled: Iterable[str] = ()) -> list[Stale]:
    """What a complete pass may delete: owned before, rendered by no stage now.

    Stages in ``prune_disabled`` keep their objects (they are dropped from the
    inventory but not deleted).  Removed stages (in ``old`` only) are included.
    """
    kept = {oid for inv in new.values() for oid in by_id(inv)}
    disabled = set(prune_disabled)
    result: list[Stale] = []
    for name, inv in old.items():
        if name in disabled:
            continue
        for oid, item in by_id(inv).items():
            if oid not in kept:
                result.append(Stale(stage=name, service_account=inv.service_account_name, entry=item))
    return sorted(result, key=lambda s: (s.stage, s.id))


def with_kept(inventories: Mapping[str, StageInventory], kept: Iterable[Stale]) -> dict[str, StageInventory]:
    """``inventories`` plus objects that could not be pruned: still tracked, so a later pass
    tries again and nothing is ever silently orphaned."""
    result = dict(inventories)
    for item in kept:
        holder = result.get(item.stage) or StageInventory(name=item.stage,
                                                           service_account_name=item.service_account)
        result[item.stage] = stage_inventory(holder.name, holder.service_account_name,
                                             [*holder.entries, item.entry], target=holder.target)
    return result


def left_behind(inventories: Iterable[StageInventory]) -> str:
    """What a forced teardown leaves: counts per kind and namespace (``ConfigMap in shop: 2``).

    Only kinds and namespaces, which the tenant's own manifests named: the message goes into
    an Event the tenant can read, and names no object of anyone else."""
    counts: dict[tuple[str, str], int] = {}
    for inv in inventories:
        for item in inv.entries:
            oid = entry_id(item)
            kind = f"{oid.kind}.{oid.group}" if oid.group else oid.kind
            counts[(kind, oid.namespace)] = counts.get((kind, oid.namespace), 0) + 1
    parts = [f"{kind} in {namespace}: {n}" if namespace else f"{kind} (cluster-scoped): {n}"
             for (kind, namespace), n in sorted(counts.items())]
    return ", ".join(parts)


def split_by_target(inventories: Mapping[str, StageInventory], moving: PreviousTargets | None, *, target: str,
                    now: str) -> tuple[dict[str, StageInventory], PreviousTargets | None]:
    """The inventories on ``target`` (the cluster applied to now), and what a move left on previous
    targets (``moving``: what status kept of a move in flight; a new one begins ``now``).  A previous
    target that is current again is no longer one: its inventory is the stage's own again."""
    current: dict[str, StageInventory] = {}
    pending: dict[tuple[str, str], StageInventory] = {}

    def leave(inv: StageInventory) -> None:
        key = (inv.name, inv.target_id)
        pending[key] = merged(pending[key], inv) if key in pending else inv

    for name, inv in inventories.items():
        if inv.target_id == target:
            current[name] = inv
        else:
            leave(inv)
    for inv in moving.inventory if moving is not None else []:
        if inv.target_id != target:
            leave(inv)
        else:
            current[inv.name] = merged(inv, current[inv.name]) if inv.name in current else inv
    left = [pending[key] for key in sorted(pending) if pending[key].entries]
    if not left:
        return current, None
    if moving is None:
        return current, PreviousTargets(since=now, inventory=left)
    return current, moving.model_copy(update={"inventory": left})
