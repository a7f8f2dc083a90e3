"""The pure rules of steering a release, table by table, on an injected clock: update windows
(across daylight-saving changes), promotion gates (soak timing, flaps, manual promotion), version
floors, the rollback plan, and what steering decides for a pass."""

from __future__ import annotations

import datetime
from typing import Any

import networkx as nx
import pytest

from stageset.api import StageSet, StageSetStatus, StageStatus
from stageset.api.fleet import FleetRelease
from stageset.api.release import (
    Promotion,
    PromotionPhase,
    PromotionState,
    Rollback,
    RollbackPhase,
    StageSnapshot,
    UpdateWindow,
)
from stageset.api.vocabulary import Reason, StagePhase
from stageset.controller.stageset import floors, gates, pruning, rollback, steering, windows
from stageset.controller.stageset.plan import StageOutcome, Verdict

UTC = datetime.UTC


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def window(**fields: Any) -> UpdateWindow:
    return UpdateWindow.model_validate(fields)


FRIDAY_FREEZE = window(type="Deny", schedule="0 18 * * FRI", duration="62h", timeZone="Europe/Berlin")
BERLIN_NIGHTLY = window(type="Allow", schedule="30 2 * * *", duration="1h", timeZone="Europe/Berlin")
# 2026: Europe's clocks go forward on Sunday 29 March (02:00 -> 03:00 CET->CEST) and back on
# Sunday 25 October (03:00 -> 02:00 CEST->CET).


@pytest.mark.parametrize(("windows_", "now", "allowed", "next_open"), [
    ([], "2026-03-27T12:00:00Z", True, None),
    # The Friday freeze: Friday 18:00 Berlin (CET, UTC+1) = 17:00 UTC, for 62h.
    ([FRIDAY_FREEZE], "2026-03-13T16:59:00Z", True, None),
    ([FRIDAY_FREEZE], "2026-03-13T17:00:00Z", False, "2026-03-16T07:00:00Z"),
    # Across the spring change: opens Fri 27 March 17:00 UTC; 62 elapsed hours later is Monday
    # 07:00 UTC = 09:00 CEST (an hour "later" on the wall clock than a week without the change).
    ([FRIDAY_FREEZE], "2026-03-30T06:59:00Z", False, "2026-03-30T07:00:00Z"),
    ([FRIDAY_FREEZE], "2026-03-30T07:00:00Z", True, None),
    # After the change the freeze starts at 18:00 CEST = 16:00 UTC.
    ([FRIDAY_FREEZE], "2026-04-03T16:00:00Z", False, "2026-04-06T06:00:00Z"),
    # A nightly Allow at 02:30 Berlin: on 29 March 02:30 does not exist, it runs at 03:00 CEST
    # (01:00 UTC), as Debian's cron does.
    ([BERLIN_NIGHTLY], "2026-03-28T12:00:00Z", False, "2026-03-29T01:00:00Z"),
    ([BERLIN_NIGHTLY], "2026-03-29T01:30:00Z", True, None),
    # On 25 October 02:30 exists twice; it runs once, at the first (CEST, 00:30 UTC).
    ([BERLIN_NIGHTLY], "2026-10-24T23:00:00Z", False, "2026-10-25T00:30:00Z"),
    ([BERLIN_NIGHTLY], "2026-10-25T01:31:00Z", False, "2026-10-26T01:30:00Z"),
    # Deny wins over Allow; the next opening is when the Allow is open and the Deny closed.
    ([window(type="Allow", schedule="0 * * * *", duration="30m"),
      window(type="Deny", from_="2026-05-01T10:00:00Z", to="2026-05-01T12:10:00Z")],
     "2026-05-01T10:05:00Z", False, "2026-05-01T12:10:00Z"),
    # Absolute windows: before, during, after.
    ([window(type="Deny", from_="2026-12-24T00:00:00Z", to="2026-12-27T00:00:00Z")],
     "2026-12-25T00:00:00Z", False, "2026-12-27T00:00:00Z"),
    ([window(type="Deny", from_="2026-12-24T00:00:00Z", to="2026-12-27T00:00:00Z")],
     "2026-12-27T00:00:00Z", True, None),
    # An Allow that is over never opens again: held, with no next opening.
    ([window(type="Allow", from_="2026-01-01T00:00:00Z", to="2026-01-02T00:00:00Z")],
     "2026-02-01T00:00:00Z", False, None),
    # A schedule more frequent than its duration stays open until the last start's end.
    ([window(type="Deny", schedule="*/10 * * * *", duration="15m"),
      window(type="Allow", schedule="0 0 * * *", duration="24h")],
     "2026-06-01T08:03:00Z", False, None),
])
def test_update_windows(windows_: list[UpdateWindow], now: str, allowed: bool, next_open: str | None) -> None:
    decided = windows.decide(windows_, at(now))
    assert decided.allowed is allowed
    assert decided.next_open == (at(next_open) if next_open else None)


def test_an_overlapping_recurring_window_closes_at_its_last_covering_start() -> None:
    frequent = window(type="Deny", schedule="*/10 * * * *", duration="15m")
    span = windows.span(frequent, at("2026-06-01T08:03:00Z"))
    assert span.open
    # Every start keeps it open: it never closes (bounded walk, reported as the last end found).
    assert span.changes is not None
    assert span.changes > at("2026-06-01T08:15:00Z")


def test_a_window_walk_is_bounded() -> None:
    always = [window(type="Deny", schedule="* * * * *", duration="2m")]
    decided = windows.decide(always, at("2026-01-01T00:00:00Z"))
    assert not decided.allowed
    assert decided.next_open is None


# -- promotion gates ---------------------------------------------------------------------------

T0 = at("2026-05-04T10:00:00Z")


def later(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


P = PromotionPhase
AWAITING = PromotionPhase.AWAITING_MANUAL
SOAK = Promotion(soak="10m")
MANUAL = Promotion(require_manual_promotion=True)
BOTH = Promotion(soak="10m", require_manual_promotion=True)


def state(phase: PromotionPhase, *, revision: str = "r1", since: datetime.datetime | None = T0,
          soak_until: datetime.datetime | None = None) -> PromotionState:
    def text(moment: datetime.datetime | None) -> str | None:
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None
    return PromotionState(phase=phase, revision=revision, since=text(since), soak_until=text(soak_until))


@pytest.mark.parametrize(("promotion", "before", "revision", "ready", "now", "promote", "phase", "released",
                          "promoted"), [
    # No gate: released when Ready.
    (None, None, "r1", True, T0, False, None, True, None),
    (Promotion(soak="0s"), None, "r1", True, T0, False, None, True, None),
    # A soak starts when first seen Ready, holds until it ends, then releases (once).
    (SOAK, None, "r1", True, T0, False, P.SOAKING, False, None),
    (SOAK, state(P.SOAKING), "r1", True, later(599), False, P.SOAKING, False, None),
    (SOAK, state(P.SOAKING), "r1", True, later(600), False, P.PROMOTED, True, "soak"),
    # A flap restarts the clock: not Ready clears since; the next Ready starts it again.
    (SOAK, state(P.SOAKING), "r1", False, later(300), False, P.SOAKING, False, None),
    (SOAK, state(P.SOAKING, since=None), "r1", True, later(900), False, P.SOAKING,
     False, None),
    # A new revision starts the gate again, even right after a promotion.
    (SOAK, state(P.PROMOTED), "r2", True, later(60), False, P.SOAKING, False, None),
    # Promoted at this revision stays promoted, even when it flaps later.
    (SOAK, state(P.PROMOTED), "r1", False, later(60), False, P.PROMOTED, False, None),
    (SOAK, state(P.PROMOTED), "r1", True, later(60), False, P.PROMOTED, True, None),
    # The manual gate holds until promoted; a promotion releases at once (break-glass over a soak).
    (MANUAL, None, "r1", True, T0, False, AWAITING, False, None),
    (MANUAL, state(AWAITING), "r1", True, later(3600), False,
     AWAITING, False, None),
    (MANUAL, state(AWAITING), "r1", True, later(5), True, P.PROMOTED, True,
     "manual"),
    (SOAK, state(P.SOAKING), "r1", True, later(5), True, P.PROMOTED, True, "manual"),
    # Soak first, then the manual gate.
    (BOTH, state(P.SOAKING), "r1", True, later(601), False, AWAITING, False,
     None),
    # Not Ready: held whatever the gate says.
    (MANUAL, state(AWAITING), "r1", False, later(5), False,
     AWAITING, False, None),
])
def test_promotion_gate(promotion: Promotion | None, before: PromotionState | None, revision: str,
                        ready: bool, now: datetime.datetime, promote: bool, phase: PromotionPhase | None,
                        released: bool, promoted: str | None) -> None:
    gate = gates.judge(promotion, before, revision=revision, ready=ready, now=now, promote=promote)
    assert (gate.state.phase if gate.state else None) is phase
    assert gate.released is released
    assert gate.promoted == promoted
    if gate.state is not None:
        assert gate.state.revision == revision


def test_a_soak_ends_ten_minutes_after_it_began_and_says_so() -> None:
    gate = gates.judge(SOAK, None, revision="r1", ready=True, now=T0)
    assert gate.state is not None
    assert gate.state.soak_until == "2026-05-04T10:10:00Z"
    said = gates.held_verdict([("staging", gate.state)], now=later(590), interval=600)
    assert said.reason is Reason.SOAKING
    assert "2026-05-04T10:10:00Z" in said.message
    assert said.requeue_after == pytest.approx(10.5)  # at the instant it ends
    early = gates.held_verdict([("staging", gate.state)], now=T0, interval=600)
    assert early.requeue_after == gates.SOAK_CHECK  # and meanwhile often enough to see a flap
    manual = gates.held_verdict([("prod", state(AWAITING))], now=T0, interval=600)
    assert manual.reason is Reason.AWAITING_PROMOTION
    assert manual.requeue_after == 600
    assert "stageset promote NAME --stage prod" in manual.message


@pytest.mark.parametrize(("annotation", "handled", "request_"), [
    (None, {"prod": None}, None),
    ("prod@t1", {"prod": None}, ("prod", "t1")),
    ("prod@t1", {"prod": "t1"}, None),  # each token acts once
    ("prod@t2", {"prod": "t1"}, ("prod", "t2")),
    ("nope@t1", {"prod": None}, None),  # not a stage
    ("prod", {"prod": None}, None),  # no token
    ("prod@", {"prod": None}, None),
])
def test_promote_requests(annotation: str | None, handled: dict[str, str | None],
                          request_: tuple[str, str] | None) -> None:
    annotations = {"stages.metio.wtf/promote": annotation} if annotation else {}
    assert gates.promote_request(annotations, handled=handled) == request_


# -- version floors ----------------------------------------------------------------------------

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(("status", "floor", "held"), [
    ({"lastAppliedRevision": f"v5.2.1@sha1:{SHA}"}, "5.2.0", False),
    ({"lastAppliedRevision": f"v5.2.0@sha1:{SHA}"}, "v5.2", False),
    ({"lastAppliedRevision": f"v5.1.9@sha1:{SHA}"}, "5.2.0", True),
    ({"lastAppliedRevision": f"refs/tags/v6.0.0@sha1:{SHA}"}, "5.2.0", False),
    ({"lastAppliedRevision": f"v5.2.0-rc.1@sha1:{SHA}"}, "5.2.0", True),
    ({"lastAppliedRevision": f"main@sha1:{SHA}"}, "5.2.0", True),
    ({"lastAppliedRevision": f"v6.0.0@sha1:{SHA}, v5.0.0@sha1:{SHA}"}, "5.2.0", True),
    ({}, "5.2.0", True),
    ({"lastAppliedRevision": f"main@sha1:{SHA}"}, None, False),
    # A new revision held back by its windows: not ready for dependents, with or without a floor.
    ({"lastAppliedRevision": f"v6.0.0@sha1:{SHA}", "pendingUpdate": {"revisions": {"ns/app": "x"}}}, None,
     True),
    ({"pendingUpdate": {"revisions": {}}}, None, False),
])
def test_version_floors(status: dict[str, Any], floor: str | None, held: bool) -> None:
    assert (floors.version_floor(status, floor, name="db/ledger") is not None) is held


# -- the rollback plan -------------------------------------------------------------------------

def snap(stage: str, revision: str, inputs: str | None = None) -> StageSnapshot:
    return StageSnapshot(stage=stage, revision=revision, substitution_digest=inputs)


GOOD = rollback.good_of([snap("db", "r1"), snap("app", "r1", "sha256:a"), snap("web", "r1")])


@pytest.mark.parametrize(("attempted", "applied", "moved"), [
    ({}, {"db": "r1", "app": "r1", "web": "r1"}, []),
    ({"db": ("r2", None)}, {"db": "r2", "app": "r1", "web": "r1"}, ["db"]),
    # Applied by an earlier pass of this release, not attempted now: moved all the same.
    ({"app": ("r2", "sha256:a")}, {"db": "r2", "app": "r1", "web": "r1"}, ["db", "app"]),
    # Same revision, other variables: moved.
    ({"app": ("r1", "sha256:b")}, {"db": "r1", "app": "r1", "web": "r1"}, ["app"]),
    # A stage with no last good revision (new in this release) has nothing to return to.
    ({"cache": ("r2", None)}, {"cache": "r2"}, []),
])
def test_which_stages_moved(attempted: dict[str, tuple[str, str | None]], applied: dict[str, str | None],
                            moved: list[str]) -> None:
    tried = {n: rollback.Applied(r, i) for n, (r, i) in attempted.items()}
    assert rollback.moved(["db", "app", "web", "cache"], good=GOOD, attempted=tried, applied=applied) == moved


def test_rollback_runs_dependents_first() -> None:
    graph: nx.DiGraph = nx.DiGraph([("db", "app"), ("app", "web"), ("db", "worker")])
    assert rollback.order(graph, ["db", "app", "web", "worker"]) == ["worker", "web", "app", "db"]
    assert rollback.order(graph, ["db", "web"]) == ["web", "db"]


def test_only_a_stage_failure_fails_the_release() -> None:
    assert rollback.trigger([StageOutcome("a", StagePhase.FAILED, Reason.RBAC_DENIED, "no")]) is None
    assert rollback.trigger([StageOutcome("a", StagePhase.PENDING, Reason.SOURCE_NOT_READY, "wait")]) is None
    held = StageOutcome("a", StagePhase.PROGRESSING, Reason.STAGE_PROGRESSING, "held")
    assert rollback.trigger([held]) is None
    failed = StageOutcome("b", StagePhase.FAILED, Reason.STAGE_FAILED, "crash")
    assert rollback.trigger([StageOutcome("a", StagePhase.READY), failed]) is failed


def test_a_rollback_record_from_start_to_parked_and_lifted() -> None:
    failed = StageOutcome("app", StagePhase.FAILED, Reason.STAGE_FAILED, "Deployment web: crash loop")
    record = rollback.started(failed=failed, moved_stages=["db", "app", "cache"],
                              rollback_order=["app", "db"], current={"db": "r2", "app": "r2", "cache": "r2"},
                              generation=3, now=T0)
    assert record.phase is RollbackPhase.ROLLING_BACK
    assert record.remaining == ["app", "db"]
    assert "cache left as they are" in record.message
    record = rollback.restored(record, "app", "r1")
    assert record.remaining == ["db"]  # a restart resumes here, app is not applied again
    record = rollback.finished(rollback.restored(record, "db", "r1"))
    assert record.phase is RollbackPhase.ROLLED_BACK
    assert "rolled back app to r1, db to r1" in record.message
    current = {"db": "r2", "app": "r2", "cache": "r2"}
    pins, skip = rollback.parked(record, current=current, good=GOOD, generation=3)
    assert pins == {"db": "r1", "app": "r1"}
    assert skip == {"cache"}
    assert not rollback.lifted(record, current=current, generation=3)
    assert rollback.lifted(record, current={**current, "app": "r3"}, generation=3)  # a new revision
    assert rollback.lifted(record, current=current, generation=4)  # a spec change
    assert rollback.parked(record, current=current, good=GOOD, generation=4) == ({}, set())


def test_the_substitution_digest_names_no_value_and_tells_changes() -> None:
    one = rollback.substitution_digest({"token": "s3cr3t"}, salt="uid-1")
    assert one is not None
    assert "s3cr3t" not in one
    assert one == rollback.substitution_digest({"token": "s3cr3t"}, salt="uid-1")
    assert one != rollback.substitution_digest({"token": "other"}, salt="uid-1")
    assert one != rollback.substitution_digest({"token": "s3cr3t"}, salt="uid-2")
    digest = rollback.substitution_digest
    assert digest({"a": "bc"}, salt="") != digest({"ab": "c"}, salt="")
    assert rollback.substitution_digest(None, salt="uid-1") is None


# -- steering a pass ---------------------------------------------------------------------------

def stageset(**spec: Any) -> StageSet:
    return StageSet.model_validate({"metadata": {"name": "shop", "namespace": "ns", **spec.pop("meta", {})},
                                    "spec": {"stages": [{"name": "staging", "sourceRef": {"name": "app"}},
                                                        {"name": "prod", "sourceRef": {"name": "app"}}],
                                             **spec}})


def status(**fields: Any) -> StageSetStatus:
    stages = fields.pop("stages", {"staging": "r1", "prod": "r1"})
    return StageSetStatus(stages=[StageStatus(name=n, phase=StagePhase.READY, revision=r)
                                  for n, r in stages.items()], **fields)


FREEZE = [FRIDAY_FREEZE.model_dump(by_alias=True, exclude_none=True)]
NOW = at("2026-03-13T18:00:00Z")  # inside the Friday freeze
SOURCES = {"staging": "ns/app", "prod": "ns/app"}


def test_a_closed_window_pins_what_was_applied_and_holds_what_never_was() -> None:
    spec = stageset(updateWindows=FREEZE)
    decided = steering.steer(spec, status(stages={"staging": "r1"}), current={"staging": "r2", "prod": "r2"},
                             sources=SOURCES, now=NOW, generation=1)
    assert decided.pins == {"staging": "r1"}
    assert set(decided.skip) == {"prod"}
    assert "held by the update windows until 2026-03-16T07:00:00Z" in \
        decided.skip["prod"]
    assert decided.pending is not None
    assert decided.pending.revisions == {"ns/app": "r2"}
    assert decided.pending.next_window_opens == "2026-03-16T07:00:00Z"
    assert decided.newly_deferred(None)
    assert not decided.newly_deferred(decided.pending)
    # Open: nothing held.
    opened = steering.steer(spec, status(), current={"staging": "r2", "prod": "r2"}, sources=SOURCES,
                            now=at("2026-03-16T07:00:00Z"), generation=1)
    assert opened.pins == {}
    assert opened.skip == {}
    assert opened.pending is None


def test_window_scope_all_freezes_and_update_now_lets_the_release_through_until_applied() -> None:
    spec = stageset(windowScope="All", updateWindows=FREEZE)
    frozen = steering.steer(spec, status(), current={"staging": "r1", "prod": "r1"}, sources=SOURCES, now=NOW,
                            generation=1)
    assert frozen.frozen
    assert frozen.pending is not None
    assert frozen.pending.revisions == {}
    asked = stageset(meta={"annotations": {"stages.metio.wtf/update-now": "t1"}}, windowScope="All",
                     updateWindows=FREEZE)
    shipped = steering.steer(asked, status(), current={"staging": "r2", "prod": "r2"}, sources=SOURCES,
                             now=NOW,
                             generation=1)
    assert not shipped.frozen
    assert shipped.override == "t1"
    assert shipped.override_revisions == {"staging": "r2", "prod": "r2"}
    assert not shipped.pins
    # The next pass: staging applied r2, prod not yet; the override still lets prod through, once.
    left = status(stages={"staging": "r2", "prod": "r1"}, last_handled_update_override="t1",
                  override_revisions={"staging": "r2", "prod": "r2"})
    following = steering.steer(asked, left, current={"staging": "r2", "prod": "r2"}, sources=SOURCES, now=NOW,
                               generation=1)
    assert following.override is None
    assert following.override_revisions == {"prod": "r2"}
    assert not following.frozen
    assert not following.pins
    assert not following.skip


def test_a_rollback_left_mid_way_is_resumed_before_anything_else() -> None:
    record = Rollback(phase=RollbackPhase.ROLLING_BACK, remaining=["db"], failed={"db": "r2"}, generation=1)
    decided = steering.steer(stageset(), status(rollback=record), current={"staging": "r2", "prod": "r2"},
                             sources=SOURCES, now=NOW, generation=1)
    assert list(decided.resume) == ["db"]


def outcome(name: str, phase: StagePhase, **fields: Any) -> StageOutcome:
    return StageOutcome(name, phase, **fields)


def test_the_steered_verdict() -> None:
    ready = Verdict(True, Reason.SUCCEEDED, "applied 2 stage(s) at r1", requeue_after=600, revision="r1")
    blocked = Verdict(False, Reason.STAGE_FAILED, "stages blocked", requeue_after=60)
    soaking = gates.judge(SOAK, None, revision="r1", ready=True, now=NOW).state
    held = steering.verdict(blocked, [outcome("staging", StagePhase.READY, promotion=soaking),
                                      outcome("prod", StagePhase.PENDING)],
                            steering=steering.Steering(), now=NOW, interval=600)
    assert held.reason is Reason.SOAKING
    assert held.ready is False
    # A failure wins over a gate.
    failing = Verdict(False, Reason.STAGE_FAILED, "boom", requeue_after=60)
    assert steering.verdict(failing, [outcome("staging", StagePhase.READY, promotion=soaking),
                                      outcome("prod", StagePhase.FAILED, reason=Reason.STAGE_FAILED)],
                            steering=steering.Steering(), now=NOW, interval=600) is failing
    pending = steering.steer(stageset(updateWindows=FREEZE),
                             status(), current={"staging": "r2", "prod": "r2"}, sources=SOURCES, now=NOW,
                             generation=1)
    both_ready = [outcome("staging", StagePhase.READY), outcome("prod", StagePhase.READY)]
    deferred = steering.verdict(ready, both_ready, steering=pending, now=NOW, interval=600)
    assert deferred.ready is True
    assert deferred.reason is Reason.UPDATE_DEFERRED
    assert deferred.requeue_after is not None
    assert deferred.requeue_after <= 600
    first = steering.steer(stageset(updateWindows=FREEZE),
                           status(stages={}), current={"staging": "r2", "prod": "r2"}, sources=SOURCES,
                           now=NOW,
                           generation=1)
    none_ready = [outcome("staging", StagePhase.PENDING), outcome("prod", StagePhase.PENDING)]
    never = steering.verdict(blocked, none_ready, steering=first, now=NOW, interval=600)
    assert never.ready is False
    assert never.reason is Reason.UPDATE_DEFERRED
    parked = steering.Steering(rollback=Rollback(phase=RollbackPhase.ROLLED_BACK, message="'prod' failed"))
    said = steering.verdict(ready, both_ready, steering=parked, now=NOW, interval=600)
    assert said.reason is Reason.ROLLED_BACK
    # Whether these passes prune (and take the last good snapshot) is the one prune decision's:
    # tests/unit/test_pruning.py.
    may = pruning.PrunePermission(pruning.Scope.STALE, pruning.PruneReason.ALL_READY,
                                  pruning.Reach.EVERYWHERE)
    assert not steering.succeeded(may, parked)
    assert steering.succeeded(may, steering.Steering())
    assert not steering.succeeded(pruning.PrunePermission(pruning.Scope.NOTHING, pruning.PruneReason.FROZEN,
                                                          pruning.Reach.EVERYWHERE), steering.Steering())


# -- a FleetRollout's hold, composed with the windows' ---------------------------------------------

def fleet_release(**fields: Any) -> dict[str, Any]:
    return {"annotations": {"stages.metio.wtf/fleet-release": FleetRelease(rollout="web", **fields).encode()}}


OPEN = at("2026-03-16T08:00:00Z")  # the Friday freeze is over


def test_a_fleet_rollout_holds_what_its_wave_was_not_released_as_a_window_does() -> None:
    waiting = stageset(meta=fleet_release(wave="ring1"))
    decided = steering.steer(waiting, status(stages={"staging": "r1"}),
                             current={"staging": "r2", "prod": "r2"}, sources=SOURCES, now=OPEN, generation=1)
    assert decided.pins == {"staging": "r1"}
    assert "held by FleetRollout web until wave ring1 opens" in decided.skip["prod"]
    assert decided.pending is not None
    assert decided.pending.revisions == {"ns/app": "r2"}
    assert (decided.pending.fleet_rollout, decided.pending.wave) == ("web", "ring1")
    assert "held by FleetRollout web" in steering.deferral(decided)
    # Released exactly r2: nothing held.  Released r2 but the source offers r3: r3 is held.
    released = stageset(meta=fleet_release(wave="ring1", revisions={"ns/app": "r2"}))
    assert steering.steer(released, status(), current={"staging": "r2", "prod": "r2"}, sources=SOURCES,
                          now=OPEN, generation=1).pending is None
    newer = steering.steer(released, status(), current={"staging": "r3", "prod": "r3"}, sources=SOURCES,
                           now=OPEN, generation=1)
    assert newer.pins == {"staging": "r1", "prod": "r1"}


def test_both_holds_apply_and_update_now_lifts_only_the_windows() -> None:
    released = fleet_release(wave="ring1", revisions={"ns/app": "r2"})
    windowed = stageset(meta=released, updateWindows=FREEZE)
    closed = steering.steer(windowed, status(), current={"staging": "r2", "prod": "r2"}, sources=SOURCES,
                            now=NOW, generation=1)
    assert closed.pins == {"staging": "r1", "prod": "r1"}  # the wave released it; the windows hold it
    assert closed.pending is not None
    assert closed.pending.fleet_rollout is None
    held = fleet_release(wave="ring1")
    asked = stageset(meta={"annotations": {**held["annotations"], "stages.metio.wtf/update-now": "t1"}},
                     updateWindows=FREEZE)
    forced = steering.steer(asked, status(), current={"staging": "r2", "prod": "r2"}, sources=SOURCES,
                            now=NOW, generation=1)
    assert forced.override == "t1"
    assert forced.pins == {"staging": "r1", "prod": "r1"}  # the rollout still holds it
    assert forced.pending is not None
    assert forced.pending.fleet_rollout == "web"


def test_an_unassigned_member_applies_nothing_new() -> None:
    lost = stageset(meta=fleet_release(hold="in no wave of FleetRollout web"))
    decided = steering.steer(lost, status(stages={}), current={"staging": "r2", "prod": "r2"},
                             sources=SOURCES, now=OPEN, generation=1)
    assert set(decided.skip) == {"staging", "prod"}
    assert "in no wave" in decided.skip["prod"]
