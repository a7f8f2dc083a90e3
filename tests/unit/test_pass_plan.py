"""The pass plan, table by table: no I/O, time passed in."""

from __future__ import annotations

import datetime

import pytest

from stageset.api import Condition, StageSetStatus, StageStatus
from stageset.api.vocabulary import ConditionStatus, Reason, StagePhase
from stageset.apply.inventory import ObjectId
from stageset.apply.readiness import Readiness, Status
from stageset.controller.ordering import StageNode
from stageset.controller.stageset import plan, pruning
from stageset.controller.stageset.plan import Previous, StageOutcome

T0 = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
REV = "main@sha1:" + "a" * 40
NEW = "main@sha1:" + "b" * 40


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def status(
    *,
    ready: str | None = "True",
    observed: int = 1,
    generation: int = 1,
    stages: dict[str, tuple[StagePhase, str]] | None = None,
) -> StageSetStatus:
    conditions = (
        []
        if ready is None
        else [
            Condition(
                type="Ready",
                status=ConditionStatus(ready),
                reason="Succeeded",
                message="",
                observed_generation=generation,
                last_transition_time="2030-01-01T00:00:00Z",
            )
        ]
    )
    return StageSetStatus(
        observed_generation=observed,
        conditions=conditions,
        stages=[StageStatus(name=n, phase=p, revision=r) for n, (p, r) in (stages or {}).items()],
    )


# -- previous state, rechecks, quiet -------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "previous", "revisions", "expected"),
    [
        ("waiting at this revision", status(stages={"a": (StagePhase.WAITING, REV)}), {"a": REV}, {"a"}),
        ("waiting, new revision", status(stages={"a": (StagePhase.WAITING, REV)}), {"a": NEW}, set()),
        ("ready is applied again", status(stages={"a": (StagePhase.READY, REV)}), {"a": REV}, set()),
        ("held past its timeout", status(stages={"a": (StagePhase.PROGRESSING, REV)}), {"a": REV}, {"a"}),
        ("held, new revision", status(stages={"a": (StagePhase.PROGRESSING, REV)}), {"a": NEW}, set()),
        ("failed is applied again", status(stages={"a": (StagePhase.FAILED, REV)}), {"a": REV}, set()),
        (
            "spec changed since",
            status(observed=1, stages={"a": (StagePhase.WAITING, REV)}),
            {"a": REV},
            "gen2",
        ),
        ("not rendered", status(stages={"a": (StagePhase.WAITING, REV)}), {}, set()),
    ],
)
def test_rechecks(case: str, previous: StageSetStatus, revisions: dict[str, str], expected: object) -> None:
    generation = 2 if expected == "gen2" else 1
    state = Previous.from_status(previous, generation=generation)
    assert plan.rechecks(state, revisions) == (set() if expected == "gen2" else expected), case


@pytest.mark.parametrize(
    ("case", "previous", "revisions", "stages", "quiet"),
    [
        ("ready, same revisions", status(stages={"a": (StagePhase.READY, REV)}), {"a": REV}, 1, True),
        ("ready, a new revision", status(stages={"a": (StagePhase.READY, REV)}), {"a": NEW}, 1, False),
        ("ready, a stage not rendered", status(stages={"a": (StagePhase.READY, REV)}), {"a": REV}, 2, False),
        (
            "ready at an older generation",
            status(generation=0, stages={"a": (StagePhase.READY, REV)}),
            {"a": REV},
            1,
            False,
        ),
        ("not ready", status(ready="False", stages={"a": (StagePhase.READY, REV)}), {"a": REV}, 1, False),
        ("a new stage", status(stages={"a": (StagePhase.READY, REV)}), {"a": REV, "b": REV}, 2, False),
    ],
)
def test_the_quiet_pass_rule(
    case: str, previous: StageSetStatus, revisions: dict[str, str], stages: int, quiet: bool
) -> None:
    state = Previous.from_status(previous, generation=1)
    assert plan.quiet(state, revisions, stages=stages) is quiet, case


@pytest.mark.parametrize(
    ("ready", "quiet", "announce"),
    [
        ("True", False, True),
        ("True", True, False),
        ("Unknown", False, False),
        ("False", False, True),
        (None, False, True),
    ],
)
def test_a_pass_announces_itself_only_when_not_visibly_in_progress(
    ready: str | None, quiet: bool, announce: bool
) -> None:
    state = Previous.from_status(status(ready=ready), generation=1)
    assert plan.announce(state, is_quiet=quiet) is announce
    # A pass that only re-checks stages applies nothing: it never announces itself.
    assert plan.announce(state, is_quiet=quiet, only_rechecks=True) is False


# -- the readiness window ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "waiting_since", "wrote", "now", "started", "wait"),
    [
        ("first wait", None, True, 0, 0, 3.0),
        ("keeps waiting from waitingSince", "2030-01-01T00:00:00Z", False, 50, 0, 3.0),
        ("last slice is shorter", "2030-01-01T00:00:00Z", False, 59, 0, 1.0),
        ("past the timeout: no wait", "2030-01-01T00:00:00Z", False, 90, 0, 0.0),
        ("a write starts afresh", "2030-01-01T00:00:00Z", True, 50, 50, 3.0),
        ("unreadable waitingSince starts afresh", "yesterday", False, 50, 50, 3.0),
    ],
)
def test_readiness_window(
    case: str, waiting_since: str | None, wrote: bool, now: float, started: float, wait: float
) -> None:
    window = plan.readiness_window(
        now=at(now), waiting_since=waiting_since, wrote=wrote, timeout=60, slice_seconds=3.0
    )
    assert (window.started, window.wait) == (at(started), wait), case


READY = StageOutcome("a", StagePhase.READY, Reason.SUCCEEDED, "", REV, 1, "2030-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("case", "readiness", "now", "phase", "reason", "message"),
    [
        ("not waited for", None, 10, StagePhase.READY, Reason.SUCCEEDED, ""),
        ("current", Readiness(Status.CURRENT), 10, StagePhase.READY, Reason.SUCCEEDED, ""),
        (
            "failed",
            Readiness(Status.FAILED, "job failed"),
            10,
            StagePhase.FAILED,
            Reason.STAGE_FAILED,
            "job failed",
        ),
        (
            "in progress, within timeout",
            Readiness(Status.IN_PROGRESS, "ready 0/1"),
            59,
            StagePhase.WAITING,
            Reason.PROGRESSING,
            "ready 0/1",
        ),
        (
            "in progress at the timeout",
            Readiness(Status.IN_PROGRESS, "ready 0/1"),
            60,
            StagePhase.PROGRESSING,
            Reason.STAGE_PROGRESSING,
            "not ready after 60s: ready 0/1",
        ),
    ],
)
def test_judge_readiness(
    case: str, readiness: Readiness | None, now: float, phase: StagePhase, reason: Reason, message: str
) -> None:
    window = plan.Window(started=T0, wait=3.0, timeout=60)
    judged = plan.judge_readiness(READY, window=window, now=at(now), readiness=readiness)
    assert (judged.phase, judged.reason, judged.message) == (phase, reason, message), case
    waiting = phase in (StagePhase.WAITING, StagePhase.PROGRESSING)
    assert judged.waiting_since == ("2030-01-01T00:00:00Z" if waiting else None)


# -- the verdict ---------------------------------------------------------------------------------


def outcome(
    name: str, phase: StagePhase, reason: Reason | None = None, message: str = "", revision: str | None = REV
) -> StageOutcome:
    return StageOutcome(name, phase, reason, message, revision)


@pytest.mark.parametrize(
    ("case", "outcomes", "ready", "reason", "requeue", "prune"),
    [
        (
            "all ready",
            [outcome("a", StagePhase.READY, Reason.SUCCEEDED)],
            True,
            Reason.SUCCEEDED,
            600.0,
            True,
        ),
        (
            "waiting",
            [outcome("a", StagePhase.READY), outcome("b", StagePhase.WAITING, Reason.PROGRESSING, "0/1")],
            None,
            Reason.PROGRESSING,
            1.0,
            False,
        ),
        (
            "a failure beats waiting",
            [
                outcome("a", StagePhase.WAITING, Reason.PROGRESSING),
                outcome("b", StagePhase.FAILED, Reason.STAGE_FAILED, "bad"),
            ],
            False,
            Reason.STAGE_FAILED,
            120.0,
            False,
        ),
        (
            "RBACDenied wins",
            [
                outcome("a", StagePhase.FAILED, Reason.STAGE_FAILED),
                outcome("b", StagePhase.FAILED, Reason.RBAC_DENIED),
            ],
            False,
            Reason.RBAC_DENIED,
            120.0,
            False,
        ),
        (
            "a source not ready retries soon",
            [outcome("a", StagePhase.PENDING, Reason.SOURCE_NOT_READY)],
            False,
            Reason.SOURCE_NOT_READY,
            30.0,
            False,
        ),
        (
            "held at its timeout retries soon",
            [outcome("a", StagePhase.PROGRESSING, Reason.STAGE_PROGRESSING)],
            False,
            Reason.STAGE_PROGRESSING,
            30.0,
            False,
        ),
        (
            "blocked without a reason",
            [outcome("a", StagePhase.PENDING)],
            False,
            Reason.STAGE_FAILED,
            120.0,
            False,
        ),
    ],
)
def test_verdict(
    case: str, outcomes: list[StageOutcome], ready: bool | None, reason: Reason, requeue: float, prune: bool
) -> None:
    verdict = plan.verdict(outcomes, interval=600.0, retry=120.0, readiness_requeue=1.0)
    # Whether the pass prunes is not the verdict's: the one decision, asked of the same outcomes.
    course = pruning.Applied(outcomes=outcomes, held_back=(), parked=False, partial=None, moving=False)
    prunes = pruning.permission(course).scope is pruning.Scope.STALE
    assert (verdict.ready, verdict.reason, verdict.requeue_after, prunes) == (
        ready,
        reason,
        requeue,
        prune,
    ), case


def test_the_verdict_names_the_revisions_applied() -> None:
    verdict = plan.verdict(
        [outcome("a", StagePhase.READY), outcome("b", StagePhase.READY, revision=NEW)],
        interval=60,
        retry=60,
        readiness_requeue=1,
    )
    assert verdict.revision == f"{REV}, {NEW}"
    assert verdict.message == f"applied 2 stage(s) at {REV}, {NEW}"


@pytest.mark.parametrize(
    ("reason", "stalled", "requeue"),
    [
        (Reason.INVALID_SPEC, True, None),
        (Reason.STALLED, True, None),
        (Reason.PROGRESSING, False, 1.0),
        (Reason.RBAC_DENIED, False, 90.0),
        (Reason.DEPENDENCY_NOT_READY, False, 90.0),
    ],
)
def test_failures_before_any_stage(reason: Reason, stalled: bool, requeue: float | None) -> None:
    assert plan.before_stages(reason, retry=90.0) == plan.Failure(stalled=stalled, requeue_after=requeue)


def test_a_stage_that_could_not_render_waits_for_its_source_or_fails() -> None:
    carried = StageOutcome.carried(
        "a",
        StageStatus(
            name="a",
            phase=StagePhase.READY,
            revision=REV,
            objects=3,
            last_applied_time="t",
            waiting_since="w",
        ),
    )
    assert (carried.phase, carried.revision, carried.objects, carried.applied_at) == (
        StagePhase.PENDING,
        REV,
        3,
        "t",
    )
    waiting = carried.failed(Reason.ARTIFACT_NOT_FOUND, "not fetched yet")
    assert (waiting.phase, waiting.revision, waiting.objects) == (StagePhase.PENDING, REV, None)
    assert carried.failed(Reason.STAGE_FAILED, "bad").phase is StagePhase.FAILED


def test_clash_message_names_the_first_object_and_its_stages() -> None:
    oid = ObjectId(namespace="ns", name="twice", group="", kind="ConfigMap")
    assert plan.clash_message({}) is None
    assert plan.clash_message({oid: ["a", "b"]}) == (
        "ConfigMap ns/twice is rendered by more than one stage (a, b); "
        "each object must belong to exactly one stage"
    )


# -- teardown ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "nodes", "inventories", "order"),
    [
        (
            "a chain, dependents first",
            [StageNode("a", None), StageNode("b", None), StageNode("c", None)],
            ["a", "b", "c"],
            ["c", "b", "a"],
        ),
        (
            "removed stages first",
            [StageNode("a", None)],
            ["a", "gone", "also-gone"],
            ["also-gone", "gone", "a"],
        ),
        ("only stages with objects", [StageNode("a", None), StageNode("b", None)], ["a"], ["a"]),
        (
            "a diamond",
            [
                StageNode("top", ()),
                StageNode("l", ("top",)),
                StageNode("r", ("top",)),
                StageNode("bottom", ("l", "r")),
            ],
            ["top", "l", "r", "bottom"],
            ["bottom", "r", "l", "top"],
        ),
        ("an unreadable spec: names only", None, ["b", "a"], ["a", "b"]),
    ],
)
def test_teardown_order(
    case: str, nodes: list[StageNode] | None, inventories: list[str], order: list[str]
) -> None:
    assert plan.teardown_order(nodes, inventories) == order, case


@pytest.mark.parametrize(
    ("deleted_at", "now", "expired"),
    [
        ("2030-01-01T00:00:00Z", 299, False),
        ("2030-01-01T00:00:00Z", 300, True),
        (None, 1000, False),
    ],
)
def test_teardown_expires_after_the_maximum_wait(deleted_at: str | None, now: float, expired: bool) -> None:
    assert plan.teardown_expired(now=at(now), deleted_at=deleted_at, max_wait=300) is expired


# -- parity: timeouts, onTimeout, drift cadence ----------------------------------------------------


def _stageset(spec: dict[str, object], **stage: object) -> object:
    from stageset.api import StageSet

    return StageSet.model_validate({"metadata": {"name": "s", "namespace": "ns"}, "spec": {
        "stages": [{"name": "app", "sourceRef": {"name": "r"}, **stage}], **spec}})


@pytest.mark.parametrize(("case", "spec", "stage", "expected"), [
    ("StageSet's timeout", {"timeout": "4m"}, {}, "4m"),
    ("the stage's wins", {"timeout": "4m"}, {"timeout": "2m"}, "2m"),
    ("readyChecks.timeout wins", {"timeout": "4m"},
     {"timeout": "2m", "readyChecks": {"timeout": "30s"}}, "30s"),
    ("zero falls through", {"timeout": "4m"}, {"timeout": "0s", "readyChecks": {"timeout": "0s"}}, "4m"),
])
def test_readiness_timeout_ladder(case: str, spec: dict[str, object], stage: dict[str, object],
                                  expected: str) -> None:
    stageset = _stageset(spec, **stage)
    assert stageset.spec.stages[0].ready_timeout(stageset.spec.timeout) == expected, case  # type: ignore[attr-defined]


@pytest.mark.parametrize(("spec", "expected"), [
    ({}, 600.0),
    ({"driftDetectionInterval": "1m"}, 60.0),
    ({"driftDetectionInterval": "20m"}, 600.0),
    ({"interval": "10m", "driftDetectionInterval": "1m"}, 60.0),
    ({"interval": "1m", "driftDetectionInterval": "10m"}, 60.0),
    ({"interval": "10m", "driftDetectionInterval": "0s"}, 600.0),
])
def test_a_ready_stageset_is_applied_again_at_the_drift_detection_interval(spec: dict[str, object],
                                                                          expected: float) -> None:
    stageset = _stageset(spec)
    requeue = stageset.spec.requeue_when_ready(600.0)  # type: ignore[attr-defined]  # --default-interval
    outcomes = [StageOutcome("app", StagePhase.READY, revision=REV)]
    assert plan.verdict(outcomes, interval=requeue, retry=5, readiness_requeue=1).requeue_after == expected


def test_on_timeout_hold_is_explicit_and_per_stage_overrides_inherit() -> None:
    from stageset.api.stageset import OnTimeout

    stageset = _stageset({})
    assert plan.on_timeout(stageset, stageset.spec.stages[0]) is OnTimeout.HOLD  # type: ignore[attr-defined]
    window = plan.Window(started=T0, wait=0, timeout=10)
    held = plan.judge_readiness(StageOutcome("app", StagePhase.READY), window=window, now=at(11),
                                readiness=Readiness(Status.IN_PROGRESS, "Widget w: not yet"),
                                on_timeout=OnTimeout.HOLD)
    assert (held.phase, held.reason) == (StagePhase.PROGRESSING, Reason.STAGE_PROGRESSING)
    failed = plan.judge_readiness(StageOutcome("app", StagePhase.READY), window=window, now=at(1),
                                  readiness=Readiness(Status.FAILED, "readyChecks.exprs[0].failed is true"),
                                  on_timeout=OnTimeout.HOLD)
    assert (failed.phase, failed.reason) == (StagePhase.FAILED, Reason.STAGE_FAILED)
