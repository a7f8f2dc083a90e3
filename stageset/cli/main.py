"""click commands.  Each command builds its settings once and injects them."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

import click
from kubernetes.utils import parse_quantity

from sources import Limits
from stageset.api import duration_seconds
from stageset.build import BuildLimits
from stageset.cli import process
from stageset.controller.manager import Manager
from stageset.controller.redact import install_log_filter
from stageset.controller.settings import ControllerSettings
from stageset.kube.client import ClientPool


def parse_size(value: str) -> int:
    """A Kubernetes quantity as whole bytes: ``2Gi``, ``500M``, ``1048576``.

    ``500m`` is 0.5 (milli), not 500 megabytes: a fraction of a byte is refused.
    """
    try:
        quantity = parse_quantity(value.strip())  # type: ignore[no-untyped-call]
    except ValueError as error:
        raise click.BadParameter(f"not a size: {value!r} (use e.g. 2Gi, 500Mi, 1000000)") from error
    if quantity < 0 or quantity != quantity.to_integral_value():
        raise click.BadParameter(f"not a whole number of bytes: {value!r} (m means milli; use M or Mi)")
    return int(quantity)


def parse_duration_option(value: str) -> float:
    """A duration flag (``30s``, ``5m``, ``1h30m``) in seconds."""
    try:
        return duration_seconds(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


def _namespaces(value: str | None) -> tuple[str, ...] | None:
    if not value:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    return names or None


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Secret values (substituted into manifests, echoed by apiservers) never reach the log.
    install_log_filter()
    # The kubernetes client logs request bodies at DEBUG, which may include Secrets.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("dulwich").setLevel(logging.WARNING)


def run_controller(manager: Manager, *, early_stop: threading.Event | None = None) -> None:
    """Run ``manager`` in the foreground until SIGINT/SIGTERM (or one received earlier: ``early_stop``)."""

    def stop(_signum: int, _frame: FrameType | None) -> None:
        manager.stop.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if early_stop is not None and early_stop.is_set():
        manager.stop.set()
    manager.run()


@click.group()
@click.version_option(package_name="stageset", prog_name="stageset")
def main() -> None:
    """stageset: staged GitOps for Kubernetes, applied as the tenant."""


@main.command()
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), envvar="KUBECONFIG",
              help="Kubeconfig to use; in-cluster configuration when omitted.")
@click.option("--watch-namespaces", envvar="STAGESET_WATCH_NAMESPACES", default="",
              help="Comma-separated namespaces to watch (namespace-scoped watches); all when empty.")
@click.option("--cluster-admin/--no-cluster-admin", default=False,
              help="Single-tenant mode: StageSets without serviceAccountName apply as the controller.")
@click.option("--no-cross-namespace-refs", is_flag=True, default=False,
              help="Refuse sourceRef and dependsOn into other namespaces.")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(min=1),
              help="Concurrent StageSet reconciles.")
@click.option("--source-workers", default=4, show_default=True, type=click.IntRange(min=1),
              help="Concurrent GitRepository fetches (a pool of their own).")
@click.option("--max-workers-per-namespace", default=0, show_default=True, type=click.IntRange(min=0),
              help="Workers of each pool one namespace may hold at once; 0: half of each pool.")
@click.option("--mirror-dir", type=click.Path(file_okay=False), default=None,
              help="Where Git mirrors are kept (default: a temporary directory).")
@click.option("--mirror-max-size", default="", help="Evict least recently used Git mirrors past "
              "this size, e.g. 2Gi (default: unbounded).")
@click.option("--allow-insecure-sources", is_flag=True, default=False,
              help="Development only: allow plain http:// Git URLs (credentials in clear text).")
@click.option("--allow-local-sources", is_flag=True, default=False,
              help="Single-tenant only: allow file:// Git URLs and local paths (never the "
              "controller's own mirrors or system paths).")
@click.option("--git-max-file-size", default="10Mi", show_default=True,
              help="Largest file a source may hold (also the largest object a fetch accepts).")
@click.option("--git-max-read-size", default="100Mi", show_default=True,
              help="Most bytes one read of a source returns (a stage path or the whole source).")
@click.option("--git-max-files", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most files one read of a source returns.")
@click.option("--git-max-fetch-size", default="512Mi", show_default=True,
              help="Most bytes (unpacked) one Git fetch may bring.")
@click.option("--max-teardown-wait", default="5m", show_default=True,
              help="Release a deleted StageSet whose objects cannot be removed after this long.")
@click.option("--resync-period", default="5m", show_default=True,
              help="List every watched kind again this often, whatever the watches said (recovers "
              "events a broken connection lost).")
@click.option("--build-limit", "build_limits", multiple=True, metavar="NAME=VALUE",
              help="Override one limit of a stage's build, e.g. max_stage_objects=50000 "
              "(see docs/layouts.md).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(["text", "json"]))
@process.lifecycle_options
def controller(kubeconfig: str | None, watch_namespaces: str, cluster_admin: bool,
               no_cross_namespace_refs: bool, workers: int, source_workers: int,
               max_workers_per_namespace: int, mirror_dir: str | None, mirror_max_size: str,
               allow_insecure_sources: bool, allow_local_sources: bool, git_max_file_size: str,
               git_max_read_size: str, git_max_files: int, git_max_fetch_size: str,
               max_teardown_wait: str, resync_period: str, build_limits: tuple[str, ...],
               log_level: str, log_format: str, lifecycle: process.LifecycleSettings) -> None:
    """Run the controller against a cluster."""
    early_stop = process.stop_on_signals()
    _setup_logging(log_level)
    if log_format == "json":
        process.use_json_logs()
    try:
        limits = BuildLimits.with_overrides(build_limits)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--build-limit") from None
    settings = ControllerSettings(
        build_limits=limits,
        watch_namespaces=_namespaces(watch_namespaces),
        cluster_admin=cluster_admin,
        no_cross_namespace_refs=no_cross_namespace_refs,
        workers=workers,
        source_workers=source_workers,
        max_workers_per_namespace=max_workers_per_namespace,
        mirror_dir=Path(mirror_dir) if mirror_dir else Path(tempfile.mkdtemp(prefix="stageset-mirrors-")),
        allow_insecure_sources=allow_insecure_sources,
        allow_local_sources=allow_local_sources,
        source_limits=Limits(max_file_bytes=parse_size(git_max_file_size),
                             max_total_bytes=parse_size(git_max_read_size),
                             max_files=git_max_files,
                             max_fetch_bytes=parse_size(git_max_fetch_size)),
        mirror_max_bytes=parse_size(mirror_max_size) if mirror_max_size else None,
        max_teardown_wait=parse_duration_option(max_teardown_wait),
        resync_period=max(1.0, parse_duration_option(resync_period)),
    )
    clients = ClientPool.from_kubeconfig(kubeconfig)
    try:
        run_controller(Manager(clients=clients, settings=settings,
                               lifecycle=process.make_lifecycle(lifecycle, clients)), early_stop=early_stop)
    finally:
        clients.close()


@main.command()
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run the controller against this cluster instead of a local control plane.")
@click.option("--examples", type=click.Path(exists=True, file_okay=False), default=None,
              help="Directory served as the demo Git repository (default: the repo's examples/).")
@click.option("--once", is_flag=True, default=False,
              help="Exit once the example StageSet is Ready (for scripted runs).")
def run(kubeconfig: str | None, examples: str | None, once: bool) -> None:
    """The main job: reconcile the example on a local control plane (or run against --kubeconfig)."""
    from stageset.cli.demo import run_demo

    _setup_logging(os.environ.get("STAGESET_LOG_LEVEL", "warning"))
    if kubeconfig:
        clients = ClientPool.from_kubeconfig(kubeconfig)
        try:
            run_controller(Manager(clients=clients, settings=ControllerSettings(
                mirror_dir=Path(tempfile.mkdtemp(prefix="stageset-mirrors-")))))
        finally:
            clients.close()
        return
    directory = Path(examples) if examples else Path(__file__).resolve().parents[2] / "examples"
    sys.exit(run_demo(examples=directory, once=once, stop=threading.Event()))
