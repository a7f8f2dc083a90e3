"""Leaving a ``prune: false`` stage's objects behind when its StageSet is deleted (as the reference does).

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
from dataclasses import dataclass, field

from stageset.api import InventoryEntry, StageInventory
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId, by_id, entry_id
from stageset.apply.ownership import FIELD_MANAGER, LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE, owned_by
from stageset.apply.prune import Owner, entry_path
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
