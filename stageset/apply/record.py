"""The durable inventory record: where a StageSet's objects can be found if status is lost.  Pure.

``status.inventory`` is the working inventory, but status is what backups leave out (Velero
restores objects without it) and what a re-creation starts without.  So each StageSet also
carries, in its own metadata, a compact record of *where* its objects live — per stage, the
ServiceAccount that applied them and the kinds (API version + kind) with the namespaces
used — in the annotation :data:`ANNOTATION`.  Never the objects themselves: those are found
on the cluster by their owner labels (:mod:`stageset.apply.ownership`), which are the truth,
so the record only changes when a stage starts or stops using a kind or namespace.

Rules:
- the record is grown (with the kinds a stage renders) *before* anything is applied, and
  shrunk to the kinds still in the inventory only *after* a complete prune, so it always
  covers every object that could carry our labels;
- ``rebuild`` marks a rebuild that could not see everything (a list was denied or failed):
  it is tried again on every pass until it completes, and nothing is pruned meanwhile.

Why an annotation and not status, a new kind (the reference's per-stage ``StageInventory``
objects) or labels alone: see docs/concepts.md ("Inventory").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stageset.api import StageInventory
from stageset.apply.inventory import entry_id
from stageset.kube.types import KubeObject

ANNOTATION = "stages.metio.wtf/inventory-record"
# Format version of the annotation's JSON; a change comes with a migration (see parse).
FORMAT = 1


@dataclass(frozen=True, order=True)
class KindRef:
    """A kind as applied: ``apiVersion`` and ``kind``."""

    api_version: str
    kind: str

    def encode(self) -> str:
        separator = "/" if "/" in self.api_version else "//"
        return f"{self.api_version}{separator}{self.kind}"

    @classmethod
    def decode(cls, value: str) -> KindRef:
        if "//" in value:  # core group: "v1//ConfigMap"
            version, _, kind = value.partition("//")
            return cls(version, kind)
        api_version, _, kind = value.rpartition("/")
        return cls(api_version, kind)


@dataclass(frozen=True)
class StageRecord:
    service_account: str | None
    kinds: Mapping[KindRef, frozenset[str]] = field(default_factory=dict)
    """Each kind with the namespaces its objects are in (``""``: cluster-scoped)."""

    def covers(self, other: StageRecord) -> bool:
        return self.service_account == other.service_account and all(
            kind in self.kinds and namespaces <= self.kinds[kind] for kind, namespaces in other.kinds.items())

    def union(self, other: StageRecord) -> StageRecord:
        kinds = {k: frozenset(v) for k, v in self.kinds.items()}
        for kind, namespaces in other.kinds.items():
            kinds[kind] = kinds.get(kind, frozenset()) | namespaces
        return StageRecord(other.service_account, kinds)


@dataclass(frozen=True)
class Record:
    stages: Mapping[str, StageRecord] = field(default_factory=dict)
    rebuild: bool = False
    """A rebuild from the cluster is pending (the last one could not see everything)."""

    def encode(self) -> str:
        body = {"v": FORMAT, "stages": {
            name: {"sa": stage.service_account,
                   "kinds": {kind.encode(): sorted(ns) for kind, ns in sorted(stage.kinds.items())}}
            for name, stage in sorted(self.stages.items())}}
        if self.rebuild:
            body["rebuild"] = True
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    def grown(self, wanted: Mapping[str, StageRecord]) -> Record:
        """This record plus ``wanted`` (what stages are about to apply)."""
        stages = dict(self.stages)
        for name, stage in wanted.items():
            stages[name] = stages[name].union(stage) if name in stages else stage
        return Record(stages, self.rebuild)

    def covers(self, wanted: Mapping[str, StageRecord]) -> bool:
        return all(name in self.stages and self.stages[name].covers(stage) for name, stage in wanted.items())


def parse(obj: KubeObject) -> Record:
    """The record on a live StageSet; an absent or unreadable one is empty (nothing recorded)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION)
    if not raw:
        return Record()
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("v") != FORMAT:
            return Record(rebuild=True)  # a format we do not know: look on the cluster again
        stages = {
            str(name): StageRecord(
                service_account=stage.get("sa") or None,
                kinds={KindRef.decode(str(k)): frozenset(str(n) for n in ns)
                       for k, ns in (stage.get("kinds") or {}).items()})
            for name, stage in (body.get("stages") or {}).items()}
        return Record(stages, bool(body.get("rebuild")))
    except (ValueError, TypeError, AttributeError):
        return Record(rebuild=True)


def of_objects(service_account: str | None, objects: Iterable[tuple[str, KubeObject]]) -> StageRecord:
    """A stage record from ``(namespace, manifest)`` pairs (namespace ``""`` when cluster-scoped)."""
    kinds: dict[KindRef, set[str]] = {}
    for namespace, obj in objects:
        kind = KindRef(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        kinds.setdefault(kind, set()).add(namespace)
    return StageRecord(service_account, {k: frozenset(v) for k, v in kinds.items()})


def of_inventories(inventories: Iterable[StageInventory]) -> Record:
    """The record that covers exactly these inventories (after a complete prune)."""
    stages: dict[str, StageRecord] = {}
    for inv in inventories:
        kinds: dict[KindRef, set[str]] = {}
        for item in inv.entries:
            oid = entry_id(item)
            kinds.setdefault(KindRef(item.v, oid.kind), set()).add(oid.namespace)
        stages[inv.name] = StageRecord(inv.service_account_name, {k: frozenset(v) for k, v in kinds.items()})
    return Record(stages)
