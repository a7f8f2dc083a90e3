"""Releasing a ``prune: false`` stage's object while another StageSet adopts it, on the real
apiserver: the release patch carries the resourceVersion it read, so the apiserver refuses it once
the object was written since; the release then reads again and leaves the adopter's labels alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stageset.api import InventoryEntry
from stageset.apply.engine import StageApplier
from stageset.apply.inventory import ObjectId, stage_inventory
from stageset.apply.orphan import Release, release_object, release_patch, release_stage
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.apply.prune import Owner
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import RestMapper
from tests.kube.interleave import Interleaving

pytestmark = pytest.mark.apiserver


def labels_of(namespace: str, name: str, stage: str) -> dict[str, str]:
    return {LABEL_NAMESPACE: namespace, LABEL_NAME: name, LABEL_STAGE: stage}


def adopting(admin: KubeClient, path: str, adopter: Callable[[int], dict[str, str]], *,
             races: int = 1) -> Interleaving:
    """A client whose first ``races`` reads are each followed by another StageSet adopting the object
    (a write as the admin), before our patch: the moment the release could lose its labels."""
    def adopt(read: int, _: dict[str, Any]) -> None:
        if read <= races:
            admin.request("PATCH", path, body={"metadata": {"labels": adopter(read)}},
                          content_type="application/merge-patch+json")
    return Interleaving(admin, path=path, verb="PATCH", after_read=adopt)


def test_a_stale_resource_version_is_refused_and_nothing_is_lost(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    namespace = make_namespace("release")
    path = f"/api/v1/namespaces/{namespace}/configmaps/shared"
    admin.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "labels": labels_of(namespace, "old", "app")},
        "data": {"kept": "yes"}})

    # The apiserver itself: a release patch built from a read that is no longer current is refused.
    read = admin.get(path)
    admin.request("PATCH", path, body={"data": {"touched": "by someone"}},
                  content_type="application/merge-patch+json")
    with pytest.raises(ApiError) as refused:
        admin.request("PATCH", path, body=release_patch(read), content_type="application/merge-patch+json")
    assert refused.value.conflict
    assert admin.get(path)["metadata"]["labels"] == labels_of(namespace, "old", "app")

    # The race: StageSet "new" adopts the object between our read and our patch.
    adopter = labels_of(namespace, "new", "web")
    client = adopting(admin, path, lambda _: adopter)
    assert release_object(client, path, owner=Owner(namespace=namespace, name="old")) is Release.NOT_OURS
    assert client.answers == [409], "the patch from the stale read was sent and refused"
    assert client.reads == 2, "refused, the release read the object again before deciding"
    live = admin.get(path)
    assert live["metadata"]["labels"] == adopter, "the adopter keeps its owner labels"
    assert live["data"] == {"kept": "yes", "touched": "by someone"}


def test_an_object_written_by_no_one_else_is_released_and_one_that_keeps_changing_stays_tracked(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    namespace = make_namespace("release")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    for name in ("quiet", "busy"):
        admin.request("POST", base, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "labels": {**labels_of(namespace, "old", "app"), "team": "shop"}}})
    owner = Owner(namespace=namespace, name="old")

    assert release_object(admin, f"{base}/quiet", owner=owner) is Release.RELEASED
    assert admin.get(f"{base}/quiet")["metadata"]["labels"] == {"team": "shop"}

    # Written after every read, yet still ours each time: never patched blindly, kept for later.
    def still_ours(read: int) -> dict[str, str]:
        return {**labels_of(namespace, "old", "app"), "touched": str(read)}

    busy = adopting(admin, f"{base}/busy", still_ours, races=99)
    entry = InventoryEntry(id=ObjectId(namespace=namespace, name="busy", group="", kind="ConfigMap").encode(),
                           v="v1")
    result = release_stage(inventory=stage_inventory("app", None, [entry]), client=busy,
                           applier=StageApplier(mapper=RestMapper(admin)), owner=owner)
    assert (result.released, result.remaining) == ([], [entry])
    assert busy.answers == [409, 409, 409]
    assert admin.get(f"{base}/busy")["metadata"]["labels"] == {**still_ours(3), "team": "shop"}
