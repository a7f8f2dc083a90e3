"""``spec.supersedes``, at the start of a pass: what a successor may take over, and what a predecessor let go.

Two sides of one hand-over (the record: :mod:`stageset.apply.handover`; the rules:
:mod:`~stageset.controller.stageset.succession`):

- :meth:`Supersedes.taking` — a StageSet naming predecessors: each is read **as the StageSet's
  identity** (``spec.serviceAccountName``: an object its spec names, read as the tenant, like
  ``dependsOn``), and that identity is asked whether it may ``patch`` it — one
  SelfSubjectAccessReview made as that identity, naming the StageSet.  A successor may take over
  only what its ServiceAccount could take over by hand: refused (``SupersedeDenied``), nothing of
  the pass is applied and the predecessor keeps everything.  Allowed, the pass gets a
  :class:`~stageset.controller.stageset.handover.Handover` (the objects its stages meet that the
  predecessor holds are taken over in place) and the predecessor's action ledgers (its stages'
  ``status.stages[].actions``, as read), so actions it ran for the revision do not run again.
  A StageSet does not take from the one that took from it while that hand-over stands
  (:func:`stageset.apply.handover.refrains`).  Why an access review and not a dry-run patch: it asks
  RBAC exactly "may it patch this StageSet" (``resourceNames`` grants included) without touching the
  predecessor — no admission webhook runs on it, nothing of it is returned to the tenant, and a
  predecessor being deleted answers the same; asking needs no right (``system:basic-user``).
- :meth:`Supersedes.letting` — a StageSet whose own record says it handed objects over: each
  successor named there is read **as the controller** (its ClusterRole reads StageSets) to see
  whether the entry is still in force (:func:`stageset.apply.handover.in_force`); the objects of the
  entries in force are what this StageSet no longer applies, lists, prunes or tears down.  A
  successor that cannot be read keeps its entry in force (what cannot be judged is never taken back).

``--no-cross-namespace-refs`` does not refuse a predecessor in another namespace: crossing namespaces
is the point of a hand-over, and the ``patch`` right on the predecessor is what gates it.

Cost: a StageSet that names no predecessor and carries no hand-over record makes no request here.
A successor: one read and one access review per predecessor that still exists, per pass (one that is
gone costs the read).  A predecessor: one read per successor in its record, per pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from stageset.api import StageSet
from stageset.api.actions import ActionLedger
from stageset.api.vocabulary import EventReason
from stageset.apply.access import SELF_SUBJECT_ACCESS_REVIEWS
from stageset.apply.handover import (
    Entry,
    HandOver,
    Ref,
    Seen,
    Unreadable,
    handed,
    in_force,
    parse,
    refrains,
)
from stageset.apply.inventory import ObjectId
from stageset.controller.events import EventRecorder, normal
from stageset.controller.identity import IdentityPolicy
from stageset.controller.stageset import succession
from stageset.controller.stageset.handover import Handover, stageset_path
from stageset.kube.client import ApiError, ClientPool, KubeClient
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Taking:
    """What a successor's pass starts with."""

    handover: Handover | None = None
    """The predecessors it takes over from (``None``: none)."""
    refusal: succession.Refusal | None = None
    """Why it may not (then nothing of the pass is applied)."""
    ledgers: Mapping[str, tuple[ActionLedger | None, ...]] = field(default_factory=dict)
    """Per stage name: the predecessors' ledgers of a stage of that name (as read)."""


@dataclass(frozen=True)
class Letting:
    """What a StageSet handed over (the entries of its own record in force), and what no longer holds."""

    kept: tuple[Entry, ...] = ()
    void: tuple[Entry, ...] = ()
    record: HandOver = field(default_factory=HandOver)

    @property
    def gone(self) -> dict[str, frozenset[ObjectId]]:
        """The objects handed over, per cluster (target id)."""
        return handed(self.kept)


NOTHING = Letting()


def _ledgers(obj: KubeObject) -> dict[str, ActionLedger | None]:
    found: dict[str, ActionLedger | None] = {}
    for stage in (obj.get("status") or {}).get("stages") or []:
        raw = stage.get("actions") if isinstance(stage, dict) else None
        try:
            found[str(stage.get("name"))] = ActionLedger.model_validate(raw) if raw else None
        except ValidationError:
            found[str(stage.get("name"))] = None
    return found


def may_patch(client: KubeClient, ref: Ref) -> bool:
    """One SelfSubjectAccessReview as ``client``'s identity: may it patch StageSet ``ref``?"""
    try:
        answer = client.request("POST", SELF_SUBJECT_ACCESS_REVIEWS, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"group": "stages.metio.wtf", "resource": "stagesets",
                                            "verb": "patch", "namespace": ref[0], "name": ref[1]}}})
    except ApiError:
        return False
    status = answer.get("status") or {}
    return bool(status.get("allowed")) and not status.get("denied")


class Supersedes:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, events: EventRecorder):
        self._clients = clients
        self._identities = identities
        self._events = events

    # -- a successor --------------------------------------------------------------------------

    def taking(self, stageset: StageSet, *, obj: KubeObject, target: str, now: str) -> Taking:
        """Which predecessors this pass takes over from, or why it may not (raises :class:`StageError`
        when the StageSet has no identity to ask with)."""
        refs = stageset.spec.supersedes
        if not refs:
            return Taking()
        namespace, name = str(stageset.metadata["namespace"]), str(stageset.metadata["name"])
        ours = (namespace, name)
        own = parse(obj)
        generation = int((obj.get("metadata") or {}).get("generation") or 0)
        identity = self._identities.for_stageset(stageset, what="reading spec.supersedes")
        client = self._clients.client(identity)
        who = identity.describe()
        predecessors: dict[Ref, str] = {}
        ledgers: dict[str, list[ActionLedger | None]] = {}
        for index, item in enumerate(refs):
            ref = item.key(namespace)
            seen, found = self._read(client, ref) if ref != ours else (succession.Reading.GONE, None)
            if found is not None and refrains(own, predecessor=ref, predecessor_uid=_uid(found),
                                               generation=generation):
                continue  # it took these objects from us, and our spec has not changed since
            allowed = may_patch(client, ref) if found is not None else None
            refusal = succession.verdict(index=index, ref=ref, ours=ours, seen=seen, may_patch=allowed,
                                         who=who)
            if refusal is not None:
                return Taking(refusal=refusal)
            if found is None:
                continue
            predecessors[ref] = _uid(found)
            for stage, ledger in _ledgers(found).items():
                ledgers.setdefault(stage, []).append(ledger)
        if not predecessors:
            return Taking()
        handover = Handover(controller=self._clients.client(), ours=ours,
                            uid=str((obj.get("metadata") or {}).get("uid") or ""), predecessors=predecessors,
                            target=target, now=now)
        return Taking(handover=handover, ledgers={k: tuple(v) for k, v in ledgers.items()})

    @staticmethod
    def _read(client: KubeClient, ref: Ref) -> tuple[succession.Reading, KubeObject | None]:
        try:
            return succession.Reading.READ, client.get(stageset_path(*ref))
        except ApiError as error:
            if error.not_found:
                return succession.Reading.GONE, None
            if error.status in (401, 403):
                return succession.Reading.UNREADABLE, None
            raise

    def told(self, obj: KubeObject, handover: Handover | None, *, failed: set[str]) -> None:
        """A ``TakenOver`` event per stage (not ``failed``) and predecessor it took objects from."""
        if handover is None:
            return
        for (stage, ref), objects in sorted(handover.taken().items()):
            if stage in failed or not objects:
                continue
            message = succession.taken(stage=stage, ref=ref, objects=objects)
            self._events.emit(normal(obj, EventReason.TAKEN_OVER, message, action="Supersede"))

    # -- a predecessor ------------------------------------------------------------------------

    def letting(self, obj: KubeObject) -> Letting:
        """The entries of this StageSet's own hand-over record in force (``NOTHING`` without a record)."""
        record = parse(obj)
        if not record.entries:
            return NOTHING
        me = Seen.of(obj)
        controller = self._clients.client()
        read: dict[Ref, Seen | Unreadable | None] = {}
        kept: list[Entry] = []
        void: list[Entry] = []
        for entry in record.entries:
            if entry.successor not in read:
                read[entry.successor] = self._successor(controller, entry.successor)
            (kept if in_force(entry, successor=read[entry.successor], predecessor=me) else void).append(entry)
        return Letting(kept=tuple(kept), void=tuple(void), record=record)

    @staticmethod
    def _successor(controller: KubeClient, ref: Ref) -> Seen | Unreadable | None:
        try:
            return Seen.of(controller.get(stageset_path(*ref)))
        except ApiError as error:
            if error.not_found:
                return None
            return Unreadable()

    def handed(self, obj: KubeObject, letting: Letting, *, listed: int) -> None:
        """A ``HandedOver`` event when this pass first lets objects go that status still listed."""
        if listed and letting.kept:
            self._events.emit(normal(obj, EventReason.HANDED_OVER, succession.note(letting.kept),
                                     action="Supersede"))


def _uid(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
