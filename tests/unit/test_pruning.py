"""The one prune decision, over every way a pass can go: a plain pass, a steered one (gates,
windows, a parked rollback), a frozen one, one over a partial inventory, a rollback, a teardown
(with either deletion policy, and while the StageSet's own namespace is terminating: offboarding).

Each row of a pass that applied its stages is also judged by the verdict (:func:`plan.verdict`,
then :func:`steering.verdict`): such a pass deletes exactly when it ends Ready — the decision and
the Ready condition cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from stageset.api import StageSet, StageSetStatus, StageStatus
from stageset.api.release import Promotion, PromotionPhase, PromotionState, Rollback, RollbackPhase
from stageset.api.stageset import DeletionPolicy
from stageset.api.vocabulary import Reason, StagePhase
from stageset.controller.stageset import gates, plan, steering
from stageset.controller.stageset.plan import StageOutcome, Verdict
from stageset.controller.stageset.pruning import (
    Applied,
    Course,
    Frozen,
    PrunePermission,
    PruneReason,
    Reach,
    RollingBack,
    Scope,
    TearingDown,
    permission,
    prunes_stale,
    released_stages,
)
from stageset.controller.stageset.steering import Steering

NOW = datetime.datetime(2026, 3, 13, 18, 0, tzinfo=datetime.UTC)  # inside the Friday freeze below
FREEZE = [{"type": "Deny", "schedule": "0 18 * * FRI", "duration": "62h", "timeZone": "Europe/Berlin"}]
SOURCES = {"staging": "ns/app", "prod": "ns/app"}


def stageset(**spec: Any) -> StageSet:
    return StageSet.model_validate({"metadata": {"name": "shop", "namespace": "ns"},
                                    "spec": {"stages": [{"name": "staging", "sourceRef": {"name": "app"}},
                                                        {"name": "prod", "sourceRef": {"name": "app"}}],
                                             **spec}})


def status(applied: dict[str, str]) -> StageSetStatus:
    return StageSetStatus(stages=[StageStatus(name=n, phase=StagePhase.READY, revision=r)
                                  for n, r in applied.items()])


def ready(name: str, **fields: Any) -> StageOutcome:
    return StageOutcome(name, StagePhase.READY, revision="r1", **fields)


MANUAL = Promotion(require_manual_promotion=True)


def soaking() -> PromotionState | None:
    return gates.judge(Promotion(soak="10m"), None, revision="r1", ready=True, now=NOW).state


def awaiting() -> PromotionState | None:
    return gates.judge(MANUAL, None, revision="r1", ready=True, now=NOW).state


def promoted() -> PromotionState | None:
    return gates.judge(MANUAL, awaiting(), revision="r1", ready=True, now=NOW, promote=True).state


def windows_closed(applied: dict[str, str]) -> Steering:
    """What steering decides inside the freeze when both sources offer r2 (``applied``: before)."""
    return steering.steer(stageset(updateWindows=FREEZE), status(applied),
                          current={"staging": "r2", "prod": "r2"}, sources=SOURCES, now=NOW, generation=1)


PARKED = Steering(rollback=Rollback(phase=RollbackPhase.ROLLED_BACK, message="stage 'prod' failed"))
BOTH_READY = [ready("staging"), ready("prod")]


@dataclasses.dataclass(frozen=True)
class Pass:
    """A pass that applied its stages: its outcomes and what steering decided."""

    outcomes: list[StageOutcome]
    steer: Steering = dataclasses.field(default_factory=Steering)
    partial: str | None = None
    moving: bool = False

    def course(self) -> Applied:
        # As the pass runner builds it.
        return Applied(outcomes=self.outcomes, held_back=tuple(self.steer.skip), parked=self.steer.parked,
                       partial=self.partial, moving=self.moving)

    def verdict(self) -> Verdict:
        base = plan.verdict(self.outcomes, interval=600.0, retry=60.0, readiness_requeue=1.0)
        return steering.verdict(base, self.outcomes, steering=self.steer, now=NOW, interval=600.0)


CASES: list[tuple[str, Pass | Course, Scope, PruneReason]] = [
    # A plain pass.
    ("plain: every stage Ready", Pass(BOTH_READY), Scope.STALE, PruneReason.ALL_READY),
    ("plain: a stage waits for readiness",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.WAITING, Reason.PROGRESSING, "0/1")]),
     Scope.NOTHING, PruneReason.NOT_READY),
    ("plain: a stage failed",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.FAILED, Reason.STAGE_FAILED, "boom")]),
     Scope.NOTHING, PruneReason.NOT_READY),
    ("plain: a stage denied",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.FAILED, Reason.RBAC_DENIED, "no")]),
     Scope.NOTHING, PruneReason.NOT_READY),
    ("plain: a source not ready, its stage not started",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.PENDING, Reason.SOURCE_NOT_READY, "fetching")]),
     Scope.NOTHING, PruneReason.NOT_READY),
    ("plain: held past its timeout",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.PROGRESSING, Reason.STAGE_PROGRESSING, "late")]),
     Scope.NOTHING, PruneReason.NOT_READY),
    # Steered: promotion gates.
    ("steered: a Ready stage soaks", Pass([ready("staging", promotion=soaking()), ready("prod")]),
     Scope.NOTHING, PruneReason.PROMOTION_HELD),
    ("steered: a Ready stage awaits a manual promotion", Pass([ready("staging", promotion=awaiting()),
                                                              ready("prod")]),
     Scope.NOTHING, PruneReason.PROMOTION_HELD),
    ("steered: every gate promoted", Pass([ready("staging", promotion=promoted()), ready("prod")]),
     Scope.STALE, PruneReason.ALL_READY),
    # Steered: update windows.
    ("steered: closed windows pin what was applied, and it is Ready",
     Pass(BOTH_READY, windows_closed({"staging": "r1", "prod": "r1"})), Scope.STALE, PruneReason.ALL_READY),
    ("steered: closed windows hold back a stage never applied",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.PENDING, message="held by the update windows")],
          windows_closed({"staging": "r1"})),
     Scope.NOTHING, PruneReason.HELD_BACK),
    # Steered: a rolled-back release parked.
    ("steered: a parked rollback", Pass(BOTH_READY, PARKED), Scope.NOTHING, PruneReason.ROLLBACK_PARKED),
    # A partial inventory.
    ("partial: every stage Ready over an inventory rebuilt from a partial view",
     Pass(BOTH_READY, partial="the cluster could not be listed completely"),
     Scope.NOTHING, PruneReason.INVENTORY_INCOMPLETE),
    ("partial: and a stage failed (the failure says more)",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.FAILED, Reason.STAGE_FAILED, "boom")],
          partial="the cluster could not be listed completely"),
     Scope.NOTHING, PruneReason.NOT_READY),
    # A move to another cluster: the previous one is cleaned up only when every stage is Ready on
    # the new one, under exactly the conditions a stale prune has; otherwise nothing anywhere.
    ("moved: every stage Ready on the new cluster", Pass(BOTH_READY, moving=True), Scope.MOVED,
     PruneReason.MOVED),
    ("moved: a stage waits on the new cluster",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.WAITING, Reason.PROGRESSING, "0/1")],
          moving=True),
     Scope.NOTHING, PruneReason.NOT_READY),
    ("moved: a stage failed on the new cluster",
     Pass([ready("staging"), StageOutcome("prod", StagePhase.FAILED, Reason.STAGE_FAILED, "boom")],
          moving=True),
     Scope.NOTHING, PruneReason.NOT_READY),
    ("moved: a Ready stage awaits a manual promotion",
     Pass([ready("staging", promotion=awaiting()), ready("prod")], moving=True),
     Scope.NOTHING, PruneReason.PROMOTION_HELD),
    ("moved: a parked rollback", Pass(BOTH_READY, PARKED, moving=True), Scope.NOTHING,
     PruneReason.ROLLBACK_PARKED),
    ("moved: over an inventory rebuilt from a partial view",
     Pass(BOTH_READY, partial="the cluster could not be listed completely", moving=True),
     Scope.NOTHING, PruneReason.INVENTORY_INCOMPLETE),
    # The other ways a pass goes.
    ("frozen: windowScope All while closed", Frozen(), Scope.NOTHING, PruneReason.FROZEN),
    ("rollback: run or resumed", RollingBack(), Scope.RESTORED, PruneReason.ROLLING_BACK),
    ("teardown", TearingDown(DeletionPolicy.DELETE, namespace_terminating=False),
     Scope.ALL, PruneReason.DELETED),
    ("teardown with deletionPolicy Orphan: released, never deleted",
     TearingDown(DeletionPolicy.ORPHAN, namespace_terminating=False), Scope.NOTHING, PruneReason.ORPHANED),
    # Offboarding: the StageSet's namespace is deleted with it.
    ("teardown in a terminating namespace: everything elsewhere, nothing inside it",
     TearingDown(DeletionPolicy.DELETE, namespace_terminating=True),
     Scope.ALL, PruneReason.NAMESPACE_TERMINATING),
    ("teardown with deletionPolicy Orphan in a terminating namespace: released elsewhere, nothing inside",
     TearingDown(DeletionPolicy.ORPHAN, namespace_terminating=True), Scope.NOTHING, PruneReason.ORPHANED),
]
# Where a pass may delete or release at all: everywhere, but for the rows named here.
REACHES = {
    "teardown in a terminating namespace: everything elsewhere, nothing inside it":
        Reach.OUTSIDE_OWN_NAMESPACE,
    "teardown with deletionPolicy Orphan in a terminating namespace: released elsewhere, nothing inside":
        Reach.OUTSIDE_OWN_NAMESPACE,
}


@pytest.mark.parametrize(("case", "given", "scope", "reason"), CASES, ids=[c[0] for c in CASES])
def test_the_one_prune_decision(case: str, given: Pass | Course, scope: Scope, reason: PruneReason) -> None:
    course = given.course() if isinstance(given, Pass) else given
    assert permission(course) == PrunePermission(scope, reason, REACHES.get(case, Reach.EVERYWHERE)), case
    if isinstance(given, Pass) and given.partial is None:
        # A pass that applied its stages deletes exactly when it ends Ready.
        assert (scope in (Scope.STALE, Scope.MOVED)) == (given.verdict().ready is True), case


def test_the_table_covers_every_scope_and_reason() -> None:
    assert {c[2] for c in CASES} == set(Scope)
    assert {c[3] for c in CASES} == set(PruneReason)
    assert {*REACHES.values(), Reach.EVERYWHERE} == set(Reach)
    assert set(REACHES) <= {c[0] for c in CASES}


@pytest.mark.parametrize("kind", [PrunePermission, Applied, Frozen, RollingBack, TearingDown])
def test_nothing_about_deleting_has_a_default(kind: type) -> None:
    """A field left out must fail (type-checking and construction): no default decides deletion."""
    for field in dataclasses.fields(kind):
        assert field.default is dataclasses.MISSING, (kind, field.name)
        assert field.default_factory is dataclasses.MISSING, (kind, field.name)


def test_a_verdict_no_longer_carries_prune() -> None:
    assert "prune" not in {f.name for f in dataclasses.fields(Verdict)}
    with pytest.raises(TypeError):
        Applied(outcomes=BOTH_READY, held_back=(), parked=False, partial=None)  # type: ignore[call-arg]


def test_a_stage_held_back_is_never_pruned_even_if_every_outcome_says_ready() -> None:
    # Belt and braces: held back wins over outcomes (its objects would look stale).
    course = Applied(outcomes=BOTH_READY, held_back=("prod",), parked=False, partial=None, moving=True)
    assert permission(course) == PrunePermission(Scope.NOTHING, PruneReason.HELD_BACK, Reach.EVERYWHERE)


@pytest.mark.parametrize("scope", list(Scope))
def test_only_stale_and_moved_prune_what_is_stale(scope: Scope) -> None:
    assert prunes_stale(scope) is (scope in (Scope.STALE, Scope.MOVED))


def test_the_promoted_gate_is_really_promoted() -> None:
    # The table's "every gate promoted" row means something only if the state is PROMOTED.
    phases = [None if s is None else s.phase for s in (promoted(), soaking(), awaiting())]
    assert phases == [PromotionPhase.PROMOTED, PromotionPhase.SOAKING, PromotionPhase.AWAITING_MANUAL]


@pytest.mark.parametrize(("policy", "unpruned", "released"), [
    (DeletionPolicy.DELETE, [], set()),
    (DeletionPolicy.DELETE, ["db"], {"db"}),  # prune: false: released, never deleted
    (DeletionPolicy.ORPHAN, [], {"db", "app"}),  # Orphan: nothing is deleted, on any cluster left
    (DeletionPolicy.ORPHAN, ["db"], {"db", "app"}),
])
def test_leaving_a_cluster_releases_as_the_deletion_policy_says_for_a_teardown_and_a_move_alike(
        policy: DeletionPolicy, unpruned: list[str], released: set[str]) -> None:
    assert released_stages(["db", "app"], unpruned=unpruned, policy=policy) == released
