"""Objects another live StageSet holds: found before a stage's first write, and never written.

An object's owner labels (:mod:`stageset.apply.ownership`) name the StageSet that holds it.  When a
stage renders an object whose labels name *another* StageSet, the engine asks :class:`Claims`
whether that StageSet still holds it (the controller's answer, and what "live" means:
:mod:`stageset.controller.stageset.claims`).  A live holder fails the stage with
``OwnershipConflict`` before anything of the stage is written (a dry-run writes nothing); a holder
that is gone, or no longer lists the object, lets the stage adopt it: the same object is applied
with our labels — same UID, nothing deleted or recreated.

Cost: nothing for a StageSet that never meets another's object.  An object in the inventory is read
before its dry-run anyway; one new to the inventory is read (:func:`read_existing`) only when its
dry-run shows it exists (a create's dry-run carries no ``resourceVersion``); and a stage's one write
without a dry-run (the pilot, :mod:`stageset.apply.write`) is made create-only (:func:`create_only`),
so it can never write an existing object unseen.  ``Claims`` is asked only about objects whose labels
name another StageSet, at most once per holder and stage.

Owner labels are on the object, where anyone who may write it can set them: the claim is judged from
what the controller wrote (the holder's inventory), and with :class:`Evidence` of the claimant's own —
whether its own inventory already lists the object, and when the apiserver created it — so labels
pointed at a StageSet that came into existence after the object, while this StageSet still lists
it, take nothing from it.

A StageSet that names the holder in ``spec.supersedes`` takes the object over instead (issue 46): the
holder's claim does not count for it, and before the first such object is written :meth:`Claims.adopting`
is told what is adopted from whom — the controller records the hand-over on the holder there
(:mod:`stageset.controller.stageset.handover`), so the holder lets go before the labels change.

Identity: reads go through the ``client`` handed in (the stage's identity); :class:`Claims` answers
with whatever identity its implementation documents (the controller's, reading StageSets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from stageset.api import InventoryEntry
from stageset.api.vocabulary import Reason
from stageset.apply.changeset import Action
from stageset.apply.core import AppliedObject, ApplyCore, read_error
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId
from stageset.apply.ownership import StageOwner, holder
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

CREATE_ONLY = "1"
"""A ``resourceVersion`` precondition no stored object meets (etcd's first write is its revision 2):
an apply carrying it creates an absent object, and is refused (409 Conflict) for an existing one —
without changing the managed fields it records."""


@dataclass(frozen=True)
class Evidence:
    """What the claimant knows of an object from records no tenant writes."""

    listed: bool = False
    """The claimant's own inventory (its status: the controller's) lists the object on this target."""
    created: str | None = None
    """The object's ``metadata.creationTimestamp`` (the apiserver's)."""


NO_EVIDENCE = Evidence()


@dataclass(frozen=True)
class Claim:
    """Another StageSet still holds an object."""

    holder: str
    """How messages name that StageSet: ``StageSet <namespace>/<name>``, or a fixed text that names
    nothing when the stage's identity may not read it."""
    until: str | None = None
    """The claim rests on the holder's durable record alone (its status is lost): it lapses then
    (RFC 3339), and the conflict says so."""


class Claims(Protocol):
    """Whether the StageSet an object's owner labels name still holds it."""

    def claim(self, *, holder: tuple[str, str], oid: ObjectId,
              evidence: Evidence = NO_EVIDENCE) -> Claim | None:
        """``holder``'s claim on ``oid``; ``None`` when it no longer holds it (gone, or it no longer
        lists the object, or it is being taken over from): the object may be adopted."""
        ...

    def adopting(self, adopted: Sequence[tuple[tuple[str, str], ObjectId]]) -> None:
        """``adopted`` — objects whose labels name another StageSet that holds them no more, with that
        StageSet — are about to be written: anything that must be recorded first is recorded now
        (raises :class:`StageError` when it cannot be: then none of them is written)."""
        ...


class Unclaimed:
    """No StageSet holds anything: what an engine without a controller behind it assumes (tests)."""

    def claim(self, *, holder: tuple[str, str], oid: ObjectId,
              evidence: Evidence = NO_EVIDENCE) -> Claim | None:
        del holder, oid, evidence
        return None

    def adopting(self, adopted: Sequence[tuple[tuple[str, str], ObjectId]]) -> None:
        del adopted


def create_only(manifest: KubeObject) -> KubeObject:
    """``manifest`` with the :data:`CREATE_ONLY` precondition (the digest is the caller's, unchanged)."""
    return {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": CREATE_ONLY}}


def read_existing(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject],
                  previous: Mapping[ObjectId, InventoryEntry]) -> None:
    """Read the live object of each item new to the inventory that exists (its dry-run carries a
    ``resourceVersion``, or the conflict policy recreates it), so its owner labels can be judged."""
    def exists(item: AppliedObject) -> bool:
        version = ((item.dry_run or {}).get("metadata") or {}).get("resourceVersion")
        return item.action is Action.RECREATED or bool(version)

    def one(item: AppliedObject) -> None:
        try:
            item.live = client.get(item.path)
        except ApiError as error:
            if not error.not_found:
                raise read_error(item, error, client.identity.describe()) from error

    core.each([i for i in items if i.live is None and i.id not in previous and exists(i)], one)


def refuse_claimed(items: list[AppliedObject], *, owner: StageOwner, claims: Claims,
                   previous: Mapping[ObjectId, InventoryEntry] | None = None) -> None:
    """Fail with ``OwnershipConflict`` when another StageSet still holds an object the stage would write
    (``previous``: the stage's own inventory, as the controller wrote it)."""
    held: list[tuple[AppliedObject, Claim]] = []
    adopted: list[tuple[tuple[str, str], ObjectId]] = []
    for item in items:
        found = holder(item.live)
        if item.action is Action.SKIPPED or found is None or found == (owner.namespace, owner.name):
            continue
        created = ((item.live or {}).get("metadata") or {}).get("creationTimestamp")
        evidence = Evidence(listed=item.id in (previous or {}), created=str(created) if created else None)
        claim = claims.claim(holder=found, oid=item.id, evidence=evidence)
        if claim is not None:
            held.append((item, claim))
        else:
            adopted.append((found, item.id))
    if not held:
        if adopted:
            claims.adopting(adopted)
        return
    item, claim = held[0]
    more = f" (and {len(held) - 1} more object(s) held by other StageSets)" if len(held) > 1 else ""
    lapses = f" (by its durable record only, while its status is lost: at the latest until {claim.until})" \
        if claim.until else ""
    raise StageError(Reason.OWNERSHIP_CONFLICT,
                     f"{item.id.describe()} is held by {claim.holder}{lapses}, which still applies it{more}; "
                     "nothing of this stage is written until it lets the object go (deleted with "
                     "deletionPolicy: Orphan, or no longer rendering it): then this StageSet adopts it "
                     "in place")
