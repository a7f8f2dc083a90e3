from __future__ import annotations

from collections.abc import Sequence

from stageset.api import Condition
from stageset.api.vocabulary import Reason
from stageset.controller.conditions import find_condition, ready_at_generation, summarize

T0, T1 = "2000-01-01T00:00:00Z", "2000-01-01T00:05:00Z"


def types(conditions: Sequence[Condition]) -> dict[str, str]:
    return {c.type: c.status for c in conditions}


def test_ready_clears_reconciling_and_stalled() -> None:
    conditions = summarize([], ready=None, reason=Reason.PROGRESSING, message="m", generation=1, now=T0)
    assert types(conditions) == {"Ready": "Unknown", "Reconciling": "True"}
    conditions = summarize(conditions, ready=True, reason=Reason.SUCCEEDED, message="ok", generation=1,
                           now=T1)
    assert types(conditions) == {"Ready": "True"}
    assert conditions[0].observed_generation == 1
    assert conditions[0].last_transition_time == T1


def test_stalled_is_set_only_when_asked() -> None:
    conditions = summarize([], ready=False, reason=Reason.STALLED, message="cycle", generation=2, now=T0,
                           stalled=True)
    assert types(conditions) == {"Ready": "False", "Stalled": "True"}
    assert types(summarize(conditions, ready=False, reason=Reason.STAGE_FAILED, message="x", generation=2,
                           now=T0)) == {"Ready": "False"}


def test_transition_time_kept_while_status_unchanged() -> None:
    first = summarize([], ready=False, reason=Reason.STAGE_FAILED, message="m", generation=1, now=T0)
    again = summarize(first, ready=False, reason=Reason.RBAC_DENIED, message="n", generation=1, now=T1)
    assert again[0].last_transition_time == T0
    assert again[0].reason == "RBACDenied"
    moved = summarize(again, ready=True, reason=Reason.SUCCEEDED, message="ok", generation=1, now=T1)
    assert moved[0].last_transition_time == T1


def test_conditions_serialize_with_the_wire_strings() -> None:
    (ready,) = summarize([], ready=True, reason=Reason.SUCCEEDED, message="ok", generation=3, now=T0)
    assert ready.model_dump(mode="json", exclude_none=True) == {
        "type": "Ready", "status": "True", "reason": "Succeeded", "message": "ok", "observedGeneration": 3,
        "lastTransitionTime": T0}


def test_ready_at_generation_of_raw_objects() -> None:
    def obj(status: str, observed: int) -> dict[str, object]:
        return {"metadata": {"generation": 2}, "status": {"conditions": [
            {"type": "Ready", "status": status, "observedGeneration": observed}]}}
    assert ready_at_generation(obj("True", 2))
    assert not ready_at_generation(obj("True", 1))
    assert not ready_at_generation(obj("False", 2))
    assert find_condition(None, "Ready") == {}


# -- runbook links (the one place status is written) -----------------------------------------

def test_a_non_ready_message_ends_with_its_reasons_runbook() -> None:
    from stageset.controller.status import with_runbook

    assert with_runbook("denied", Reason.RBAC_DENIED, "https://docs.example/runbooks/") == \
        "denied; runbook: https://docs.example/runbooks/rbacdenied/"
    assert with_runbook("", Reason.SOURCE_NOT_READY, "https://docs.example/runbooks") == \
        "runbook: https://docs.example/runbooks/sourcenotready/"
    assert with_runbook("denied", Reason.RBAC_DENIED, "") == "denied"


def test_the_runbook_link_survives_the_length_bound() -> None:
    from stageset.controller.conditions import MAX_MESSAGE
    from stageset.controller.status import with_runbook

    long = with_runbook("x" * (MAX_MESSAGE + 100), Reason.STAGE_FAILED, "https://d/")
    assert len(long) == MAX_MESSAGE
    assert long.endswith("; runbook: https://d/stagefailed/")
