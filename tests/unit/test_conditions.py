from __future__ import annotations

from stageset.controller.conditions import summarize


def types(conditions: list[dict[str, object]]) -> dict[object, object]:
    return {c["type"]: c["status"] for c in conditions}


def test_ready_clears_reconciling_and_stalled() -> None:
    conditions = summarize([], ready=None, reason="Progressing", message="m", generation=1)
    assert types(conditions) == {"Ready": "Unknown", "Reconciling": "True"}
    conditions = summarize(conditions, ready=True, reason="Succeeded", message="ok", generation=1)
    assert types(conditions) == {"Ready": "True"}
    assert conditions[0]["observedGeneration"] == 1


def test_stalled_is_set_only_when_asked() -> None:
    conditions = summarize([], ready=False, reason="Stalled", message="cycle", generation=2, stalled=True)
    assert types(conditions) == {"Ready": "False", "Stalled": "True"}


def test_transition_time_kept_while_status_unchanged() -> None:
    first = summarize([], ready=False, reason="A", message="m", generation=1)
    first[0]["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    again = summarize(first, ready=False, reason="B", message="n", generation=1)
    assert again[0]["lastTransitionTime"] == "2000-01-01T00:00:00Z"
