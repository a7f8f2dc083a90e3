"""Label shards' hand-off records on the real apiserver (stageset/controller/handoff.py): the losing
shard records the release in a Lease, the gaining shard waits for it, and deletes it once the
hand-off is complete — only the version it read: a record rewritten in between is kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.controller.handoff import RELEASED_BY, RELEASED_UID, RELEASED_VERSION, ShardHandoff, record_name
from stageset.controller.keys import ObjectKey
from stageset.controller.kinds import STAGESETS
from stageset.controller.metrics import Metrics
from stageset.controller.result import Result
from stageset.controller.setup import Event
from stageset.controller.sharding import SHARD_LABEL, LabelSelector
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject
from tests.kube.interleave import Interleaving

pytestmark = pytest.mark.apiserver


class Rewriting:
    """Once ``armed``, the next read of ``path`` through :attr:`client` is followed by someone else's
    write to it (a newer release recorded), before anything else that client sends."""

    def __init__(self, admin: KubeClient, *, path: str):
        self._admin = admin
        self._path = path
        self.armed = False
        self.client = Interleaving(admin, path=path, verb="DELETE", after_read=self._rewrite)

    def _rewrite(self, _: int, answer: dict[str, Any]) -> None:
        if self.armed:
            self.armed = False
            meta = dict(answer["metadata"])
            self._admin.request("PUT", self._path, body={**answer, "metadata": {
                **meta, "annotations": {**meta["annotations"], "rewritten": "yes"}}})


def stageset(namespace: str, *, shard: str | None) -> KubeObject:
    """A StageSet some controller reconciled before (it has status), labelled for ``shard``."""
    return {"apiVersion": STAGESETS.api_version, "kind": STAGESETS.kind,
            "metadata": {"name": "mover", "namespace": namespace, "uid": "uid-1", "resourceVersion": "100",
                         "labels": {SHARD_LABEL: shard} if shard else {}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded"}]}}


@pytest.fixture
def shards(admin: KubeClient) -> Iterator[Callable[[KubeClient, str, str], ShardHandoff]]:
    made: list[tuple[ShardHandoff, threading.Event]] = []

    def make(client: KubeClient, namespace: str, selector: str) -> ShardHandoff:
        stop = threading.Event()
        handoff = ShardHandoff(client=client, selector=LabelSelector.parse(selector), namespace=namespace,
                               timeout=60.0, metrics=Metrics(), synced=lambda: True, stop=stop)
        made.append((handoff, stop))
        return handoff

    yield make
    for handoff, stop in made:
        stop.set()
        handoff.close()


def exists(admin: KubeClient, path: str) -> KubeObject | None:
    try:
        return admin.get(path)
    except ApiError as error:
        if error.not_found:
            return None
        raise


def wait_for_record(admin: KubeClient, path: str) -> KubeObject:
    deadline = time.monotonic() + 20
    while (found := exists(admin, path)) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"no hand-off record at {path}")
        time.sleep(0.05)
    return found


def move(*, gaining: ShardHandoff, losing: ShardHandoff) -> ObjectKey:
    """The StageSet leaves ``losing`` (which records the release) and arrives on ``gaining``."""
    key = ObjectKey(kind=STAGESETS.kind, namespace="tenant", name="mover")
    moved = stageset("tenant", shard="shard1")
    gaining.observe(key, Event.ADDED, moved, known=False)
    losing.observe(key, Event.DELETED, moved, known=True)
    return key


def test_the_gaining_shard_deletes_the_record_once_it_saw_the_release(
    admin: KubeClient, make_namespace: Callable[..., str],
    shards: Callable[[KubeClient, str, str], ShardHandoff],
) -> None:
    namespace = make_namespace("handoff")
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{record_name('tenant', 'mover')}"
    losing = shards(admin, namespace, f"!{SHARD_LABEL}")
    gaining = shards(admin, namespace, f"{SHARD_LABEL}=shard1")
    reconciled: list[KubeObject] = []

    def reconcile(obj: KubeObject) -> Result:
        reconciled.append(obj)
        return Result()

    key = move(gaining=gaining, losing=losing)
    annotations = wait_for_record(admin, path)["metadata"]["annotations"]
    assert annotations[RELEASED_UID] == "uid-1"
    assert annotations[RELEASED_VERSION] == "100"
    assert annotations[RELEASED_BY]
    assert gaining.run(key, stageset("tenant", shard="shard1"), reconcile) == Result()
    assert len(reconciled) == 1, "released: the gaining shard reconciles"
    assert exists(admin, path) is None, "the hand-off is complete: its record is gone"


def test_a_record_rewritten_since_it_was_read_is_kept(
    admin: KubeClient, make_namespace: Callable[..., str],
    shards: Callable[[KubeClient, str, str], ShardHandoff],
) -> None:
    namespace = make_namespace("handoff")
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{record_name('tenant', 'mover')}"
    rewriting = Rewriting(admin, path=path)
    losing = shards(admin, namespace, f"!{SHARD_LABEL}")
    gaining = shards(rewriting.client, namespace, f"{SHARD_LABEL}=shard1")
    key = move(gaining=gaining, losing=losing)
    wait_for_record(admin, path)
    rewriting.armed = True
    gaining.run(key, stageset("tenant", shard="shard1"), lambda _: Result())
    deletes = rewriting.client.answers
    assert deletes == [409], "the delete named the version read, and the apiserver refused it"
    kept = exists(admin, path)
    assert kept is not None
    assert kept["metadata"]["annotations"]["rewritten"] == "yes"
