"""Label shards in process: two managers on one fake cluster, each seeing only its selector's objects.

The fake selects lists and watches as the apiserver does (an object relabelled away is ``DELETED``
on the old shard's watch, ``ADDED`` on the new one's); the real apiserver, the chart's RBAC and the
audit log are ``tests/e2e/test_sharding.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from stageset.controller.handoff import record_name
from stageset.controller.manager import Manager
from stageset.controller.settings import ControllerSettings
from stageset.controller.sharding import SHARD_LABEL, LabelSelector
from tests.inprocess.conftest import NS, SA, TENANT, URL, World, configmap, stageset_path
from tests.inprocess.test_manager import eventually, running  # noqa: F401 - the fixture

MAIN = LabelSelector.parse(f"!{SHARD_LABEL}")
SHARD1 = LabelSelector.parse(f"{SHARD_LABEL}=shard1")


@pytest.fixture
def shards(world: World, running: Callable[..., Manager]) -> tuple[Manager, Manager]:  # noqa: F811
    world.sources.commit(URL, {"app/cm.json": configmap("one"), "two/cm.json": configmap("two")})
    for name, labels in (("app", {}), ("app-shard1", {SHARD_LABEL: "shard1"})):
        world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                           "metadata": {"name": name, "namespace": NS, "labels": labels},
                           "spec": {"url": URL}})
    main = running(watch_label_selector=MAIN, shard_keys=("shard1",))
    shard1 = running(watch_label_selector=SHARD1)
    return main, shard1


def labelled(world: World, name: str, stages: list[dict[str, Any]], shard: str | None) -> str:
    """A new StageSet, created with its shard label (so no other shard ever sees it first)."""
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                       "metadata": {"name": name, "namespace": NS,
                                    "labels": {SHARD_LABEL: shard} if shard else {}},
                       "spec": {"serviceAccountName": SA,
                                "stages": [{"sourceRef": {"name": "app"}, **s} for s in stages]}})
    return stageset_path(name)


def relabel(world: World, path: str, shard: str | None) -> None:
    world.pool.client().request("PATCH", path, content_type="application/merge-patch+json",
                                body={"metadata": {"labels": {SHARD_LABEL: shard}}})


def reason(world: World, name: str) -> str:
    ready = world.ready(name)
    return f"{ready['status']}/{ready['reason']}"


def test_each_shard_lists_and_watches_with_its_selector(world: World,
                                                        shards: tuple[Manager, Manager]) -> None:
    labelled(world, "main-set", [{"name": "s", "path": "./app"}], None)
    labelled(world, "shard1-set", [{"name": "s", "path": "./two", "sourceRef": {"name": "app-shard1"}}],
             "shard1")
    eventually(lambda: reason(world, "main-set") == "True/Succeeded", what="main shard's StageSet Ready")
    eventually(lambda: reason(world, "shard1-set") == "True/Succeeded", what="shard1's StageSet Ready")
    watches = [r for r in world.cluster.requests if r.verb == "watch" and "/stages.metio.wtf/" in r.path]
    selectors = {parse_qs(urlsplit(r.path).query).get("labelSelector", [""])[0] for r in watches}
    # Never an unselected watch of our kinds: the apiserver does the selecting.
    assert selectors == {str(MAIN), str(SHARD1), str(MAIN.unserved(("shard1",)))}


def test_a_source_of_another_shard_is_named_as_such(world: World, shards: tuple[Manager, Manager]) -> None:
    labelled(world, "crossing", [{"name": "s", "path": "./app"}], "shard1")  # names the main shard's source
    eventually(lambda: reason(world, "crossing") == "False/SourceNotReady", what="SourceNotReady")
    message = world.ready("crossing")["message"]
    assert "GitRepository shop/app does not match this controller's --watch-label-selector" in message
    assert world.configmap("one") is None


def test_an_unserved_key_is_reported_by_the_main_shard(world: World, shards: tuple[Manager, Manager]) -> None:
    main, _ = shards
    path = labelled(world, "typo", [{"name": "s", "path": "./app"}], "shard-1")
    eventually(lambda: reason(world, "typo") == "False/NoShard", what="NoShard")
    message = world.ready("typo")["message"]
    assert "sharding.fluxcd.io/key='shard-1' names no shard" in message
    assert "(shards: shard1)" in message
    assert world.configmap("one") is None
    assert "shop" not in (world.get("typo")["metadata"].get("finalizers") or [])
    assert 'stageset_unserved_objects{kind="StageSet"} 1.0' in main.metrics.exposition().decode()
    # Fixed: the main shard lets go, and shard1 reconciles it (its source is shard1's).
    world.pool.client().request("PATCH", path, content_type="application/merge-patch+json", body={
        "metadata": {"labels": {SHARD_LABEL: "shard1"}},
        "spec": {"stages": [{"name": "s", "path": "./two", "sourceRef": {"name": "app-shard1"}}]}})
    eventually(lambda: reason(world, "typo") == "True/Succeeded", what="shard1 takes it over")
    assert 'stageset_unserved_objects{kind="StageSet"} 0.0' in main.metrics.exposition().decode()


def test_an_unserved_gitrepository_is_reported_too(world: World, shards: tuple[Manager, Manager]) -> None:
    main, _ = shards
    path = "/apis/stages.metio.wtf/v1/namespaces/shop/gitrepositories/lost"
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "lost", "namespace": NS, "labels": {SHARD_LABEL: "nine"}},
                       "spec": {"url": URL}})

    def reported() -> bool:
        conditions = ((world.cluster.get(path) or {}).get("status") or {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["reason"] == "NoShard" for c in conditions)

    eventually(reported, what="NoShard on the GitRepository")
    assert 'stageset_unserved_objects{kind="GitRepository"} 1.0' in main.metrics.exposition().decode()


def test_relabelling_moves_a_stageset_without_a_teardown(world: World,
                                                          shards: tuple[Manager, Manager]) -> None:
    path = labelled(world, "mover", [{"name": "s", "path": "./app"}], None)
    eventually(lambda: reason(world, "mover") == "True/Succeeded", what="Ready on the main shard")
    uid = world.configmap("one")["metadata"]["uid"]  # type: ignore[index]
    mark = len(world.cluster.requests)
    # The source first: the main shard's StageSet now names a source of shard1, and waits (objects kept).
    relabel(world, "/apis/stages.metio.wtf/v1/namespaces/shop/gitrepositories/app", "shard1")
    eventually(lambda: reason(world, "mover") == "False/SourceNotReady", what="waiting for its source")
    relabel(world, path, "shard1")
    eventually(lambda: reason(world, "mover") == "True/Succeeded", what="Ready on shard1")
    after = world.cluster.requests[mark:]
    assert [r for r in after if r.user == TENANT and r.dry_run], "shard1 did not check the objects"
    # Unchanged in Git: shard1 rewrites nothing the main shard applied, and nothing is deleted.
    assert not [r for r in after if r.verb in ("apply", "delete") and not r.dry_run]
    assert world.configmap("one")["metadata"]["uid"] == uid  # type: ignore[index]
    assert world.cluster.get(stageset_path("mover")) is not None


def test_settings_default_to_no_shards() -> None:
    assert ControllerSettings().watch_label_selector is None
    assert ControllerSettings().shard_keys is None


# -- the hand-off between shards (controller/handoff.py) ------------------------------------------------

HANDOFF_NS = "stageset-system"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{HANDOFF_NS}/leases"


def may_use_leases(world: World) -> None:
    """The controller's Role in the release namespace (the chart's, for leader election)."""
    world.cluster.controller_prefixes = (*(world.cluster.controller_prefixes or ()), LEASES)


def synced(manager: Manager) -> bool:
    return "stageset_caches_synced 1.0" in manager.metrics.exposition().decode()


def handoffs(manager: Manager, outcome: str) -> float:
    line = f'stageset_shard_handoffs_total{{outcome="{outcome}"}} '
    for text in manager.metrics.exposition().decode().splitlines():
        if text.startswith(line):
            return float(text.removeprefix(line))
    return 0.0


def first(requests: list[Any], match: Callable[[Any], bool]) -> int:
    return next((i for i, r in enumerate(requests) if match(r)), len(requests))


def since_relabel(requests: list[Any], path: str) -> list[Any]:
    """The requests after the test's own relabelling patch (the first patch of ``path``)."""
    return requests[first(requests, lambda r: r.verb == "patch" and r.path == path) + 1:]


def test_the_gaining_shard_writes_only_after_the_losing_shard_recorded_its_release(
        world: World, running: Callable[..., Manager]) -> None:  # noqa: F811
    world.sources.commit(URL, {"app/cm.json": configmap("one"), "two/cm.json": configmap("two")})
    for name, labels in (("app", {}), ("app-shard1", {SHARD_LABEL: "shard1"})):
        world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                           "metadata": {"name": name, "namespace": NS, "labels": labels},
                           "spec": {"url": URL}})
    may_use_leases(world)
    running(watch_label_selector=MAIN, shard_handoff_namespace=HANDOFF_NS)
    shard1 = running(watch_label_selector=SHARD1, shard_handoff_namespace=HANDOFF_NS)
    path = labelled(world, "handed", [{"name": "s", "path": "./app"}], None)
    eventually(lambda: reason(world, "handed") == "True/Succeeded", what="Ready on the main shard")
    eventually(lambda: synced(shard1), what="shard1's caches")
    mark = len(world.cluster.requests)
    world.pool.client().request("PATCH", path, content_type="application/merge-patch+json", body={
        "metadata": {"labels": {SHARD_LABEL: "shard1"}},
        "spec": {"stages": [{"name": "s", "path": "./two", "sourceRef": {"name": "app-shard1"}}]}})
    def concluded_by_shard1() -> bool:
        # shard1 applied its revision and wrote the StageSet since the relabel: the ConfigMap alone
        # shows it applied, and the main shard's earlier Ready is still there until it writes.
        after = since_relabel(world.cluster.requests[mark:], path)
        return (world.configmap("two") is not None and reason(world, "handed") == "True/Succeeded"
                and first(after, lambda r: r.write and r.path.startswith(path)) < len(after))

    eventually(concluded_by_shard1, what="shard1 applying its revision and writing the StageSet")
    after = since_relabel(world.cluster.requests[mark:], path)
    record = f"{LEASES}/{record_name(NS, 'handed')}"
    released = first(after, lambda r: r.write and r.path.startswith(LEASES))
    looked = first(after, lambda r: r.verb == "get" and r.path == record)
    written = first(after, lambda r: r.write and r.path.startswith(path))
    # The release was recorded, shard1 read it, and only then wrote the StageSet.
    assert released < len(after)
    assert looked < written < len(after)
    assert released < written
    recorded = next(obj for _, kind, obj in world.cluster.events
                    if kind == "ADDED" and obj["metadata"]["name"] == record_name(NS, "handed"))
    annotations = recorded["metadata"]["annotations"]
    assert annotations["stages.metio.wtf/released-uid"] == world.get("handed")["metadata"]["uid"]
    assert handoffs(shard1, "released") + handoffs(shard1, "waited") == 1
    # The hand-off complete, shard1 deleted the record it read (after reading it, before its first write).
    retired = first(after, lambda r: r.verb == "delete" and r.path == record)
    assert looked < retired < written
    assert world.cluster.get(record) is None


def test_a_shard_that_never_releases_is_waited_for_only_until_the_timeout(
        world: World, running: Callable[..., Manager]) -> None:  # noqa: F811
    """The losing shard crashed (here: never ran): shard1 waits, then goes on; the wait is counted."""
    world.sources.commit(URL, {"two/cm.json": configmap("two")})
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "app-shard1", "namespace": NS, "labels": {SHARD_LABEL: "shard1"}},
                       "spec": {"url": URL}})
    may_use_leases(world)
    shard1 = running(watch_label_selector=SHARD1, shard_handoff_namespace=HANDOFF_NS,
                     shard_handoff_timeout=0.5)
    # Reconciled before by a shard that is gone: it has status.
    path = labelled(world, "orphan", [{"name": "s", "path": "./two", "sourceRef": {"name": "app-shard1"}}],
                    None)
    world.cluster.put({**world.get("orphan"), "status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Succeeded", "message": "applied",
         "lastTransitionTime": "2024-01-01T00:00:00Z", "observedGeneration": 1}]}})
    eventually(lambda: synced(shard1), what="shard1's caches")
    mark = len(world.cluster.requests)
    relabel(world, path, "shard1")
    eventually(lambda: handoffs(shard1, "timeout") == 1, what="the hand-off timing out")
    eventually(lambda: world.configmap("two") is not None, what="shard1 applying after the timeout")
    after = since_relabel(world.cluster.requests[mark:], path)
    record = f"{LEASES}/{record_name(NS, 'orphan')}"
    written = first(after, lambda r: r.write and (r.path.startswith(path) or "/configmaps" in r.path))
    assert len([r for r in after[:written] if r.verb == "get" and r.path == record]) >= 2
    assert handoffs(shard1, "released") + handoffs(shard1, "waited") == 0
    assert not [r for r in after if r.verb == "delete" and r.path == record], "no record: nothing to delete"
