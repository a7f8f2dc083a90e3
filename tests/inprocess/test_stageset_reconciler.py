"""The StageSet reconciler in process: which requests each scenario makes, as whom."""

from __future__ import annotations

import json
import logging

import pytest

from stageset.api.vocabulary import Reason
from tests.inprocess.conftest import NS, SA, TENANT, World, configmap, deployment, stageset_path
from tests.inprocess.fakes import CONTROLLER, FakeCluster, Request

CM = f"/api/v1/namespaces/{NS}/configmaps"


def verbs(requests: list[Request]) -> list[tuple[str, str, bool]]:
    return [(r.verb, r.path, r.dry_run) for r in requests]


def test_a_cold_apply_dry_runs_then_writes_as_the_tenant(world: World) -> None:
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    result = world.reconcile("shop")

    assert world.ready("shop")["status"] == "True"
    assert result.requeue_after == 600.0  # spec.interval
    tenant = world.cluster.by(TENANT)
    # The tenant reads its source, then dry-runs everything before the first real write — but the
    # first object it writes: b's dry-run showed it may write ConfigMaps there, and a's own write,
    # made first, is a's check (had it failed, nothing would have been written).
    assert verbs(tenant) == [
        ("get", f"/apis/stages.metio.wtf/v1/namespaces/{NS}/gitrepositories/app", False),
        ("apply", f"{CM}/b", True),
        ("apply", f"{CM}/a", False),
        ("apply", f"{CM}/b", False),
    ]
    # Everything else is the controller's: discovery, finalizer, status, the success event.
    controller_writes = world.cluster.by(CONTROLLER, writes_only=True)
    events = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
    assert {r.path for r in controller_writes} <= {stageset_path("shop"), stageset_path("shop") + "/status",
                                                   events}
    [event] = [o for p, o in world.cluster.objects.items() if p.startswith(events)]
    assert (event["type"], event["reason"]) == ("Normal", "ReconciliationSucceeded")
    assert event["note"] == f"ConfigMap/{NS}/a created, ConfigMap/{NS}/b created"
    status = world.get("shop")["status"]
    assert [e["id"] for e in status["inventory"][0]["entries"]] == [
        f"{NS}_a__ConfigMap",
        f"{NS}_b__ConfigMap",
    ]
    assert status["inventory"][0]["serviceAccountName"] == SA
    assert status["stages"][0]["phase"] == "Ready"


def test_a_quiet_pass_makes_no_writes_at_all(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    before = world.get("shop")
    world.cluster.clear()
    world.clock.advance(600)

    world.reconcile("shop")

    assert world.cluster.writes() == []
    # Nothing changed the object since it was applied (its resourceVersion says so), and the
    # tenant showed it may write ConfigMaps there (its writes, 10 minutes ago): the source read and
    # one label-selected list, as the tenant — two requests.
    assert verbs(world.cluster.by(TENANT)) == [
        ("get", f"/apis/stages.metio.wtf/v1/namespaces/{NS}/gitrepositories/app", False),
        ("list", CM, False),
    ]
    assert world.get("shop")["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def request_reconcile(world: World, name: str, stamp: str) -> None:
    world.cluster.edit(stageset_path(name), lambda obj: obj["metadata"].setdefault("annotations", {})
                       .update({"reconcile.fluxcd.io/requestedAt": stamp}))


@pytest.mark.parametrize(("how", "dry_runs"), [
    ("periodic, rights shown 10 minutes ago", 0),
    ("periodic, rights shown over an hour ago", 1),  # --rights-recheck-interval (1h)
    ("requested", 1),  # reconcile.fluxcd.io/requestedAt: asked for, so everything is checked
])
def test_a_quiet_pass_asks_whether_the_tenant_may_still_write_only_when_due(
        world: World, how: str, dry_runs: int) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    world.clock.advance(600)
    world.reconcile("shop")  # a first quiet pass: 10 minutes after the writes, no question
    if "hour" in how:
        world.clock.advance(3600)
    if how == "requested":
        request_reconcile(world, "shop", "2026-11-27T12:00:00Z")
    world.cluster.clear()

    world.reconcile("shop")

    tenant = verbs(world.cluster.by(TENANT))
    assert [r for r in world.cluster.by(TENANT) if r.write and not r.dry_run] == []
    assert tenant.count(("apply", f"{CM}/a", True)) == dry_runs, tenant
    assert tenant.count(("list", CM, False)) == 1, tenant
    assert world.ready("shop")["status"] == "True"


def test_a_denied_stage_writes_nothing(world: World) -> None:
    world.commit(
        {
            "app/a.json": configmap("a"),
            "app/role.json": '{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",'
            ' "metadata": {"name": "escalate"}, "rules": []}',
        }
    )
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")

    ready = world.ready("shop")
    assert ready["reason"] == "RBACDenied"
    assert TENANT in ready["message"]
    assert "ClusterRole escalate" in ready["message"]
    assert [r for r in world.cluster.by(TENANT) if r.write] == []
    assert world.configmap("a") is None


def test_multi_tenant_mode_without_a_service_account_fails_closed_without_a_request(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], serviceAccountName=None)
    world.reconcile("shop")

    ready = world.ready("shop")
    assert ready["reason"] == "RBACDenied"
    assert "serviceAccountName is required" in ready["message"]
    assert [r for r in world.cluster.requests if r.user not in (CONTROLLER,)] == []
    assert not [
        r for r in world.cluster.by(CONTROLLER) if "/configmaps" in r.path or "/gitrepositories" in r.path
    ]


def test_single_tenant_mode_applies_as_the_controller(world: World) -> None:
    world.reconciler = world.make_reconciler(cluster_admin=True)
    world.cluster.controller_prefixes = None
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], serviceAccountName=None)
    world.reconcile("shop")

    assert world.ready("shop")["status"] == "True"
    assert ("apply", f"{CM}/a", False) in verbs(world.cluster.by(CONTROLLER))
    assert "serviceAccountName" not in world.get("shop")["status"]["inventory"][0]


def test_prune_runs_only_after_every_stage_is_ready(world: World) -> None:
    world.commit(
        {"a/cm.json": configmap("in-a"), "b/old.json": configmap("old"), "b/keep.json": configmap("keep")}
    )
    world.stageset("shop", [{"name": "a", "path": "./a"}, {"name": "b", "path": "./b"}])
    world.reconcile("shop")
    assert world.configmap("old") is not None

    # The next revision drops "old" and adds a Deployment to stage a that is not ready yet.
    world.commit(
        {"a/cm.json": configmap("in-a"), "a/web.json": deployment("web"), "b/keep.json": configmap("keep")}
    )
    world.cluster.clear()
    world.reconcile("shop")
    assert world.phases("shop") == {"a": "Waiting", "b": "Pending"}
    assert [r for r in world.cluster.requests if r.verb == "delete"] == []
    assert world.configmap("old") is not None
    tracked = [e["id"] for i in world.get("shop")["status"]["inventory"] for e in i["entries"]]
    assert f"{NS}_old__ConfigMap" in tracked, "old and new inventories are merged until prune ran"

    world.roll_out("web")
    world.cluster.clear()
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    deletes = [(i, r) for i, r in enumerate(world.cluster.requests) if r.verb == "delete"]
    assert [(r.user, r.path) for _, r in deletes] == [(TENANT, f"{CM}/old")]
    # Applied, or found unchanged by a list: either way before prune.
    last_apply = max(i for i, r in enumerate(world.cluster.requests) if r.verb in ("apply", "list"))
    assert deletes[0][0] > last_apply, "prune runs after every stage was applied"
    assert world.configmap("old") is None
    tracked = [e["id"] for i in world.get("shop")["status"]["inventory"] for e in i["entries"]]
    assert f"{NS}_old__ConfigMap" not in tracked


def test_prune_never_deletes_an_adopted_or_opted_out_object(world: World) -> None:
    world.commit({"app/adopted.json": configmap("adopted"), "app/optout.json": configmap("optout")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    with world.cluster._lock:
        world.cluster.objects[f"{CM}/adopted"]["metadata"]["labels"] = {}
        world.cluster.objects[f"{CM}/optout"]["metadata"]["annotations"] = {
            "stages.metio.wtf/prune": "disabled"
        }
    world.commit({"app/other.json": configmap("other")})
    world.reconcile("shop")

    assert [r for r in world.cluster.requests if r.verb == "delete"] == []
    assert world.configmap("adopted") is not None
    assert world.configmap("optout") is not None
    tracked = [e["id"] for i in world.get("shop")["status"]["inventory"] for e in i["entries"]]
    assert tracked == [f"{NS}_other__ConfigMap"], "released objects are no longer tracked"


def test_an_object_that_cannot_be_pruned_stays_tracked(world: World) -> None:
    from stageset.kube.client import ApiError

    world.commit({"app/keep.json": configmap("keep"), "app/old.json": configmap("old")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    world.cluster.failures[("delete", f"{CM}/old", None)] = ApiError(
        status=403, reason="Forbidden", message="no delete"
    )
    world.commit({"app/keep.json": configmap("keep")})
    world.reconcile("shop")

    assert world.ready("shop")["status"] == "True"
    tracked = [e["id"] for i in world.get("shop")["status"]["inventory"] for e in i["entries"]]
    assert f"{NS}_old__ConfigMap" in tracked
    events = [o for p, o in world.cluster.objects.items() if "/events/" in p and o["type"] == "Warning"]
    assert [e["reason"] for e in events] == ["PruneFailed"]


def test_a_waiting_stage_is_only_rechecked_and_times_out_by_the_clock(world: World) -> None:
    world.commit({"app/web.json": deployment("web"), "next/cm.json": configmap("after")})
    world.stageset(
        "shop", [{"name": "app", "path": "./app", "timeout": "60s"}, {"name": "next", "path": "./next"}]
    )
    first = world.reconcile("shop")
    assert world.phases("shop") == {"app": "Waiting", "next": "Pending"}
    assert first.requeue_after == world.settings.readiness_requeue
    since = world.get("shop")["status"]["stages"][0]["waitingSince"]
    assert since == "2030-01-01T00:00:00Z"

    # Within the timeout: a re-check is one read per object, no dry-run, no write (each stage
    # still reads its source to render).
    world.clock.advance(30)
    world.cluster.clear()
    world.reconcile("shop")
    source = ("get", f"/apis/stages.metio.wtf/v1/namespaces/{NS}/gitrepositories/app", False)
    assert verbs(world.cluster.by(TENANT)) == [
        source,
        source,
        ("get", f"/apis/apps/v1/namespaces/{NS}/deployments/web", False),
    ]
    assert world.cluster.writes() == []
    assert world.get("shop")["status"]["stages"][0]["waitingSince"] == since

    # Past it: held as Progressing (StageProgressing), objects kept, dependents not started.
    world.clock.advance(31)
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "StageProgressing")
    assert "not ready after 60s" in ready["message"]
    assert world.phases("shop") == {"app": "Progressing", "next": "Pending"}
    assert world.configmap("after") is None


def test_teardown_deletes_dependents_first_each_stage_gone_before_the_next(world: World) -> None:
    world.commit(
        {
            "first/cm.json": configmap("first"),
            "second/cm.json": configmap("second", finalizers=["example.com/hold"]),
            "third/cm.json": configmap("third"),
        }
    )
    world.stageset(
        "shop",
        [
            {"name": "first", "path": "./first"},
            {"name": "second", "path": "./second"},
            {"name": "third", "path": "./third"},
        ],
    )
    world.reconcile("shop")
    assert "stages.metio.wtf/teardown" in world.get("shop")["metadata"]["finalizers"]
    with world.cluster._lock:
        world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    world.cluster.clear()

    def deletes() -> list[tuple[str, str]]:
        return [(r.user, r.path) for r in world.cluster.requests if r.verb == "delete"]

    # A pass deletes one stage's objects and comes back to see them gone before the next stage.
    assert world.reconcile("shop").requeue_after == 1.0
    assert deletes() == [(TENANT, f"{CM}/third")]
    assert world.reconcile("shop").requeue_after == 1.0
    assert deletes() == [(TENANT, f"{CM}/third"), (TENANT, f"{CM}/second")]
    # second's object is held by its finalizer: first is not touched meanwhile.
    assert world.reconcile("shop").requeue_after == 1.0
    assert deletes() == [(TENANT, f"{CM}/third"), (TENANT, f"{CM}/second")]
    assert [i["name"] for i in world.get("shop")["status"]["inventory"]] == ["first", "second"]

    with world.cluster._lock:
        world.cluster.objects[f"{CM}/second"]["metadata"]["finalizers"] = []
    world.cluster.remove(f"{CM}/second")
    assert world.reconcile("shop").requeue_after == 1.0
    assert deletes()[-1] == (TENANT, f"{CM}/first")
    assert world.reconcile("shop").requeue_after is None
    assert world.configmap("first") is None
    assert world.cluster.get(stageset_path("shop")) is None, "finalizer removed: the StageSet is gone"


def test_a_teardown_that_cannot_finish_is_forced_by_the_clock(world: World) -> None:
    world.commit({"app/cm.json": configmap("stuck", finalizers=["example.com/never"])})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    with world.cluster._lock:
        world.cluster.objects[stageset_path("shop")]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    assert world.reconcile("shop").requeue_after == 1.0
    world.clock.advance(world.settings.max_teardown_wait)
    assert world.reconcile("shop").requeue_after is None
    assert world.cluster.get(stageset_path("shop")) is None
    events = [o for p, o in world.cluster.objects.items() if "/events/" in p and o["type"] == "Warning"]
    assert [e["reason"] for e in events] == ["TeardownForced"]


def test_two_stages_rendering_one_object_apply_nothing(world: World) -> None:
    world.commit(
        {"a/cm.json": configmap("twice"), "a/only.json": configmap("only-a"), "b/cm.json": configmap("twice")}
    )
    world.stageset("shop", [{"name": "a", "path": "./a"}, {"name": "b", "path": "./b"}])
    assert world.reconcile("shop").requeue_after is None
    ready = world.ready("shop")
    assert (ready["reason"], "ConfigMap shop/twice" in ready["message"]) == ("InvalidSpec", True)
    assert [r for r in world.cluster.by(TENANT) if r.verb == "apply"] == []


def test_references_into_other_namespaces_are_refused_unread(world: World) -> None:
    world.reconciler = world.make_reconciler(no_cross_namespace_refs=True)
    world.commit({"app/cm.json": configmap("x")})
    world.stageset(
        "shop", [{"name": "app", "path": "./app", "sourceRef": {"name": "app", "namespace": "other"}}]
    )
    world.reconcile("shop")
    # The reference's wire strings: a refused sourceRef is ResolveFailed, a refused dependsOn
    # DependencyNotReady (not Stalled: a controller started without the flag would accept it);
    # both with a fixed text that names nothing of the other namespace.
    refused = world.ready("shop")
    assert (refused["reason"], refused["status"]) == ("ResolveFailed", "False")
    assert "other" not in refused["message"].replace("another", "")
    assert "--no-cross-namespace-refs" in refused["message"]
    assert not [r for r in world.cluster.requests if "/namespaces/other/" in r.path]

    world.stageset(
        "deps", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "x", "namespace": "other"}]
    )
    result = world.reconcile("deps")
    waiting = world.ready("deps")
    assert (waiting["reason"], "another namespace" in waiting["message"]) == ("DependencyNotReady", True)
    assert "other" not in waiting["message"].replace("another", "")
    assert result.requeue_after is not None, "not stalled: retried at retryInterval"
    stalled = [c for c in world.get("deps")["status"]["conditions"] if c["type"] == "Stalled"]
    assert all(c["status"] != "True" for c in stalled)
    assert not [r for r in world.cluster.requests if "/namespaces/other/" in r.path]


def test_a_cycle_message_names_only_this_namespaces_stagesets(world: World) -> None:
    world.cluster.grant(TENANT, "/apis/stages.metio.wtf/v1/namespaces/other/stagesets/", "get")
    world.commit({"app/cm.json": configmap("x")})
    world.stageset(
        "ping", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "secret-plan", "namespace": "other"}]
    )
    world.cluster.put(
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "secret-plan", "namespace": "other"},
            "spec": {"stages": [{"name": "x", "sourceRef": {"name": "x"}}]},
        }
    )
    world.index.update(("other", "secret-plan"), [(NS, "ping")])
    world.reconcile("ping")
    ready = world.ready("ping")
    assert ready["reason"] == "Stalled"
    assert f"{NS}/ping" in ready["message"]
    assert "secret-plan" not in ready["message"]
    assert "(a StageSet in another namespace)" in ready["message"]


def test_the_dependency_of_a_stageset_is_read_as_its_service_account(world: World) -> None:
    world.commit({"app/cm.json": configmap("x"), "db/cm.json": configmap("y")})
    world.stageset("db", [{"name": "app", "path": "./db"}])
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "db"}])
    world.reconcile("app")
    assert world.ready("app")["reason"] == "DependencyNotReady"
    assert ("get", stageset_path("db"), False) in verbs(world.cluster.by(TENANT))
    world.reconcile("db")
    world.reconcile("app")
    assert world.ready("app")["status"] == "True"


def test_a_drifted_object_is_restored_and_reported(world: World) -> None:
    world.commit({"app/cm.json": configmap("edited", "git")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    world.cluster.edit(f"{CM}/edited", lambda o: o.update(data={"k": "by hand"}))
    world.reconcile("shop")
    assert world.configmap("edited")["data"] == {"k": "git"}  # type: ignore[index]
    events = [o for p, o in world.cluster.objects.items() if "/events/" in p and o["type"] == "Warning"]
    assert [(e["reason"], e["type"]) for e in events] == [("DriftCorrected", "Warning")]
    assert "ConfigMap shop/edited" in events[0]["note"]


def test_a_stage_failure_reason_wins_by_priority_and_requeues_at_retry_interval(world: World) -> None:
    world.commit({"ok/cm.json": configmap("fine"), "bad/README.md": "no manifests"})
    world.stageset(
        "shop",
        [{"name": "ok", "path": "./ok", "dependsOn": []}, {"name": "bad", "path": "./bad", "dependsOn": []}],
        retryInterval="2m",
    )
    result = world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", Reason.STAGE_FAILED)
    assert result.requeue_after == 120.0
    assert world.phases("shop") == {"ok": "Ready", "bad": "Failed"}
    assert world.configmap("fine") is not None, "an independent branch still ran"


def remote_world(world: World) -> FakeCluster:
    import base64

    import yaml

    remote = FakeCluster(name="prod.example")
    remote.grant_namespace(TENANT, NS)
    world.pool.clusters["prod.example"] = remote
    kubeconfig = yaml.safe_dump(
        {
            "current-context": "prod",
            "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "u"}}],
            "clusters": [{"name": "prod", "cluster": {"server": "https://prod.example:6443"}}],
            "users": [{"name": "u", "user": {"token": "t0k3n"}}],
        }
    )
    world.cluster.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "prod", "namespace": NS},
            "data": {"value": base64.b64encode(kubeconfig.encode()).decode()},
        }
    )
    world.commit({"app/cm.json": configmap("remote")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "prod"}})
    return remote


def test_remote_cluster_requests_go_to_the_remote_as_the_same_service_account(world: World) -> None:
    remote = remote_world(world)
    world.reconcile("shop")

    assert world.ready("shop")["status"] == "True"
    assert ("get", f"/api/v1/namespaces/{NS}/secrets/prod", False) in verbs(world.cluster.by(TENANT))
    assert world.configmap("remote") is None
    assert ("apply", f"{CM}/remote", False) in verbs(remote.by(TENANT))


@pytest.mark.parametrize(
    ("failure", "how"),
    [
        ("unreachable", "connection refused"),
        ("unauthorized", "answered HTTP 401 Unauthorized"),
        ("not an apiserver", "answered HTTP 502"),
    ],
)
def test_a_failing_remote_cluster_gets_a_short_condition_and_backs_off(
    world: World, failure: str, how: str
) -> None:
    from stageset.kube.client import ApiError, UnreachableError, _api_error

    remote = remote_world(world)
    world.reconcile("shop")
    inventory = world.get("shop")["status"]["inventory"]
    world.commit({"app/cm.json": configmap("remote", "v2")})
    errors: dict[str, Exception] = {
        "unreachable": UnreachableError(server="https://prod.example:6443", why="connection refused"),
        "unauthorized": _api_error(
            401, b'{"kind": "Status", "reason": "Unauthorized", "message": "REMOTE-BODY"}'
        ),
        "not an apiserver": _api_error(502, b"<html>REMOTE-BODY from a proxy</html>"),
    }
    remote.down = errors[failure]
    # A new process: discovery of the remote is not cached yet.
    world.reconciler = world.make_reconciler()
    result = world.reconcile("shop")

    assert result.backoff
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "ClusterUnreachable")
    assert ready["message"] == (
        "spec.kubeConfig: the cluster at https://prod.example:6443 cannot be used: "
        f"{how}; retrying with backoff; runbook: https://stageset.github.io/stageset/runbooks/clusterunreachable/"
    )
    assert "REMOTE-BODY" not in json.dumps(world.get("shop"))
    assert world.get("shop")["status"]["inventory"] == inventory, "nothing forgotten"
    assert isinstance(errors["unauthorized"], ApiError)


def test_a_remote_cluster_failing_mid_pass_keeps_what_the_pass_applied_before_it(world: World) -> None:
    """The pass's progress is a local value of the runner; a remote failure in the second stage
    still writes the status as the pass stood: the first stage applied, its objects in the inventory."""
    from stageset.kube.client import UnreachableError

    remote = remote_world(world)
    world.commit({"app/cm.json": configmap("remote"), "later/cm.json": configmap("second")})
    world.stageset("shop", [{"name": "app", "path": "./app"},
                            {"name": "later", "path": "./later", "dependsOn": ["app"]}],
                   kubeConfig={"secretRef": {"name": "prod"}})
    broken = UnreachableError(server="https://prod.example:6443", why="connection reset")
    failing: dict[tuple[str, str, bool | None], Exception] = {("apply", f"{CM}/second", None): broken}
    remote.failures.update(failing)  # type: ignore[arg-type]  # the connection breaks: not an ApiError

    result = world.reconcile("shop")

    assert result.backoff
    assert world.ready("shop")["reason"] == "ClusterUnreachable"
    assert remote.get(f"{CM}/remote") is not None
    assert world.phases("shop")["app"] == "Ready"
    inventory = {s["name"]: s for s in world.get("shop")["status"]["inventory"]}
    assert "app" in inventory, "what the first stage applied is not forgotten"
    assert any("remote" in json.dumps(entry) for entry in inventory["app"]["entries"])


def test_secret_values_never_reach_status_events_or_logs(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    import base64

    from stageset.controller.redact import LogRedactor, go_quote
    from stageset.kube.client import ApiError

    value = 'Not "a" label!'
    world.cluster.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "vars", "namespace": NS},
            "data": {"tier": base64.b64encode(value.encode()).decode()},
        }
    )
    world.commit(
        {
            "app/cm.json": '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c",'
            ' "labels": {"tier": "${tier}"}}}'
        }
    )
    echo = f'ConfigMap "c" is invalid: metadata.labels: Invalid value: "{go_quote(value)}": a valid label ...'
    world.cluster.failures[("apply", f"{CM}/c", True)] = ApiError(status=422, reason="Invalid", message=echo)
    world.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "postBuild": {"substituteFrom": [{"kind": "Secret", "name": "vars"}]},
            }
        ],
    )
    caplog.handler.addFilter(LogRedactor())
    world.reconcile("shop")
    logging.getLogger("test").warning("apiserver said: %s", echo)

    ready = world.ready("shop")
    assert ready["reason"] == "StageFailed"
    assert 'Invalid value: "***"' in ready["message"]
    everything = (
        json.dumps(
            [world.get("shop")["status"], [o for p, o in world.cluster.objects.items() if "/events/" in p]]
        )
        + caplog.text
    )
    for form in (value, go_quote(value), json.dumps(value)[1:-1]):
        assert form not in everything
    assert "apiserver said: ConfigMap" in caplog.text


def test_a_reference_field_stored_before_its_rule_is_invalid_spec_naming_it(world: World) -> None:
    # The fake apiserver runs no CEL: what the models re-check is all that stands between a
    # StageSet stored under an older CRD and an apply that ignores what it asks for.
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app", "errorBudget": {
        "source": {"prometheus": {"address": "http://prometheus:9090", "query": "slo:budget"}}}}])
    world.reconcile("shop")

    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.stages.0: errorBudget (freezing a stage on its SLO error "
                                       "budget) is not supported by this controller; remove it")
    assert world.cluster.by(TENANT) == []  # nothing read or applied as the tenant


def test_a_stageset_without_interval_runs_at_the_default_interval(world: World) -> None:
    world.reconciler = world.make_reconciler(default_interval=90.0)
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    assert world.reconcile("shop").requeue_after == 90.0
    world.stageset("shop", [{"name": "app", "path": "./app"}], interval="45s")
    assert world.reconcile("shop").requeue_after == 45.0


def test_a_tenant_that_may_not_list_gets_the_dry_run_path_in_warm_passes(world: World) -> None:
    world.cluster.grants.clear()
    world.cluster.grant_namespace(TENANT, NS, "get,create,apply,patch,delete")
    world.commit({"app/a.json": configmap("a"), "app/b.json": configmap("b")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    world.cluster.clear()
    world.clock.advance(600)

    world.reconcile("shop")

    assert world.cluster.writes() == []
    tenant = verbs(world.cluster.by(TENANT))
    assert tenant[:2] == [  # a routine pass: its writes showed its rights, no dry-run first
        ("get", f"/apis/stages.metio.wtf/v1/namespaces/{NS}/gitrepositories/app", False),
        ("list", CM, False),  # denied: nothing is assumed unchanged
    ]
    assert sorted(tenant[2:]) == [  # each object read and dry-run (in parallel), as before
        ("apply", f"{CM}/a", True), ("apply", f"{CM}/b", True), ("get", f"{CM}/a", False),
        ("get", f"{CM}/b", False)]


def test_rights_taken_away_are_denied_at_the_next_requested_or_due_pass_though_nothing_changed(
        world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    world.cluster.grants.clear()
    world.cluster.grant_namespace(TENANT, NS, "get,list,watch")  # view: may still list
    world.cluster.clear()
    world.clock.advance(600)

    # A routine pass 10 minutes on trusts the rights its writes showed: nothing to write, no question.
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    # Asked for, the pass checks them — and so does the first routine pass an hour after they were
    # last shown (--rights-recheck-interval).
    request_reconcile(world, "shop", "2026-11-27T12:00:00Z")
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "RBACDenied"
    assert [r for r in world.cluster.by(TENANT) if r.write and not r.dry_run] == []

    world.cluster.grant_namespace(TENANT, NS, "get,list,watch,create,apply,patch,delete")
    request_reconcile(world, "shop", "2026-11-27T12:01:00Z")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    world.cluster.grants.clear()
    world.cluster.grant_namespace(TENANT, NS, "get,list,watch")
    world.clock.advance(3601)
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "RBACDenied"
    assert [r for r in world.cluster.by(TENANT) if r.write and not r.dry_run] == []
