"""Process-level pieces of ``stageset controller``: addresses, leader-election flags, JSON logs."""

from __future__ import annotations

import json
import logging
import os
import signal

import click
import pytest

from stageset.cli import process
from stageset.cli.process import lifecycle_settings
from stageset.controller.health import parse_address
from stageset.controller.leader import LeaderElectionConfig
from stageset.controller.logs import JsonFormatter


@pytest.mark.parametrize(("text", "expected"), [
    (":8081", ("0.0.0.0", 8081)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9000", ("::1", 9000)),  # noqa: S104
])
def test_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["8081", ":http", "host:99999", ""])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="not an address"):
        parse_address(text)


def settings(**overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        "probe_address": ":8081", "metrics_address": "", "leader_elect": True,
        "leader_election_namespace": "ops", "leader_election_id": "prod-stageset",
        "leader_election_lease_duration": "15s", "leader_election_renew_deadline": "10s",
        "leader_election_retry_period": "2s"}
    values.update(overrides)
    return values


def test_leader_election_settings() -> None:
    lifecycle = lifecycle_settings(**settings())  # type: ignore[arg-type]
    assert lifecycle.probe_address == ":8081"
    assert lifecycle.metrics_address is None
    election = lifecycle.leader_election
    assert election is not None
    assert (election.namespace, election.name) == ("ops", "prod-stageset")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (15, 10, 2)
    assert lifecycle_settings(**settings(leader_elect=False)).leader_election is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"leader_election_renew_deadline": "20s"}, "retry period < renew deadline < lease duration"),
    ({"leader_election_lease_duration": "15"}, "invalid duration"),
    ({"leader_election_retry_period": "0s"}, "must be positive"),
    ({"probe_address": "8081"}, "not an address"),
])
def test_bad_settings_are_usage_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(click.BadParameter, match=message):
        lifecycle_settings(**settings(**overrides))  # type: ignore[arg-type]


def test_the_lease_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline"):
        LeaderElectionConfig(namespace="n", name="l", identity="me", lease_duration=10, renew_deadline=10)


def test_json_logs_are_one_object_per_line() -> None:
    record = logging.LogRecord("stageset.x", logging.WARNING, __file__, 1, "a %s\nb", ("message",), None)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == ("warning", "stageset.x", "a message\nb")


def test_a_signal_before_the_controller_starts_is_kept_for_it() -> None:
    # `run --kubeconfig` catches signals before it installs the CRDs; the controller's own call
    # must hand back the same event, or a Ctrl-C in between would be lost (or kill the process).
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        early = process.stop_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        later = process.stop_on_signals()
        assert later is early
        assert later.wait(timeout=5)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        process._requested = None
