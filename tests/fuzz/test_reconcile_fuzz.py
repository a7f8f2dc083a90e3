"""Every spec the CRDs admit, and manifests of every shape, end in a condition — never an exception.

StageSet and GitRepository specs are drawn from the generated CRD schemas (``crds/``) and kept
when the models accept them (the models carry every CEL rule of the CRDs).  Each is reconciled
by the real reconcilers over the in-process fake cluster (:mod:`tests.inprocess.fakes`); the
stages read a Git tree of hostile manifests.  A reconcile may fail — it must say so in a Ready
condition with a message, and return a result.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from stageset.api import GitRepository, StageSet
from stageset.controller.result import Result, TerminalError
from tests.fuzz.schema import crd_schema, from_schema
from tests.inprocess.conftest import NS, TENANT, URL, Clock, World
from tests.inprocess.fakes import FakeCluster, FakeSources
from tests.inprocess.test_gitrepository_reconciler import PATH, reconciler

SPEC = from_schema(crd_schema("stagesets")["properties"]["spec"])
GIT_SPEC = from_schema(crd_schema("gitrepositories")["properties"]["spec"])

# JSON-ish values for manifests.
SCALARS = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=12)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)
NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)


@st.composite
def manifest(draw: st.DrawFn) -> Any:
    """Objects a repository may hold: good ones, broken ones, and things that are not objects."""
    shape = draw(st.sampled_from(["configmap"] * 6 + ["object", "noise", "namespaced-elsewhere", "cluster"]))
    if shape == "configmap":
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": draw(NAMES)},
                "data": draw(st.dictionaries(NAMES, st.text(max_size=10), max_size=2))}
    if shape == "namespaced-elsewhere":
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": draw(NAMES), "namespace": draw(NAMES)}}
    if shape == "cluster":
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": draw(NAMES)}, "rules": []}
    if shape == "object":
        return {"apiVersion": draw(st.sampled_from(["v1", "apps/v1", "x.example/v1", "", "v1/v2/v3"])),
                "kind": draw(st.sampled_from(["ConfigMap", "Deployment", "Widget", "", "List"])),
                "metadata": draw(st.one_of(VALUES, st.fixed_dictionaries({"name": NAMES}))),
                **draw(st.dictionaries(st.sampled_from(["spec", "data", "items", "status"]), VALUES,
                                       max_size=2))}
    return draw(VALUES)


@st.composite
def tree(draw: st.DrawFn) -> dict[str, str]:
    files: dict[str, str] = {}
    for directory in ("app", "bad", "."):
        for _ in range(draw(st.integers(0 if directory != "app" else 1, 3))):
            name = draw(st.sampled_from(["a.yaml", "b.json", "c.yml", "kustomization.yaml", "notes.txt"]))
            docs = draw(st.lists(manifest(), min_size=1, max_size=3))
            if name.endswith(".json"):
                text = json.dumps(docs[0])
            elif name == "kustomization.yaml":
                text = yaml.safe_dump(draw(st.fixed_dictionaries({}, optional={
                    "resources": st.lists(st.sampled_from(["a.yaml", "../app", "/etc/passwd",
                                                           "https://example.test/x", "missing.yaml"]),
                                          max_size=2),
                    "namePrefix": st.text(max_size=5)})))
            else:
                text = (draw(st.sampled_from(["yaml", "raw"])) == "raw" and draw(st.text(max_size=40))) \
                    or yaml.safe_dump_all(docs)
            files[f"{directory}/{name}".removeprefix("./")] = text
    return files


@st.composite
def stageset_spec(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = draw(SPEC)
    # Most stages read the repository the test serves, at paths that exist or not.
    for stage in spec.get("stages", []):
        if draw(st.integers(0, 3)) > 0:
            stage["sourceRef"] = {"name": "app"}
            stage["path"] = draw(st.sampled_from(["./app", "./bad", "./", "./missing", "app/a.yaml"]))
            stage.pop("postBuild", None) if draw(st.booleans()) else None
        if draw(st.integers(0, 3)) > 0:
            stage.pop("serviceAccountName", None)
    if draw(st.integers(0, 3)) > 0:
        spec["serviceAccountName"] = "deployer"
    if draw(st.integers(0, 3)) > 0:
        spec.pop("kubeConfig", None)
        spec.pop("dependsOn", None)
        for stage in spec.get("stages", []):
            stage.pop("readyChecks", None)
    spec["suspend"] = False
    return spec


def admitted(model: type[StageSet] | type[GitRepository], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


def _world() -> World:
    """A new fake cluster per example (hypothesis would reuse a function fixture across examples)."""
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    cluster.controller_prefixes = ("/apis/stages.metio.wtf/",)
    return World(cluster=cluster, sources=FakeSources(), clock=Clock())


def _ready(obj: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(spec=stageset_spec(), files=tree(), passes=st.integers(1, 3))
def test_any_admitted_stageset_ends_with_a_condition(spec: dict[str, Any], files: dict[str, str],
                                                     passes: int) -> None:
    body = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": "fuzz", "namespace": NS}, "spec": spec}
    if not admitted(StageSet, body):
        event("refused by the models")
        return
    world = _world()
    if files:
        world.commit(files)
    world.cluster.put(body)
    for _ in range(passes):
        live = world.cluster.get("/apis/stages.metio.wtf/v1/namespaces/shop/stagesets/fuzz")
        assert live is not None
        try:
            result = world.reconciler.reconcile(live)
        except TerminalError:
            pytest.fail("a spec the CRD admits was given up on without a condition")
        assert isinstance(result, Result)
        ready = _ready(world.get("fuzz"))
        assert ready is not None, "no Ready condition"
        assert ready["reason"], ready
        event(f"Ready={ready['status']} {ready['reason']}")
        if ready["status"] != "True":
            assert ready["message"].strip(), f"no message for {ready['reason']}"
        world.clock.advance(30)


URLS = st.sampled_from([URL, "https://git.example/other.git", "ssh://git@git.example/app.git",
                        "git@git.example:app.git", "http://git.example/app.git", "file:///etc",
                        "https://-oProxyCommand=x/y", "ext::sh -c id", "https://user:pw@git.example/a.git"])


@st.composite
def git_spec(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = draw(GIT_SPEC)
    if draw(st.integers(0, 3)) > 0:
        spec["url"] = draw(URLS)
    if draw(st.booleans()):
        spec.pop("secretRef", None)
    spec["suspend"] = False
    return spec


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(spec=git_spec(), files=tree())
def test_any_admitted_gitrepository_ends_with_a_condition(
    spec: dict[str, Any], files: dict[str, str]
) -> None:
    body = {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": NS}, "spec": spec}
    if not admitted(GitRepository, body):
        event("refused by the models")
        return
    world = _world()
    world.sources.commit(str(spec.get("url") or URL), files or {"x.yaml": ""})
    world.cluster.put(body)
    git, _ = reconciler(world)
    live = world.cluster.get(PATH)
    assert live is not None
    result = git.reconcile(live)
    assert isinstance(result, Result)
    ready = _ready(world.cluster.get(PATH) or {})
    assert ready is not None
    assert ready["reason"]
    event(f"Ready={ready['status']} {ready['reason']}")
    if ready["status"] != "True":
        assert ready["message"].strip()
