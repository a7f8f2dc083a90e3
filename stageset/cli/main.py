"""``controller`` (production) and ``run`` (the local demo), and the ``stageset`` group they join.

``controller`` runs the controller; ``run`` is the local demo (or the controller against
``--kubeconfig``; hidden from the command list, ``make run`` runs it).  The group itself and every
other command are registered in :mod:`stageset.cli.root`, which loads a command's module only when
it runs, so ``stageset --version`` or a TAB press never imports the controller; this module is the
controller's, loaded for ``controller`` and ``run`` (and re-exports the group as ``main``).  The
user commands (``get``, ``tree``, ``graph``, ``events``, ``history``, ``logs``, ``trace``,
``build``, ``diff``, ``reconcile``, ``suspend``, ``resume`` -- each also in its ``source git`` form
--, ``export``, ``create stageset``/``source git``, ``delete stageset``/``source git``, ``crds``)
and the platform commands (``check``, ``version``, ``cleanup``, ``completion``, ``create tenant``,
``delete tenant``, ``uninstall``) live in their own modules.  The same group is the
``kubectl-stageset`` plugin (:func:`kubectl_plugin`).  Exit codes: 0 ok, 1 differences (``diff``),
2 usage, 3 runtime error (:mod:`stageset.cli.session`).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import inspect
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType
from typing import Any

import click

from sources import Limits
from sources.limits import ArtifactLimits
from stageset.apply.rights import DEFAULT_MAX_AGE
from stageset.apply.settings import ApplySettings
from stageset.build import BuildLimits
from stageset.cli import process
from stageset.cli.params import (
    BASE_URL,
    DURATION,
    HOSTS,
    LABEL_SELECTOR,
    NAMESPACE_OR_EMPTY,
    NAMESPACES,
    SERVICE_ACCOUNT_NAME,
    SHARD_KEYS,
    SIZE,
    parse_duration_option,
    parse_size,
)
from stageset.cli.root import kubectl_plugin, main
from stageset.controller import logs, memory
from stageset.controller.leader import default_namespace
from stageset.controller.manager import Manager
from stageset.controller.metrics import Metrics
from stageset.controller.notifications.delivery import DeliverySettings
from stageset.controller.notifications.notifier import NotificationSettings
from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL, ArtifactSettings, ControllerSettings
from stageset.controller.sharding import SHARD_LABEL, LabelSelector
from stageset.controller.sourcekinds import DefaultSourceKind
from stageset.kube.client import ClientPool

__all__ = ["controller", "kubectl_plugin", "main", "parse_duration_option", "parse_size"]


def _setup_logging(level: str, fmt: str = "text") -> None:
    logs.setup(level=level, fmt=fmt)


def run_controller(manager: Manager, *, early_stop: threading.Event | None = None) -> None:
    """Run ``manager`` in the foreground until SIGINT/SIGTERM (or one received earlier: ``early_stop``)."""

    def stop(_signum: int, _frame: FrameType | None) -> None:
        manager.stop.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if early_stop is not None and early_stop.is_set():
        manager.stop.set()
    manager.run()


def controller_settings(params: dict[str, Any], *, temporary_mirrors: bool = True) -> ControllerSettings:
    """The controller's settings from its flags (``controller``, and ``run``'s pass-through);
    without ``--mirror-dir``, a fresh temporary directory (``temporary_mirrors``) or the default."""
    try:
        limits = BuildLimits.with_overrides(params.get("build_limits") or ())
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--build-limit") from None
    mirror_dir = params.get("mirror_dir") or (tempfile.mkdtemp(prefix="stageset-mirrors-")
                                              if temporary_mirrors else None)
    known = Limits()
    settings = ControllerSettings(
        build_limits=limits,
        watch_namespaces=params.get("watch_namespaces"),
        watch_label_selector=params.get("watch_label_selector"),
        shard_keys=shard_keys(params),
        shard_handoff_timeout=float(params.get("shard_handoff_timeout", 30.0)),
        cluster_admin=bool(params.get("cluster_admin")),
        default_service_account=params.get("default_service_account") or None,
        no_cross_namespace_refs=bool(params.get("no_cross_namespace_refs")),
        workers=int(params.get("workers", 4)),
        source_workers=int(params.get("source_workers", 4)),
        max_workers_per_namespace=int(params.get("max_workers_per_namespace", 0)),
        allow_insecure_sources=bool(params.get("allow_insecure_sources")),
        allow_local_sources=bool(params.get("allow_local_sources")),
        source_limits=Limits(max_file_bytes=int(params.get("git_max_file_size") or known.max_file_bytes),
                             max_total_bytes=int(params.get("git_max_read_size") or known.max_total_bytes),
                             max_files=int(params.get("git_max_files") or known.max_files),
                             max_fetch_bytes=int(params.get("git_max_fetch_size") or known.max_fetch_bytes)),
        mirror_max_bytes=params.get("mirror_max_size"),
        default_interval=max(1.0, float(params.get("default_interval", 600.0))),
        max_teardown_wait=float(params.get("max_teardown_wait", 3600.0)),
        resync_period=max(1.0, float(params.get("resync_period", 300.0))),
        max_readiness_watches=int(params.get("max_readiness_watches", 100)),
        max_drift_watches=int(params.get("max_drift_watches", 500)),
        target_namespaces=tuple(params.get("target_namespaces") or ()),
        max_remote_targets=int(params.get("max_remote_targets", 64)),
        workload_identity=bool(params.get("workload_identity")),
        max_dependency_watches=int(params.get("max_dependency_watches", 100)),
        runbook_base_url=str(params.get("runbook_base_url", DEFAULT_RUNBOOK_BASE_URL)),
        default_source_kind=DefaultSourceKind(params.get("default_source_kind")
                                              or DefaultSourceKind.GIT_REPOSITORY),
        artifacts=artifact_settings(params),
        allowed_action_hosts=tuple(params.get("allowed_action_hosts") or ()),
        notifications=NotificationSettings(
            namespace=params.get("notification_namespace") or None,
            tenants=bool(params.get("tenant_notifications")),
            delivery=DeliverySettings(rate=float(params.get("notification_rate", 1.0)),
                                      burst=int(params.get("notification_burst", 10)))),
        apply=ApplySettings(rights_max_age=float(params.get("rights_recheck_interval", DEFAULT_MAX_AGE))),
    )
    return dataclasses.replace(settings, mirror_dir=Path(mirror_dir)) if mirror_dir else settings


def shard_keys(params: dict[str, Any]) -> tuple[str, ...] | None:
    """``--shard-keys``: only for the main shard (``--watch-label-selector '!sharding.fluxcd.io/key'``),
    the one whose watch leaves out every labelled object."""
    keys: tuple[str, ...] | None = params.get("shard_keys")
    selector: LabelSelector | None = params.get("watch_label_selector")
    if keys is not None and (selector is None or selector.shard != ""):
        raise click.BadParameter(f"only the main shard reports objects no shard serves: it needs "
                                 f"--watch-label-selector '!{SHARD_LABEL}'", param_hint="--shard-keys")
    return keys


def _main_shard_only(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...] | None
                     ) -> tuple[str, ...] | None:
    """Checked while parsing (before the command sets anything up); ``--watch-label-selector`` is
    declared first, so it is parsed already."""
    return shard_keys({**ctx.params, "shard_keys": value})


def artifact_settings(params: dict[str, Any]) -> ArtifactSettings:
    """``--artifact-*`` flags; unset ones keep :class:`ArtifactSettings`' defaults."""
    known, limits = ArtifactSettings(), ArtifactLimits()
    directory = params.get("artifact_dir") or tempfile.mkdtemp(prefix="stageset-artifacts-")
    return ArtifactSettings(
        directory=Path(directory),
        max_bytes=params.get("artifact_cache_max_size") or known.max_bytes,
        max_tenant_bytes=params.get("artifact_tenant_max_size") or known.max_tenant_bytes,
        timeout=float(params.get("artifact_timeout") or known.timeout),
        discovery_interval=max(1.0, float(params.get("flux_discovery_interval") or known.discovery_interval)),
        limits=ArtifactLimits(
            max_download_bytes=int(params.get("artifact_max_size") or limits.max_download_bytes),
            max_unpacked_bytes=int(params.get("artifact_max_unpacked_size") or limits.max_unpacked_bytes),
            max_file_bytes=int(params.get("artifact_max_file_size") or limits.max_file_bytes),
            max_files=int(params.get("artifact_max_files") or limits.max_files)))


@click.command()
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), envvar="KUBECONFIG",
              help="Kubeconfig to use; in-cluster configuration when omitted.")
@click.option("--watch-namespaces", envvar="STAGESET_WATCH_NAMESPACES", default="", type=NAMESPACES,
              help="Comma-separated namespaces to watch (namespace-scoped watches); all when empty.")
@click.option("--watch-label-selector", envvar="STAGESET_WATCH_LABEL_SELECTOR", default="",
              type=LABEL_SELECTOR, help="Only StageSets and GitRepositories with these labels (Kubernetes' "
              "selector syntax, selected by the apiserver), e.g. sharding.fluxcd.io/key=shard1 for a "
              "shard and '!sharding.fluxcd.io/key' for the main one; all when empty.")
@click.option("--shard-keys", envvar="STAGESET_SHARD_KEYS", default="", type=SHARD_KEYS,
              callback=_main_shard_only,
              help="Main shard only: the sharding.fluxcd.io/key values the other shards serve; objects "
              "labelled with any other value are reported (Ready=False, reason NoShard), never reconciled.")
@click.option("--shard-handoff-timeout", default="30s", show_default=True, type=DURATION,
              help="Label shards: a shard that gains a relabelled StageSet waits at most this long for "
              "the shard that lost it to record that it stopped writing it (a Lease in the release "
              "namespace); then it goes on (the old shard is taken for gone).")
@click.option("--cluster-admin/--no-cluster-admin", default=False,
              help="Single-tenant mode: StageSets without serviceAccountName apply as the controller.")
@click.option("--default-service-account", envvar="STAGESET_DEFAULT_SERVICE_ACCOUNT", default="",
              type=SERVICE_ACCOUNT_NAME, help="StageSets, stages and GitRepositories without "
              "serviceAccountName act as this ServiceAccount of their own namespace (never as the "
              "controller, even with --cluster-admin); empty: no default.")
@click.option("--no-cross-namespace-refs", is_flag=True, default=False,
              help="Refuse sourceRef and dependsOn into other namespaces.")
@click.option("--max-dependency-watches", default=100, show_default=True, type=click.IntRange(min=0),
              help="Watches StageSets waiting for an object of another kind in spec.dependsOn may hold at "
              "once (one per cluster, identity, kind and namespace; at most 16 per identity); past that "
              "they look again at their retryInterval. 0: no such watches.")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(min=1),
              help="Concurrent StageSet reconciles.")
@click.option("--source-workers", default=4, show_default=True, type=click.IntRange(min=1),
              help="Concurrent GitRepository fetches (a pool of their own).")
@click.option("--max-workers-per-namespace", default=0, show_default=True, type=click.IntRange(min=0),
              help="Workers of each pool one namespace may hold at once; 0: half of each pool.")
@click.option("--mirror-dir", type=click.Path(file_okay=False), default=None,
              help="Where Git mirrors are kept (default: a temporary directory).")
@click.option("--mirror-max-size", default="", type=SIZE, help="Evict least recently used Git mirrors "
              "past this size, a Kubernetes quantity such as 2Gi (default: unbounded).")
@click.option("--allow-insecure-sources", is_flag=True, default=False,
              help="Development only: allow plain http:// Git URLs (credentials in clear text), and "
              "artifact downloads from loopback, link-local and metadata addresses.")
@click.option("--allowed-action-hosts", envvar="STAGESET_ALLOWED_ACTION_HOSTS", default="", type=HOSTS,
              help="Comma-separated hosts an http action may call (shell wildcards: *.example.com); "
              "none when empty. Loopback, link-local and metadata addresses stay refused unless "
              "--allow-insecure-sources.")
@click.option("--notification-namespace", envvar="STAGESET_NOTIFICATION_NAMESPACE", default="",
              type=NAMESPACE_OR_EMPTY,
              help="Send StageSet events as the NotificationAlerts and NotificationProviders of this "
              "namespace say (read with the controller's identity, with the providers' Secrets; "
              "docs/notifications.md); empty: no notifications.")
@click.option("--tenant-notifications", is_flag=True, default=False, envvar="STAGESET_TENANT_NOTIFICATIONS",
              help="Also send each StageSet's events as the NotificationAlerts of its own namespace say "
              "(an app team's alerts, for that namespace's StageSets only; a provider's Secret read as its "
              "serviceAccountName; docs/notifications.md#tenant-owned-alerts).")
@click.option("--notification-rate", default=1.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Notifications per second each provider sends once its burst is spent.")
@click.option("--notification-burst", default=10, show_default=True, type=click.IntRange(min=1),
              help="Notifications each provider may send at once; what waits past its queue "
              "(100 per provider) is dropped and counted.")
@click.option("--allow-local-sources", is_flag=True, default=False,
              help="Single-tenant only: allow file:// Git URLs and local paths (never the "
              "controller's own mirrors or system paths).")
@click.option("--git-max-file-size", default="10Mi", show_default=True, type=SIZE,
              help="Largest file a source may hold (also the largest object a fetch accepts).")
@click.option("--git-max-read-size", default="100Mi", show_default=True, type=SIZE,
              help="Most bytes one read of a source returns (a stage path or the whole source).")
@click.option("--git-max-files", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most files one read of a source returns.")
@click.option("--git-max-fetch-size", default="512Mi", show_default=True, type=SIZE,
              help="Most bytes (unpacked) one Git fetch may bring.")
@click.option("--default-interval", default="10m", show_default=True, type=DURATION,
              help="How often to reconcile a StageSet that leaves spec.interval out.")
@click.option("--default-source-kind", default=DefaultSourceKind.GIT_REPOSITORY.value, show_default=True,
              type=click.Choice([k.value for k in DefaultSourceKind]), envvar="STAGESET_DEFAULT_SOURCE_KIND",
              help="What a stage's sourceRef without kind names: our GitRepository, or Flux's "
              "ExternalArtifact (the reference controller's meaning; an omitted apiVersion is then "
              "source.toolkit.fluxcd.io/v1 for every kind).")
@click.option("--artifact-dir", type=click.Path(file_okay=False), default=None,
              help="Where verified Flux artifacts are kept (default: a temporary directory).")
@click.option("--artifact-cache-max-size", default="1Gi", show_default=True, type=SIZE,
              help="Delete least recently read artifacts past this size on disk.")
@click.option("--artifact-tenant-max-size", default="256Mi", show_default=True, type=SIZE,
              help="Delete a namespace's least recently read artifacts past this size on disk (the trees "
              "its downloads stored).")
@click.option("--artifact-max-size", default="100Mi", show_default=True, type=SIZE,
              help="Largest artifact (the compressed file) a download accepts.")
@click.option("--artifact-max-unpacked-size", default="100Mi", show_default=True, type=SIZE,
              help="Most bytes an artifact's files may hold together, unpacked.")
@click.option("--artifact-max-file-size", default="10Mi", show_default=True, type=SIZE,
              help="Largest file an artifact may hold.")
@click.option("--artifact-max-files", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most entries (files, directories, links) an artifact may hold.")
@click.option("--artifact-timeout", default="60s", show_default=True, type=DURATION,
              help="How long one artifact download (every redirect included) may take.")
@click.option("--flux-discovery-interval", default="30s", show_default=True, type=DURATION,
              help="How often to look for Flux source kinds to watch (a CRD installed after start is "
              "watched within this time, or at once when a StageSet names it).")
@click.option("--max-teardown-wait", default="1h", show_default=True, type=DURATION,
              help="Release a deleted StageSet whose objects cannot be removed after this long.")
@click.option("--resync-period", default="5m", show_default=True, type=DURATION,
              help="List every watched kind again this often, whatever the watches said (recovers "
              "events a broken connection lost).")
@click.option("--rights-recheck-interval", default="1h", show_default=True, type=DURATION,
              help="A routine pass over a Ready StageSet dry-runs one unchanged object per kind and "
              "namespace (may its identity still write there?) only if that identity has not shown "
              "those rights for this long; requested passes always check. 0: every pass checks.")
@click.option("--target-namespaces", envvar="STAGESET_TARGET_NAMESPACES", default="", type=NAMESPACES,
              help="Comma-separated namespaces whose StageTargets (the platform's clusters) are honoured; "
              "the controller reads their kubeconfig Secrets as itself. Empty: StageTargets are off and "
              "every spec.targetRef is refused.")
@click.option("--max-remote-targets", default=64, show_default=True, type=click.IntRange(min=1),
              help="Remote clusters (StageTargets and spec.kubeConfig contents) kept connected at once, "
              "each with its discovery; past it the least recently used is dropped (reconnected when used).")
@click.option("--workload-identity/--no-workload-identity", default=False, show_default=True,
              envvar="STAGESET_WORKLOAD_IDENTITY",
              help="Reach remote clusters named by a kubeConfig.configMapRef (StageSets and StageTargets) "
              "with tokens this cluster issues for the ServiceAccounts that act there (TokenRequest: the "
              "controller needs create on serviceaccounts/token). Off: configMapRef is refused.")
@click.option("--max-readiness-watches", default=100, show_default=True, type=click.IntRange(min=0),
              help="Watches stages waiting for readiness may hold at once (each as the stage's identity, "
              "one kind and namespace, label-selected); past that they poll. 0: always poll.")
@click.option("--max-drift-watches", default=500, show_default=True, type=click.IntRange(min=0),
              help="Watches held on what StageSets applied (one per cluster, identity, kind and namespace; "
              "kubeConfig Secrets too), so a change made outside Git is noticed within seconds; past "
              "that, StageSets fall back to their interval. 0: no drift watches.")
@click.option("--build-limit", "build_limits", multiple=True, metavar="NAME=VALUE",
              help="Override one limit of a stage's build, e.g. max_stage_objects=50000 "
              "(see docs/layouts.md).")
@click.option("--runbook-base-url", default=DEFAULT_RUNBOOK_BASE_URL, show_default=True, type=BASE_URL,
              envvar="STAGESET_RUNBOOK_BASE_URL",
              help="Non-ready condition messages end with <this>/<reason>/; empty: no links.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(logs.LEVELS, case_sensitive=False))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(logs.FORMATS),
              help="json: one object per line, with the StageSet, stage, revision, identity kind and "
              "reconcile id as fields.")
@process.lifecycle_options
def controller(kubeconfig: str | None, log_level: str, log_format: str, lifecycle: process.LifecycleSettings,
               **params: Any) -> None:
    """Run the controller against a cluster."""
    early_stop = process.stop_on_signals()
    memory.cap_arenas()  # before any thread starts (controller/memory.py)
    # `kill -USR1` prints every thread's stack: what a report of a stuck controller needs.
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)  # fd 2: stderr, the log stream
    if tracemalloc.is_tracing():  # PYTHONTRACEMALLOC=25: `kill -USR2` writes a heap snapshot
        signal.signal(signal.SIGUSR2, _dump_heap)
    _setup_logging(log_level, log_format)
    settings = controller_settings(params)
    if settings.watch_label_selector is not None:
        # The hand-off records of label shards live beside the release's Lease.
        election = lifecycle.leader_election
        settings = dataclasses.replace(settings, shard_handoff_namespace=(
            election.namespace if election is not None else default_namespace()))
    metrics = Metrics()
    clients = ClientPool.from_kubeconfig(kubeconfig)
    try:
        run_controller(Manager(clients=clients, settings=settings, metrics=metrics,
                               lifecycle=process.make_lifecycle(lifecycle, clients, metrics)),
                       early_stop=early_stop)
    finally:
        clients.close()
    process.exit_stopped()


def _dump_heap(_signum: int, _frame: FrameType | None) -> None:
    """Write a tracemalloc snapshot to the temporary directory (compare two with
    ``Snapshot.load(a).compare_to(Snapshot.load(b), "traceback")``)."""
    path = Path(tempfile.gettempdir()) / f"stageset-{os.getpid()}-{int(time.time())}.tracemalloc"
    tracemalloc.take_snapshot().dump(str(path))
    logging.getLogger(__name__).warning("heap snapshot written to %s", path)


_LIFECYCLE = tuple(inspect.signature(process.lifecycle_settings).parameters)


@click.command(hidden=True, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run the controller against this cluster instead of a local control plane "
              "(the CRDs are installed when missing).")
@click.option("--examples", type=click.Path(exists=True, file_okay=False), default=None,
              help="Directory served as the demo Git repository (default: the repo's examples/).")
@click.option("--once", is_flag=True, default=False,
              help="Exit once the example StageSet is Ready (for scripted runs).")
@click.pass_context
def run(ctx: click.Context, kubeconfig: str | None, examples: str | None, once: bool) -> None:
    """The main job: reconcile the example on a local control plane (or run against --kubeconfig).

    Any `stageset controller` flag may follow (e.g. --workers 2, --cluster-admin); `make run`
    passes ARGS here.
    """
    from stageset.cli import demo

    passed = [*(["--kubeconfig", kubeconfig] if kubeconfig else []), *ctx.args]
    # Parsed (and refused, exit 2) exactly as `stageset controller` parses them.
    params = controller.make_context("stageset run", list(passed), parent=ctx).params
    if kubeconfig:
        process.stop_on_signals()  # a signal while the CRDs are installed still stops cleanly
        demo.prepare_cluster(kubeconfig=Path(kubeconfig), cluster_admin=bool(params.get("cluster_admin")))
        controller.main(args=passed, prog_name="stageset run", standalone_mode=False)
        return
    params.pop("kubeconfig", None)
    fmt = str(params.pop("log_format", None) or "text")
    # Unless asked for a format, the controller's lines take the shape of the demo's progress lines.
    fmt = fmt if "--log-format" in ctx.args else logs.PROGRESS
    level = str(params.pop("log_level", None) or "warning")
    level = level if "--log-level" in ctx.args else "warning"
    _setup_logging(os.environ.get("STAGESET_LOG_LEVEL", level), fmt)
    lifecycle = process.lifecycle_settings(**{name: params.pop(name) for name in _LIFECYCLE})
    directory = Path(examples) if examples else Path(__file__).resolve().parents[2] / "examples"
    sys.exit(demo.run_demo(examples=directory, once=once, stop=threading.Event(),
                           settings=controller_settings(params, temporary_mirrors=False),
                           lifecycle=lifecycle))
