"""Events: the change-set summary, Ready transitions, and series aggregation as client-go's."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from stageset.api.vocabulary import EventReason, EventType, Reason
from stageset.apply.changeset import Action, Change
from stageset.apply.inventory import ObjectId
from stageset.controller.events import (
    EventRecorder,
    ReadyWarnings,
    Recorded,
    Subscription,
    change_summary,
    failing_revision,
    normal,
    ready_transition,
    warning,
)
from stageset.kube.client import ApiError


def change(kind: str, name: str, action: Action, namespace: str = "shop") -> Change:
    return Change(ObjectId(namespace=namespace, name=name, group="", kind=kind), action)


def test_the_summary_names_what_was_written_then_counts_prunes() -> None:
    changes = [
        change("Deployment", "web", Action.CREATED),
        change("ConfigMap", "x", Action.CONFIGURED),
        change("ConfigMap", "same", Action.UNCHANGED),
        change("Namespace", "shop", Action.CREATED, ""),
    ]
    assert (
        change_summary(changes, pruned=2)
        == "ConfigMap/shop/x configured, Deployment/shop/web created, Namespace/shop created, 2 pruned"
    )
    assert change_summary([change("ConfigMap", "same", Action.UNCHANGED)]) == ""
    many = [change("ConfigMap", f"c{i:02}", Action.CREATED) for i in range(12)]
    assert change_summary(many).endswith("ConfigMap/shop/c09 created, and 2 more")


@pytest.mark.parametrize(
    ("before", "after", "told"),
    [
        (None, {"status": "False", "reason": "RBACDenied"}, True),
        ({"status": "True", "reason": "Succeeded"}, {"status": "False", "reason": "StageFailed"}, True),
        ({"status": "Unknown", "reason": "Progressing"}, {"status": "False", "reason": "StageFailed"}, True),
        ({"status": "False", "reason": "StageFailed"}, {"status": "False", "reason": "StageFailed"}, False),
        ({"status": "False", "reason": "StageFailed"}, {"status": "False", "reason": "RBACDenied"}, True),
        ({"status": "False", "reason": "StageFailed"}, {"status": "True", "reason": "Succeeded"}, False),
        ({"status": "True", "reason": "Succeeded"}, None, False),
    ],
)
def test_a_warning_is_told_when_ready_turns_false(before: Any, after: Any, told: bool) -> None:
    assert ready_transition(before, after) is told


class Recording:
    """A client that records requests and answers as an apiserver would."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.gone: set[str] = set()

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        self.requests.append((method, path, body))
        if method == "PATCH" and path.rsplit("/", 1)[1] in self.gone:
            raise ApiError(status=404, reason="NotFound", message="gone")
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now


OBJ = {
    "apiVersion": "stages.metio.wtf/v1",
    "kind": "StageSet",
    "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
}


def test_repeats_patch_one_events_series_until_the_window_passes() -> None:
    client, clock = Recording(), Clock()
    recorder = EventRecorder(client, clock=clock, instance="test")  # type: ignore[arg-type]
    for _ in range(3):
        recorder.emit(warning(OBJ, Reason.STAGE_FAILED, "boom"))
        clock.now += datetime.timedelta(minutes=1)
    creates = [r for r in client.requests if r[0] == "POST"]
    patches = [r for r in client.requests if r[0] == "PATCH"]
    assert len(creates) == 1
    assert [p[2]["series"]["count"] for p in patches] == [2, 3]
    created = creates[0][2]
    assert created["regarding"] == {
        "apiVersion": "stages.metio.wtf/v1",
        "kind": "StageSet",
        "name": "web",
        "namespace": "shop",
        "uid": "u-1",
    }
    assert (created["type"], created["reason"], created["note"], created["action"]) == (
        "Warning",
        "StageFailed",
        "boom",
        "Reconcile",
    )
    assert created["eventTime"] == "2026-01-01T00:00:00.000000Z"
    assert all(p[1].endswith("/" + created["metadata"]["name"]) for p in patches)
    # A different note is another event; a quiet window starts a new one.
    recorder.emit(warning(OBJ, Reason.STAGE_FAILED, "other"))
    clock.now += datetime.timedelta(minutes=7)
    recorder.emit(warning(OBJ, Reason.STAGE_FAILED, "boom"))
    assert len([r for r in client.requests if r[0] == "POST"]) == 3


def test_an_expired_event_is_created_again_and_notes_are_redacted_and_bounded() -> None:
    client, clock = Recording(), Clock()
    recorder = EventRecorder(client, clock=clock, instance="test")  # type: ignore[arg-type]
    recorder.emit(normal(OBJ, EventReason.RECONCILIATION_SUCCEEDED, "value=s3cr3t " + "x" * 2000,
                         redact=lambda text: text.replace("s3cr3t", "***")))
    first = client.requests[0][2]
    assert first["note"].startswith("value=*** ")
    assert len(first["note"]) == 1024
    client.gone.add(first["metadata"]["name"])
    recorder.emit(normal(OBJ, EventReason.RECONCILIATION_SUCCEEDED, "value=s3cr3t " + "x" * 2000,
                         redact=lambda text: text.replace("s3cr3t", "***")))
    assert [r[0] for r in client.requests] == ["POST", "PATCH", "POST"]
    assert "s3cr3t" not in str(client.requests)


def test_forget_ends_an_objects_series() -> None:
    client, clock = Recording(), Clock()
    recorder = EventRecorder(client, clock=clock, instance="test")  # type: ignore[arg-type]
    recorder.emit(warning(OBJ, Reason.STAGE_FAILED, "boom"))
    recorder.forget("shop", "web")
    recorder.emit(warning(OBJ, Reason.STAGE_FAILED, "boom"))
    assert [r[0] for r in client.requests] == ["POST", "POST"]


def test_a_repeat_at_another_revision_is_a_new_event_never_folded_into_the_old_one() -> None:
    # A revert: A, then B, then A again within the window.  Each event must keep the revision it
    # reports; a repeat of A at A may count on A's event, never on B's.
    client, clock = Recording(), Clock()
    recorder = EventRecorder(client, clock=clock, instance="test")  # type: ignore[arg-type]

    def succeeded(revision: str) -> None:
        recorder.emit(normal(OBJ, EventReason.RECONCILIATION_SUCCEEDED, "ConfigMap/shop/x configured",
                             revision=revision))
        clock.now += datetime.timedelta(seconds=30)

    for revision in ("main@sha1:aaa", "main@sha1:bbb", "main@sha1:aaa"):
        succeeded(revision)
    creates = [r for r in client.requests if r[0] == "POST"]
    assert [c[2]["metadata"]["annotations"]["stages.metio.wtf/revision"] for c in creates] == [
        "main@sha1:aaa",
        "main@sha1:bbb",
    ]
    patches = [r for r in client.requests if r[0] == "PATCH"]
    assert len(patches) == 1
    assert patches[0][1].endswith("/" + creates[0][2]["metadata"]["name"])  # A's own event


def test_a_listener_hears_each_new_event_redacted_never_a_repeat_and_never_fails_the_emit() -> None:
    client, clock = Recording(), Clock()
    heard: list[Recorded] = []
    recorder = EventRecorder(client, clock=clock, instance="test", listener=heard.append)  # type: ignore[arg-type]
    obj = {**OBJ, "metadata": {**OBJ["metadata"], "labels": {"team": "a"}}}  # type: ignore[dict-item]
    for _ in range(3):
        recorder.emit(warning(obj, Reason.STAGE_FAILED, "token s3cret!",
                              redact=lambda text: text.replace("s3cret!", "***"), revision="main@sha1:abc"))
    assert len(heard) == 1, "a repeat folded into the series is not told again"
    told = heard[0]
    assert (told.type, told.reason, told.note) == (EventType.WARNING, "StageFailed", "token ***")
    assert told.regarding == {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "namespace": "shop",
                              "name": "web", "uid": "u-1"}
    assert told.labels == {"team": "a"}
    assert told.annotations == {"stages.metio.wtf/revision": "main@sha1:abc"}

    def broken(_: Recorded) -> None:
        raise RuntimeError("listener bug")

    failing = EventRecorder(client, clock=clock, instance="test", listener=broken)  # type: ignore[arg-type]
    failing.emit(normal(OBJ, EventReason.NEW_ARTIFACT, "x"))
    assert client.requests[-1][0] == "POST", "the event is recorded all the same"


@pytest.mark.parametrize(("stages", "attempted", "revision"), [
    # A failed stage: what the pass attempted for it, not what status says it last applied.
    ([{"name": "a", "phase": "Failed", "revision": "main@sha1:old"}, {"name": "b", "phase": "Ready"}],
     {"a": "main@sha1:new", "b": "main@sha1:other"}, "main@sha1:new"),
    ([{"name": "a", "phase": "Pending"}], {"a": "main@sha1:new", "b": "v1@sha1:b"},
     "main@sha1:new, v1@sha1:b"),
    ([{"name": "a", "phase": "Failed", "revision": "main@sha1:old"}], {}, "main@sha1:old"),
    ([], {}, ""),
])
def test_a_failure_names_the_revision_its_pass_attempted(stages: list[dict[str, str]],
                                                        attempted: dict[str, str], revision: str) -> None:
    assert failing_revision({"status": {"stages": stages}}, attempted) == revision


def test_attempted_revisions_are_kept_per_stageset_and_forgotten_with_it() -> None:
    recorder = EventRecorder(Recording(), clock=Clock(), instance="test")  # type: ignore[arg-type]
    recorder.attempting("shop", "web", {"a": "main@sha1:1"})
    assert recorder.attempted("shop", "web") == {"a": "main@sha1:1"}
    assert recorder.attempted("shop", "api") == {}
    recorder.forget("shop", "web")
    assert recorder.attempted("shop", "web") == {}


def ready(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {**OBJ, "status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
                                              "message": message}]}}


@pytest.mark.parametrize(("before", "after", "told"), [
    (ready("True", "Succeeded"), ready("False", "StageFailed", "boom"), "StageFailed"),
    (ready("False", "StageFailed"), ready("False", "StageFailed"), None),  # no transition
    (ready("True", "Succeeded"), ready("False", "Soaking"), None),  # a hold the reconciler asked for
    (ready("True", "Succeeded"), ready("False", "NotAReason"), None),  # not our vocabulary: not told
    (ready("False", "StageFailed"), ready("True", "Succeeded"), None),
])
def test_the_ready_policy_a_controller_declares_tells_a_warning_when_ready_turns_false(
        before: dict[str, Any], after: dict[str, Any], told: str | None) -> None:
    heard: list[Recorded] = []
    recorder = EventRecorder(Recording(), clock=Clock(), instance="test", listener=heard.append)  # type: ignore[arg-type]
    ReadyWarnings(recorder)(("StageSet", "shop", "web"), before, after)
    assert [(e.type, e.reason, e.note) for e in heard] == \
        ([] if told is None else [(EventType.WARNING, told, "boom")])


def test_the_stagesets_ready_policy_names_the_revision_that_failed_others_none() -> None:
    heard: list[Recorded] = []
    recorder = EventRecorder(Recording(), clock=Clock(), instance="test", listener=heard.append)  # type: ignore[arg-type]
    ReadyWarnings(recorder, revision=lambda _: "main@sha1:new")(
        ("StageSet", "shop", "web"), ready("True", "Succeeded"), ready("False", "StageFailed", "boom"))
    ReadyWarnings(recorder)(("GitRepository", "shop", "web"), ready("True", "Succeeded"),
                            ready("False", "GitOperationFailed", "boom"))
    assert [e.annotations for e in heard] == [{"stages.metio.wtf/revision": "main@sha1:new"}, {}]


def test_a_subscription_hears_the_kinds_it_declared_and_no_other() -> None:
    every: list[Recorded] = []
    stagesets: list[Recorded] = []
    recorder = EventRecorder(Recording(), clock=Clock(), instance="test", listener=every.append)  # type: ignore[arg-type]
    recorder.subscribe(Subscription(kinds=frozenset({"StageSet"}), tell=stagesets.append))
    recorder.emit(normal(OBJ, EventReason.RECONCILIATION_SUCCEEDED, "x"))
    recorder.emit(normal({**OBJ, "kind": "GitRepository"}, EventReason.NEW_ARTIFACT, "y"))
    assert [e.note for e in every] == ["x", "y"]
    assert [e.regarding["kind"] for e in stagesets] == ["StageSet"]
