"""``bench.transport`` at a tiny size, so it cannot rot: every candidate that the table names ran the
controller's request mix against a real control plane, each request answered 2xx as the tenant.

A real control plane and real subprocesses (one per candidate), as the benchmark runs them; the
numbers are not asserted (no timed assertions), only that each row is a real measurement: the
requests made, their status codes, the CPU counted, and connections kept within what the workers
need (no connection re-opened per request).
"""

from __future__ import annotations

import pytest

from bench import transport

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

CYCLES = 3
THREADS = 2
TENANTS = 2
# The candidates that work from several threads at once (httpx's HTTP/2 does not: its row says so).
WORKING = ("stageset", "stageset-urllib3", "urllib3-h2", "httpx-h1", "pycurl")


def test_every_candidate_completes_the_mix_as_the_tenant() -> None:
    text, results = transport.measure(candidates=transport.CANDIDATES, threads=(THREADS,), cycles=CYCLES,
                                      tenants=TENANTS, repeat=1)
    by_name = {r["candidate"]: r for r in results}
    assert set(by_name) == set(transport.CANDIDATES)
    expected = THREADS * CYCLES * transport.REQUESTS_PER_CYCLE
    for name in WORKING:
        result = by_name[name]
        assert not result.get("failed"), result
        assert result["codes"] == {"200": expected}, result  # 403 if impersonation or the Role were wrong
        assert result["requests"] == expected
        assert result["cpu"] > 0
        assert result["kube-apiserver"] >= 0
        # Keep-alive: at most one connection per worker and identity over the whole run.
        assert 0 < result["connections"] <= THREADS * TENANTS, result
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == list(transport.CANDIDATES)
