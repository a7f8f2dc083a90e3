"""Whether another StageSet still holds an object: the controller's answer to the engine's :class:`Claims`.

A stage that renders an object whose owner labels name another StageSet asks this (through
:mod:`stageset.apply.claims`) before it writes anything.  That StageSet is **live** for the object
— and the stage fails with ``OwnershipConflict`` — when:

- it exists on this cluster (one being deleted counts: its teardown still deletes, or releases,
  what it holds), and
- it lists the object **on the cluster being written** (the stage's target, by cluster id: two
  StageSets may each own a ``shop/web`` ConfigMap on two clusters): in ``status.inventory`` (any
  stage applied there; namespace, name, group and kind) or in ``status.previousTargets`` (a move
  that still has to clean that cluster up) — the controller's own record, which no tenant writes;
- or, only while its status is **genuinely lost** (no condition, no observed generation: restored
  from a backup without status, or created and not reconciled yet), its durable record
  (:mod:`stageset.apply.record`) covers the object's kind in the object's namespace on that cluster
  (or a move's previous record does) — the record grows before anything is applied, so a StageSet
  about to write the object already holds it.  A record from before targets were recorded names no
  cluster and holds on every one.

The durable record is an annotation on the holder's own object: its tenant can write it.  So a
**record-only claim** is a hint that may hold an object back for a while, never for good (the
platform's boundary rests on what the controller wrote): it never counts for a suspended StageSet
(it applies nothing) nor for one whose status shows it never applied anything (a status with
conditions and no inventory), and it lapses :data:`RECORD_CLAIM_WINDOW` after the holder was created
(a restore creates it anew), by when its own first pass has long rebuilt its inventory from the
cluster.  While it holds, the conflict says so and until when (:attr:`Claim.until`).

Owner labels name the holder, and anyone who may write the object may point them anywhere.  So a
holder never takes an object from a StageSet whose own inventory lists it when the holder came into
existence after the object did (creation times are the apiserver's): it cannot have created it,
only been pointed at it — by a rebuild of a lost status that trusted the labels, or by a forged
record (:func:`came_after`).

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

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from stageset.api import API_VERSION, THIS_CLUSTER, format_time, parse_time
from stageset.apply.claims import NO_EVIDENCE, Claim, Evidence
from stageset.apply.inventory import ObjectId
from stageset.apply.record import parse
from stageset.controller.stageset.handover import Handover
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

UNREADABLE_HOLDER = "another StageSet (in a namespace this StageSet's identity may not read)"
RECORD_CLAIM_WINDOW = datetime.timedelta(minutes=10)
"""How long after its creation a StageSet whose status is lost holds objects by its durable record
alone (its first pass rebuilds its inventory from the cluster well within it)."""


def stageset_path(namespace: str, name: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/stagesets/{name}"


def _target_of(inventory: KubeObject) -> str:
    """The cluster id a stage inventory (as read, JSON) names: absent, this cluster."""
    return str((inventory.get("target") or {}).get("id") or THIS_CLUSTER)


@dataclass(frozen=True)
class Listing:
    """Whether a holder lists an object, and for a record-only claim until when it may."""

    listed: bool
    until: datetime.datetime | None = None
    """A record-only claim lapses then (``None``: the controller's own inventory lists it)."""


def record_claim_until(holder: KubeObject) -> datetime.datetime | None:
    """Until when ``holder``'s durable record alone may hold objects: ``None`` when it may not at all
    (suspended; its status shows it never applied anything), else its creation plus the window
    (:data:`datetime.datetime.max` when it carries no creation time, as only a test's object does)."""
    spec = holder.get("spec") or {}
    if spec.get("suspend") is True:
        return None
    status = holder.get("status") or {}
    if status.get("conditions") or status.get("observedGeneration"):
        return None  # reconciled, and no inventory: it never applied anything (not lost)
    created = parse_time(str((holder.get("metadata") or {}).get("creationTimestamp") or ""))
    return datetime.datetime.max.replace(tzinfo=datetime.UTC) if created is None \
        else created + RECORD_CLAIM_WINDOW


def listing(holder: KubeObject, oid: ObjectId, *, target: str,
            now: datetime.datetime | None = None) -> Listing:
    """Does the StageSet ``holder`` (as read) list ``oid`` on the cluster ``target``: its inventories
    there (current, and a move's previous ones), else — within the rules above — its record?  Pure."""
    status = holder.get("status") or {}
    inventory = status.get("inventory") or []
    previous = (status.get("previousTargets") or {}).get("inventory") or []
    if inventory or previous:
        encoded = oid.encode()
        return Listing(any(entry.get("id") == encoded for stage in (*inventory, *previous)
                           if _target_of(stage) == target for entry in stage.get("entries") or []))
    until = record_claim_until(holder)
    if until is None or (now is not None and now >= until):
        return Listing(False)
    record = parse(holder)
    stages = [*record.stages.values(), *(stage for _, stage in record.previous)]
    for stage in stages:
        if not record.targetless and stage.target != target:
            continue
        for kind, namespaces in stage.kinds.items():
            if kind.kind == oid.kind and kind.api_version.rpartition("/")[0] == oid.group \
                    and oid.namespace in namespaces:
                return Listing(True, until)
    return Listing(False)


def came_after(holder: KubeObject, evidence: Evidence) -> bool:
    """Does the claimant's own inventory list the object, and the holder exist only since the object
    was created or later (so its claim rests on labels alone; creation times have a one-second
    grain: a holder created in the same second is taken to have come after)?  Pure."""
    if not evidence.listed:
        return False
    born = parse_time(str((holder.get("metadata") or {}).get("creationTimestamp") or ""))
    created = parse_time(evidence.created)
    return born is not None and created is not None and born >= created


def lists(holder: KubeObject, oid: ObjectId, *, target: str, now: datetime.datetime | None = None) -> bool:
    """:func:`listing`, as a yes or no."""
    return listing(holder, oid, target=target, now=now).listed


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
    now: datetime.datetime | None = None
    """When the stage writes (a record-only claim lapses after its window; ``None``: never, tests)."""
    _read: dict[tuple[str, str], KubeObject | None] = field(default_factory=dict)
    _named: dict[tuple[str, str], str] = field(default_factory=dict)

    def claim(self, *, holder: tuple[str, str], oid: ObjectId,
              evidence: Evidence = NO_EVIDENCE) -> Claim | None:
        if holder == self.ours:
            return None
        if self.handover is not None and self.handover.takes_from(holder):
            return None  # taken over: recorded on the holder before it is written (adopting)
        if holder not in self._read:
            self._read[holder] = self._fetch(holder)
        found = self._read[holder]
        if found is None:
            return Claim(self._name(holder))
        seen = listing(found, oid, target=self.target, now=self.now)
        if not seen.listed:
            return None
        if came_after(found, evidence):
            log.warning("StageSet %s/%s: %s is labelled for StageSet %s/%s, created after the object while "
                        "this StageSet's inventory lists it: the labels are not taken as a claim",
                        *self.ours, oid.describe(), *holder)
            return None
        until = None if seen.until is None or seen.until.year >= 9999 else format_time(seen.until)
        return Claim(self._name(holder), until=until)

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
