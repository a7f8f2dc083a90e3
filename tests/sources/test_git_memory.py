"""Memory stays near its idle level for every hostile Git input (each run in a fresh process;
see tests/sources/memprobe.py).  The figures themselves are reported by
``python -m bench.git_fetch --hostile`` into docs/security.md."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sources.memprobe import Case, hostile_cases, measure

UNFILTERED, FILTERED = (f"450 MB blob of zeros, server {kind} partial clone"
                        for kind in ("without", "with"))
EXPECTED = {
    UNFILTERED: "LimitExceededError: the remote sent a blob of 471859200",
    FILTERED: "LimitExceededError: file 'deploy/blob.bin' is larger",
    "100 000 files": "LimitExceededError: more than 10000 files",
    "tree bomb (64 million paths)": "LimitExceededError: more than 200000 tree entries",
    "wide pack": "LimitExceededError: the objects the remote sent add up to more than 67108864",
    "endless ref listing": "LimitExceededError: the remote sent more than 16777216 bytes",
    "catastrophic ignore pattern": "ok: 2 files read",
}


@pytest.fixture(scope="module")
def cases() -> Iterator[list[Case]]:
    with hostile_cases(quick=True) as built:
        yield built


@pytest.mark.timeout(600)
def test_hostile_inputs_are_refused_with_flat_memory(cases: list[Case]) -> None:
    failures = []
    for case in cases:
        report = measure(case.spec)
        assert report["outcome"].startswith(EXPECTED[case.name]), (case.name, report)
        # Idle is ~40 MiB (interpreter, dulwich, re2).  Generous bounds: a 450 MB blob
        # inflated in memory would be 10x these.
        if report["peak"] - report["before"] > 96 or report["after"] - report["before"] > 32:
            failures.append((case.name, report))
    assert not failures
