"""Steering a release through the real reconciler, in process, on a clock the test moves: soak and
manual gates, update windows, rollback (and a rollback resumed after a restart), each with the
requests it makes and as whom."""

from __future__ import annotations

import json
from typing import Any

from stageset.api.fleet import ANNOTATION_FLEET_RELEASE, FleetRelease
from stageset.api.vocabulary import Reason
from tests.inprocess.conftest import NS, TENANT, World, configmap, deployment, stageset_path

CM = f"/api/v1/namespaces/{NS}/configmaps"


def stage_status(world: World, name: str, stage: str) -> dict[str, Any]:
    stages = (world.get(name).get("status") or {}).get("stages", [])
    found: dict[str, Any] = next(s for s in stages if s["name"] == stage)
    return found


def annotate(world: World, name: str, key: str, value: str) -> None:
    with world.cluster._lock:
        live = world.cluster.objects[stageset_path(name)]
        live["metadata"].setdefault("annotations", {})[key] = value


def events(world: World, reason: str) -> list[dict[str, Any]]:
    prefix = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
    return [o for p, o in world.cluster.objects.items() if p.startswith(prefix) and o["reason"] == reason]


def fail_rollout(world: World, name: str) -> None:
    world.cluster.set_status(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}", {
        "observedGeneration": 1, "conditions": [{"type": "Progressing", "status": "False",
                                                 "reason": "ProgressDeadlineExceeded",
                                                 "message": "crash loop"}]})


def recover(world: World, name: str) -> None:
    world.roll_out(name)
    world.cluster.set_status(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}", {"conditions": [
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]})


def test_a_soak_holds_the_dependent_until_it_ends_and_a_flap_restarts_it(world: World) -> None:
    world.commit({"staging/web.json": deployment("web"), "prod/cm.json": configmap("prod")})
    world.stageset("shop", [{"name": "staging", "path": "./staging", "promotion": {"soak": "10m"}},
                            {"name": "prod", "path": "./prod"}])
    world.reconcile("shop")
    world.roll_out("web")
    result = world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "Soaking")
    gate = stage_status(world, "shop", "staging")["promotionState"]
    assert gate["phase"] == "Soaking"
    assert gate["soakUntil"] == "2030-01-01T00:10:00Z"
    assert world.configmap("prod") is None
    assert result.requeue_after == 30.0  # checked while soaking, to see a flap

    # A flap at minute 5 restarts the soak from the next time the stage is Ready.
    world.clock.advance(300)
    world.cluster.set_status(f"/apis/apps/v1/namespaces/{NS}/deployments/web", {
        "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0,
        "availableReplicas": 0})
    world.reconcile("shop")
    assert "soakUntil" not in stage_status(world, "shop", "staging").get("promotionState", {})
    world.roll_out("web")
    world.clock.advance(60)
    world.reconcile("shop")
    assert stage_status(world, "shop", "staging")["promotionState"]["soakUntil"] == "2030-01-01T00:16:00Z"
    world.clock.advance(599)
    world.reconcile("shop")
    assert world.configmap("prod") is None

    world.clock.advance(1)
    world.reconcile("shop")
    assert world.configmap("prod") is not None
    assert world.ready("shop")["status"] == "True"
    assert stage_status(world, "shop", "staging")["promotionState"]["phase"] == "Promoted"
    [promoted] = events(world, "Promoted")
    assert "its soak ended" in promoted["note"]
    # The same revision stays promoted: a later pass does not soak again.
    world.clock.advance(600)
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "Succeeded"


def test_a_manual_gate_is_released_once_by_a_promote_token_for_the_revision_it_waits_at(world: World) -> None:
    world.commit({"staging/cm.json": configmap("staging"), "prod/cm.json": configmap("prod")})
    gated = {"name": "staging", "path": "./staging", "promotion": {"requireManualPromotion": True}}
    world.stageset("shop", [gated, {"name": "prod", "path": "./prod"}])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "AwaitingPromotion"
    assert stage_status(world, "shop", "staging")["promotionState"]["phase"] == "AwaitingManual"
    assert world.configmap("prod") is None

    annotate(world, "shop", "stages.metio.wtf/promote", "staging@t1")
    world.reconcile("shop")
    assert world.configmap("prod") is not None
    assert stage_status(world, "shop", "staging")["lastHandledPromotion"] == "t1"
    assert world.ready("shop")["status"] == "True"

    # A new revision waits again; the old token does not promote it.
    world.commit({"staging/cm.json": configmap("staging", "v2"), "prod/cm.json": configmap("prod", "v2")})
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "AwaitingPromotion"
    assert json.loads(json.dumps(world.configmap("prod")))["data"]["k"] == "v"
    # A token naming a stage that waits for nothing is acted on (once), and promotes nothing.
    annotate(world, "shop", "stages.metio.wtf/promote", "prod@t2")
    world.reconcile("shop")
    assert stage_status(world, "shop", "prod")["lastHandledPromotion"] == "t2"
    assert [e["note"] for e in events(world, "PromotionIgnored")] == [
        "stage 'prod' was not waiting for a promotion (phase Pending); nothing promoted"]
    assert world.configmap("prod")["data"]["k"] == "v"  # type: ignore[index]
    # Each revision the gate waits at is told once (a notification reaches whoever promotes), with
    # the revision it waits at: the first, then the second; passes that keep waiting tell nothing.
    world.reconcile("shop")
    waiting = events(world, "AwaitingPromotion")
    revisions = [e["metadata"]["annotations"]["stages.metio.wtf/revision"] for e in waiting]
    assert len(waiting) == 2
    assert len(set(revisions)) == 2
    assert all("stage 'staging' is Ready at" in e["note"] for e in waiting)


def test_a_closed_window_keeps_the_applied_revision_corrected_and_holds_the_new_one(world: World) -> None:
    first = world.commit({"app/cm.json": configmap("app", "v1")})
    world.stageset("shop", [{"name": "app", "path": "./app"}],
                   updateWindows=[{"type": "Deny", "from": "2030-01-01T01:00:00Z",
                                   "to": "2030-01-01T02:00:00Z"}])
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v1"  # type: ignore[index]

    world.clock.advance(3600)  # inside the Deny window
    world.commit({"app/cm.json": configmap("app", "v2")})
    with world.cluster._lock:  # someone changes the applied object meanwhile
        world.cluster.objects[f"{CM}/app"]["data"]["k"] = "drifted"
    result = world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("True", "UpdateDeferred")
    assert "until 2030-01-01T02:00:00Z" in ready["message"]
    assert world.configmap("app")["data"]["k"] == "v1"  # type: ignore[index]
    status = world.get("shop")["status"]
    assert status["pendingUpdate"]["nextWindowOpens"] == "2030-01-01T02:00:00Z"
    assert status["stages"][0]["revision"].endswith(first)
    assert result.requeue_after is not None
    assert result.requeue_after <= 3600.5
    assert len(events(world, "UpdateDeferred")) == 1

    world.clock.advance(3600)
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v2"  # type: ignore[index]
    assert "pendingUpdate" not in world.get("shop")["status"]
    assert world.ready("shop")["reason"] == "Succeeded"


def test_a_failed_release_is_rolled_back_dependents_first_and_parked(world: World) -> None:
    world.commit({"db/cm.json": configmap("schema", "v1"), "app/web.json": deployment("web"),
                  "app/cfg.json": configmap("cfg", "v1")})
    world.stageset("shop", [{"name": "db", "path": "./db"}, {"name": "app", "path": "./app"}],
                   rollbackOnFailure=True)
    world.reconcile("shop")
    world.roll_out("web")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    good = world.get("shop")["status"]["lastAppliedSnapshot"]
    assert [s["stage"] for s in good] == ["db", "app"]

    # The new release changes the schema, adds an object and breaks the app.
    world.commit({"db/cm.json": configmap("schema", "v2"), "db/extra.json": configmap("extra"),
                  "app/web.json": deployment("web"), "app/cfg.json": configmap("cfg", "v2")})
    world.cluster.clear()
    fail_rollout(world, "web")
    world.reconcile("shop")

    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "RolledBack")
    assert "stage 'app' failed" in ready["message"]
    assert "rollout failed" in ready["message"]
    assert world.configmap("schema")["data"]["k"] == "v1"  # type: ignore[index]
    assert world.configmap("extra") is None  # what the new revision added is pruned
    record = world.get("shop")["status"]["rollback"]
    assert record["phase"] == "RolledBack"
    assert record["restored"] == {"app": good[1]["revision"], "db": good[0]["revision"]}
    # Dependents first, every write as the tenant.
    tenant_writes = [(r.verb, r.path) for r in world.cluster.by(TENANT) if not r.dry_run
                     and r.verb in ("apply", "delete")]
    def last(path: str) -> int:
        return max(i for i, write in enumerate(tenant_writes) if write == ("apply", path))
    # The rollback writes last: app's objects restored before db's.
    assert last(f"{CM}/cfg") < last(f"{CM}/schema")
    assert world.configmap("cfg")["data"]["k"] == "v1"  # type: ignore[index]
    assert ("delete", f"{CM}/extra") in tenant_writes
    assert [e["type"] for e in events(world, "RolledBack")] == ["Warning"]

    # Parked: the failed revision is not applied again while the source offers it (the restored
    # Deployment rolls out again, as the deployment controller would make it).
    recover(world, "web")
    world.cluster.clear()
    world.clock.advance(600)
    world.reconcile("shop")
    assert world.configmap("schema")["data"]["k"] == "v1"  # type: ignore[index]
    assert world.ready("shop")["reason"] == "RolledBack"
    assert not [r for r in world.cluster.writes() if r.path == f"{CM}/schema"]

    # A new revision tries again.
    world.commit({"db/cm.json": configmap("schema", "v3"), "app/web.json": deployment("web")})
    world.roll_out("web")
    world.reconcile("shop")
    world.reconcile("shop")
    assert world.configmap("schema")["data"]["k"] == "v3"  # type: ignore[index]
    assert world.ready("shop")["status"] == "True"
    assert "rollback" not in world.get("shop")["status"]


def test_a_rollback_left_mid_way_resumes_with_the_stages_still_to_restore(world: World) -> None:
    world.commit({"db/cm.json": configmap("schema", "v1"), "app/web.json": deployment("web")})
    world.stageset("shop", [{"name": "db", "path": "./db"}, {"name": "app", "path": "./app"}],
                   rollbackOnFailure=True)
    world.reconcile("shop")
    world.roll_out("web")
    world.reconcile("shop")
    good = {s["stage"]: s["revision"] for s in world.get("shop")["status"]["lastAppliedSnapshot"]}
    failed = world.commit({"db/cm.json": configmap("schema", "v2"), "app/web.json": deployment("web")})
    # As if the controller stopped after restoring app: status says db is still to restore.
    with world.cluster._lock:
        live = world.cluster.objects[stageset_path("shop")]
        live["status"]["rollback"] = {"phase": "RollingBack", "remaining": ["db"],
                                      "restored": {"app": good["app"]}, "message": "stage 'app' failed",
                                      "failed": {"db": f"main@sha1:{failed}", "app": f"main@sha1:{failed}"},
                                      "generation": live["metadata"]["generation"]}
    world.cluster.clear()
    world.reconcile("shop")  # the rollback is resumed before anything else
    assert world.configmap("schema")["data"]["k"] == "v1"  # type: ignore[index]
    applied = [r.path for r in world.cluster.by(TENANT) if r.verb == "apply" and not r.dry_run]
    assert f"/apis/apps/v1/namespaces/{NS}/deployments/web" not in applied  # not re-applied
    assert world.get("shop")["status"]["rollback"]["phase"] == "RolledBack"
    assert world.ready("shop")["reason"] == Reason.ROLLED_BACK.value


def test_a_rollback_without_the_last_good_revision_touches_nothing(world: World) -> None:
    world.commit({"app/web.json": deployment("web")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], rollbackOnFailure=True)
    world.reconcile("shop")
    world.roll_out("web")
    world.reconcile("shop")
    world.sources.served.clear()  # the mirror lost every commit (evicted)
    world.commit({"app/web.json": deployment("web"), "app/cm.json": configmap("new")})
    fail_rollout(world, "web")
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "PreviousRevisionUnavailable")
    assert "nothing was rolled back" in ready["message"]
    assert world.configmap("new") is not None


def test_a_dependency_must_reach_a_version_tag_at_or_above_min_version(world: World) -> None:
    world.commit({"app/cm.json": configmap("app")})
    world.stageset("db", [{"name": "db", "path": "./app"}])
    world.stageset("shop", [{"name": "app", "path": "./app"}],
                   dependsOn=[{"name": "db", "minVersion": "5.2.0"}])
    sha = "0123456789abcdef0123456789abcdef01234567"

    def dependency_at(revision: str, **status: Any) -> None:
        generation = world.get("db")["metadata"]["generation"]
        world.cluster.set_status(stageset_path("db"), {
            "lastAppliedRevision": revision, **status,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "",
                            "observedGeneration": generation, "lastTransitionTime": "2030-01-01T00:00:00Z"}]})

    dependency_at(f"main@sha1:{sha}")
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "DependencyNotReady")
    assert f"StageSet {NS}/db applied main@sha1:{sha}, which is not a version tag" in ready["message"]
    dependency_at(f"v5.1.9@sha1:{sha}")
    world.reconcile("shop")
    assert "is at version 5.1.9, minVersion needs 5.2.0 or later" in world.ready("shop")["message"]
    dependency_at(f"v5.2.1@sha1:{sha}", pendingUpdate={"revisions": {f"{NS}/app": "v6"}})
    world.reconcile("shop")
    assert "new revision held back by its update windows" in world.ready("shop")["message"]
    dependency_at(f"v5.2.1@sha1:{sha}", pendingUpdate=None)
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"


def test_a_frozen_stageset_applies_nothing_but_is_still_torn_down(world: World) -> None:
    world.commit({"app/cm.json": configmap("app", "v1")})
    world.stageset("shop", [{"name": "app", "path": "./app"}], windowScope="All",
                   updateWindows=[{"type": "Deny", "from": "2030-01-01T01:00:00Z",
                                   "to": "2030-01-02T00:00:00Z"}])
    world.reconcile("shop")
    world.clock.advance(3600)
    with world.cluster._lock:  # drift during the hard freeze is left alone
        world.cluster.objects[f"{CM}/app"]["data"]["k"] = "drifted"
    world.commit({"app/cm.json": configmap("app", "v2")})
    world.cluster.clear()
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("True", "UpdateDeferred")
    assert "stage(s) app held by the update windows until 2030-01-02T00:00:00Z" in ready["message"]
    assert world.configmap("app")["data"]["k"] == "drifted"  # type: ignore[index]
    assert not [r for r in world.cluster.by(TENANT) if r.verb == "apply"]
    # Deleting it is never held: its objects go.
    with world.cluster._lock:
        live = world.cluster.objects[stageset_path("shop")]
        live["metadata"]["deletionTimestamp"] = "2030-01-01T01:00:00Z"
    for _ in range(5):
        world.reconcile("shop")
        if world.configmap("app") is None:
            break
    assert world.configmap("app") is None


def test_a_soak_check_does_not_flap_ready_or_write_status(world: World) -> None:
    world.commit({"staging/cm.json": configmap("staging"), "prod/cm.json": configmap("prod")})
    world.stageset("shop", [{"name": "staging", "path": "./staging", "promotion": {"soak": "10m"}},
                            {"name": "prod", "path": "./prod"}])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "Soaking"
    world.clock.advance(30)
    world.cluster.clear()
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "Soaking"
    status_writes = [r for r in world.cluster.writes() if r.path.endswith("/status")]
    assert status_writes == []  # no "applying stages" in between, nothing new to write
    # The soaking stage stays applied: drift is corrected while it soaks.
    with world.cluster._lock:
        world.cluster.objects[f"{CM}/staging"]["data"]["k"] = "drifted"
    world.clock.advance(30)
    world.reconcile("shop")
    assert world.configmap("staging")["data"]["k"] == "v"  # type: ignore[index]
    assert world.configmap("prod") is None


def test_a_release_rolled_back_past_a_gate_is_not_held_by_it_again(world: World) -> None:
    world.commit({"staging/cm.json": configmap("staging", "v1"), "prod/web.json": deployment("web")})
    world.stageset("shop", [{"name": "staging", "path": "./staging",
                             "promotion": {"requireManualPromotion": True}},
                            {"name": "prod", "path": "./prod"}], rollbackOnFailure=True)
    world.reconcile("shop")
    annotate(world, "shop", "stages.metio.wtf/promote", "staging@t1")
    world.reconcile("shop")
    recover(world, "web")
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    world.commit({"staging/cm.json": configmap("staging", "v2"), "prod/web.json": deployment("web")})
    world.reconcile("shop")
    annotate(world, "shop", "stages.metio.wtf/promote", "staging@t2")
    fail_rollout(world, "web")
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "RolledBack"
    assert world.configmap("staging")["data"]["k"] == "v1"  # type: ignore[index]
    gate = stage_status(world, "shop", "staging")["promotionState"]
    assert (gate["phase"], gate["promotedBy"]) == ("Promoted", "rollback")
    # Parked passes correct drift at the last good revision without a new promotion.
    recover(world, "web")
    world.clock.advance(600)
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "RolledBack"


def test_a_member_a_rollout_selects_holds_new_revisions_until_that_rollouts_release_is_on_it(
        world: World) -> None:
    world.commit({"app/cm.json": configmap("app", "v1")})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v1"  # type: ignore[index]

    # A rollout selects it (the controller's watch says so) but has written no release on it: its
    # first decision has not reached it yet, or a tenant removed the annotation.
    world.rollouts[(NS, "shop")] = ["web"]
    world.commit({"app/cm.json": configmap("app", "v2")})
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v1"  # type: ignore[index]
    pending = world.get("shop")["status"]["pendingUpdate"]
    assert pending["fleetRollout"] == "web"
    assert "until it releases a revision" in world.ready("shop")["message"]

    # A release of another rollout does not count; the selecting rollout's does, exactly.
    annotate(world, "shop", ANNOTATION_FLEET_RELEASE,
             FleetRelease(rollout="other", wave="all", revisions=pending["revisions"]).encode())
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v1"  # type: ignore[index]
    # Issue 43 item 1: what the rollout released is what its *status* records (the controller's,
    # on a subresource no tenant writes); the annotation alone — which the tenant can write — no
    # longer releases anything, and it must say what the status records.
    released = FleetRelease(rollout="web", wave="canary", revisions=pending["revisions"])
    annotate(world, "shop", ANNOTATION_FLEET_RELEASE, released.encode())
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v1", "a forged annotation releases nothing"  # type: ignore[index]
    world.fleet_records[(NS, "shop")] = {"web": released}
    annotate(world, "shop", ANNOTATION_FLEET_RELEASE,
             FleetRelease(rollout="web", wave="canary", revisions={}).encode())
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v1", "an edited annotation holds"  # type: ignore[index]
    assert "does not say what the rollout released" in world.ready("shop")["message"]
    annotate(world, "shop", ANNOTATION_FLEET_RELEASE, released.encode())
    world.reconcile("shop")
    assert world.configmap("app")["data"]["k"] == "v2"  # type: ignore[index]
    assert "pendingUpdate" not in world.get("shop")["status"]
