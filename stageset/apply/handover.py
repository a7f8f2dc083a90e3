"""The hand-over record on a superseded StageSet: which of its objects another StageSet took over.  Pure.

A StageSet that names another in ``spec.supersedes`` (the successor) takes over, in place, the
objects it renders that the other (the predecessor) holds (:mod:`stageset.controller.stageset.supersedes`).
Before it writes the first of them, it records on the predecessor, in the annotation
:data:`ANNOTATION`, exactly which objects it takes, on which cluster, and who it is (namespace, name
and UID).  The predecessor reads its own annotation (no request) and, while the entry is in force,
lets those objects go: it no longer applies, lists, prunes or tears them down — even in the moment
before the successor has relabelled them, which is why the record is written first.

Rules (each a function here, table-tested):

- :func:`in_force` — an entry holds while its successor exists with the recorded UID (one that was
  deleted and re-created is another StageSet), unless the predecessor has since named that
  successor in its own ``spec.supersedes`` at a newer generation than the entry was written at: the
  explicit, newer intent takes the objects back;
- :func:`refrains` — the other side of that: a StageSet does not take objects from the StageSet that
  took them from it while that hand-over is in force (so two StageSets naming each other do not take
  the objects back and forth: the latest hand-over stands until a spec change says otherwise);
- :func:`released` — a StageSet's inventories without what it handed over (per cluster);
- :meth:`HandOver.grown` — the record with more objects handed to a successor (a successor
  re-created under the same name replaces the old entry).

What a tenant can edit: the annotation is on the predecessor's own object, so whoever may patch that
StageSet may write it.  It only ever narrows what the predecessor does (it lets objects go; nothing
is deleted because of it), which that same right allows anyway (``deletionPolicy: Orphan``, then a
delete) — so a forged entry takes nothing from anyone.  What lets a successor *take* objects is never
this record: it is its own ``spec.supersedes`` and its ServiceAccount's rights on the predecessor.
An unreadable record reads as empty (nothing handed over).

Size: objects are grouped by kind and namespace; a record above :data:`MAX_BYTES` is not written
(the hand-over fails with a message; annotations are bounded at 256 KiB in all).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stageset.api import THIS_CLUSTER, StageInventory
from stageset.apply.inventory import ObjectId, entry_id, stage_inventory
from stageset.kube.types import KubeObject

ANNOTATION = "stages.metio.wtf/handed-over"
FORMAT = 1
MAX_BYTES = 128 * 1024
"""The largest record written (half of what all of an object's annotations may take)."""

Ref = tuple[str, str]
"""A StageSet: ``(namespace, name)``."""


@dataclass(frozen=True)
class Entry:
    """The objects handed over to one successor on one cluster."""

    successor: Ref
    uid: str
    """The successor's UID when it took them (a successor re-created under the same name is another)."""
    generation: int
    """The predecessor's ``metadata.generation`` when the entry was last written."""
    since: str
    """When the hand-over began (RFC 3339)."""
    target: str = THIS_CLUSTER
    """The cluster the objects are on (a target id)."""
    objects: frozenset[ObjectId] = field(default_factory=frozenset)

    def body(self) -> dict[str, Any]:
        grouped: dict[str, dict[str, list[str]]] = {}
        for oid in sorted(self.objects, key=lambda o: (o.group, o.kind, o.namespace, o.name)):
            grouped.setdefault(f"{oid.group}/{oid.kind}", {}).setdefault(oid.namespace, []).append(oid.name)
        encoded: dict[str, Any] = {"ns": self.successor[0], "name": self.successor[1], "uid": self.uid,
                                   "gen": self.generation, "since": self.since, "o": grouped}
        if self.target != THIS_CLUSTER:
            encoded["t"] = self.target
        return encoded

    @classmethod
    def of_body(cls, body: Mapping[str, Any]) -> Entry:
        objects: set[ObjectId] = set()
        for kind, namespaces in (body.get("o") or {}).items():
            group, _, name_of_kind = str(kind).rpartition("/")
            for namespace, names in dict(namespaces).items():
                objects.update(ObjectId(namespace=str(namespace), name=str(name), group=group,
                                        kind=name_of_kind) for name in names)
        return cls(successor=(str(body["ns"]), str(body["name"])), uid=str(body["uid"]),
                   generation=int(body["gen"]), since=str(body["since"]),
                   target=str(body.get("t") or THIS_CLUSTER), objects=frozenset(objects))


@dataclass(frozen=True)
class HandOver:
    """Everything a StageSet handed over, one entry per successor and cluster."""

    entries: tuple[Entry, ...] = ()

    def encode(self) -> str | None:
        """The annotation's value (``None``: nothing handed over, no annotation)."""
        if not self.entries:
            return None
        ordered = sorted(self.entries, key=lambda e: (e.successor, e.target))
        return json.dumps({"v": FORMAT, "to": [e.body() for e in ordered]}, separators=(",", ":"),
                          sort_keys=True)

    def grown(self, *, successor: Ref, uid: str, generation: int, target: str, since: str,
              objects: Iterable[ObjectId]) -> HandOver:
        """This record with ``objects`` handed to ``successor`` on ``target`` too.  An entry for the same
        successor under another UID (deleted and re-created since) is replaced; ``since`` is kept from
        an existing entry."""
        kept: list[Entry] = []
        found: Entry | None = None
        for entry in self.entries:
            if entry.successor == successor and entry.target == target:
                if entry.uid == uid:
                    found = entry
                continue
            kept.append(entry)
        taken = frozenset(objects) | (found.objects if found is not None else frozenset())
        entry = Entry(successor=successor, uid=uid, generation=generation,
                      since=found.since if found is not None else since, target=target, objects=taken)
        return HandOver((*kept, entry))

    def without(self, dropped: Iterable[Entry]) -> HandOver:
        gone = set(dropped)
        return HandOver(tuple(e for e in self.entries if e not in gone))

    def covers(self, *, successor: Ref, uid: str, target: str, objects: Iterable[ObjectId]) -> bool:
        """Are ``objects`` already recorded as handed to ``successor`` (this UID) on ``target``?"""
        wanted = set(objects)
        return any(e.successor == successor and e.uid == uid and e.target == target and wanted <= e.objects
                   for e in self.entries)


def parse(obj: KubeObject | None) -> HandOver:
    """The record on a live StageSet; absent, or unreadable (a format this controller does not know,
    an edit that broke it), it is empty: nothing was handed over."""
    raw = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if not raw:
        return HandOver()
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("v") != FORMAT:
            return HandOver()
        return HandOver(tuple(Entry.of_body(item) for item in body.get("to") or []))
    except (ValueError, TypeError, AttributeError, KeyError):
        return HandOver()


@dataclass(frozen=True)
class Seen:
    """A StageSet as a hand-over rule needs it: who it is, and what its spec names."""

    uid: str
    generation: int
    supersedes: frozenset[Ref]
    """``spec.supersedes``, namespaces defaulted to its own."""

    @classmethod
    def of(cls, obj: KubeObject) -> Seen:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        named = ((obj.get("spec") or {}).get("supersedes") or [])
        return cls(uid=str(meta.get("uid") or ""), generation=int(meta.get("generation") or 0),
                   supersedes=frozenset((str(ref.get("namespace") or namespace), str(ref.get("name") or ""))
                                        for ref in named if isinstance(ref, dict)))


GONE = None
"""A successor that does not exist (read: 404)."""


class Unreadable:
    """A successor that could not be read now."""


UNREADABLE = Unreadable()


def in_force(entry: Entry, *, successor: Seen | Unreadable | None, predecessor: Seen) -> bool:
    """Does ``entry`` (on ``predecessor``) still hold?  While its successor exists with the recorded UID,
    unless the predecessor now names that successor in ``spec.supersedes`` at a newer generation than the
    entry's (it takes the objects back).  A successor that cannot be read now holds (what cannot be
    judged is never taken back); one that is gone (or another under its name) does not."""
    if entry.successor in predecessor.supersedes and predecessor.generation > entry.generation:
        return False
    if isinstance(successor, Unreadable):
        return True
    return successor is not None and successor.uid == entry.uid


def refrains(own: HandOver, *, predecessor: Ref, predecessor_uid: str, generation: int) -> bool:
    """Does a StageSet (its own record ``own``, its generation ``generation``) refrain from taking over from
    ``predecessor``?  Yes while its own record says that very StageSet (by UID) took objects from it and
    its spec has not changed since: the latest hand-over stands."""
    return any(e.successor == predecessor and e.uid == predecessor_uid and generation <= e.generation
               for e in own.entries)


def handed(entries: Iterable[Entry]) -> dict[str, frozenset[ObjectId]]:
    """The objects ``entries`` hand over, per cluster (target id)."""
    found: dict[str, set[ObjectId]] = {}
    for entry in entries:
        found.setdefault(entry.target, set()).update(entry.objects)
    return {target: frozenset(objects) for target, objects in found.items()}


def released(inventories: Mapping[str, StageInventory], gone: Mapping[str, frozenset[ObjectId]]
             ) -> dict[str, StageInventory]:
    """``inventories`` without the objects handed over on each one's cluster (``gone``); a stage left
    with nothing keeps an empty inventory (it still exists)."""
    if not gone:
        return dict(inventories)
    result: dict[str, StageInventory] = {}
    for name, inv in inventories.items():
        away = gone.get(inv.target_id, frozenset())
        if not away:
            result[name] = inv
            continue
        kept = [entry for entry in inv.entries if entry_id(entry) not in away]
        result[name] = inv if len(kept) == len(inv.entries) else \
            stage_inventory(inv.name, inv.service_account_name, kept, target=inv.target)
    return result


def count(entries: Iterable[Entry]) -> int:
    return sum(len(e.objects) for e in entries)
