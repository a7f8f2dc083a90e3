"""Deleting what a StageSet applied: prune after a complete pass, teardown of a deleted StageSet.

Identity: every read and delete goes through the client the caller hands in for the
inventory being deleted — the identity that applied those objects (the stage's
ServiceAccount, or the controller in single-tenant mode).  Discovery goes through the
applier's mapper (controller identity, or the remote kubeconfig's).

Every prune rule lives here, for the controller, teardown and the CLI's ``diff`` alike:

- :func:`candidates` — what a complete pass may delete: in the old inventory, rendered by no
  stage now, not in a ``prune: false`` stage (:func:`unpruned_stages`);
- :func:`deletable` — an object is deleted only while it still carries this StageSet's owner
  labels and has not opted out (:mod:`stageset.apply.ownership`), and only at the version that
  check read (a delete precondition: adopted in between, it is read and decided again);
- delete or orphan: teardown deletes a stage's objects, except a ``prune: false`` stage's,
  which it releases instead (:func:`unpruned_stages`; the release is
  :mod:`stageset.apply.orphan`);
- :func:`entry_path` — the one API path of an inventoried object.

*When* prune runs is the pass plan's verdict (every stage Ready, the inventory complete:
:func:`stageset.controller.stageset.plan.verdict`).  An object that cannot be read or
deleted is reported :attr:`Deletion.FAILED`, so the caller keeps it tracked and tries
again — never silently orphaned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from stageset.api import InventoryEntry, StageInventory, StageSet
from stageset.apply.changeset import Action, Change, ChangeSet
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import Stale, by_id, entry_id, stale
from stageset.apply.ownership import owned_by, prune_disabled
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)


DELETE_READS = 3
"""Reads (each followed by a conditional delete) before an object that keeps changing is left for
the next pass."""


class Deletion(StrEnum):
    """What became of one inventoried object."""

    GONE = "Gone"
    """Not there (or its kind is gone): stop tracking it."""
    RELEASED = "Released"
    """Adopted (owner labels removed) or opted out: never deleted; stop tracking it."""
    DELETING = "Deleting"
    """Deleted now, or already being deleted (finalizers pending)."""
    FAILED = "Failed"
    """Could not be read or deleted: keep tracking it and try again."""


@dataclass(frozen=True)
class Owner:
    """The StageSet whose owner labels an object must carry to be deleted."""

    namespace: str
    name: str


def unpruned_stages(stageset: StageSet) -> list[str]:
    """Stages with ``prune: false``: nothing of theirs is ever deleted — prune drops their
    objects from the inventory, teardown releases them (owner labels removed)."""
    return [s.name for s in stageset.spec.stages if not s.prune]


def candidates(*, old: Mapping[str, StageInventory], new: Mapping[str, StageInventory], stageset: StageSet
               ) -> list[Stale]:
    """What the prune after a complete pass may delete: inventoried before (``old``), rendered
    by no stage now (``new``), outside ``prune: false`` stages."""
    return stale(old=old, new=new, prune_disabled=unpruned_stages(stageset))


def deletable(live: KubeObject, owner: Owner) -> bool:
    """Is the live object still ours to delete: this StageSet's owner labels, and no opt-out?"""
    return owned_by(live, namespace=owner.namespace, name=owner.name) and not prune_disabled(live)


def entry_path(applier: StageApplier, item: InventoryEntry, namespace: str) -> str | None:
    """The API path of an inventoried object (``None``: the cluster no longer serves its kind,
    so the object is gone with it); discovery failures raise :class:`ApiError`."""
    oid = entry_id(item)
    stub = {"apiVersion": item.v, "kind": oid.kind,
            "metadata": {"name": oid.name, "namespace": oid.namespace}}
    resource = applier.resolve(stub, namespace)[1]
    return None if resource is None else resource.object_path(name=oid.name, namespace=oid.namespace or None)


def delete_owned(*, client: KubeClient, applier: StageApplier, item: InventoryEntry, owner: Owner
                 ) -> Deletion:
    """Delete one inventoried object as ``client``'s identity, if it is still ours."""
    oid = entry_id(item)
    try:
        path = entry_path(applier, item, owner.namespace)
    except ApiError:
        return Deletion.FAILED
    if path is None:
        return Deletion.GONE  # the kind itself is gone, and with it the object
    # The delete carries the resourceVersion the ownership check read: an object written since (another
    # StageSet adopting it in that instant) is refused with 409, read again and decided again -- never
    # deleted on a stale check.  An object that keeps changing stays tracked for the next pass.
    for _ in range(DELETE_READS):
        try:
            live = client.get(path)
        except ApiError as error:
            if error.not_found:
                return Deletion.GONE
            log.warning("cannot read %s for deletion as %s: %s", oid.describe(), client.identity.describe(),
                        error)
            return Deletion.FAILED
        if not deletable(live, owner):
            return Deletion.RELEASED
        if live["metadata"].get("deletionTimestamp"):
            return Deletion.DELETING
        try:
            client.delete(path, resource_version=live["metadata"].get("resourceVersion"))
        except ApiError as error:
            if error.not_found:
                return Deletion.GONE
            if error.conflict:
                continue
            log.warning("cannot delete %s as %s: %s", oid.describe(), client.identity.describe(), error)
            return Deletion.FAILED
        return Deletion.DELETING
    log.info("%s kept changing while being deleted as %s; tried again on the next pass", oid.describe(),
             client.identity.describe())
    return Deletion.FAILED


@dataclass
class PruneResult:
    changes: ChangeSet = field(default_factory=ChangeSet)
    kept: list[Stale] = field(default_factory=list)
    """Objects that could not be deleted: still tracked, retried on the next pass."""


# The client for the identity that applied an inventory; ``None`` when that identity may
# no longer be used (applied as the controller, which multi-tenant mode forbids).
ClientFor = Callable[[str | None], KubeClient | None]


def prune(*, stale: Iterable[Stale], client_for: ClientFor, applier: StageApplier, owner: Owner
          ) -> PruneResult:
    """Delete what no stage renders any more (the caller decided the pass is complete)."""
    result = PruneResult()
    for item in stale:
        client = client_for(item.service_account)
        if client is None:
            log.warning("not pruning %s: it was applied as the controller, which is no longer allowed",
                        item.id.describe())
            result.kept.append(item)
            continue
        outcome = delete_owned(client=client, applier=applier, item=item.entry, owner=owner)
        if outcome is Deletion.FAILED:
            result.kept.append(item)
        elif outcome is Deletion.DELETING:
            result.changes.add(Change(id=item.id, action=Action.DELETED))
        else:
            result.changes.add(Change(id=item.id, action=Action.SKIPPED))
    return result


@dataclass(frozen=True)
class TeardownProgress:
    """What one teardown attempt of a stage left."""

    remaining: list[InventoryEntry]
    """Objects still there: being deleted (finalizers pending), or not deletable now."""
    failed: int = 0
    """Of those, how many could not be read or deleted (the cluster or the tenant's rights failed)."""


def teardown_stage(*, inventory: StageInventory, client: KubeClient | None, applier: StageApplier | None,
                   owner: Owner) -> TeardownProgress:
    """Delete one stage's objects as ``client``'s identity.

    Without a client (identity no longer allowed) or an applier (cluster unknown), nothing is
    deleted and everything remains, failed.  A cluster that cannot be reached at all raises
    :class:`~stageset.kube.client.UnreachableError` (the caller stops trying this pass).
    """
    if client is None or applier is None:
        return TeardownProgress(remaining=list(inventory.entries), failed=len(inventory.entries))
    remaining: list[InventoryEntry] = []
    failed = 0
    for item in by_id(inventory).values():
        outcome = delete_owned(client=client, applier=applier, item=item, owner=owner)
        if outcome in (Deletion.GONE, Deletion.RELEASED):
            continue
        remaining.append(item)
        failed += outcome is Deletion.FAILED
    return TeardownProgress(remaining=remaining, failed=failed)
