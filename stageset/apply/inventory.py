"""Inventories: which objects each stage owns, and what a finished pass may prune.  Pure.

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
from dataclasses import dataclass, field
from typing import Any

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
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


def object_id(obj: KubeObject) -> ObjectId:
    """The identity of a manifest (namespace already defaulted by the caller)."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    metadata = obj.get("metadata", {})
    return ObjectId(namespace=str(metadata.get("namespace") or ""), name=str(metadata.get("name")),
                    group=group, kind=str(obj.get("kind")))


def manifest_hash(obj: KubeObject) -> str:
    """A short digest of the manifest as we apply it (tells drift from a new revision)."""
    encoded = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


@dataclass
class Entry:
    id: ObjectId
    version: str
    digest: str | None = None

    def as_status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": self.id.encode(), "v": self.version}
        if self.digest:
            entry["h"] = self.digest
        return entry

    @classmethod
    def from_status(cls, raw: Mapping[str, Any]) -> Entry:
        return cls(id=ObjectId.decode(str(raw["id"])), version=str(raw["v"]), digest=raw.get("h"))


@dataclass
class StageInventory:
    name: str
    service_account: str | None
    entries: dict[ObjectId, Entry] = field(default_factory=dict)

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"name": self.name,
                                  "entries": [self.entries[k].as_status() for k in sorted(self.entries)]}
        if self.service_account:
            status["serviceAccountName"] = self.service_account
        return status

    @classmethod
    def from_status(cls, raw: Mapping[str, Any]) -> StageInventory:
        entries = [Entry.from_status(e) for e in raw.get("entries") or []]
        return cls(name=str(raw["name"]), service_account=raw.get("serviceAccountName"),
                   entries={e.id: e for e in entries})


def load(status: Mapping[str, Any] | None) -> dict[str, StageInventory]:
    return {inv.name: inv for inv in
            (StageInventory.from_status(raw) for raw in (status or {}).get("inventory") or [])}


def dump(inventories: Mapping[str, StageInventory]) -> list[dict[str, Any]]:
    return [inventories[name].as_status() for name in sorted(inventories)]


def duplicates(rendered: Mapping[str, Iterable[ObjectId]]) -> dict[ObjectId, list[str]]:
    """Objects rendered by more than one stage, with the stages (an InvalidSpec)."""
    owners: dict[ObjectId, list[str]] = {}
    for stage, ids in rendered.items():
        for oid in set(ids):
            owners.setdefault(oid, []).append(stage)
    return {oid: sorted(stages) for oid, stages in owners.items() if len(stages) > 1}


def merged(old: StageInventory | None, new: StageInventory) -> StageInventory:
    """Old and new entries together: written before prune so nothing is ever forgotten."""
    entries = dict(old.entries) if old else {}
    entries.update(new.entries)
    return StageInventory(name=new.name, service_account=new.service_account, entries=entries)


@dataclass(frozen=True)
class Stale:
    stage: str
    service_account: str | None
    entry: Entry


def stale(*, old: Mapping[str, StageInventory], new: Mapping[str, StageInventory],
          prune_disabled: Iterable[str] = ()) -> list[Stale]:
    """What a complete pass may delete: owned before, rendered by no stage now.

    Stages in ``prune_disabled`` keep their objects (they are dropped from the
    inventory but not deleted).  Removed stages (in ``old`` only) are included.
    """
    kept = {oid for inv in new.values() for oid in inv.entries}
    disabled = set(prune_disabled)
    result: list[Stale] = []
    for name, inv in old.items():
        if name in disabled:
            continue
        for oid, entry in inv.entries.items():
            if oid not in kept:
                result.append(Stale(stage=name, service_account=inv.service_account, entry=entry))
    return sorted(result, key=lambda s: (s.stage, s.entry.id))
