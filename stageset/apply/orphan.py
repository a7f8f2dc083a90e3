"""Leaving a ``prune: false`` stage's objects behind when its StageSet is deleted (as the reference does),
or when the stage no longer renders them (:func:`release_stale`: a ``spec.targetNamespace`` change
leaves the old namespace's copies, a file removed from Git its object).

Instead of deleting them, teardown removes our owner labels from each object that still carries
this StageSet's (a JSON merge patch setting them to null), so nothing of ours claims it any
more and a later StageSet can adopt it by applying it.  An object already gone, or no longer
ours, needs nothing.  One that cannot be read or patched stays in the inventory and is tried
again (teardown's usual give-up rule applies).

Identity: every read and patch goes through the client the caller hands in — the identity that
applied the stage (recorded in its inventory); discovery through the applier's mapper.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stageset.api import InventoryEntry, StageInventory
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId, Stale, by_id, entry_id, stage_inventory, stale
from stageset.apply.ownership import FIELD_MANAGER, LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE, owned_by
from stageset.apply.prune import ClientFor, Owner, entry_path
from stageset.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

RELEASE_PATCH = {"metadata": {"labels": {LABEL_NAME: None, LABEL_NAMESPACE: None, LABEL_STAGE: None}}}


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
            live = client.get(path)
            if not owned_by(live, namespace=owner.namespace, name=owner.name):
                continue  # adopted by someone else already
            client.request("PATCH", path, body=RELEASE_PATCH, content_type="application/merge-patch+json",
                           query={"fieldManager": FIELD_MANAGER})
        except ApiError as error:
            if error.not_found:
                continue
            log.warning("cannot release %s as %s: %s", oid.describe(), client.identity.describe(), error)
            result.remaining.append(item)
            continue
        result.released.append(oid)
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
