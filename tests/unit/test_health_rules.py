"""CEL health checks: the priority rules (pure, table by table) and the real CEL runtime behind them.

``judge`` is pure: answers in, readiness out.  The tests at the bottom evaluate real
expressions in the sandbox's worker process (cel-expr-python), so the rules are checked
against what CEL really answers — a missing key, a non-bool, a type error.
"""

from __future__ import annotations

from typing import Any

import pytest

from stageset.api import StageSet
from stageset.api.stageset import HealthCheckExpr
from stageset.api.vocabulary import Reason
from stageset.apply.cel import Answer, CelSandbox
from stageset.apply.errors import StageError
from stageset.apply.health import ExpressionChecker, HealthChecks, HealthRule, judge, rules_of, variables
from stageset.apply.readiness import Status

RULE = HealthRule.of(0, HealthCheckExpr(api_version="example.com/v1", kind="Widget", current="c",
                                        in_progress="p", failed="f"))
TRUE, FALSE = Answer(value=True), Answer(value=False)
MISSING = Answer(error='NOT_FOUND: Key not found in map : "phase"')


def test_rule_orders_expressions_failed_current_in_progress() -> None:
    assert [field for field, _ in RULE.exprs] == ["failed", "current", "inProgress"]
    only_current = HealthRule.of(2, HealthCheckExpr(api_version="v1", kind="X", current="c"))
    assert only_current.exprs == (("current", "c"),)
    assert only_current.where("current") == "readyChecks.exprs[2].current"


# answers are (failed, current, inProgress)
@pytest.mark.parametrize(("case", "answers", "status", "message"), [
    ("failed wins over current", (TRUE, TRUE, TRUE), Status.FAILED, "readyChecks.exprs[0].failed is true"),
    ("current wins over inProgress", (FALSE, TRUE, TRUE), Status.CURRENT, ""),
    ("inProgress", (FALSE, FALSE, TRUE), Status.IN_PROGRESS, "readyChecks.exprs[0].inProgress is true"),
    ("none true: in progress", (FALSE, FALSE, FALSE), Status.IN_PROGRESS, "current is not true yet"),
    ("an error counts as not true", (MISSING, TRUE, FALSE), Status.CURRENT, ""),
    ("an error is shown while waiting", (FALSE, MISSING, FALSE), Status.IN_PROGRESS, "Key not found"),
])
def test_priority(case: str, answers: tuple[Answer, ...], status: Status, message: str) -> None:
    verdict = judge(RULE, answers, stage="app", what="Widget ns/w")
    assert verdict.status is status, case
    assert message in verdict.message, case


def test_a_result_that_is_not_a_bool_is_invalid_spec_naming_the_expression() -> None:
    with pytest.raises(StageError) as caught:
        judge(RULE, (FALSE, Answer(type="string"), FALSE), stage="app", what="Widget ns/w")
    assert caught.value.reason is Reason.INVALID_SPEC
    assert caught.value.message == ("stage 'app': readyChecks.exprs[0].current returned string, not bool, "
                                    "for Widget ns/w")


def test_rules_match_group_and_kind_not_version() -> None:
    widget = {"apiVersion": "example.com/v2", "kind": "Widget"}
    assert RULE.governs(widget)
    assert not RULE.governs({"apiVersion": "other.com/v1", "kind": "Widget"})
    assert not RULE.governs({"apiVersion": "example.com/v1", "kind": "Gadget"})


def test_variables_are_the_top_level_fields_with_empty_maps_for_absent_ones() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    seen = variables(obj)
    assert seen == {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                    "spec": {}, "status": {}, "self": obj}


# -- against the real runtime ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def sandbox() -> Any:
    box = CelSandbox()
    yield box
    box.close()


def widget(status: dict[str, Any] | None = None, *, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "example.com/v1", "kind": "Widget",
                           "metadata": {"name": "w", "namespace": "ns", "generation": generation}}
    if status is not None:
        obj["status"] = status
    return obj


FLUX_STYLE = HealthCheckExpr(
    api_version="example.com/v1", kind="Widget",
    current="status.conditions.filter(e, e.type == 'Ready').all(e, e.status == 'True')",
    in_progress="status.phase == 'Provisioning'",
    failed="status.conditions.filter(e, e.type == 'Ready').all(e, e.status == 'False')")


@pytest.mark.parametrize(("case", "obj", "status"), [
    ("ready", widget({"conditions": [{"type": "Ready", "status": "True"}], "phase": "Up"}), Status.CURRENT),
    ("failed", widget({"conditions": [{"type": "Ready", "status": "False"}], "phase": "Up"}), Status.FAILED),
    ("provisioning", widget({"conditions": [{"type": "Ready", "status": "Unknown"}],
                             "phase": "Provisioning"}), Status.IN_PROGRESS),
    ("no status yet: the missing key waits", widget(), Status.IN_PROGRESS),
    ("generation not observed: no expression runs",
     widget({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}, generation=2),
     Status.IN_PROGRESS),
])
def test_flux_style_expressions_in_the_real_runtime(sandbox: CelSandbox, case: str, obj: dict[str, Any],
                                                    status: Status) -> None:
    checks = HealthChecks(rules=[HealthRule.of(0, FLUX_STYLE)], sandbox=sandbox, stage="app")
    verdict = checks.judge(obj, what="Widget ns/w")
    assert verdict is not None
    assert verdict.status is status, (case, verdict)


def test_kinds_without_an_expression_are_left_to_kstatus(sandbox: CelSandbox) -> None:
    checks = HealthChecks(rules=[HealthRule.of(0, FLUX_STYLE)], sandbox=sandbox, stage="app")
    assert checks.judge({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
                        what="ConfigMap c") is None


FAILED_ONLY = HealthCheckExpr(api_version="example.com/v1", kind="Widget", failed="status.phase == 'Broken'")


@pytest.mark.parametrize(("case", "obj", "verdict"), [
    ("failed is true: failed", widget({"phase": "Broken"}), Status.FAILED),
    ("otherwise kstatus decides", widget({"phase": "Up"}), None),
    ("even with no status", widget(), None),
])
def test_an_entry_without_current_only_adds_failed(sandbox: CelSandbox, case: str, obj: dict[str, Any],
                                                   verdict: Status | None) -> None:
    # The reference's rule: its kstatus wait runs first, then an entry without `current` can only fail.
    checks = HealthChecks(rules=[HealthRule.of(0, FAILED_ONLY)], sandbox=sandbox, stage="app")
    judged = checks.judge(obj, what="Widget ns/w")
    assert (judged.status if judged else None) is verdict, case
    assert not checks.gates(obj)  # nothing for a stage with disableWait to wait for
    assert HealthChecks(rules=[HealthRule.of(0, FLUX_STYLE)], sandbox=sandbox, stage="app").gates(obj)


def stageset_with(exprs: list[dict[str, Any]]) -> StageSet:
    return StageSet.model_validate({"metadata": {"name": "s", "namespace": "ns"}, "spec": {"stages": [
        {"name": "first", "sourceRef": {"name": "r"}},
        {"name": "app", "sourceRef": {"name": "r"}, "readyChecks": {"exprs": exprs}}]}})


@pytest.mark.parametrize(("case", "expr", "message"), [
    ("syntax error", {"current": "status.phase =="},
     "stage 'app': readyChecks.exprs[0].current does not compile: INVALID_ARGUMENT"),
    ("unknown variable", {"current": "true", "failed": "widget.status"},
     "stage 'app': readyChecks.exprs[0].failed does not compile"),
    ("returns an int", {"current": "size(status)"},
     "stage 'app': readyChecks.exprs[0].current returns int, not bool"),
    ("returns a string", {"current": "true", "inProgress": "'yes'"},
     "stage 'app': readyChecks.exprs[0].inProgress returns string, not bool"),
])
def test_bad_expressions_are_invalid_spec_before_anything_is_applied(
        sandbox: CelSandbox, case: str, expr: dict[str, str], message: str) -> None:
    spec = stageset_with([{"apiVersion": "example.com/v1", "kind": "Widget", **expr}])
    with pytest.raises(StageError) as caught:
        ExpressionChecker(sandbox).check(spec)
    assert caught.value.reason is Reason.INVALID_SPEC, case
    assert caught.value.message.startswith(message), (case, caught.value.message)


def test_good_expressions_pass_the_check_and_dyn_results_wait_for_evaluation(sandbox: CelSandbox) -> None:
    spec = stageset_with([{"apiVersion": "example.com/v1", "kind": "Widget",
                           "current": "status.ready", "failed": "has(status.error)",
                           "inProgress": "status.?phase.orValue('') == 'Provisioning'"}])
    ExpressionChecker(sandbox).check(spec)  # dyn (status.ready) is only known when evaluated
    checks = HealthChecks(rules=rules_of(spec.spec.stages[1]), sandbox=sandbox, stage="app")
    with pytest.raises(StageError, match=r"readyChecks.exprs\[0\].current returned string, not bool"):
        checks.judge(widget({"ready": "yes"}), what="Widget ns/w")
    ready = checks.judge(widget({"ready": True}), what="Widget ns/w")
    assert ready is not None
    assert ready.status is Status.CURRENT
