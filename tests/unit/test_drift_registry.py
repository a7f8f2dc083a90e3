"""The drift watches' registry over a recording pool (``stageset/controller/drift/registry.py``):
which watches it holds and shares, as whom, what it releases, what the bound refuses, and which
events queue which StageSet."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from stageset.apply.ownership import FIELD_MANAGER
from stageset.controller.drift.registry import SELECTOR, Applied, DriftWatches, SecretWatch
from stageset.kube.client import LOCAL, ClusterKey, Identity
from stageset.kube.mapping import Resource
from stageset.kube.watch import Handler, Listed
from stageset.kube.watches import Key, WatchPool

CONFIGMAPS = Resource(group="", version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)
DEPLOYMENTS = Resource(group="apps", version="v1", kind="Deployment", plural="deployments", namespaced=True)


@dataclass
class FakeClient:
    identity: Identity
    cluster: ClusterKey = LOCAL


def tenant(namespace: str, name: str = "deployer", cluster: ClusterKey = LOCAL) -> Any:
    return FakeClient(Identity.service_account(namespace=namespace, name=name), cluster)


@dataclass
class Held:
    client: Any
    resource: Resource
    namespace: str | None
    label_selector: str
    field_selector: str
    resource_version: str
    handler: Handler
    listed: Listed | None


@dataclass
class Pool:
    """Held watches, recorded: what was opened (and from where), what released; events are
    delivered by hand."""

    held: dict[Key, Held] = field(default_factory=dict)
    opened: list[Key] = field(default_factory=list)
    released: list[Key] = field(default_factory=list)
    unhealthy: set[Key] = field(default_factory=set)
    drained: list[Key] = field(default_factory=list)

    def hold(
        self,
        holder: Hashable,  # noqa: ARG002 - one holder here
        client: Any,
        resource: Resource,
        namespace: str | None,
        *,
        handler: Handler,
        listed: Listed | None = None,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str = "",
        metadata_only: bool = True,
    ) -> Key:
        assert metadata_only
        key = WatchPool.key(
            client, resource, namespace, label_selector=label_selector, field_selector=field_selector
        )
        assert key not in self.held, "held twice"
        self.held[key] = Held(
            client, resource, namespace, label_selector, field_selector, resource_version, handler, listed
        )
        self.opened.append(key)
        return key

    def release(self, holder: Hashable, key: Key, *, drain: bool = False) -> None:  # noqa: ARG002
        del self.held[key]
        self.released.append(key)
        if drain:
            self.drained.append(key)

    def healthy(self, key: Key) -> bool | None:
        return key not in self.unhealthy

    def send(
        self, namespace: str, resource: Resource, event: str, obj: dict[str, Any], *, user: str = ""
    ) -> None:
        for key, held in list(self.held.items()):
            if held.resource == resource and held.namespace == namespace and (not user or key[1] == user):
                held.handler(event, obj)


def live(
    name: str,
    *,
    namespace: str = "shop",
    rv: str = "10",
    uid: str = "u-a",
    ours: dict[str, Any] | None = None,
    others: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    fields = {"f:data": {"f:k": {}}} if ours is None else ours
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": rv,
            "managedFields": [{"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": fields}, *others],
        }
    }


def applied(name: str, *, resource: Resource = CONFIGMAPS, namespace: str = "shop", **kw: Any) -> Applied:
    return Applied(
        resource=resource, namespace=namespace, name=name, live=live(name, namespace=namespace, **kw)
    )


class Registry:
    def __init__(self, capacity: int = 100, terminating: frozenset[str] = frozenset()) -> None:
        self.pool = Pool()
        self.queued: list[tuple[str, str]] = []
        self.drift = DriftWatches(
            pool=self.pool,
            enqueue=lambda ns, name: self.queued.append((ns, name)),
            capacity=capacity,
            terminating=lambda ns: ns in terminating,
        )

    def pass_(
        self, ref: tuple[str, str], stage: str, client: Any, objects: list[Applied], **settle: Any
    ) -> None:
        self.drift.begin(ref)
        self.drift.applied(ref, stage, client, objects)
        self.drift.settle(ref, stages=settle.pop("stages", [stage]), **settle)


def test_one_watch_per_identity_kind_and_namespace_shared_by_every_stageset_there() -> None:
    r = Registry()
    client = tenant("shop")
    for i in range(50):
        r.pass_(
            ("shop", f"set-{i}"),
            "app",
            client,
            [applied(f"cm-{i}", rv=str(100 + i)), applied(f"web-{i}", resource=DEPLOYMENTS, rv="90")],
        )
    assert len(r.pool.held) == 2 == r.drift.watches()
    [cms] = [h for h in r.pool.held.values() if h.resource == CONFIGMAPS]
    # As the stage's identity, selected by the owner labels, from what the first pass saw (no list).
    assert cms.client is client
    assert cms.label_selector == SELECTOR
    assert cms.resource_version == "100"
    # Another identity applying there has a watch of its own.
    r.pass_(("shop", "other"), "app", tenant("shop", "reader"), [applied("x")])
    assert r.drift.watches() == 3
    # The last StageSet to need a watch releases it; until then it stays.
    for i in range(49):
        r.drift.forget(("shop", f"set-{i}"))
    assert r.pool.released == []
    r.drift.forget(("shop", "set-49"))
    assert len(r.pool.released) == 2
    assert r.drift.watches() == 1


def test_only_a_change_that_is_not_ours_queues_the_owner() -> None:
    r = Registry()
    r.pass_(("shop", "web"), "app", tenant("shop"), [applied("a")])
    # Our own write as the pass left it, a status or another manager's field: nothing.
    r.pool.send("shop", CONFIGMAPS, "MODIFIED", live("a"))
    r.pool.send(
        "shop",
        CONFIGMAPS,
        "MODIFIED",
        live("a", rv="11", others=({"manager": "hpa", "operation": "Update", "fieldsV1": {"f:x": {}}},)),
    )
    assert r.queued == []
    # An edit of a field we manage: queued once; the status updates that follow are judged against it.
    r.pool.send("shop", CONFIGMAPS, "MODIFIED", live("a", rv="12", ours={}))
    r.pool.send("shop", CONFIGMAPS, "MODIFIED", live("a", rv="13", ours={}))
    assert r.queued == [("shop", "web")]
    # A delete (or a removed owner label): queued.
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("a", rv="14"))
    assert r.queued == [("shop", "web")] * 2
    # An object nobody registered, or one registered under another identity's watch: nothing.
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("unknown", rv="15"))
    assert r.queued == [("shop", "web")] * 2


def test_events_during_a_pass_are_judged_against_what_it_left() -> None:
    r = Registry()
    ref = ("shop", "web")
    r.pass_(ref, "app", tenant("shop"), [applied("a"), applied("old")])
    r.drift.begin(ref)
    # The pass corrects a (a new version, our fields back), prunes old: both events come meanwhile.
    r.pool.send("shop", CONFIGMAPS, "MODIFIED", live("a", rv="20"))
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("old", rv="21"))
    # ... and someone edits a after the pass wrote it.
    r.pool.send("shop", CONFIGMAPS, "MODIFIED", live("a", rv="22", ours={}))
    assert r.queued == []
    r.drift.applied(ref, "app", tenant("shop"), [applied("a", rv="20")])
    r.drift.settle(ref, stages=["app"])
    assert r.queued == [ref], "the edit after the pass's write, and nothing else"


def test_the_bound_refuses_new_watches_and_counts_the_stagesets_that_fall_back() -> None:
    r = Registry(capacity=2)
    r.pass_(("a", "one"), "app", tenant("a"), [applied("x", namespace="a"), applied("y", namespace="b")])
    r.pass_(("c", "two"), "app", tenant("c"), [applied("z", namespace="c")])
    assert r.drift.watches() == 2
    assert r.drift.refused == 1
    assert r.drift.unwatched() == 1
    # Asked again at its next pass: counted once, still refused; room made: held.
    r.pass_(("c", "two"), "app", tenant("c"), [applied("z", namespace="c")])
    assert r.drift.refused == 1
    r.drift.forget(("a", "one"))
    r.pass_(("c", "two"), "app", tenant("c"), [applied("z", namespace="c")])
    assert r.drift.watches() == 1
    assert r.drift.unwatched() == 0
    # A watch that does not work (RBAC, a cluster down) is a fallback too.
    r.pool.unhealthy.update(r.pool.held)
    assert r.drift.unwatched() == 1


def test_a_relist_that_misses_an_object_is_a_delete_and_terminating_namespaces_are_left_alone() -> None:
    r = Registry(terminating=frozenset({"gone"}))
    r.pass_(("shop", "web"), "app", tenant("shop"), [applied("a"), applied("b")])
    [held] = r.pool.held.values()
    assert held.listed is not None
    held.listed({("shop", "a")})
    assert r.queued == [("shop", "web")]
    r.pass_(("gone", "web"), "app", tenant("gone"), [applied("a", namespace="gone")])
    r.pool.send("gone", CONFIGMAPS, "DELETED", live("a", namespace="gone", rv="30"))
    assert r.queued == [("shop", "web")]


def test_stages_dropped_from_the_spec_and_remote_clusters() -> None:
    r = Registry()
    remote = ClusterKey("shop/prod#abc")
    ref = ("shop", "web")
    r.drift.begin(ref)
    r.drift.applied(ref, "app", tenant("shop", cluster=remote), [applied("a")])
    r.drift.applied(ref, "db", tenant("shop"), [applied("b")])
    r.drift.settle(ref, stages=["app", "db"])
    keys = set(r.pool.held)
    assert {k[0] for k in keys} == {remote.name, LOCAL.name}
    # The same path on the other cluster is another object.
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("b", rv="40"), user="")
    assert r.queued == [ref]
    r.drift.begin(ref)
    r.drift.settle(ref, stages=["app"])
    assert [k[0] for k in r.pool.released] == [LOCAL.name]


def test_the_kubeconfig_secret_is_watched_as_the_stageset_from_the_version_read() -> None:
    r = Registry()
    ref = ("shop", "web")
    me = tenant("shop")
    r.pass_(
        ref,
        "app",
        me,
        [applied("a")],
        secret=SecretWatch(client=me, namespace="shop", name="prod", version="7"),
    )
    [secret] = [h for h in r.pool.held.values() if h.field_selector]
    assert (secret.client, secret.field_selector, secret.resource_version) == (me, "metadata.name=prod", "7")
    secret.handler("MODIFIED", {"metadata": {"name": "prod", "namespace": "shop", "resourceVersion": "7"}})
    assert r.queued == []
    secret.handler("MODIFIED", {"metadata": {"name": "prod", "namespace": "shop", "resourceVersion": "9"}})
    assert r.queued == [ref]
    # A pass that did not get as far as the Secret keeps its watch; one without kubeConfig drops it.
    r.drift.begin(ref)
    r.drift.settle(ref, stages=["app"], keep_secret=True)
    assert any(h.field_selector for h in r.pool.held.values())
    r.drift.begin(ref)
    r.drift.settle(ref, stages=["app"])
    assert not any(h.field_selector for h in r.pool.held.values())


def test_an_event_queues_only_the_stageset_that_registered_that_object_under_that_identity() -> None:
    """Tenant b watches its own namespace; an object there carrying a's owner labels (forged), or an
    object a registered but seen through b's watch, queues nobody."""
    r = Registry()
    a, b = tenant("shop", "deployer"), tenant("shop", "reader")
    r.pass_(("shop", "a"), "app", a, [applied("mine")])
    r.pass_(("shop", "b"), "app", b, [applied("theirs")])
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("forged", rv="50"))
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("mine", rv="51"), user=b.identity.user)
    assert r.queued == []
    r.pool.send("shop", CONFIGMAPS, "DELETED", live("mine", rv="52"), user=a.identity.user)
    assert r.queued == [("shop", "a")]


def test_a_watch_of_a_namespace_being_deleted_is_drained_not_closed() -> None:
    """Nothing more is sent into a terminating namespace, not even the close of a watch there."""
    r = Registry(terminating=frozenset({"gone"}))
    r.pass_(
        ("gone", "web"),
        "app",
        tenant("gone"),
        [applied("a", namespace="gone"), applied("b", namespace="web")],
    )
    r.drift.forget(("gone", "web"))
    assert len(r.pool.released) == 2
    assert [k[2] for k in r.pool.drained] == ["/api/v1/namespaces/gone/configmaps"]
