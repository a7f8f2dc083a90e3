"""``status.history`` as a pass's conclusion records it (pure rules)."""

from __future__ import annotations

from stageset.api.history import NAMED, PER_STAGE, StageHistory, per_stage
from stageset.api.vocabulary import StagePhase
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
        pruned: int = 0) -> list[StageHistory]:
    return recorded(previous, order=["config"], outcomes={"config": outcome(revision, phase)},
                    applied=["config"] if applied else [], changes={"config": changes or []},
                    pruned={"config": pruned} if pruned else {}, generation=generation)


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
    # A new spec generation at the same revision is a release of its own.
    assert len(run(fixed, "r1", generation=2)[0].releases) == 2


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
    gone = recorded(first, order=["other"], outcomes={}, applied=[], changes={}, pruned={}, generation=2)
    assert gone == []
