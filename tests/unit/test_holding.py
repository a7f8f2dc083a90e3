"""A new StageSet's first word held back while it only waits (stageset/controller/stageset/holding.py):
the deadline through a hand-moved clock, and which passes the writer holds — pure units, the
client a recording fake."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from stageset.api import StageSetStatus
from stageset.api.vocabulary import Reason
from stageset.apply.ownership import FINALIZER
from stageset.controller.kinds import STAGESETS
from stageset.controller.stageset.holding import GRACE, PATIENCE, SOONEST, Holding
from stageset.controller.stageset.writer import PassWriter
from stageset.controller.status import REQUESTED_AT, StatusWriter
from stageset.kube.types import KubeObject
from tests.recording import RecordingClient

PATH = STAGESETS.object_path(name="shop", namespace="shop")
REF = ("shop", "shop")
T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stageset(status: dict[str, Any] | None = None, *, generation: int = 1, **metadata: Any) -> KubeObject:
    obj: KubeObject = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                       "metadata": {"name": "shop", "namespace": "shop", "generation": generation,
                                    **metadata},
                       "spec": {"stages": [{"name": "app", "sourceRef": {"name": "app"}}]}}
    if status is not None:
        obj["status"] = status
    return obj


def writer_of(obj: KubeObject, holding: Holding) -> tuple[PassWriter, RecordingClient]:
    client = RecordingClient()
    cached = client.put(PATH, obj)
    status = StatusWriter(client=client, resource=STAGESETS, obj=cached, model=StageSetStatus,
                          clock=lambda: T0)
    return PassWriter(status=status, client=client, resource=STAGESETS, holding=holding), client


# -- the deadline -----------------------------------------------------------------------------------


def test_a_wait_is_held_for_the_grace_from_its_first_pass_then_said() -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    assert holding.hold(REF, generation=1) == GRACE
    ticks.now += 0.4
    assert holding.hold(REF, generation=1) == pytest.approx(GRACE - 0.4), "counted from the first pass"
    assert holding.pending(REF)
    ticks.now += GRACE
    assert holding.hold(REF, generation=1) is None, "the grace is over: say it"
    assert not holding.pending(REF)
    assert len(holding) == 0


def test_a_deadline_just_ahead_asks_for_no_busy_requeue() -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    holding.hold(REF, generation=1)
    ticks.now += GRACE - 0.001
    assert holding.hold(REF, generation=1) == SOONEST


def test_a_wait_for_a_first_fetch_is_held_longer_and_counted_from_the_same_first_pass() -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    assert holding.hold(REF, generation=1, patient=True) == PATIENCE
    ticks.now += GRACE * 5
    assert holding.hold(REF, generation=1, patient=True) == pytest.approx(PATIENCE - GRACE * 5)
    # The source said something (it failed, say): the StageSet now waits for nothing of ours.
    assert holding.hold(REF, generation=1) is None


def test_patience_is_never_shorter_than_the_grace() -> None:
    holding = Holding(ticks=Ticks(), grace=5.0, patience=1.0)
    assert holding.hold(REF, generation=1, patient=True) == 5.0


def test_a_new_generation_starts_its_own_grace() -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    holding.hold(REF, generation=1)
    ticks.now += GRACE + 1
    assert holding.hold(REF, generation=2) == GRACE


def test_a_concluded_or_deleted_stageset_is_no_longer_pending() -> None:
    holding = Holding(ticks=Ticks())
    holding.hold(REF, generation=1)
    holding.hold(("other", "x"), generation=1)
    holding.release(REF)
    assert not holding.pending(REF), "its deadline's requeue is dropped"
    holding.forget("other", "x")
    assert len(holding) == 0


# -- which passes the writer holds ------------------------------------------------------------------


@pytest.mark.parametrize("reason", [Reason.SOURCE_NOT_READY, Reason.ARTIFACT_NOT_FOUND,
                                    Reason.DEPENDENCY_NOT_READY])
def test_a_new_stageset_waiting_for_another_object_is_held_without_any_write(reason: Reason) -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    writer, client = writer_of(stageset(), holding)
    writer.finalizer(present=True, deferred=True)

    held = writer.held(reason)

    assert held is not None
    assert held.requeue_after == GRACE
    assert client.writes() == [], "no finalizer, status or record"
    assert held.wanted is not None
    assert held.wanted(), "its look-again is wanted while it waits"


def test_the_held_wait_is_said_once_the_grace_is_over_and_its_requeue_is_then_dropped() -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    first, _ = writer_of(stageset(), holding)
    held = first.held(Reason.SOURCE_NOT_READY)
    assert held is not None
    assert held.wanted is not None
    ticks.now += GRACE
    later, client = writer_of(stageset(), holding)
    later.finalizer(present=True, deferred=True)

    assert later.held(Reason.SOURCE_NOT_READY) is None
    later.conclude(ready=False, reason=Reason.SOURCE_NOT_READY, message="stage 'app': not ready")

    [(_, finalizer, _), (_, status, body)] = client.writes()
    assert (finalizer, status) == (PATH, PATH + "/status")
    assert body["status"]["conditions"][0]["reason"] == "SourceNotReady"
    assert not held.wanted(), "the first pass's requeue is not needed any more"


def test_a_wait_that_ends_sooner_concludes_once_and_drops_the_held_requeue() -> None:
    holding = Holding(ticks=Ticks())
    first, _ = writer_of(stageset(), holding)
    held = first.held(Reason.SOURCE_NOT_READY)
    assert held is not None
    assert held.wanted is not None
    second, client = writer_of(stageset(), holding)

    second.conclude(ready=True, reason=Reason.SUCCEEDED, message="applied 1 stage(s)")

    assert len(client.writes()) == 1
    assert not held.wanted()


@pytest.mark.parametrize("why", ["not waiting", "shown", "requested", "wrote", "applied"])
def test_what_is_never_held(why: str) -> None:
    holding = Holding(ticks=Ticks())
    reason = Reason.STAGE_FAILED if why == "not waiting" else Reason.SOURCE_NOT_READY
    status = {"observedGeneration": 1} if why == "shown" else None
    annotations: dict[str, Any] = {REQUESTED_AT: "now"} if why == "requested" else {}
    writer, _ = writer_of(stageset(status, annotations=annotations), holding)
    if why == "wrote":
        writer.finalizer(present=True)  # written at once
        assert FINALIZER in writer.obj["metadata"]["finalizers"]

    assert writer.held(reason, changed_elsewhere=why == "applied") is None
    assert len(holding) == 0


def test_without_holding_every_pass_concludes_at_once() -> None:
    client = RecordingClient()
    cached = client.put(PATH, stageset())
    status = StatusWriter(client=client, resource=STAGESETS, obj=cached, model=StageSetStatus,
                          clock=lambda: T0)
    writer = PassWriter(status=status, client=client, resource=STAGESETS)
    assert writer.held(Reason.SOURCE_NOT_READY) is None


def test_a_requeue_a_later_pass_replaced_is_not_wanted() -> None:
    ticks = Ticks()
    holding = Holding(ticks=ticks)
    holding.hold(REF, generation=1)  # its source not there yet: GRACE
    first = holding.wanted(REF)
    ticks.now += 0.2
    holding.hold(REF, generation=1, patient=True)  # created, not fetched yet: PATIENCE
    later = holding.wanted(REF)
    assert not first(), "the first deadline is superseded: its requeue would only re-check"
    assert later()
    holding.release(REF)
    assert not later()
