"""``bench.drift`` runs, and says what it should, at a small N (the N = 100 and 1,000 measurement is a
long run on a quiet machine: docs/scale.md#drift-by-watch).

Three StageSets, each in a tenant namespace of its own, with a controller without drift watches and
one with them: the second holds one watch per tenant namespace, opened during the cold convergence
as the tenants, and corrects both edits; the first holds none and corrects nothing within the wait.
"""

from __future__ import annotations

import pytest

from bench import drift

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]


def test_the_drift_benchmark_runs_and_shows_watches_held_and_edits_corrected(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert drift.main(["--sizes", "3", "--interval", "5", "--windows", "1", "--edits", "2",
                       "--watch-memory", "10", "--no-docs"]) == 0
    out = capsys.readouterr().out
    rows = {cells[2]: cells for line in out.splitlines()
            if (cells := [c.strip() for c in line.strip("|").split("|")]) and cells[0] == "3"}
    assert set(rows) == {"off", "on"}, out
    off, on = rows["off"], rows["on"]
    assert (off[3], off[9]) == ("0", "0"), "no drift watch held or opened without them"
    assert (on[3], on[4], on[9]) == ("3", "0", "3"), "one watch per tenant namespace, opened as the tenant"
    assert on[11].endswith("(2 of 2)"), on[11]
    assert off[11] == "at the interval"
    [memory] = [line for line in out.splitlines() if line.startswith("| 10 |")]
    assert memory.split("|")[2].strip() == "10", "every held watch streamed"
