"""``status.history`` as a pass's conclusion records it (pure rules)."""

from __future__ import annotations

from stageset.api.history import NAMED, PER_STAGE, StageHistory, per_stage
from stageset.api.vocabulary import Reason, StagePhase
from stageset.apply.changeset import Action, Change
from stageset.apply.inventory import ObjectId
from stageset.controller.stageset.history import recorded
from stageset.controller.stageset.plan import StageOutcome


def change(name: str, action: Action, *, drift: bool = False) -> Change:
    return Change(ObjectId(namespace="shop", name=name, group="", kind="ConfigMap"), action, drift)


def outcome(revision: str, phase: StagePhase = StagePhase.READY) -> StageOutcome:
    return StageOutcome("config", phase, revision=revision, applied_at=f"2026-01-01T00:00:0{revision[-1]}Z")


def run(previous: list[StageHistory], revision: str, *, changes: list[Change] | None = None,
        generation: int = 1, phase: StagePhase = StagePhase.READY, applied: bool = True,
        pruned: int = 0, now: str | None = None) -> list[StageHistory]:
    return recorded(previous, order=["config"], outcomes={"config": outcome(revision, phase)},
                    applied=["config"] if applied else [], changes={"config": changes or []},
                    pruned={"config": pruned} if pruned else {}, generation=generation,
                    now=now or f"2026-01-01T00:00:0{revision[-1]}Z")


def attempt(previous: list[StageHistory], revision: str | None, reason: Reason, *, generation: int = 1,
            now: str) -> list[StageHistory]:
    """A pass in which the stage failed without applying anything (refused, denied, not buildable)."""
    failed = StageOutcome("config", StagePhase.FAILED, reason, "stage 'config': refused")
    return recorded(previous, order=["config"], outcomes={"config": failed}, applied=[], changes={},
                    pruned={}, generation=generation, now=now, tried={"config": revision})


def test_a_new_revision_starts_a_release_newest_first() -> None:
    first = run([], "r1", changes=[change("a", Action.CREATED)])
    second = run(first, "r2", changes=[change("a", Action.CONFIGURED), change("b", Action.CREATED)], pruned=1)
    releases = second[0].releases
    assert [r.revision for r in releases] == ["r2", "r1"]
    assert (releases[0].created, releases[0].configured, releases[0].deleted) == (1, 1, 1)
    assert releases[0].objects == ["ConfigMap/shop/a configured", "ConfigMap/shop/b created"]
    assert releases[0].applied_at == "2026-01-01T00:00:02Z"


def test_a_quiet_pass_leaves_the_history_as_it_was() -> None:
    first = run([], "r1", changes=[change("a", Action.CREATED)])
    again = run(first, "r1", changes=[change("a", Action.UNCHANGED)])
    assert again == first
    # Restoring drift is no release, and is not counted.
    drifted = run(first, "r1", changes=[change("a", Action.CONFIGURED, drift=True)])
    assert drifted == first
    # A stage not applied in the pass keeps its history untouched.
    assert run(first, "r9", applied=False) == first


def test_the_same_revision_after_a_failure_updates_its_release() -> None:
    failed = run([], "r1", changes=[change("a", Action.CREATED)], phase=StagePhase.FAILED)
    fixed = run(failed, "r1", changes=[change("b", Action.CREATED)])
    assert len(fixed[0].releases) == 1
    assert fixed[0].releases[0].phase is StagePhase.READY
    assert fixed[0].releases[0].created == 2
    # A new spec generation at the same revision is a release of its own when it changed something
    # (issue 50: one that changed nothing -- a suspend, a resume -- is not, see below).
    assert len(run(fixed, "r1", generation=2, changes=[change("a", Action.CONFIGURED)])[0].releases) == 2


def test_a_release_has_its_own_time_even_when_it_wrote_nothing() -> None:
    """A new revision that changed nothing this stage renders is released at that pass's time, not at
    the time of the last apply that wrote (the stage's lastAppliedTime)."""
    first = run([], "r1", changes=[change("a", Action.CREATED)], now="2026-01-01T00:00:00Z")
    quiet = recorded(first, order=["config"], outcomes={"config": StageOutcome(
        "config", StagePhase.READY, revision="r2", applied_at="2026-01-01T00:00:00Z")},
        applied=["config"], changes={"config": [change("a", Action.UNCHANGED)]}, pruned={}, generation=1,
        now="2026-01-01T00:03:00Z")
    assert [(r.revision, r.applied_at) for r in quiet[0].releases] == [
        ("r2", "2026-01-01T00:03:00Z"), ("r1", "2026-01-01T00:00:00Z")]


def test_suspend_and_resume_never_crowd_out_releases() -> None:
    """Each suspend and resume is a new spec generation that applies nothing: no row of its own."""
    history = run([], "r1", changes=[change("a", Action.CREATED)])
    history = run(history, "r2", changes=[change("a", Action.CONFIGURED)])
    for generation in range(2, 2 + 2 * PER_STAGE):
        history = run(history, "r2", generation=generation, changes=[change("a", Action.UNCHANGED)])
    assert [r.revision for r in history[0].releases] == ["r2", "r1"]
    assert history[0].releases[0].generation == 1


def test_failed_attempts_are_listed_with_their_reason_once() -> None:
    history = run([], "r1", changes=[change("a", Action.CREATED)])
    failed = attempt(history, "r2", Reason.RBAC_DENIED, now="2026-01-01T00:05:00Z")
    entry = failed[0].releases[0]
    assert (entry.revision, entry.phase, entry.reason, entry.attempt, entry.applied_at) == (
        "r2", StagePhase.FAILED, "RBACDenied", True, "2026-01-01T00:05:00Z")
    assert (entry.created, entry.configured, entry.deleted) == (0, 0, 0)
    # The same failure retried is the same entry (a retrying stage writes nothing new) ...
    assert attempt(failed, "r2", Reason.RBAC_DENIED, now="2026-01-01T00:06:00Z") == failed
    # ... another one is a new entry, and the fix is a release above them.
    other = attempt(failed, "r2", Reason.STAGE_FAILED, now="2026-01-01T00:07:00Z")
    fixed = run(other, "r2", changes=[change("a", Action.CONFIGURED)], now="2026-01-01T00:09:00Z")
    assert [(r.revision, r.reason, bool(r.attempt)) for r in fixed[0].releases] == [
        ("r2", None, False), ("r2", "StageFailed", True), ("r2", "RBACDenied", True), ("r1", None, False)]
    # A stage that could not be built tried a revision unknown to it.
    unbuilt = attempt([], None, Reason.INVALID_SPEC, now="2026-01-01T00:01:00Z")
    assert unbuilt[0].releases[0].revision is None


def test_history_is_bounded() -> None:
    history: list[StageHistory] = []
    for number in range(PER_STAGE + 5):
        history = run(history, f"r{number}",
                      changes=[change(f"o{i}", Action.CREATED) for i in range(NAMED + 3)])
    releases = history[0].releases
    assert len(releases) == PER_STAGE
    assert releases[0].revision == f"r{PER_STAGE + 4}"
    assert all(len(r.objects) == NAMED and r.created == NAMED + 3 for r in releases)
    assert per_stage(64) * 64 <= 160
    assert per_stage(1) == PER_STAGE


def test_a_stage_gone_from_the_spec_keeps_no_history() -> None:
    first = run([], "r1")
    gone = recorded(first, order=["other"], outcomes={}, applied=[], changes={}, pruned={}, generation=2,
                    now="2026-01-01T00:00:09Z")
    assert gone == []
