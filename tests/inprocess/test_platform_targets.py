"""Platform targets (StageTarget, spec.targetRef): who reads what, one connection per target, one refusal.

The clusters are in-process fakes that record every request (identity, verb, path): what these
tests assert is exactly which requests a resolve makes and as whom.  The real apiservers' side
(audit logs, the chart's Roles) is tests/e2e/test_platform_targets.py.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from stageset.api import StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.engine import StageApplier
from stageset.apply.errors import StageError
from stageset.apply.settings import ApplySettings
from stageset.controller.keys import ObjectKey
from stageset.controller.setup import Event
from stageset.controller.stageset.watches import target_named, target_trigger
from stageset.controller.targets.clusters import Target, Targets
from stageset.controller.targets.platform import PlatformTargets
from stageset.kube.mapping import RestMapper
from stageset.kube.remote import cluster_id
from tests.inprocess.fakes import CONTROLLER, FakeClientPool, FakeCluster

PLATFORM = "platform-targets"
TENANT_NS = "shop"
CA = b"-----BEGIN CERTIFICATE-----\nnot parsed here\n-----END CERTIFICATE-----\n"


def kubeconfig(server: str, *, token: str = "t", ca: bytes = CA) -> bytes:  # noqa: S107 - a test token
    return yaml.safe_dump({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": f"https://{server}:6443",
                                               "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": "u", "user": {"token": token}}]}).encode()


def secret(cluster: FakeCluster, name: str, raw: bytes, *, namespace: str = PLATFORM) -> None:
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    data = {"value": base64.b64encode(raw).decode()}
    if cluster.get(path) is None:
        cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
                     "data": data})
    else:
        cluster.edit(path, lambda obj: obj.__setitem__("data", data))


def stage_target(name: str, *, allowed: list[str], namespace: str = PLATFORM,
                 secret_name: str = "kc") -> dict[str, Any]:  # noqa: S107 - a Secret's name
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageTarget",
            "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": {"kubeConfig": {"secretRef": {"name": secret_name}}, "allowedNamespaces": allowed}}


def on_target(name: str, *, target: str = "prod", target_namespace: str = PLATFORM,
              namespace: str = TENANT_NS) -> StageSet:
    return StageSet.model_validate({"metadata": {"name": name, "namespace": namespace}, "spec": {
        "serviceAccountName": "deployer", "targetRef": {"name": target, "namespace": target_namespace},
        "stages": [{"name": "app", "sourceRef": {"name": "app"}}]}})


class Platform:
    """A controller's view: the local fake cluster, a pool, the targets and their index."""

    def __init__(self, *, capacity: int = 64) -> None:
        self.local = FakeCluster()
        self.pool = FakeClientPool(self.local)
        self.platform = PlatformTargets(admin=self.pool.client(), namespaces=(PLATFORM,))
        self.targets = Targets(clients=self.pool, settings=ApplySettings(),
                               local=StageApplier(mapper=RestMapper(self.pool.client())),
                               capacity=capacity, platform=self.platform)

    def register(self, obj: dict[str, Any], event: Event = Event.ADDED) -> None:
        meta = obj["metadata"]
        self.platform.observe(event, ObjectKey("StageTarget", meta["namespace"], meta["name"]), obj)

    def remote(self, host: str) -> FakeCluster:
        return self.pool.clusters.setdefault(host, FakeCluster(name=host))

    def every_request(self) -> list[Any]:
        return [r for c in {id(c): c for c in self.pool.clusters.values()}.values() for r in c.requests]


@pytest.fixture
def world() -> Platform:
    return Platform()


def refusal(world: Platform, stageset: StageSet) -> StageError:
    with pytest.raises(StageError) as raised:
        world.targets.for_target_ref(stageset)
    return raised.value


def test_every_refusal_has_one_shape_and_sends_nothing(world: Platform) -> None:
    secret(world.local, "kc", kubeconfig("prod.example"))
    world.remote("prod.example")
    world.register(stage_target("prod", allowed=["other-team"]))
    # A StageTarget outside --target-namespaces is never indexed, whatever it allows.
    world.register(stage_target("prod", allowed=[TENANT_NS], namespace=TENANT_NS))

    disallowed = refusal(world, on_target("a"))
    missing = refusal(world, on_target("a", target="nope"))
    foreign = refusal(world, on_target("a", target_namespace=TENANT_NS))
    assert {disallowed.reason, missing.reason, foreign.reason} == {Reason.TARGET_NOT_AVAILABLE}
    shapes = {e.message.replace("nope", "X").replace(f"{TENANT_NS}/prod", f"{PLATFORM}/X")
              .replace(f"{PLATFORM}/prod", f"{PLATFORM}/X") for e in (disallowed, missing, foreign)}
    assert len(shapes) == 1, shapes
    assert f"StageTarget {PLATFORM}/prod is not available to namespace {TENANT_NS}" in disallowed.message
    assert "prod.example" not in disallowed.message
    assert "6443" not in disallowed.message
    assert world.every_request() == [], "a refused targetRef reads no Secret and reaches no cluster"
    assert world.platform.secret_reads == 0


def test_targets_are_off_without_target_namespaces() -> None:
    pool = FakeClientPool(FakeCluster())
    targets = Targets(clients=pool, settings=ApplySettings(),
                      local=StageApplier(mapper=RestMapper(pool.client())))
    with pytest.raises(StageError) as raised:
        targets.for_target_ref(on_target("a"))
    assert raised.value.reason is Reason.TARGET_NOT_AVAILABLE


def resolve_kind(target: Target) -> None:
    target.applier.resolve({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, TENANT_NS)


def test_ten_stagesets_share_one_connection_one_secret_read_and_one_discovery(world: Platform) -> None:
    secret(world.local, "kc", kubeconfig("prod.example"))
    remote = world.remote("prod.example")
    world.register(stage_target("prod", allowed=[TENANT_NS]))

    found = [world.targets.for_target_ref(on_target(f"s{i}")) for i in range(10)]
    for target in found:
        resolve_kind(target)
    assert all(target is found[0] for target in found), "one Target (clients, discovery) per StageTarget"
    assert found[0].id == cluster_id(server="https://prod.example:6443", ca_data=CA)
    assert found[0].name == f"{PLATFORM}/prod"
    assert "StageTarget platform-targets/prod" in found[0].where
    assert "prod.example" not in found[0].where
    reads = world.local.by(CONTROLLER)
    assert [r.path for r in reads] == [f"/api/v1/namespaces/{PLATFORM}/secrets/kc"], \
        "the Secret is read once, by the controller itself"
    assert [r for r in world.local.requests if r.user != CONTROLLER] == [], "never as the tenant"
    assert len([r for r in remote.requests if r.path == "/api/v1"]) == 1, "one discovery"


def test_a_rotated_secret_reconnects_to_the_same_cluster_and_another_cluster_changes_the_id(
        world: Platform) -> None:
    secret(world.local, "kc", kubeconfig("prod.example", token="old"))
    world.remote("prod.example")
    world.remote("dr.example")
    world.register(stage_target("prod", allowed=[TENANT_NS]))
    first = world.targets.for_target_ref(on_target("a"))

    secret(world.local, "kc", kubeconfig("prod.example", token="new"))
    changed = world.local.get(f"/api/v1/namespaces/{PLATFORM}/secrets/kc")
    assert changed is not None
    assert world.platform.secret_changed("MODIFIED", changed) == [ObjectKey("StageTarget", PLATFORM, "prod")]
    assert world.platform.secret_changed("MODIFIED", changed) == [], "a resync of the same version: nothing"
    rotated = world.targets.for_target_ref(on_target("a"))
    assert rotated.cluster != first.cluster, "new credentials: a new connection"
    assert rotated.id == first.id, "the same cluster: not a move"
    assert world.targets.for_target_ref(on_target("b")) is rotated

    secret(world.local, "kc", kubeconfig("dr.example"))
    _, connection = world.platform.refresh((PLATFORM, "prod"), remotes=world.targets)
    moved = world.targets.for_target_ref(on_target("a"))
    assert moved.cluster == connection.cluster
    assert moved.id.startswith("https://dr.example:6443#"), "another cluster: a move"
    assert world.platform.secret_reads == 3


def test_withdrawing_a_namespace_refuses_at_once(world: Platform) -> None:
    secret(world.local, "kc", kubeconfig("prod.example"))
    world.remote("prod.example")
    world.register(stage_target("prod", allowed=[TENANT_NS, "other"]))
    world.targets.for_target_ref(on_target("a"))
    world.local.clear()
    world.register({**stage_target("prod", allowed=["other"]), "metadata": {
        "name": "prod", "namespace": PLATFORM, "generation": 2}}, Event.MODIFIED)
    assert refusal(world, on_target("a")).reason is Reason.TARGET_NOT_AVAILABLE
    assert world.targets.for_target_ref(on_target("a", namespace="other")).name == f"{PLATFORM}/prod"
    assert world.local.writes() == []
    world.register(stage_target("prod", allowed=["other"]), Event.DELETED)
    assert refusal(world, on_target("a", namespace="other")).reason is Reason.TARGET_NOT_AVAILABLE


def test_an_unusable_secret_tells_the_tenant_only_that_the_target_is_not_ready(world: Platform) -> None:
    world.register(stage_target("prod", allowed=[TENANT_NS]))
    error = refusal(world, on_target("a"))
    assert error.reason is Reason.CLUSTER_UNREACHABLE
    assert "StageTarget platform-targets/prod is not ready" in error.message
    secret(world.local, "kc", yaml.safe_dump({"current-context": "x"}).encode())
    assert "kc" not in refusal(world, on_target("a")).message, "nothing of the Secret reaches the tenant"


def test_the_bound_of_remote_clusters_is_a_setting() -> None:
    world = Platform(capacity=2)
    for i in range(3):
        secret(world.local, f"kc{i}", kubeconfig(f"r{i}.example"))
        world.remote(f"r{i}.example")
        world.register(stage_target(f"t{i}", allowed=[TENANT_NS], secret_name=f"kc{i}"))
    for i in range(3):
        world.targets.for_target_ref(on_target("a", target=f"t{i}"))
    assert len(world.targets) == 2
    world.targets.for_target_ref(on_target("a", target="t0"))
    assert world.platform.secret_reads == 4, "an evicted target is read and connected again"


def test_stagesets_are_woken_by_what_their_target_changes() -> None:
    obj = {"metadata": {"generation": 3},
           "status": {"observedSecretVersion": "41", "kubernetesVersion": "v1.31",
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    later = {**obj, "status": {**obj["status"], "kubernetesVersion": "v1.32"}}
    assert target_trigger(obj) == target_trigger(later), "a new version reported wakes nobody"
    rotated = {**obj, "status": {**obj["status"], "observedSecretVersion": "42"}}
    assert target_trigger(obj) != target_trigger(rotated)
    named = target_named({"spec": {"targetRef": {"name": "prod", "namespace": PLATFORM}}}, kind="StageTarget")
    assert [(s.kind, s.namespace, s.name) for s in named] == [("StageTarget", PLATFORM, "prod")]
    assert target_named({"spec": {}}, kind="StageTarget") == set()
