"""One Event per object per pass: which event heads it, its note and revision, and the recorder's
pass (listeners hear every event at once; the apiserver gets one Event per object when it ends)."""

from __future__ import annotations

import contextvars
import datetime
import threading
from typing import Any

import pytest

from stageset.api import eventnote
from stageset.api.vocabulary import EventReason, EventType, Reason
from stageset.controller.events import (
    MAX_NOTE,
    EventRecorder,
    ObjectEvent,
    Recorded,
    headline,
    normal,
    pass_note,
    pass_revision,
    warning,
)
from stageset.controller.redact import REGISTRY

OBJ: dict[str, Any] = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                       "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"}}
OTHER: dict[str, Any] = {**OBJ, "metadata": {"name": "api", "namespace": "shop", "uid": "u-2"}}

DRIFT = warning(OBJ, EventReason.DRIFT_CORRECTED, "stage 'app': restored ConfigMap shop/a", action="Apply")
SUCCESS = normal(OBJ, EventReason.RECONCILIATION_SUCCEEDED, "ConfigMap/shop/a configured",
                 revision="main@sha1:new")
FAILED = warning(OBJ, Reason.STAGE_FAILED, "stage 'db' failed", revision="main@sha1:bad")
PROMOTED = normal(OBJ, EventReason.PROMOTED, "stage 'staging' promoted (its soak ended)", action="Promote")
RESUMED = normal(OBJ, EventReason.RESUMED, "reconciliation resumed (spec.suspend is false)")
DEFERRED = normal(OBJ, EventReason.UPDATE_DEFERRED, "held", revision="main@sha1:held")
WAVE_A = normal(OBJ, EventReason.WAVE_OPENED, "wave a opened", action="Rollout")
WAVE_B = normal(OBJ, EventReason.WAVE_OPENED, "wave b opened", action="Rollout")


@pytest.mark.parametrize(("told", "head", "others"), [
    # A Warning heads; among Warnings the Ready failure (the state the pass left), then the others.
    ([DRIFT, SUCCESS], DRIFT, [SUCCESS]),
    ([DRIFT, FAILED], FAILED, [DRIFT]),
    # Among Normals what made the pass more than routine heads; the success it explains follows.
    ([PROMOTED, SUCCESS], PROMOTED, [SUCCESS]),
    ([SUCCESS, RESUMED], RESUMED, [SUCCESS]),
    # Equals: the first told; an exact repeat is told once.
    ([WAVE_A, WAVE_B, WAVE_A], WAVE_A, [WAVE_B]),
    ([SUCCESS], SUCCESS, []),
])
def test_the_most_important_event_heads_the_others_follow_in_the_order_told(
        told: list[ObjectEvent], head: ObjectEvent, others: list[ObjectEvent]) -> None:
    assert headline(told) == (head, others)


@pytest.mark.parametrize(("told", "revision"), [
    ([DRIFT, SUCCESS], "main@sha1:new"),  # the headline names none: what the success applied
    ([DEFERRED, SUCCESS], "main@sha1:new"),  # what the dashboard shows as applied, not the held one
    ([FAILED, DRIFT], "main@sha1:bad"),
    ([DRIFT, PROMOTED], ""),
])
def test_a_passs_event_is_annotated_with_what_its_success_applied_else_its_headlines_revision(
        told: list[ObjectEvent], revision: str) -> None:
    assert pass_revision(*headline(told)) == revision


def keep(text: str) -> str:
    return text


def test_the_note_names_every_other_event_and_reads_back_part_by_part() -> None:
    note = pass_note(DRIFT.message, [("ReconciliationSucceeded", SUCCESS.message), ("Promoted", "p")],
                     limit=MAX_NOTE, redact=keep)
    assert note == ("stage 'app': restored ConfigMap shop/a; also ReconciliationSucceeded: "
                    "ConfigMap/shop/a configured; also Promoted: p")
    assert eventnote.split("DriftCorrected", note) == [
        ("DriftCorrected", DRIFT.message), ("ReconciliationSucceeded", SUCCESS.message), ("Promoted", "p")]


def test_the_note_is_bounded_and_every_named_reason_survives_a_long_headline() -> None:
    others = [("ReconciliationSucceeded", "y" * 900)] + [("WaveOpened", f"wave {i}") for i in range(10)]
    note = pass_note("x" * 5000, others, limit=MAX_NOTE, redact=keep)
    assert len(note) <= MAX_NOTE
    parts = eventnote.split("DriftCorrected", note)
    # The headline and the first NAMED others named (each at least "Reason: ..."); 3 more counted.
    assert [reason for reason, _ in parts] == ["DriftCorrected", "ReconciliationSucceeded",
                                               *["WaveOpened"] * (eventnote.NAMED - 1)]
    assert note.endswith("; and 3 more")
    assert parts[0][1].startswith("xxx")
    assert parts[0][1].endswith("...")
    # A short headline leaves its room to the others, in order.
    roomy = pass_note("short", [("ReconciliationSucceeded", "y" * 900)], limit=MAX_NOTE, redact=keep)
    assert roomy == "short; also ReconciliationSucceeded: " + "y" * 900


def test_the_note_is_redacted_part_by_part_and_whole() -> None:
    secret = "s3cr; also ReconciliationSucceeded: et"  # a value only the joined note spells

    def redact(text: str) -> str:
        return text.replace("s3cret", "***").replace(secret, "***")

    note = pass_note("value s3cret and s3cr", [("ReconciliationSucceeded", "et here"),
                                               ("Promoted", "s3cret " + "z" * 2000)],
                     limit=MAX_NOTE, redact=redact)
    assert "s3cret" not in note
    assert "s3cr" not in note, note
    assert len(note) <= MAX_NOTE


def test_split_reads_an_event_of_one_part_as_it_is() -> None:
    assert eventnote.split("ReconciliationSucceeded", "ConfigMap/shop/a configured; and 2 more") == [
        ("ReconciliationSucceeded", "ConfigMap/shop/a configured; and 2 more")]
    assert eventnote.split("X", "a; also NotAReason: b") == [("X", "a; also NotAReason: b")]


# -- the recorder's pass -------------------------------------------------------------------------


class Recording:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        self.requests.append((method, path, body))
        return {}

    def posts(self) -> list[dict[str, Any]]:
        return [body for method, _, body in self.requests if method == "POST"]


class Clock:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now


def recorder() -> tuple[EventRecorder, Recording, list[Recorded], Clock]:
    client, clock = Recording(), Clock()
    heard: list[Recorded] = []
    return EventRecorder(client, clock=clock, instance="test", listener=heard.append), client, heard, clock  # type: ignore[arg-type]


def test_a_pass_records_one_event_per_object_and_tells_the_listeners_each_at_once() -> None:
    events, client, heard, _ = recorder()
    with events.one_pass():
        events.emit(DRIFT)
        events.emit(normal(OTHER, EventReason.RECONCILIATION_SUCCEEDED, "ConfigMap/shop/b created"))
        events.emit(SUCCESS)
        # Notifications filter by reason: each event is told as it happens, nothing recorded yet.
        assert [(e.regarding["name"], e.reason) for e in heard] == [
            ("web", "DriftCorrected"), ("api", "ReconciliationSucceeded"), ("web", "ReconciliationSucceeded")]
        assert heard[2].annotations == {"stages.metio.wtf/revision": "main@sha1:new"}
        assert client.requests == []
    posts = client.posts()
    assert [(p["regarding"]["name"], p["type"], p["reason"], p["action"]) for p in posts] == [
        ("web", "Warning", "DriftCorrected", "Apply"),
        ("api", "Normal", "ReconciliationSucceeded", "Reconcile")]
    assert posts[0]["note"] == (
        "stage 'app': restored ConfigMap shop/a; also ReconciliationSucceeded: ConfigMap/shop/a configured")
    assert posts[0]["metadata"]["annotations"] == {"stages.metio.wtf/revision": "main@sha1:new"}
    assert posts[1]["note"] == "ConfigMap/shop/b created"
    assert "annotations" not in posts[1]["metadata"]


def test_the_same_pass_again_counts_on_its_events_series_and_is_not_told_again() -> None:
    events, client, heard, clock = recorder()
    for _ in range(2):
        with events.one_pass():
            events.emit(DRIFT)
            events.emit(SUCCESS)
        clock.now += datetime.timedelta(minutes=1)
    assert [m for m, _, _ in client.requests] == ["POST", "PATCH"]
    assert client.requests[1][2]["series"]["count"] == 2
    assert len(heard) == 2, "each event told once within the window"


def test_a_pass_that_tells_one_thing_records_it_as_outside_a_pass() -> None:
    inside, in_client, _, _ = recorder()
    with inside.one_pass():
        inside.emit(FAILED)
    outside, out_client, _, _ = recorder()
    outside.emit(FAILED)
    strip = [{k: v for k, v in p.items() if k != "metadata"} for p in in_client.posts()]
    assert strip == [{k: v for k, v in p.items() if k != "metadata"} for p in out_client.posts()]
    assert in_client.posts()[0]["metadata"]["annotations"] == out_client.posts()[0]["metadata"]["annotations"]


def test_a_passs_stage_threads_tell_into_it_and_a_late_event_is_recorded_on_its_own() -> None:
    events, client, _, _ = recorder()
    with events.one_pass():
        with events.one_pass():  # nested: the outer pass records
            events.emit(DRIFT)
        context = contextvars.copy_context()  # as the stage scheduler hands a stage its context
        stage = threading.Thread(target=context.run, args=(events.emit, SUCCESS))
        stage.start()
        stage.join()
        assert client.requests == []
    assert len(client.posts()) == 1
    # A thread the pass left behind tells after it ended: recorded at once, never lost.
    late = threading.Thread(target=context.run, args=(events.emit, PROMOTED))
    late.start()
    late.join()
    assert [p["reason"] for p in client.posts()] == ["DriftCorrected", "Promoted"]


def test_a_passs_note_passes_the_objects_redactor() -> None:
    events, client, heard, _ = recorder()
    REGISTRY.set(("StageSet", "shop", "web"), {"hunter22secret"})
    try:
        with events.one_pass():
            events.emit(DRIFT)
            events.emit(normal(OBJ, EventReason.PROMOTED, "token hunter22secret"))
    finally:
        REGISTRY.drop(("StageSet", "shop", "web"))
    assert "hunter22secret" not in str(client.requests)
    assert "hunter22secret" not in str(heard)
    assert "; also Promoted: token " in client.posts()[0]["note"]


def test_a_fault_recording_a_passs_events_never_fails_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    events, client, heard, _ = recorder()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(events, "_record_pass", broken)
    with events.one_pass():
        events.emit(SUCCESS)
    assert client.requests == []
    assert [e.type for e in heard] == [EventType.NORMAL], "told all the same"
