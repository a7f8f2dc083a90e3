"""429 and Retry-After: how long the client waits before retrying a shed request."""

from __future__ import annotations

import pytest

from stageset.kube.client import MAX_RETRY_AFTER, _api_error, _throttle_wait, retry_after


@pytest.mark.parametrize(("header", "seconds"), [
    (None, None), ("1", 1.0), ("8", 8.0), ("0", 0.0), ("3600", MAX_RETRY_AFTER), ("-5", 0.0),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 1.0),
])
def test_retry_after_header(header: str | None, seconds: float | None) -> None:
    assert retry_after({} if header is None else {"Retry-After": header}) == seconds


def test_a_429_waits_at_least_retry_after_and_doubles() -> None:
    shed = _api_error(429, b'{"kind": "Status", "reason": "TooManyRequests", "message": "slow down"}', 2.0)
    waits = [_throttle_wait(shed, attempt=a) for a in range(4)]
    assert all(w is not None for w in waits)
    assert waits[0] is not None
    assert 2.0 <= waits[0] <= 2.5
    assert waits[1] is not None
    assert 4.0 <= waits[1] <= 5.0
    assert all(w is not None and w <= MAX_RETRY_AFTER * 1.25 for w in waits)


def test_only_shed_requests_are_retried() -> None:
    assert _throttle_wait(_api_error(500, b"{}", None), attempt=0) is None
    assert _throttle_wait(_api_error(503, b"{}", None), attempt=0) is None
    assert _throttle_wait(_api_error(503, b"{}", 3.0), attempt=0) is not None
    assert _throttle_wait(_api_error(429, b"{}", None), attempt=0) is not None
