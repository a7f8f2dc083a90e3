"""Process-level options of ``stageset controller``: probes, metrics, leader election, signals.

Kept apart from :mod:`stageset.cli.main` so the command's own options stay readable:
:func:`lifecycle_options` adds the flags below to a click command and hands the command one
``lifecycle: LifecycleSettings`` argument instead of eight.

Identity: none here; :class:`~stageset.controller.health.Lifecycle` runs leader election with
the controller's own identity.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

from stageset.api import duration_seconds
from stageset.controller.health import Lifecycle, LifecycleSettings, parse_address
from stageset.controller.leader import LeaderElectionConfig, default_identity, default_namespace
from stageset.controller.metrics import Metrics
from stageset.kube.client import ClientPool

__all__ = ["LifecycleSettings", "exit_stopped", "lifecycle_options", "make_lifecycle", "stop_on_signals"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = ("probe_address", "metrics_address", "leader_elect", "leader_election_namespace",
            "leader_election_id", "leader_election_lease_duration", "leader_election_renew_deadline",
            "leader_election_retry_period")


def _seconds(value: str, flag: str) -> float:
    try:
        seconds = duration_seconds(value)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=flag) from None
    if seconds <= 0:
        raise click.BadParameter(f"must be positive, got {value!r}", param_hint=flag)
    return seconds


def _address(value: str, flag: str) -> str | None:
    if not value:
        return None
    try:
        parse_address(value)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint=flag) from None
    return value


def lifecycle_settings(*, probe_address: str, metrics_address: str, leader_elect: bool,
                       leader_election_namespace: str, leader_election_id: str,
                       leader_election_lease_duration: str, leader_election_renew_deadline: str,
                       leader_election_retry_period: str) -> LifecycleSettings:
    election = None
    if leader_elect:
        namespace = leader_election_namespace or default_namespace()
        if not namespace:
            raise click.BadParameter("outside a cluster, name the Lease's namespace",
                                     param_hint="--leader-election-namespace")
        try:
            election = LeaderElectionConfig(
                namespace=namespace, name=leader_election_id, identity=default_identity(),
                lease_duration=_seconds(leader_election_lease_duration, "--leader-election-lease-duration"),
                renew_deadline=_seconds(leader_election_renew_deadline, "--leader-election-renew-deadline"),
                retry_period=_seconds(leader_election_retry_period, "--leader-election-retry-period"))
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--leader-election-*") from None
    return LifecycleSettings(probe_address=_address(probe_address, "--probe-address"),
                             metrics_address=_address(metrics_address, "--metrics-address"),
                             leader_election=election)


def lifecycle_options(command: F) -> F:
    """Add the process-level flags; the command receives ``lifecycle: LifecycleSettings``."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _OPTIONS}
        return command(*args, lifecycle=lifecycle_settings(**values), **kwargs)

    options = [
        click.option("--probe-address", default="", help="Serve /healthz and /readyz here, e.g. :8081 "
                     "(default: off)."),
        click.option("--metrics-address", default="", help="Serve /metrics here, e.g. :8080 (default: off)."),
        click.option("--leader-elect/--no-leader-elect", default=False, show_default=True,
                     help="Reconcile only while holding a Lease, so several replicas can run."),
        click.option("--leader-election-namespace", default="", help="Namespace of the Lease (default: "
                     "$POD_NAMESPACE or the in-cluster ServiceAccount's namespace)."),
        click.option("--leader-election-id", default="stageset-controller", show_default=True,
                     help="Name of the Lease; one per release (the chart uses the release's name)."),
        click.option("--leader-election-lease-duration", default="15s", show_default=True,
                     help="How long a Lease is valid without renewal."),
        click.option("--leader-election-renew-deadline", default="10s", show_default=True,
                     help="The leader exits when it could not renew for this long."),
        click.option("--leader-election-retry-period", default="2s", show_default=True,
                     help="How often the Lease is renewed or tried."),
    ]
    decorated: Any = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


def make_lifecycle(settings: LifecycleSettings, clients: ClientPool,
                   metrics: Metrics | None = None) -> Callable[[threading.Event], Lifecycle]:
    """The factory the Manager calls with its stop event; ``/metrics`` serves ``metrics``."""
    return lambda stop: Lifecycle(settings=settings, client=clients.client(), stop=stop,
                                  on_leadership_lost=exit_leadership_lost, metrics=metrics)


def exit_leadership_lost() -> None:
    """Leave at once: another process may hold the Lease soon, and we must not write after it."""
    logging.shutdown()
    os._exit(1)


def exit_stopped() -> None:
    """Leave once the controller has stopped (workers joined or their deadline passed, Lease
    released): a stage thread still in a request (a remote cluster that accepts connections and
    never answers holds one for its whole 30 s timeout) must not hold the process past the
    grace period.  What it was doing is abandoned safely: every write is an idempotent
    server-side apply or delete, and the next pass (or leader) does it again."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


_requested: threading.Event | None = None


def stop_on_signals() -> threading.Event:
    """Catch SIGTERM/SIGINT from the first moment; the event is handed to the manager later.

    One event per process: a command that prepares something before it starts the controller
    (``run --kubeconfig`` installs CRDs first) calls this early, and the controller's own call
    returns the same event, so a signal in between still stops it cleanly.
    """
    global _requested
    requested = _requested = _requested or threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s during start-up; stopping", signal.Signals(signum).name)
        requested.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    return requested
