"""Leaving a ``prune: false`` stage's objects behind when its StageSet is deleted (as the reference does),
or when the stage no longer renders them (:func:`release_stale`: a ``spec.targetNamespace`` change
leaves the old namespace's copies, a file removed from Git its object).

Instead of deleting them, teardown removes our owner labels from each object that still carries
this StageSet's (a JSON merge patch setting them to null), so nothing of ours claims it any
more and a later StageSet can adopt it by applying it.  An object already gone, or no longer
ours, needs nothing.  One that cannot be read or patched stays in the inventory and is tried
again (teardown's usual give-up rule applies).

Invariant: a release removes labels only from the object as it was read and judged ours.  The
patch carries the ``resourceVersion`` it read, so the apiserver refuses it (409 Conflict) when
anyone wrote the object in between — another StageSet adopting it must never lose its fresh
owner labels to our patch.  A refusal is not retried blindly: the object is read again and the
decision taken again on what it is now (adopted meanwhile: left alone).  An object that keeps
changing under us (:data:`RELEASE_READS` reads) stays tracked for the next pass.

Identity: every read and patch goes through the client the caller hands in — the identity that
applied the stage (recorded in its inventory); discovery through the applier's mapper.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from stageset.api import InventoryEntry, StageInventory
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId, Stale, by_id, entry_id, stage_inventory, stale
from stageset.apply.ownership import FIELD_MANAGER, LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE, owned_by
from stageset.apply.prune import ClientFor, Owner, entry_path
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

OWNER_LABELS_REMOVED = {LABEL_NAME: None, LABEL_NAMESPACE: None, LABEL_STAGE: None}
RELEASE_READS = 3
"""Reads of one object per release: each after the first follows a 409 (written since read)."""


class Release(StrEnum):
    """What became of one object a release was asked for."""

    RELEASED = "Released"
    """Our owner labels were removed from the object as read (it stays)."""
    NOT_OURS = "NotOurs"
    """It carries no owner labels of ours (any more): someone else's, left alone."""
    GONE = "Gone"
    """Not there: nothing to release."""
    CONTENDED = "Contended"
    """Written by someone else between every read and our patch: keep tracking it, try later."""


def release_patch(live: KubeObject) -> KubeObject:
    """The merge patch that removes our owner labels from ``live`` — and only from ``live``: it
    carries the ``resourceVersion`` read, so a write since makes the apiserver refuse it."""
    version = str((live.get("metadata") or {}).get("resourceVersion") or "")
    if not version:
        raise ValueError("an object read from the apiserver has a resourceVersion")
    return {"metadata": {"resourceVersion": version, "labels": dict(OWNER_LABELS_REMOVED)}}


def release_object(client: KubeClient, path: str, *, owner: Owner) -> Release:
    """Read the object at ``path``; while it is ``owner``'s, remove the owner labels from what was
    read (as ``client``'s identity).  A 409 means it changed since: read it and decide again.
    Other errors (forbidden, unreachable) reach the caller."""
    for _ in range(RELEASE_READS):
        try:
            live = client.get(path)
        except ApiError as error:
            if error.not_found:
                return Release.GONE
            raise
        if not owned_by(live, namespace=owner.namespace, name=owner.name):
            return Release.NOT_OURS  # adopted by someone else already
        try:
            client.request("PATCH", path, body=release_patch(live), query={"fieldManager": FIELD_MANAGER},
                           content_type="application/merge-patch+json")
        except ApiError as error:
            if error.not_found:
                return Release.GONE
            if error.conflict:
                continue  # written since our read: what is it now?
            raise
        return Release.RELEASED
    return Release.CONTENDED


@dataclass
class Released:
    """What :func:`release_stage` did."""

    released: list[ObjectId] = field(default_factory=list)
    """Objects whose owner labels were removed (left in place)."""
    remaining: list[InventoryEntry] = field(default_factory=list)
    """Objects that could not be read or released: keep tracking them."""


def release_stage(*, inventory: StageInventory, client: KubeClient | None, applier: StageApplier | None,
                  owner: Owner) -> Released:
    """Remove this StageSet's owner labels from the stage's objects, deleting nothing."""
    result = Released()
    if client is None or applier is None:
        result.remaining = list(inventory.entries)
        return result
    for item in by_id(inventory).values():
        oid = entry_id(item)
        try:
            path = entry_path(applier, item, owner.namespace)
        except ApiError:
            result.remaining.append(item)
            continue
        if path is None:
            continue  # the kind is gone, and the object with it
        try:
            outcome = release_object(client, path, owner=owner)
        except ApiError as error:
            log.warning("cannot release %s as %s: %s", oid.describe(), client.identity.describe(), error)
            result.remaining.append(item)
            continue
        if outcome is Release.RELEASED:
            result.released.append(oid)
        elif outcome is Release.CONTENDED:
            log.info("%s kept changing while being released as %s; trying again later", oid.describe(),
                     client.identity.describe())
            result.remaining.append(item)
    return result


def release_stale(*, old: Mapping[str, StageInventory], new: Mapping[str, StageInventory],
                  stages: Iterable[str], client_for: ClientFor, applier: StageApplier, owner: Owner
                  ) -> tuple[list[ObjectId], list[Stale]]:
    """After a complete pass: what ``prune: false`` ``stages`` owned before (``old``) and no stage
    renders now (``new``) is released — owner labels removed, objects kept — as the identity that
    applied it, never left labelled and untracked.  Returns what was released, and what could not
    be (still tracked, so a later pass tries again)."""
    kept = set(stages)
    found = stale(old={n: inv for n, inv in old.items() if n in kept}, new=new)
    released: list[ObjectId] = []
    failed: list[Stale] = []
    for name in sorted({item.stage for item in found}):
        items = [item for item in found if item.stage == name]
        inventory = stage_inventory(name, items[0].service_account, (item.entry for item in items))
        result = release_stage(inventory=inventory, client=client_for(items[0].service_account),
                               applier=applier, owner=owner)
        released.extend(result.released)
        left = {entry_id(entry) for entry in result.remaining}
        failed.extend(item for item in items if item.id in left)
    return released, failed
