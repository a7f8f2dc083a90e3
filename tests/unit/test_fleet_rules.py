"""FleetRollout's pure rules: selection, the decision (rounds, waves, soaks, halts, fail closed) and
a member's hold.  Time is an argument: no test sleeps."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import replace

import pytest

from stageset.api.actions import LabelSelector, SelectorRequirement
from stageset.api.fleet import (
    FleetRelease,
    FleetRollout,
    FleetRolloutStatus,
    FleetView,
    FleetWave,
    WavePhase,
    read_release,
)
from stageset.api.vocabulary import Reason
from stageset.controller.fleet.decide import Decision, Member, decide
from stageset.controller.fleet.selection import matches, selects, waves_of
from stageset.controller.stageset.fleethold import hold, of_view

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
OLD, NEW, FIX = "main@sha1:" + "a" * 40, "main@sha1:" + "b" * 40, "main@sha1:" + "c" * 40
SRC = "t/src"


def wave(name: str, soak: str | None = None) -> FleetWave:
    return FleetWave(name=name, selector=LabelSelector(match_labels={"ring": name}), soak=soak)


WAVES = [wave("canary", "10m"), wave("ring1", "10m"), wave("all")]


def member(name: str, ring: str | None, **kw: object) -> Member:
    fields: dict[str, object] = {"ready": True, "reason": "Succeeded", "applied": frozenset({OLD})}
    fields.update(kw)
    return Member(namespace=f"t-{name}", name=name, waves=[ring] if ring else [], **fields)  # type: ignore[arg-type]


def fleet(*, pending: dict[str, dict[str, str]] | None = None, applied: dict[str, str] | None = None,
          released: dict[str, str] | None = None, failing: dict[str, str] | None = None) -> list[Member]:
    """Six members, two per wave; per member what it holds, applied, was released, or fails with."""
    found = []
    for ring, names in (("canary", ("c1", "c2")), ("ring1", ("r1", "r2")), ("all", ("a1", "a2"))):
        for name in names:
            revision = (applied or {}).get(name, OLD)
            held = (pending or {}).get(name, {})
            reason = (failing or {}).get(name)
            found.append(member(name, ring, pending=held, applied=frozenset({revision}),
                                released={SRC: released[name]} if released and name in released else {},
                                ready=reason is None and not held, reason=reason or "UpdateDeferred"))
    return found


def step(members: Sequence[Member], previous: FleetRolloutStatus | None, minutes: float) -> Decision:
    return decide(rollout="web", waves=WAVES, members=members, previous=previous,
                  now=T0 + datetime.timedelta(minutes=minutes))


def released(decision: Decision) -> dict[str, str]:
    return {key[1]: r.revisions.get(SRC, "") for key, r in decision.releases.items()}


def phases(decision: Decision) -> list[WavePhase]:
    return [w.phase for w in decision.status.waves]


EVERYONE = ("c1", "c2", "r1", "r2", "a1", "a2")


def test_waves_open_in_order_after_each_soak_and_no_later_member_is_released_early() -> None:
    held = {n: {SRC: NEW} for n in EVERYONE}
    first = step(fleet(pending=held), None, 0)
    assert first.started
    assert first.opened == ["canary"]
    assert phases(first) == [WavePhase.OPEN, WavePhase.WAITING, WavePhase.WAITING]
    assert released(first) == {"c1": NEW, "c2": NEW, "r1": "", "r2": "", "a1": "", "a2": ""}
    assert first.ready is None
    assert first.reason is Reason.PROGRESSING

    # The canaries applied it and are Ready: their soak starts; ring1 still waits.
    canaries_done = {n: v for n, v in held.items() if n not in ("c1", "c2")}
    applied = {"c1": NEW, "c2": NEW}
    soaking = step(fleet(pending=canaries_done, applied=applied, released={"c1": NEW, "c2": NEW}),
                   first.status, 1)
    assert phases(soaking)[:2] == [WavePhase.SOAKING, WavePhase.WAITING]
    assert soaking.requeue_after == pytest.approx(600.5)
    assert released(soaking)["r1"] == ""

    # Nine minutes later: still soaking.  Eleven: ring1 opens.
    assert released(step(fleet(pending=canaries_done, applied=applied, released={"c1": NEW, "c2": NEW}),
                         soaking.status, 10))["r1"] == ""
    opened = step(fleet(pending=canaries_done, applied=applied, released={"c1": NEW, "c2": NEW}),
                  soaking.status, 11.1)
    assert opened.opened == ["ring1"]
    assert released(opened) == {"c1": NEW, "c2": NEW, "r1": NEW, "r2": NEW, "a1": "", "a2": ""}


def test_the_whole_fleet_completes_once_every_wave_is_ready() -> None:
    status = None
    done = {n: NEW for n in EVERYONE}
    decision = step(fleet(pending={n: {SRC: NEW} for n in EVERYONE}), status, 0)
    status = decision.status
    told = []
    for minute in (1, 12, 13, 24, 25):
        decision = step(fleet(applied=done, released=done), status, minute)
        status = decision.status
        told.append(decision.completed)
    assert told == [False, False, False, True, False]  # completed at 24: ring1's soak ended
    assert phases(decision) == [WavePhase.DONE] * 3
    assert decision.ready is True
    assert decision.reason is Reason.COMPLETED
    again = step(fleet(applied=done, released=done), status, 30)
    assert again.reason is Reason.COMPLETED
    assert not again.completed


def test_a_failing_canary_halts_withdraws_the_revision_and_a_fix_restarts_from_the_first_wave() -> None:
    held = {n: {SRC: NEW} for n in EVERYONE}
    first = step(fleet(pending=held), None, 0)
    later = {n: v for n, v in held.items() if n not in ("c1",)}
    failed = step(fleet(pending=later, applied={"c1": NEW}, released={"c1": NEW},
                        failing={"c1": "StageFailed"}), first.status, 1)
    assert failed.halted is not None
    assert failed.halted.member == "t-c1/c1"
    assert failed.reason is Reason.HALTED
    assert "t-c1/c1" in failed.message
    assert NEW in failed.status.withdrawn
    assert phases(failed)[0] is WavePhase.HALTED
    # Hours later the canary recovered (rolled back, Ready): nothing opens, NEW is never released on.
    recovered = step(fleet(pending=later, released={"c1": NEW}), failed.status, 600)
    assert recovered.reason is Reason.HALTED
    assert {n: r for n, r in released(recovered).items() if n not in ("c1", "c2")} == dict.fromkeys(
        ("r1", "r2", "a1", "a2"), "")
    # A fix arrives (some sources still offer NEW): a new round, from the canaries, without NEW.
    mixed = {**{n: {SRC: FIX} for n in EVERYONE}, "a2": {SRC: NEW}}
    fixed = step(fleet(pending=mixed, released={"c1": NEW}, failing={"c1": "StageFailed"}), recovered.status,
                 601)
    assert fixed.started
    assert fixed.status.halted is None
    assert fixed.status.round is not None
    assert fixed.status.round.revisions == [FIX]
    assert released(fixed)["c1"] == FIX
    assert released(fixed)["r1"] == ""
    # Rolled all the way out: a2's source still offering NEW never gets it released.
    status = fixed.status
    done = {n: FIX for n in EVERYONE if n != "a2"}
    for minute in (602, 613, 614, 625, 626):
        decision = step(fleet(applied=done, released=done, pending={"a2": {SRC: NEW}}), status, minute)
        status = decision.status
    assert released(decision)["a2"] == ""


@pytest.mark.parametrize("reason", ["StageFailed", "ActionFailed", "StageProgressing", "RolledBack"])
def test_each_failing_reason_halts(reason: str) -> None:
    first = step(fleet(pending={"c1": {SRC: NEW}}), None, 0)
    assert step(fleet(failing={"c2": reason}), first.status, 1).reason is Reason.HALTED


@pytest.mark.parametrize("reason", ["Progressing", "DependencyNotReady", "UpdateDeferred"])
def test_waiting_is_no_failure(reason: str) -> None:
    first = step(fleet(pending={"c1": {SRC: NEW}}), None, 0)
    assert step(fleet(failing={"c2": reason}), first.status, 1).reason is Reason.PROGRESSING


def test_a_member_of_a_wave_not_open_that_fails_does_not_halt() -> None:
    first = step(fleet(pending={"c1": {SRC: NEW}}), None, 0)
    later = step(fleet(pending={"c1": {SRC: NEW}}, failing={"a1": "StageFailed"}), first.status, 1)
    assert later.halted is None


def test_a_new_revision_mid_rollout_restarts_and_later_members_keep_what_they_were_released() -> None:
    held = {n: {SRC: NEW} for n in EVERYONE}
    status = step(fleet(pending=held), None, 0).status
    for minute in (1, 12):
        members = fleet(pending={n: held[n] for n in ("a1", "a2", "r1", "r2")},
                        applied={"c1": NEW, "c2": NEW}, released={"c1": NEW, "c2": NEW})
        status = step(members, status, minute).status
    assert [w.phase for w in status.waves][:2] == [WavePhase.DONE, WavePhase.OPEN]
    # ring1 was released NEW; FIX arrives before it applied: ring1 closes, keeps NEW, holds FIX.
    now_fix = {n: {SRC: FIX} for n in EVERYONE}
    restart = step(fleet(pending=now_fix, applied={"c1": NEW, "c2": NEW},
                         released={"c1": NEW, "c2": NEW, "r1": NEW, "r2": NEW}), status, 13)
    assert restart.started
    assert restart.opened == ["canary"]
    assert released(restart) == {"c1": FIX, "c2": FIX, "r1": NEW, "r2": NEW, "a1": "", "a2": ""}


def test_a_canary_whose_source_has_not_fetched_the_new_revision_holds_the_next_wave() -> None:
    # A ring1 member fetched first and started the round; the canaries still run OLD, Ready.
    first = step(fleet(pending={"r1": {SRC: NEW}}), None, 0)
    assert first.started
    assert phases(first)[:2] == [WavePhase.OPEN, WavePhase.WAITING]
    assert released(first)["r1"] == ""
    later = step(fleet(pending={"r1": {SRC: NEW}}), first.status, 30)
    assert phases(later)[:2] == [WavePhase.OPEN, WavePhase.WAITING]


def test_the_same_revision_arriving_late_at_another_member_does_not_restart() -> None:
    first = step(fleet(pending={"c1": {SRC: NEW}}), None, 0)
    late = step(fleet(pending={"c1": {SRC: NEW}, "a1": {SRC: NEW}}), first.status, 1)
    assert not late.started
    assert released(late)["a1"] == ""


def test_unassigned_and_contested_members_fail_closed_and_are_named() -> None:
    members = [*fleet(pending={"c1": {SRC: NEW}}), member("lost", None, pending={SRC: NEW}),
               member("both", "canary", pending={SRC: NEW}, contested_by=["other"]),
               replace(member("twice", "canary"), waves=["canary", "all"])]
    decision = step(members, None, 0)
    assert decision.reason is Reason.MEMBERS_CONTESTED
    assert "t-both/both" in decision.message
    assert "other" in decision.message
    for name in ("lost", "both", "twice"):
        release = decision.releases[(f"t-{name}", name)]
        assert release.hold, name
        assert not release.revisions, name
    assert decision.releases[("t-both", "both")].rollout == "other, web"
    assert decision.releases[("t-c1", "c1")].revisions == {SRC: NEW}  # the others roll on
    alone = step([m for m in members if m.name != "both"], None, 0)
    assert alone.reason is Reason.MEMBERS_UNASSIGNED
    assert "t-lost/lost" in alone.message
    assert "t-twice/twice" in alone.message


def test_no_round_yet_is_completed_and_releases_nothing_new() -> None:
    decision = step(fleet(), None, 0)
    assert decision.reason is Reason.COMPLETED
    assert not decision.started
    assert not decision.opened
    assert set(released(decision).values()) == {""}


# -- selection ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("selector", "labels", "expected"), [
    (LabelSelector(match_labels={"app": "web"}), {"app": "web", "x": "y"}, True),
    (LabelSelector(match_labels={"app": "web"}), {"app": "db"}, False),
    (LabelSelector(match_expressions=[SelectorRequirement(key="ring", operator="In", values=["a", "b"])]),
     {"ring": "b"}, True),
    (LabelSelector(match_expressions=[SelectorRequirement(key="ring", operator="NotIn", values=["a"])]),
     {}, True),
    (LabelSelector(match_expressions=[SelectorRequirement(key="ring", operator="Exists")]), {}, False),
    (LabelSelector(match_expressions=[SelectorRequirement(key="ring", operator="DoesNotExist")]),
     {"ring": "a"}, False),
    (LabelSelector(), {"anything": "x"}, True),
])
def test_label_selectors(selector: LabelSelector, labels: dict[str, str], expected: bool) -> None:
    assert matches(selector, labels) is expected


def test_a_namespace_selector_with_unknown_namespace_labels_selects_nothing() -> None:
    rollout = FleetRollout.model_validate({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "namespaceSelector": {"matchLabels": {"env": "prod"}},
                 "waves": [{"name": "all", "selector": {}}]}})
    assert selects(rollout, labels={"app": "web"}, namespace_labels={"env": "prod"})
    assert not selects(rollout, labels={"app": "web"}, namespace_labels=None)
    assert waves_of(WAVES, {"ring": "ring1"}) == ["ring1"]


@pytest.mark.parametrize("field", ["targetVersion", "previousVersion", "onRegression"])
def test_the_reference_version_fields_are_refused_by_name(field: str) -> None:
    value: object = {"action": "Rollback"} if field == "onRegression" else "1.2.3"
    with pytest.raises(ValueError, match=rf"{field} \(.*\) is not supported by this controller"):
        FleetRollout.model_validate({"metadata": {"name": "x"}, "spec": {
            "selector": {}, field: value, "waves": [{"name": "a", "selector": {}}]}})


def test_a_wave_gate_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"gate \(.*\) is not supported by this controller"):
        FleetRollout.model_validate({"metadata": {"name": "x"}, "spec": {
            "selector": {}, "waves": [{"name": "a", "selector": {}, "gate": {"approval": "Manual"}}]}})


# -- the member's side ------------------------------------------------------------------------------

def test_a_member_holds_everything_new_but_exactly_what_was_released() -> None:
    release = FleetRelease(rollout="web", wave="ring1", revisions={SRC: NEW})
    assert hold(None, new={"app": NEW}, sources={"app": SRC}, selected_by=[]) is None
    assert hold(release, new={"app": NEW}, sources={"app": SRC}, selected_by=["web"]) is None
    # An intermediate (or later) revision it was never released is held.
    later = hold(release, new={"app": FIX}, sources={"app": SRC}, selected_by=["web"])
    assert later is not None
    assert later.held == {"app": FIX}
    assert "wave ring1" in later.why
    closed = hold(FleetRelease(rollout="web", hold="in no wave"), new={"app": NEW}, sources={"app": SRC},
                  selected_by=["web"])
    assert closed is not None
    assert closed.held == {"app": NEW}
    assert "in no wave" in closed.why


@pytest.mark.parametrize(("release", "selected_by", "held"), [
    # Selected, but the rollout's release is not written yet (its first decision has not reached
    # the member) or was removed by hand: everything new is held until the rollout writes it.
    (None, ["web"], True),
    # A release of another rollout than the one that selects it now: held until this one writes.
    (FleetRelease(rollout="old", wave="a", revisions={SRC: NEW}), ["web"], True),
    # Not selected by any rollout: its own release (or none) decides.
    (None, [], False),
    (FleetRelease(rollout="web", wave="a", revisions={SRC: NEW}), [], False),
    (FleetRelease(rollout="web", wave="a", revisions={SRC: NEW}), ["web"], False),
])
def test_a_selected_member_without_its_rollouts_release_fails_closed(
        release: FleetRelease | None, selected_by: list[str], held: bool) -> None:
    found = hold(release, new={"app": NEW}, sources={"app": SRC}, selected_by=selected_by)
    assert (found is not None) is held
    if found is not None:
        assert found.held == {"app": NEW}
        assert found.rollout == "web"
    # Nothing new: nothing to hold, selected or not.
    assert hold(release, new={}, sources={"app": SRC}, selected_by=selected_by) is None


def test_an_unreadable_release_annotation_holds_everything() -> None:
    release = read_release({"stages.metio.wtf/fleet-release": "{not json"})
    assert release is not None
    assert release.hold
    assert read_release({}) is None
    encoded = FleetRelease(rollout="web", wave="a", revisions={SRC: NEW}).encode()
    assert read_release({"stages.metio.wtf/fleet-release": encoded}) == \
        FleetRelease(rollout="web", wave="a", revisions={SRC: NEW})


def test_the_porting_page_lists_every_refused_fleet_field() -> None:
    from pathlib import Path

    from stageset.api.unsupported import FLEET_REFUSED

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference-controller.md").read_text(
        encoding="utf-8")
    section = page.split("## FleetRollout fields", 1)[1].split("\n## ", 1)[0]
    for refusal in FLEET_REFUSED:
        assert f"`{refusal.path}` | refused" in section, refusal.path


# -- issue 43: a fleet the platform controls, and that recovers -----------------------------------

def recorded(decision: Decision) -> dict[str, tuple[str, str, bool]]:
    """Per member: (its recorded wave, what it was released, joined) from ``status.releases``."""
    return {r.name: (r.wave, r.revisions.get(SRC, ""), r.joined) for r in decision.status.releases}


def test_every_member_is_recorded_in_status_and_the_next_decision_reads_its_release_from_there() -> None:
    first = step(fleet(pending={n: {SRC: NEW} for n in EVERYONE}), None, 0)
    assert recorded(first) == {"c1": ("canary", NEW, False), "c2": ("canary", NEW, False),
                               "r1": ("ring1", "", False), "r2": ("ring1", "", False),
                               "a1": ("all", "", False), "a2": ("all", "", False)}
    for key, release in first.releases.items():
        record = next(r for r in first.status.releases if (r.namespace, r.name) == key)
        assert record.release("web") == release, "the annotation says exactly what the status records"


def test_a_fix_whose_round_another_member_starts_resumes_every_wave_after_a_halt() -> None:
    """Issue 43 item 3: the canary halted at NEW; FIX reaches ring1 and all first (their sources
    fetched it), so the new round starts while the canary still shows its old failure and holds
    nothing: that is no failure of the new round.  Then the canary gets FIX, is Ready, soaks, and
    every wave opens in order."""
    held = {n: {SRC: NEW} for n in EVERYONE}
    first = step(fleet(pending=held), None, 0)
    later = {n: v for n, v in held.items() if n != "c1"}
    halted = step(fleet(pending=later, applied={"c1": NEW}, released={"c1": NEW},
                        failing={"c1": "StageFailed"}), first.status, 1)
    assert halted.reason is Reason.HALTED
    assert NEW in halted.status.withdrawn
    # FIX is fetched everywhere but at c1, which still fails at NEW (released to it, withdrawn).
    elsewhere = {n: {SRC: FIX} for n in EVERYONE if n != "c1"}
    fixed = step(fleet(pending=elsewhere, applied={"c1": NEW}, released={"c1": NEW},
                       failing={"c1": "StageFailed"}), halted.status, 2)
    assert fixed.started
    assert fixed.halted is None, "a member still on a withdrawn revision does not halt the new round"
    assert fixed.status.halted is None
    assert fixed.reason is Reason.PROGRESSING
    # c1 fetches FIX: released; applies it; Ready.  The canaries soak; every wave opens in order.
    status = fixed.status
    fetched = {**elsewhere, "c1": {SRC: FIX}}
    status = step(fleet(pending=fetched, applied={"c1": NEW}, released={"c1": NEW},
                        failing={"c1": "StageFailed"}), status, 3).status
    assert recorded(step(fleet(pending=fetched, applied={"c1": NEW}, released={"c1": NEW},
                               failing={"c1": "StageFailed"}), status, 3))["c1"][1] == FIX
    opened: list[str] = []
    applied: dict[str, str] = {}
    for minute in (4, 5, 16, 17, 28, 29, 30):
        waiting = {n: v for n, v in fetched.items() if n not in applied}
        decision = step(fleet(pending=waiting, applied=applied, released=dict(applied)), status, minute)
        status = decision.status
        opened += decision.opened
        for name, (_wave, revision, _joined) in recorded(decision).items():
            if revision == FIX:
                applied[name] = FIX
    assert opened == ["ring1", "all"]
    assert decision.reason is Reason.COMPLETED
    assert set(applied) == set(EVERYONE)
    assert NEW not in {r.revisions.get(SRC) for r in decision.status.releases}


def test_a_member_that_changes_its_wave_mid_round_keeps_its_old_one_until_the_next_round() -> None:
    held = {n: {SRC: NEW} for n in EVERYONE}
    first = step(fleet(pending=held), None, 0)
    # a1 relabels itself into the open canary wave: it stays in "all" for this round.
    jumped = [replace(m, waves=["canary"]) if m.name == "a1" else m for m in fleet(pending=held)]
    moved = step(jumped, first.status, 1)
    assert recorded(moved)["a1"] == ("all", "", False)
    assert moved.releases[("t-a1", "a1")].revisions == {}
    assert moved.releases[("t-a1", "a1")].wave == "all"
    # A member that relabels itself out of every wave (or out of the selector) keeps its wave too.
    lost = [replace(m, waves=[]) if m.name == "r1" else m for m in fleet(pending=held)]
    assert recorded(step(lost, first.status, 1))["r1"] == ("ring1", "", False)
    left = [replace(m, waves=[], selected=False) if m.name == "r2" else m for m in fleet(pending=held)]
    assert recorded(step(left, first.status, 1))["r2"] == ("ring1", "", False)
    # The next round takes the new labels (and frees who left the selection).
    fixed = {n: {SRC: FIX} for n in EVERYONE}
    nxt = step([replace(m, waves=["canary"]) if m.name == "a1" else
                replace(m, waves=[], selected=False) if m.name == "r2" else m for m in fleet(pending=fixed)],
               moved.status, 2)
    assert nxt.started
    assert recorded(nxt)["a1"] == ("canary", FIX, False)
    assert "r2" not in recorded(nxt)
    assert ("t-r2", "r2") not in nxt.releases


def test_a_member_that_joins_mid_round_neither_halts_it_nor_holds_its_wave_back() -> None:
    held = {n: {SRC: NEW} for n in EVERYONE}
    first = step(fleet(pending=held), None, 0)
    canaries = {"c1": NEW, "c2": NEW}
    rest = {n: v for n, v in held.items() if n not in canaries}
    # A StageSet labels itself into the open canary wave after the round began, and fails.
    joiner = member("evil", "canary", pending={}, ready=False, reason="StageFailed")
    joined = step([*fleet(pending=rest, applied=canaries, released=canaries), joiner], first.status, 1)
    assert joined.halted is None
    assert joined.reason is Reason.PROGRESSING
    assert recorded(joined)["evil"] == ("canary", "", True)
    assert next(m for m in joined.status.members if m.name == "evil").joined
    assert joined.status.waves[0].members == 2, "a joiner is not counted in its wave"
    # The canaries soak and ring1 opens, whatever the joiner does.
    later = step([*fleet(pending=rest, applied=canaries, released=canaries), joiner], joined.status, 12)
    assert later.opened == ["ring1"]
    assert later.halted is None
    # A joiner holding what it fetched is released as its wave is (the canary wave is open).
    fetching = member("late", "canary", pending={SRC: NEW}, ready=False, reason="UpdateDeferred")
    assert step([*fleet(pending=rest, applied=canaries, released=canaries), fetching],
                joined.status, 2).releases[("t-late", "late")].revisions == {SRC: NEW}
    # The next round counts it like anyone.
    fixed = {n: {SRC: FIX} for n in EVERYONE}
    nxt = step([*fleet(pending=fixed, applied=canaries, released=canaries),
                member("evil", "canary", pending={SRC: FIX})], later.status, 13)
    assert recorded(nxt)["evil"] == ("canary", FIX, False)


def test_a_status_from_before_records_counts_everyone_by_their_labels() -> None:
    first = step(fleet(pending={n: {SRC: NEW} for n in EVERYONE}), None, 0)
    legacy = first.status.model_copy(update={"releases": []})
    decision = step(fleet(pending={n: {SRC: NEW} for n in EVERYONE if n not in ("c1", "c2")},
                          applied={"c1": NEW, "c2": NEW}, released={"c1": NEW, "c2": NEW}), legacy, 1)
    assert not any(joined for _w, _r, joined in recorded(decision).values())
    assert released(decision)["r1"] == "", "nothing opens early after an upgrade"


# -- the member's side: its release from the rollout's status, the annotation a hint ------------------

RECORD = FleetRelease(rollout="web", wave="ring1", revisions={SRC: NEW})


@pytest.mark.parametrize(("case", "view", "annotation", "held", "said"), [
    ("no rollout, no annotation", FleetView(), None, False, ""),
    ("no rollout: an annotation left behind only narrows", FleetView(),
     FleetRelease(rollout="web", wave="a", revisions={SRC: OLD}), True, "until wave a opens"),
    ("no rollout: an annotation releasing it narrows nothing", FleetView(), RECORD, False, ""),
    ("selected, its status records the release, the annotation agrees",
     FleetView(selected_by=("web",), records={"web": RECORD}), RECORD, False, ""),
    ("recorded in a round that goes on (it relabelled itself out of the selector)",
     FleetView(records={"web": RECORD}), RECORD, False, ""),
    ("a forged annotation: the status records nothing for it yet",
     FleetView(selected_by=("web",)), RECORD, True, "until it releases a revision to this StageSet"),
    ("a forged annotation: the status records something else",
     FleetView(selected_by=("web",), records={"web": RECORD.model_copy(update={"revisions": {}})}), RECORD,
     True, "does not say what the rollout released"),
    ("an edited annotation", FleetView(selected_by=("web",), records={"web": RECORD}),
     RECORD.model_copy(update={"wave": "canary"}), True, "does not say what the rollout released"),
    ("a removed annotation", FleetView(selected_by=("web",), records={"web": RECORD}), None, True,
     "does not say what the rollout released"),
    ("an unreadable annotation", FleetView(selected_by=("web",), records={"web": RECORD}),
     FleetRelease(rollout="?", hold="unreadable"), True, "does not say what the rollout released"),
    ("contested", FleetView(selected_by=("other", "web"), records={"web": RECORD}), RECORD, True,
     "selected by the FleetRollouts other, web"),
    ("recorded by one rollout, selected by another",
     FleetView(selected_by=("other",), records={"web": RECORD}), RECORD, True,
     "selected by the FleetRollouts other, web"),
    ("a refused rollout selects it", FleetView(refused={"web": "spec.namespaceSelector: Field required"}),
     None, True, "it is refused (spec.namespaceSelector: Field required)"),
    ("its namespace's labels are not known yet", FleetView(unknown=("web",)), None, True,
     "its namespace's labels are not known yet"),
])
def test_a_member_takes_its_release_from_the_rollouts_status_and_the_annotation_only_narrows(
        case: str, view: FleetView, annotation: FleetRelease | None, held: bool, said: str) -> None:
    found = of_view(view, annotation=annotation, new={"app": NEW}, sources={"app": SRC})
    assert (found is not None) is held, case
    if found is not None:
        assert found.held == {"app": NEW}, case
        assert said in found.why, (case, found.why)
    assert of_view(view, annotation=annotation, new={}, sources={"app": SRC}) is None, "nothing new: no hold"


def test_a_rollout_without_a_platform_namespace_selector_is_refused() -> None:
    base = {"selector": {"matchLabels": {"app": "web"}}, "waves": [{"name": "all", "selector": {}}]}
    with pytest.raises(ValueError, match="namespaceSelector"):
        FleetRollout.model_validate({"metadata": {"name": "x"}, "spec": base})
    with pytest.raises(ValueError, match="must name at least one namespace label"):
        FleetRollout.model_validate({"metadata": {"name": "x"}, "spec": {**base, "namespaceSelector": {}}})
    assert FleetRollout.model_validate({"metadata": {"name": "x"}, "spec": {
        **base, "namespaceSelector": {"matchExpressions": [{"key": "fleet", "operator": "Exists"}]}}})


# -- the index: what a member's pass learns of the rollouts ----------------------------------------

def test_the_index_gives_members_their_records_and_holds_them_for_a_refused_rollout() -> None:
    from stageset.controller.fleet.index import FleetIndex
    from stageset.controller.keys import ObjectKey
    from stageset.controller.setup import Event

    labels = {"t-a": {"fleet": "yes"}, "t-b": {}}
    index = FleetIndex(namespace_labels=labels.get)
    for ns in ("t-a", "t-b", "t-c"):
        index.stageset(Event.ADDED, ObjectKey("StageSet", ns, "web"), {
            "metadata": {"namespace": ns, "name": "web", "labels": {"app": "web", "ring": "all"}}})
    spec = {"selector": {"matchLabels": {"app": "web"}},
            "namespaceSelector": {"matchLabels": {"fleet": "yes"}},
            "waves": [{"name": "all", "selector": {}}]}
    record = {"namespace": "t-a", "name": "web", "wave": "all", "revisions": {SRC: NEW}}
    changed = index.rollout(Event.ADDED, ObjectKey("FleetRollout", "", "web"),
                            {"metadata": {"name": "web"}, "spec": spec, "status": {"releases": [record]}})
    assert changed == [("t-a", "web")], "a member whose record changed is told"
    view = index.view("t-a", "web")
    assert view.selected_by == ("web",)
    assert view.records == {"web": FleetRelease(rollout="web", wave="all", revisions={SRC: NEW})}
    assert index.view("t-b", "web") == FleetView(), "a namespace the platform did not label: no member"
    assert index.view("t-c", "web").unknown == ("web",), "unknown namespace labels: held, never free"
    # The same status again: nothing changed for anyone.
    assert index.rollout(Event.MODIFIED, ObjectKey("FleetRollout", "", "web"),
                         {"metadata": {"name": "web"}, "spec": spec, "status": {"releases": [record]}}) == []
    # A rollout stored before namespaceSelector was required: refused, and it holds what it selects.
    legacy = {k: v for k, v in spec.items() if k != "namespaceSelector"}
    index.rollout(Event.ADDED, ObjectKey("FleetRollout", "", "old"),
                  {"metadata": {"name": "old"}, "spec": legacy})
    held = index.view("t-b", "web")
    assert "namespaceSelector" in held.refused["old"]
    found = of_view(held, annotation=None, new={"app": NEW}, sources={"app": SRC})
    assert found is not None
    assert "refused" in found.why
    assert index.orphans(rollout=None) == [], "no annotation is taken back from what a refused rollout holds"
    # The rollout goes: its members are told, and free.
    assert index.rollout(Event.DELETED, ObjectKey("FleetRollout", "", "web"), {}) == [("t-a", "web")]
    assert index.view("t-a", "web").records == {}
