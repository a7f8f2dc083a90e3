"""What a Warn StageSet says about drift (``stageset/controller/drift/report.py``)."""

from __future__ import annotations

from stageset.api import DriftedObject, DriftMode, StageSetStatus
from stageset.api.vocabulary import ConditionType, Reason
from stageset.apply.changeset import Action, Change
from stageset.apply.inventory import ObjectId
from stageset.controller.drift.report import message, reported

WEB = ObjectId(namespace="shop", name="web", group="apps", kind="Deployment")
CM = ObjectId(namespace="shop", name="a", group="", kind="ConfigMap")
NOW = "2026-11-29T09:00:00Z"


def left(oid: ObjectId, *fields: str, gone: bool = False) -> Change:
    return Change(id=oid, action=Action.SKIPPED, drift=True, fields=fields, gone=gone)


def drifted(status: StageSetStatus) -> list[tuple[str, str, list[str], bool | None]]:
    return [(e.stage, e.id, e.fields, e.deleted) for e in status.drifted]


def test_warn_lists_what_was_left_names_it_in_the_condition_and_tells_what_is_new_once() -> None:
    first = reported(
        StageSetStatus(),
        written={"app": [left(WEB, "spec.replicas"), Change(CM, Action.UNCHANGED)]},
        stages=["app"],
        mode=DriftMode.WARN,
        generation=3,
        now=NOW,
    )
    assert drifted(first.status) == [("app", WEB.encode(), ["spec.replicas"], None)]
    [condition] = [c for c in first.status.conditions if c.type == ConditionType.DRIFTED]
    assert (condition.status, condition.reason, condition.observed_generation) == (
        "True",
        Reason.DRIFT_DETECTED,
        3,
    )
    assert "Deployment shop/web (spec.replicas)" in condition.message
    assert [e.id for e in first.new] == [WEB.encode()]
    # The next pass finds the same drift: nothing new to tell, the condition's time kept.
    again = reported(
        first.status,
        written={"app": [left(WEB, "spec.replicas")]},
        stages=["app"],
        mode=DriftMode.WARN,
        generation=3,
        now="2026-11-29T09:05:00Z",
    )
    assert again.new == ()
    assert [c.last_transition_time for c in again.status.conditions] == [condition.last_transition_time]
    # More drift (another object deleted): that one is new.
    more = reported(
        again.status,
        written={"app": [left(WEB, "spec.replicas"), left(CM, gone=True)]},
        stages=["app"],
        mode=DriftMode.WARN,
        generation=3,
        now=NOW,
    )
    assert [(e.id, e.deleted) for e in more.new] == [(CM.encode(), True)]
    assert "ConfigMap shop/a (deleted" in next(c.message for c in more.status.conditions)


def test_a_stage_not_applied_this_pass_keeps_what_status_said_and_a_removed_stage_says_nothing() -> None:
    status = StageSetStatus(
        drifted=[
            DriftedObject(stage="db", id=CM.encode(), fields=["data.k"]),
            DriftedObject(stage="gone", id=WEB.encode(), fields=["spec.replicas"]),
        ]
    )
    found = reported(
        status, written={"app": []}, stages=["app", "db"], mode=DriftMode.WARN, generation=1, now=NOW
    )
    assert drifted(found.status) == [("db", CM.encode(), ["data.k"], None)]
    assert found.new == ()


def test_correct_mode_clears_the_list_and_the_condition() -> None:
    warned = reported(
        StageSetStatus(),
        written={"app": [left(WEB, "spec.replicas")]},
        stages=["app"],
        mode=DriftMode.WARN,
        generation=1,
        now=NOW,
    )
    corrected = reported(
        warned.status, written={}, stages=["app"], mode=DriftMode.CORRECT, generation=2, now=NOW
    )
    assert corrected.status.drifted == []
    assert not [c for c in corrected.status.conditions if c.type == ConditionType.DRIFTED]
    assert corrected.count == 0


def test_the_message_is_bounded_and_counts_all() -> None:
    many = [
        DriftedObject(
            stage="app", id=ObjectId("shop", f"cm-{i}", "", "ConfigMap").encode(), fields=["data.k"]
        )
        for i in range(30)
    ]
    text = message(many[:20], count=30)
    assert text.startswith("30 objects differ")
    assert text.count("ConfigMap shop/cm-") == 10
    assert text.endswith("and 20 more")
