"""Hostile stage contents at full size, each built in its own process: refused, never a crash.

The child process exits normally with a BuildError for every input (a crash of the parser
would show up here as a signal exit, not as a dead test runner), and its memory stays
near where it started.  ``python -m tests.build.hostile`` prints the figures for
docs/security.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.build.hostile import CASES, Case, measure

MiB_GROWTH_AT_PEAK = 128
"""Before these fixes a 4 MiB flow sequence peaked ~880 MiB above the idle process."""
MiB_KEPT_AFTER = 32


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_input_is_refused_in_bounded_memory(case: Case, request: pytest.FixtureRequest) -> None:
    builder: Path | None = request.getfixturevalue("builder_binary") if case.kustomize else None
    figures = measure(case, builder=str(builder) if builder else None)
    assert figures["outcome"] != "crashed", f"the build process died: {figures}"
    assert figures["outcome"] == "refused", figures
    assert case.refused in figures["message"]
    assert figures["peak"] - figures["before"] < MiB_GROWTH_AT_PEAK, figures
    assert figures["after"] - figures["before"] < MiB_KEPT_AFTER, figures
