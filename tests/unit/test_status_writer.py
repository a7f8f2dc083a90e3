"""The one writer of status (and, for a StageSet, its record and finalizer), without any reconciler:
what it writes, when it writes nothing, and that it never changes the object it was given."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest

from stageset.api import Condition, StageInventory, StageSet, StageSetStatus
from stageset.api.vocabulary import ConditionStatus, Reason, StagePhase
from stageset.apply.errors import StageError
from stageset.apply.record import ANNOTATION, Record, StageRecord
from stageset.controller.kinds import STAGESETS
from stageset.controller.stageset.plan import Previous, StageOutcome
from stageset.controller.stageset.progress import PROGRESS_INTERVAL, Progress, shown
from stageset.controller.stageset.writer import PassWriter
from stageset.controller.status import StatusWriter
from stageset.kube.client import ApiError
from stageset.kube.types import KubeObject
from tests.recording import RecordingClient

PATH = STAGESETS.object_path(name="shop", namespace="shop")
T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
RUNBOOKS = "https://stages.metio.wtf/runbooks/"


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stageset(status: dict[str, Any] | None = None, **metadata: Any) -> KubeObject:
    obj: KubeObject = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                       "metadata": {"name": "shop", "namespace": "shop", "generation": 2, **metadata},
                       "spec": {"stages": [{"name": "app", "sourceRef": {"name": "app"}}]}}
    if status is not None:
        obj["status"] = status
    return obj


def writers(obj: KubeObject, *, redact: Any = None, ticks: Ticks | None = None
            ) -> tuple[PassWriter, RecordingClient, list[KubeObject], KubeObject]:
    """A writer of ``obj`` as the cache holds it (stored on the fake); what it tells ``on_write``."""
    client = RecordingClient()
    cached = client.put(PATH, obj)
    told: list[KubeObject] = []
    status = StatusWriter(client=client, resource=STAGESETS, obj=cached, model=StageSetStatus,
                          clock=lambda: T0, redact=redact or (lambda text: text), runbook_base_url=RUNBOOKS,
                          on_write=told.append)
    writer = PassWriter(status=status, client=client, resource=STAGESETS, ticks=ticks or Ticks())
    return writer, client, told, cached


def ready_true(generation: int = 2) -> dict[str, Any]:
    return {"observedGeneration": generation, "conditions": [
        Condition(type="Ready", status=ConditionStatus.TRUE, reason="Succeeded", message="applied",
                  observed_generation=generation, last_transition_time="2029-01-01T00:00:00Z"
                  ).model_dump(mode="json", by_alias=True, exclude_none=True)]}


def test_a_write_is_a_merge_patch_of_the_status_subresource_and_the_given_object_stays_as_it_was() -> None:
    writer, client, told, cached = writers(stageset({"lastAppliedRevision": "old", "stages": []}))
    before = copy.deepcopy(cached)

    writer.conclude(ready=False, reason=Reason.STAGE_FAILED, message="stage 'app': boom")

    assert cached == before, "the object handed over is never changed"
    [(method, path, body)] = client.writes()
    assert (method, path) == ("PATCH", PATH + "/status")
    assert body["status"]["lastAppliedRevision"] == "old"
    assert body["status"]["observedGeneration"] == 2
    [ready] = [c for c in body["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["message"] == "stage 'app': boom; runbook: https://stages.metio.wtf/runbooks/stagefailed/"
    # The object as written goes to the listener and is the writer's from now on.
    [after] = told
    assert after is writer.obj
    assert after["metadata"]["resourceVersion"] == client.objects[PATH]["metadata"]["resourceVersion"]
    assert after["status"] == client.objects[PATH]["status"]


def test_nothing_changed_writes_nothing_and_a_removed_field_is_nulled() -> None:
    writer, client, told, _ = writers(stageset({"lastAppliedRevision": "r1"}))
    writer.inventory([])
    assert client.writes() == [], "the status as read: nothing to write"
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied")
    again = len(client.writes())
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied")
    assert len(client.writes()) == again == 1, "the same status twice is one write"
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied",
                    status=writer.status.model_copy(update={"last_applied_revision": None}))
    assert client.writes()[-1][2]["status"]["lastAppliedRevision"] is None
    assert len(told) == 2


def test_every_message_is_redacted_before_it_is_cut_and_the_runbook_link_survives() -> None:
    secret = "hunter2"
    writer, client, _, _ = writers(stageset(), redact=lambda text: text.replace(secret, "***"))
    progress = Progress.start(parse_stageset(), Previous.from_status(StageSetStatus(), generation=2))
    progress = progress.with_outcome(StageOutcome("app", StagePhase.FAILED, Reason.STAGE_FAILED,
                                                  f"value {secret} refused"))
    long = "x" * 40000 + secret
    writer.conclude(ready=False, reason=Reason.STAGE_FAILED, message=long,
                    status=progress_status(writer, progress))
    text = json.dumps(client.writes()[-1][2])
    assert secret not in text
    [ready] = [c for c in client.objects[PATH]["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["message"].endswith("; runbook: https://stages.metio.wtf/runbooks/stagefailed/")
    assert len(ready["message"]) <= 32768
    assert client.objects[PATH]["status"]["stages"][0]["message"] == "value *** refused"


def test_conditions_summarize_from_where_the_reconcile_began() -> None:
    # Ready=True since 2029; a pass announces itself (Unknown), then ends Ready again: the
    # transition time is the one it began with, not the announcement's.
    writer, client, _, _ = writers(stageset(ready_true()))
    progress = Progress.start(parse_stageset(), Previous.from_status(writer.status, generation=2))
    writer.announce(progress, "applying stages")
    writer.show(progress, quiet=False)  # the announcement is written with the first progress shown
    assert condition(client, "Ready")["status"] == "Unknown"
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied")
    assert condition(client, "Ready")["lastTransitionTime"] == "2029-01-01T00:00:00Z"


def test_requested_at_is_recorded_with_the_first_write() -> None:
    writer, client, _, _ = writers(stageset(annotations={"reconcile.fluxcd.io/requestedAt": "now-please"}))
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied")
    assert client.objects[PATH]["status"]["lastHandledReconcileAt"] == "now-please"


def test_an_object_gone_meanwhile_is_no_error() -> None:
    writer, client, told, _ = writers(stageset())
    del client.objects[PATH]
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied")
    writer.record(Record({"app": StageRecord("sa")}))
    assert told == []


def test_a_quiet_pass_writes_nothing_until_its_conclusion() -> None:
    writer, client, _, _ = writers(stageset(ready_true()))
    progress = Progress.start(parse_stageset(), Previous.from_status(writer.status, generation=2))
    writer.announce(progress, "applying stages")
    writer.show(progress.applying("app"), quiet=True)
    writer.waiting(progress.outcomes["app"], progress.with_outcome(waiting("web: 0/1")), quiet=True)
    assert client.writes() == []
    # The same calls in a pass that is not quiet write (the test above can fail).
    writer.show(progress.applying("app"), quiet=False)
    assert client.writes() != []


@pytest.mark.parametrize(("case", "before", "after", "seconds", "writes"), [
    ("a stage starts waiting: at once", StagePhase.APPLYING, ("Waiting", "0/3 ready"), 0.1, True),
    ("a new message soon after a write: not yet", StagePhase.WAITING, ("Waiting", "1/3 ready"), 1.0, False),
    ("a new message later: shown", StagePhase.WAITING, ("Waiting", "1/3 ready"), PROGRESS_INTERVAL, True),
    ("the same message: never", StagePhase.WAITING, ("Waiting", "0/3 ready"), 60.0, False),
])
def test_waiting_is_shown_at_once_and_its_messages_throttled(case: str, before: StagePhase,
                                                             after: tuple[str, str], seconds: float,
                                                             writes: bool) -> None:
    ticks = Ticks()
    writer, client, _, _ = writers(stageset(), ticks=ticks)
    progress = Progress.start(parse_stageset(), Previous.from_status(writer.status, generation=2))
    progress = progress.with_outcome(StageOutcome("app", before, message="0/3 ready"))
    writer.announce(progress, "applying stages")
    writer.show(progress, quiet=False)  # the last write: now
    count = len(client.writes())
    ticks.now += seconds
    was = progress.outcomes["app"]
    writer.waiting(was, progress.with_outcome(StageOutcome("app", StagePhase(after[0]), message=after[1])),
                   quiet=False)
    assert (len(client.writes()) > count) is writes, case


def test_the_record_is_written_only_when_it_changes_and_removed_when_empty() -> None:
    writer, client, told, cached = writers(stageset())
    record = Record({"app": StageRecord("deployer")})
    writer.record(record)
    writer.record(record)
    writer.record(None)
    [(method, path, body)] = client.writes()
    assert (method, path) == ("PATCH", PATH)
    assert json.loads(body["metadata"]["annotations"][ANNOTATION]) == json.loads(record.encode())
    assert writer.obj["metadata"]["annotations"][ANNOTATION] == record.encode()
    writer.record(Record({}))
    assert client.writes()[-1][2] == {"metadata": {"annotations": {ANNOTATION: None}}}
    assert ANNOTATION not in writer.obj["metadata"]["annotations"]
    assert "annotations" not in cached["metadata"]
    assert len(told) == 2


def test_the_finalizer_tests_the_version_the_last_write_made() -> None:
    writer, client, _, cached = writers(stageset())
    writer.conclude(ready=None, reason=Reason.PROGRESSING, message="applying stages")
    writer.finalizer(present=True)
    writer.finalizer(present=True)  # present already: nothing to do
    [(_, _, status), (_, path, patch)] = client.writes()
    assert path == PATH
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "101"}, \
        "the version the status write made, not the cached one"
    assert client.objects[PATH]["metadata"]["finalizers"] == ["stages.metio.wtf/teardown"]
    assert "finalizers" not in cached["metadata"]
    writer.finalizer(present=False)
    assert client.objects[PATH]["metadata"]["finalizers"] == []
    assert status["status"]["conditions"]


def test_a_finalizer_race_is_reported_to_be_retried() -> None:
    writer, client, _, _ = writers(stageset())
    client.failures[("PATCH", PATH)] = ApiError(status=409, reason="Conflict", message="changed")
    with pytest.raises(StageError) as raised:
        writer.finalizer(present=True)
    assert raised.value.reason is Reason.PROGRESSING


# -- helpers ----------------------------------------------------------------------------------

def parse_stageset() -> StageSet:
    return StageSet.model_validate({**stageset(), "status": None})


def progress_status(writer: PassWriter, progress: Progress) -> StageSetStatus:
    return shown(writer.status, progress)


def waiting(message: str) -> StageOutcome:
    return StageOutcome("app", StagePhase.WAITING, Reason.PROGRESSING, message)


def condition(client: RecordingClient, type_: str) -> dict[str, Any]:
    return next(c for c in client.objects[PATH]["status"]["conditions"] if c["type"] == type_)


def test_inventory_writes_what_teardown_left() -> None:
    writer, client, _, _ = writers(stageset({"inventory": [{"name": "app", "entries": []}]}))
    writer.inventory([StageInventory(name="web")])
    assert client.objects[PATH]["status"]["inventory"] == [{"name": "web", "entries": []}]


def test_a_pass_that_shows_no_progress_writes_its_status_once() -> None:
    writer, client, _, _ = writers(stageset())
    progress = Progress.start(parse_stageset(), Previous.from_status(writer.status, generation=2))
    writer.finalizer(present=True, deferred=True)
    writer.announce(progress, "applying stages")
    assert client.writes() == [], "both wait for the pass's first write"
    writer.record(Record({"app": StageRecord("deployer")}), before_apply=True)
    [(_, path, patch)] = client.writes()
    # One optimistic patch before anything is applied: the finalizer and the record.
    assert path == PATH
    assert patch["metadata"]["finalizers"] == ["stages.metio.wtf/teardown"]
    assert patch["metadata"]["resourceVersion"] == "100"
    assert ANNOTATION in patch["metadata"]["annotations"]
    assert writer.obj["metadata"]["finalizers"] == ["stages.metio.wtf/teardown"]
    writer.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied")
    assert [p for _, p, _ in client.writes()] == [PATH, PATH + "/status"]
    assert condition(client, "Ready")["status"] == "True"


def test_a_finalizer_due_is_written_before_a_conclusion_that_applied_nothing() -> None:
    writer, client, _, _ = writers(stageset())
    writer.finalizer(present=True, deferred=True)
    writer.conclude(ready=False, reason=Reason.RBAC_DENIED, message="denied")
    [(_, first, patch), (_, second, _)] = client.writes()
    assert (first, second) == (PATH, PATH + "/status")
    assert patch["metadata"]["finalizers"] == ["stages.metio.wtf/teardown"]
