"""Deleting a pruned object while another StageSet adopts it, on the real apiserver: the delete
carries the resourceVersion its ownership check read, so the apiserver refuses it once the object
was written since; the prune then reads again and leaves the adopter's object in place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stageset.api import InventoryEntry
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.apply.prune import DELETE_READS, Deletion, Owner, delete_owned
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import RestMapper
from tests.kube.interleave import Interleaving

pytestmark = pytest.mark.apiserver


def labels_of(namespace: str, name: str) -> dict[str, str]:
    return {LABEL_NAMESPACE: namespace, LABEL_NAME: name, LABEL_STAGE: "app"}


def racing(admin: KubeClient, path: str, write: Callable[[int], dict[str, Any]], *,
           races: int = 1) -> Interleaving:
    """A client whose first ``races`` reads are each followed by someone's write (as the admin),
    before our delete."""
    def race(read: int, _: dict[str, Any]) -> None:
        if read <= races:
            admin.request("PATCH", path, body=write(read), content_type="application/merge-patch+json")
    return Interleaving(admin, path=path, verb="DELETE", after_read=race)


def entry(namespace: str, name: str) -> InventoryEntry:
    return InventoryEntry(id=ObjectId(namespace=namespace, name=name, group="", kind="ConfigMap").encode(),
                          v="v1")


def test_an_object_adopted_between_check_and_delete_is_kept(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    namespace = make_namespace("prune-race")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    admin.request("POST", base, body={"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": "shared", "labels": labels_of(namespace, "old")}})
    applier = StageApplier(mapper=RestMapper(admin))
    owner = Owner(namespace=namespace, name="old")

    # StageSet "new" adopts the object between the ownership check and the delete.
    adopter = labels_of(namespace, "new")
    client = racing(admin, f"{base}/shared", lambda _: {"metadata": {"labels": adopter}})
    assert delete_owned(client=client, applier=applier, item=entry(namespace, "shared"), owner=owner) \
        is Deletion.RELEASED
    assert client.answers == [409], "the delete from the stale check was sent and refused"
    assert client.reads == 2, "refused, the prune read the object again before deciding"
    assert admin.get(f"{base}/shared")["metadata"]["labels"] == adopter, "the adopter's object stays"


def test_an_object_still_ours_is_deleted_and_one_that_keeps_changing_stays_tracked(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    namespace = make_namespace("prune-race")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    for name in ("quiet", "busy"):
        admin.request("POST", base, body={"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": name, "labels": labels_of(namespace, "old")}})
    applier = StageApplier(mapper=RestMapper(admin))
    owner = Owner(namespace=namespace, name="old")

    assert delete_owned(client=admin, applier=applier, item=entry(namespace, "quiet"), owner=owner) \
        is Deletion.DELETING
    with pytest.raises(ApiError, match="not found"):
        admin.get(f"{base}/quiet")

    # Written after every read, yet still ours each time: never deleted blindly, kept for later.
    busy = racing(admin, f"{base}/busy", lambda read: {"data": {"touched": str(read)}}, races=99)
    assert delete_owned(client=busy, applier=applier, item=entry(namespace, "busy"), owner=owner) \
        is Deletion.FAILED
    assert busy.answers == [409] * DELETE_READS
    assert admin.get(f"{base}/busy")["data"] == {"touched": str(DELETE_READS)}
