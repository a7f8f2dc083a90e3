"""Tenant-written records and kubeconfigs of every shape never leave a stale ``Ready=True`` (issue 43
item 7).

A StageSet is first made Ready at one commit; then its tenant replaces what only it controls — the
durable record annotation (``stages.metio.wtf/inventory-record``) on its own StageSet, or the
kubeconfig in its ``spec.kubeConfig`` Secret — with hostile values drawn below, and a new commit
lands.  The pass that follows must either apply the new commit (Ready=True at it) or conclude
Ready=False with a reason and a message: never keep the last pass's Ready=True while the commit
goes unapplied, whatever it raised.  A record or kubeconfig the parsers refuse must end in
``InvalidSpec`` naming the field.

Reconciled by the real reconciler over the in-process fake clusters (:mod:`tests.inprocess.fakes`);
the remote cluster a kubeconfig may name is a fake too (``prod.example``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stageset.apply.record import ANNOTATION, parse, problem_of
from stageset.kube.remote import KubeconfigError, parse_remote_kubeconfig
from tests.inprocess.conftest import NS, TENANT, Clock, World, configmap, stageset_path
from tests.inprocess.fakes import FakeCluster, FakeSources

HOSTILE_TEXT = st.sampled_from([
    "", " ", "a b", "UPPER", "../../etc", "a/b", "x\r\nInjected: 1", "\x00", "ns\n", "é", "a" * 300,
    "kc", "value", "shop", "deployer", "v1//ConfigMap", "apps/v1/Deployment", "-bad-", "ok.example",
    "https://user:pw@evil.example", "2030-01-01T00:00:00Z", "yesterday"]) | st.text(max_size=20)
HOSTILE = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | HOSTILE_TEXT,
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(HOSTILE_TEXT, inner, max_size=2), max_leaves=6)
GOOD_STAGE: dict[str, Any] = {"sa": "deployer", "kinds": {"v1//ConfigMap": [NS]}}
REMOTE_STAGE: dict[str, Any] = {**GOOD_STAGE, "t": "https://prod.example:6443#insecure",
                                "kc": ["prod", "value"]}


@st.composite
def record(draw: st.DrawFn) -> str:
    """A record body: a valid skeleton (a stage here, a move's previous one on a remote) with
    hostile values swapped in at a few places, or no JSON at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["{not json", "[]", "null", '"x"', "[" * 5000, '{"v":2}']))
    body: dict[str, Any] = {"v": draw(st.sampled_from([2, 2, 2, 1, 3, "2"])),
                            "stages": {"app": dict(GOOD_STAGE)},
                            "prev": [{"stage": "app", **REMOTE_STAGE}], "since": "2030-01-01T00:00:00Z"}
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["stage-name", "sa", "kinds-key", "kinds-ns", "t", "kc", "kc-name",
                                      "st", "prev", "prev-stage", "since", "stages", "rebuild"]))
        value = draw(HOSTILE)
        stages = body["stages"] if isinstance(body["stages"], dict) else {}
        stage = stages["app"] if isinstance(stages.get("app"), dict) else {}
        first = body["prev"][0] if isinstance(body["prev"], list) and body["prev"] else None
        previous = first if isinstance(first, dict) else {}
        if where == "stage-name":
            body["stages"] = {str(draw(HOSTILE_TEXT)): stage}
        elif where == "sa":
            stage["sa"] = value
        elif where == "kinds-key":
            stage["kinds"] = {str(draw(HOSTILE_TEXT)): [NS]}
        elif where == "kinds-ns":
            stage["kinds"] = {"v1//ConfigMap": value}
        elif where in ("t", "kc", "st"):
            previous[where] = value
        elif where == "kc-name":
            previous["kc"] = [draw(HOSTILE_TEXT), "value"]
        elif where == "prev":
            body["prev"] = value
        elif where == "prev-stage":
            previous["stage"] = value
        else:
            body[where] = value
    return json.dumps(body)


SERVERS = st.sampled_from([
    "https://prod.example:6443", "https://user:pass@prod.example:6443", "https://token@prod.example:6443",
    "https://prod.example:6443/\r\nX: y", "https://prod.example :6443", "https://prod.example:99999",
    "https://prod.example:6443?x=1", "https://prod.example:6443#frag", "https://", "http://prod.example:6443",
    "https://[::1", "https://prod.example:6443/path"]) | HOSTILE
TOKENS = st.sampled_from(["t0k3n", "t0k3n\r\nX-Injected: 1", "t0k3n\n", "a b", "", "é", "x" * 20000,
                          "Bearer x"]) | HOSTILE


@st.composite
def kubeconfig(draw: st.DrawFn) -> bytes:
    """A kubeconfig naming the fake remote, with hostile values in its server, token or shape."""
    user: dict[str, Any] = {"token": draw(TOKENS)} if draw(st.integers(0, 4)) else \
        draw(st.dictionaries(st.sampled_from(["token", "client-certificate-data", "client-key-data",
                                              "username", "password"]), HOSTILE, max_size=3))
    cluster: dict[str, Any] = {"server": draw(SERVERS)}
    if draw(st.booleans()):
        cluster["certificate-authority-data"] = draw(st.sampled_from(["", "!!", 5])) \
            if draw(st.integers(0, 3)) == 0 else base64.b64encode(b"CA").decode()
    document: Any = {"current-context": "c",
                     "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                     "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}]}
    if draw(st.integers(0, 9)) == 0:
        document = draw(st.sampled_from([[], "text", {"current-context": 5}, {"current-context": "c",
                                                                              "contexts": 7}]))
    return yaml.safe_dump(document).encode()


def _world() -> tuple[World, FakeCluster]:
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    world = World(cluster=cluster, sources=FakeSources(), clock=Clock())
    prod = FakeCluster(name="prod.example")
    prod.grant_namespace(TENANT, NS)
    world.pool.clusters["prod.example"] = prod
    return world, prod


def _secret(world: World, raw: bytes) -> None:
    world.cluster.objects.pop(f"/api/v1/namespaces/{NS}/secrets/prod", None)
    world.cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "prod", "namespace": NS},
                       "data": {"value": base64.b64encode(raw).decode()}})


def _pass(world: World) -> BaseException | None:
    """One reconcile; what it raised (the manager would back off and retry)."""
    try:
        world.reconcile("shop")
    except Exception as error:  # the property is about what is left in status
        return error
    return None


def _not_stale(world: World, revision: str, raised: BaseException | None) -> dict[str, Any]:
    ready = world.ready("shop")
    assert ready["reason"], ready
    if ready["status"] == "True":
        applied = world.get("shop")["status"].get("lastAppliedRevision")
        assert applied == revision, \
            f"a stale Ready=True ({ready['reason']}) after {raised!r}: still at {applied}"
    else:
        assert ready["message"].strip(), ready
    event(f"Ready={ready['status']} {ready['reason']}"
          + (f" raised {type(raised).__name__}" if raised else ""))
    return ready


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(raw=record())
def test_a_hostile_record_never_leaves_a_stale_ready(raw: str) -> None:
    world, _prod = _world()
    world.commit({"app/a.json": configmap("a", "v1")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"

    live = world.cluster.objects[stageset_path("shop")]
    live["metadata"].setdefault("annotations", {})[ANNOTATION] = raw
    world.commit({"app/a.json": configmap("a", "v2")})
    raised = _pass(world)
    ready = _not_stale(world, world.sources.revision("https://git.example/shop.git"), raised)
    problem = problem_of(live)
    if problem is not None:
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
        assert ANNOTATION in ready["message"], ready
        assert str(parse(live).problem) in ready["message"], ready
    else:
        assert raised is None, f"a record the parser accepts made the pass raise {raised!r}"


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(raw=kubeconfig())
def test_a_hostile_kubeconfig_never_leaves_a_stale_ready(raw: bytes) -> None:
    world, prod = _world()
    _secret(world, yaml.safe_dump({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://prod.example:6443"}}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}]}).encode())
    world.commit({"app/a.json": configmap("a", "v1")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "prod"}})
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert prod.get(f"/api/v1/namespaces/{NS}/configmaps/a") is not None

    _secret(world, raw)
    world.commit({"app/a.json": configmap("a", "v2")})
    raised = _pass(world)
    ready = _not_stale(world, world.sources.revision("https://git.example/shop.git"), raised)
    refusal = _refusal(raw)
    if refusal is None:
        assert raised is None, f"a kubeconfig the parser accepts made the pass raise {raised!r}"
        return
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
    assert refusal in ready["message"], ready
    assert "t0k3n" not in ready["message"], "a refusal never quotes a credential"
    assert "pass" not in ready["message"].replace("password", ""), "a refusal never quotes a credential"


def _refusal(raw: bytes) -> str | None:
    """What the kubeconfig parser says of ``raw`` (``None``: accepted)."""
    try:
        parse_remote_kubeconfig(raw)
    except KubeconfigError as error:
        return str(error)
    return None
