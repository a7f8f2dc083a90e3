"""Prune, rule by rule (``apply/prune``, the one home the controller, teardown and ``diff`` share), and
what the controller reports about it (``Changes``) — each without a reconciler."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from stageset.api import StageInventory, StageSet
from stageset.api.vocabulary import EventReason, EventType
from stageset.apply.changeset import Action, Change, ChangeSet
from stageset.apply.inventory import ObjectId, Stale, entry, stage_inventory
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, PRUNE_OPT_OUT
from stageset.apply.prune import (
    Deletion,
    Owner,
    PruneResult,
    candidates,
    deletable,
    delete_owned,
    prune,
    unpruned_stages,
)
from stageset.controller.events import ObjectEvent
from stageset.controller.metrics import Metrics
from stageset.controller.redact import Redactor
from stageset.controller.stageset.changes import Changes
from stageset.kube.client import ApiError
from stageset.kube.mapping import Resource
from tests.recording import RecordingClient

OWNER = Owner("shop", "app")
CM = "/api/v1/namespaces/shop/configmaps"


def live(name: str = "a", *, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         deleting: bool = False) -> dict[str, Any]:
    ours = {LABEL_NAME: "app", LABEL_NAMESPACE: "shop"}
    metadata: dict[str, Any] = {"name": name, "namespace": "shop"}
    metadata["labels"] = ours if labels is None else labels
    if annotations:
        metadata["annotations"] = annotations
    if deleting:
        metadata["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}


@pytest.mark.parametrize(("case", "obj", "expected"), [
    ("ours", live(), True),
    ("adopted: owner labels removed", live(labels={}), False),
    ("another StageSet's", live(labels={LABEL_NAME: "other", LABEL_NAMESPACE: "shop"}), False),
    ("the same name in another namespace", live(labels={LABEL_NAME: "app", LABEL_NAMESPACE: "other"}), False),
    ("opted out by annotation", live(annotations={PRUNE_OPT_OUT: "disabled"}), False),
    ("opted out by label",
     live(labels={LABEL_NAME: "app", LABEL_NAMESPACE: "shop", PRUNE_OPT_OUT: "disabled"}), False),
    ("an opt-out that says something else", live(annotations={PRUNE_OPT_OUT: "enabled"}), True),
])
def test_deletable_means_ours_and_not_opted_out(case: str, obj: dict[str, Any], expected: bool) -> None:
    assert deletable(obj, OWNER) is expected, case


def inventory(stage: str, *names: str, account: str | None = "deployer") -> StageInventory:
    ids = [ObjectId("shop", n, "", "ConfigMap") for n in names]
    return stage_inventory(stage, account, [entry(i, version="v1", digest=None) for i in ids])


def stageset(**prune: bool) -> StageSet:
    stages = [{"name": name, "sourceRef": {"name": "src"}, "prune": value} for name, value in prune.items()]
    return StageSet.model_validate({"metadata": {"name": "app", "namespace": "shop"},
                                    "spec": {"serviceAccountName": "deployer", "stages": stages}})


@pytest.mark.parametrize(("case", "spec", "expected"), [
    ("rendered by no stage now, and a removed stage's objects", {"app": True}, ["app:b", "gone:c"]),
    ("prune: false keeps a stage's objects", {"app": False}, ["gone:c"]),
])
def test_candidates_are_what_no_stage_renders_outside_prune_false_stages(case: str, spec: dict[str, bool],
                                                                         expected: list[str]) -> None:
    old = {"app": inventory("app", "a", "b"), "gone": inventory("gone", "c")}
    new = {"app": inventory("app", "a")}
    found = candidates(old=old, new=new, stageset=stageset(**spec))
    assert [f"{c.stage}:{c.id.name}" for c in found] == expected, case
    assert unpruned_stages(stageset(**spec)) == [n for n, v in spec.items() if not v]


class Served:
    """The apply engine's kind -> path step: ConfigMaps are served, nothing else."""

    def resolve(self, obj: dict[str, Any], namespace: str) -> tuple[dict[str, Any], Resource | None]:
        del namespace  # every object here names its own
        if obj["kind"] != "ConfigMap":
            return obj, None
        return obj, Resource(group="", version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)


@pytest.mark.parametrize(("case", "stored", "failures", "kind", "expected", "deleted"), [
    ("ours: deleted", live(), {}, "ConfigMap", Deletion.DELETING, True),
    ("being deleted: not deleted again", live(deleting=True), {}, "ConfigMap", Deletion.DELETING, False),
    ("no longer ours: released, never deleted", live(labels={}), {}, "ConfigMap", Deletion.RELEASED, False),
    ("opted out: released", live(annotations={PRUNE_OPT_OUT: "disabled"}), {}, "ConfigMap", Deletion.RELEASED,
     False),
    ("gone already", None, {}, "ConfigMap", Deletion.GONE, False),
    ("its kind is no longer served", live(), {}, "Widget", Deletion.GONE, False),
    ("cannot be read: kept and retried", live(), {"GET": 403}, "ConfigMap", Deletion.FAILED, False),
    ("cannot be deleted: kept and retried", live(), {"DELETE": 403}, "ConfigMap", Deletion.FAILED, False),
    ("gone between the read and the delete", live(), {"DELETE": 404}, "ConfigMap", Deletion.GONE, False),
])
def test_deleting_one_inventoried_object(case: str, stored: dict[str, Any] | None, failures: dict[str, int],
                                         kind: str, expected: Deletion, deleted: bool) -> None:
    client = RecordingClient()
    if stored is not None:
        client.put(f"{CM}/a", stored)
    for method, status in failures.items():
        client.failures[(method, f"{CM}/a")] = ApiError(status=status, reason="", message="no")
    item = entry(ObjectId("shop", "a", "", kind), version="v1", digest=None)
    outcome = delete_owned(client=client, applier=Served(), item=item, owner=OWNER)  # type: ignore[arg-type]
    assert outcome is expected, case
    assert (("DELETE", f"{CM}/a") in [(m, p) for m, p, _ in client.requests] and "DELETE" not in failures) \
        is deleted, case


def test_prune_keeps_what_it_could_not_delete_and_what_it_may_no_longer_delete_as() -> None:
    client = RecordingClient()
    for name in ("ours", "stuck"):
        client.put(f"{CM}/{name}", live(name))
    client.failures[("DELETE", f"{CM}/stuck")] = ApiError(status=403, reason="Forbidden", message="no")
    old = {"app": inventory("app", "ours", "stuck"), "legacy": inventory("legacy", "mine", account=None)}
    result = prune(stale=candidates(old=old, new={}, stageset=stageset(app=True, legacy=True)),
                   client_for=lambda account: client if account else None, applier=Served(),  # type: ignore[arg-type]
                   owner=OWNER)
    assert [(c.id.name, c.action) for c in result.changes] == [(("ours"), Action.DELETED)]
    assert sorted(k.id.name for k in result.kept) == ["mine", "stuck"], \
        "applied as the controller, which multi-tenant mode forbids now: kept, never orphaned"


# -- what the controller reports about prune --------------------------------------------------

class Events:
    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    def emit(self, event: ObjectEvent) -> None:
        """The typed event as the fields it carries."""
        self.emitted.append({"on": event.subject.name, "type_": event.type, "reason": event.reason,
                             "message": event.message, "action": event.action,
                             "annotations": event.annotations})


OBJ = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
       "metadata": {"name": "app", "namespace": "shop"}}


def changes() -> tuple[Changes, Events, Metrics]:
    events, metrics = Events(), Metrics()
    metrics.observe(("StageSet", "shop", "app"), OBJ)
    return Changes(events=events, metrics=metrics), events, metrics  # type: ignore[arg-type]


def change(name: str, action: Action, *, drift: bool = False) -> Change:
    return Change(id=ObjectId("shop", name, "", "ConfigMap"), action=action, drift=drift)


def test_prune_is_counted_and_what_it_could_not_delete_is_a_warning() -> None:
    reported, events, metrics = changes()
    stuck = Stale(stage="app", service_account="deployer",
                  entry=entry(ObjectId("shop", "stuck", "", "ConfigMap"), version="v1", digest=None))
    result = PruneResult(changes=ChangeSet([change("a", Action.DELETED), change("b", Action.SKIPPED)]),
                         kept=[stuck])
    assert reported.pruned(OBJ, result, Redactor()) == 1
    [event] = events.emitted
    assert (event["type_"], event["reason"]) == (EventType.WARNING, EventReason.PRUNE_FAILED)
    assert event["message"] == "could not delete 1 object(s) no longer in Git: ConfigMap shop/stuck"
    def count(result: str) -> float | None:
        labels = {"namespace": "shop", "name": "app", "result": result, "tenant": ""}
        return metrics.registry.get_sample_value("stageset_objects_pruned_total", labels)

    assert (count("deleted"), count("failed")) == (1, 1)
    assert reported.pruned(OBJ, PruneResult(), Redactor()) == 0
    assert len(events.emitted) == 1, "nothing kept: no event"


def test_success_names_every_change_since_ready_once_and_drift_is_a_warning() -> None:
    reported, events, _ = changes()
    applied = SimpleNamespace(changes=ChangeSet([change("a", Action.CREATED), change("b", Action.CONFIGURED,
                                                                                     drift=True)]))
    reported.applied(OBJ, "app", applied, Redactor())  # type: ignore[arg-type]
    [drift] = events.emitted
    assert (drift["reason"], drift["message"]) == (EventReason.DRIFT_CORRECTED,
                                                   "stage 'app': restored ConfigMap shop/b")
    reported.succeeded(OBJ, was_ready=False, stages=1, pruned=1, revision="r1", redactor=Redactor())
    success = events.emitted[-1]
    assert success["reason"] is EventReason.RECONCILIATION_SUCCEEDED
    assert "ConfigMap/shop/a created" in success["message"]
    assert success["annotations"] == {"stages.metio.wtf/revision": "r1"}
    # Ready again with nothing new: no event; turning Ready with nothing new: says so.
    reported.succeeded(OBJ, was_ready=True, stages=1, pruned=0, revision="r1", redactor=Redactor())
    assert len(events.emitted) == 2
    reported.succeeded(OBJ, was_ready=False, stages=2, pruned=0, revision="r2", redactor=Redactor())
    assert events.emitted[-1]["message"] == "no changes; 2 stage(s) ready at r2"
