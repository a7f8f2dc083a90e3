"""Whether another StageSet still holds an object: the controller's answer to the engine's :class:`Claims`.

A stage that renders an object whose owner labels name another StageSet asks this (through
:mod:`stageset.apply.claims`) before it writes anything.  That StageSet is **live** for the object
— and the stage fails with ``OwnershipConflict`` — when:

- it exists on this cluster (one being deleted counts: its teardown still deletes, or releases,
  what it holds), and
- it lists the object **on the cluster being written** (the stage's target, by cluster id: two
  StageSets may each own a ``shop/web`` ConfigMap on two clusters): in ``status.inventory`` (any
  stage applied there; namespace, name, group and kind) or in ``status.previousTargets`` (a move
  that still has to clean that cluster up), or, when its status carries no inventory at all (lost
  in a restore, or not written yet), its durable record (:mod:`stageset.apply.record`) covers the
  object's kind in the object's namespace on that cluster (or a move's previous record does) — the
  record grows before anything is applied, so a StageSet about to write the object already holds
  it.  A record from before targets were recorded names no cluster and holds on every one.

A holder the StageSet names in ``spec.supersedes`` and may take over from this pass (its
:class:`~stageset.controller.stageset.handover.Handover`) holds nothing against it: the object is
taken over in place, and the hand-over is recorded on the holder before it is written
(:meth:`LiveClaims.adopting`).

Anything else lets the stage adopt the object in place: the StageSet is gone (404), or it lists the
object nowhere on that cluster (it stopped rendering it; a ``prune: false`` stage dropped it;
``deletionPolicy: Orphan`` released it, labels and all; it moved away and gave that cluster up
with ``RetargetAbandoned``, leaving the labels).  A StageSet the controller cannot read now holds the object:
what cannot be judged is never written.

Identity: the holder is read as the controller (its role reads StageSets cluster-wide).  Whether the
message may name it is the stage's identity's: a holder in the StageSet's own namespace is named; one
in another namespace only when that identity may read it (a GET as it succeeds), else a fixed text
that names nothing of the other namespace — as refused cross-namespace references are told.

Cost: nothing unless an object's labels name another StageSet; then one read per holder per stage
(this object lives for one stage's apply), and one more as the tenant for a holder elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stageset.api import API_VERSION, THIS_CLUSTER
from stageset.apply.claims import Claim
from stageset.apply.inventory import ObjectId
from stageset.apply.record import parse
from stageset.controller.stageset.handover import Handover
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

UNREADABLE_HOLDER = "another StageSet (in a namespace this StageSet's identity may not read)"


def stageset_path(namespace: str, name: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/stagesets/{name}"


def _target_of(inventory: KubeObject) -> str:
    """The cluster id a stage inventory (as read, JSON) names: absent, this cluster."""
    return str((inventory.get("target") or {}).get("id") or THIS_CLUSTER)


def lists(holder: KubeObject, oid: ObjectId, *, target: str) -> bool:
    """Does the StageSet ``holder`` (as read) list ``oid`` on the cluster ``target``: its inventories
    there (current, and a move's previous ones), else its record?  Pure."""
    status = holder.get("status") or {}
    inventory = status.get("inventory") or []
    if inventory:
        previous = (status.get("previousTargets") or {}).get("inventory") or []
        encoded = oid.encode()
        return any(entry.get("id") == encoded for stage in (*inventory, *previous)
                   if _target_of(stage) == target for entry in stage.get("entries") or [])
    record = parse(holder)
    stages = [*record.stages.values(), *(stage for _, stage in record.previous)]
    for stage in stages:
        if not record.targetless and stage.target != target:
            continue
        for kind, namespaces in stage.kinds.items():
            if kind.kind == oid.kind and kind.api_version.rpartition("/")[0] == oid.group \
                    and oid.namespace in namespaces:
                return True
    return False


@dataclass
class LiveClaims:
    """The claims of live StageSets, judged for one stage of StageSet ``ours`` (see the module)."""

    controller: KubeClient
    """The controller's own client on this cluster (reads the holder)."""
    tenant: KubeClient
    """The stage's identity on this cluster (whether the message may name the holder)."""
    ours: tuple[str, str]
    target: str
    """The cluster the stage writes (its target id): a holder holds only what it lists there."""
    handover: Handover | None = None
    """The predecessors this pass takes over from (``spec.supersedes``; ``None``: it names none)."""
    stage: str = ""
    _read: dict[tuple[str, str], KubeObject | None] = field(default_factory=dict)
    _named: dict[tuple[str, str], str] = field(default_factory=dict)

    def claim(self, *, holder: tuple[str, str], oid: ObjectId) -> Claim | None:
        if holder == self.ours:
            return None
        if self.handover is not None and self.handover.takes_from(holder):
            return None  # taken over: recorded on the holder before it is written (adopting)
        if holder not in self._read:
            self._read[holder] = self._fetch(holder)
        found = self._read[holder]
        if found is not None and not lists(found, oid, target=self.target):
            return None
        return Claim(self._name(holder))

    def adopting(self, adopted: Sequence[tuple[tuple[str, str], ObjectId]]) -> None:
        """Before the first of ``adopted`` is written: record on each predecessor what is taken from it."""
        if self.handover is None:
            return
        taken: dict[tuple[str, str], list[ObjectId]] = {}
        for holder, oid in adopted:
            if self.handover.takes_from(holder):
                taken.setdefault(holder, []).append(oid)
        for holder, oids in sorted(taken.items()):
            self.handover.record(holder, oids, stage=self.stage)

    def _fetch(self, holder: tuple[str, str]) -> KubeObject | None:
        """The holder as the controller reads it: ``{}`` when it is gone (it lists nothing);
        ``None`` when it cannot be read now (it holds everything: what cannot be judged is never
        written)."""
        try:
            return self.controller.get(stageset_path(*holder))
        except ApiError as error:
            if error.not_found:
                return {}  # gone: lists nothing
            return None  # cannot be judged: held

    def _name(self, holder: tuple[str, str]) -> str:
        if holder not in self._named:
            named = f"StageSet {holder[0]}/{holder[1]}"
            if holder[0] != self.ours[0]:
                try:
                    self.tenant.get(stageset_path(*holder))
                except ApiError:
                    named = UNREADABLE_HOLDER
            self._named[holder] = named
        return self._named[holder]
