"""Controller settings, grouped and injected (never global).

The CLI builds one :class:`ControllerSettings` and hands it to the manager, which hands
each part to what reads it (``apply`` to every apply engine, for example).  Every part's settings
are declared here or below (``apply``, ``build``, ``sources``), never in a feature package, so the
settings import no feature.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sources import Limits
from sources.limits import ArtifactLimits
from stageset.apply.settings import ApplySettings
from stageset.build import BuildLimits
from stageset.controller.sharding import LabelSelector
from stageset.controller.sourcekinds import DefaultSourceKind

# Where each condition reason's runbook lives: ``<base>/<reason in lower case>/`` (the docs site's
# runbooks/ section, built by ``make docs``; this project's site is the GitHub Pages of
# github.com/stageset/stageset, mkdocs.yml's site_url, which a test keeps equal).  Operators who
# host the docs elsewhere set ``--runbook-base-url``; an empty base leaves messages without links.
DEFAULT_RUNBOOK_BASE_URL = "https://stageset.github.io/stageset/runbooks/"


@dataclass(frozen=True)
class DeliverySettings:
    """How each notification provider's outbox sends (:mod:`stageset.controller.notifications.delivery`)."""

    rate: float = 1.0
    """Requests per second per provider, once its burst is spent."""
    burst: int = 10
    capacity: int = 100
    """Requests one provider's queue holds; past that, new ones are dropped."""
    attempts: int = 4
    backoff: float = 1.0
    backoff_cap: float = 30.0
    max_providers: int = 64
    """Providers with an outbox at once (each has one thread); past that, events to others are dropped."""


@dataclass(frozen=True)
class NotificationSettings:
    """Notifications (:mod:`stageset.controller.notifications`): where configured, how sent."""

    namespace: str | None = None
    """Where the platform's providers, alerts and their Secrets are read (``--notification-namespace``);
    ``None``: no platform alerts."""
    tenants: bool = False
    """Also each StageSet's own namespace's alerts, for its events only (``--tenant-notifications``;
    :mod:`~stageset.controller.notifications.tenants`)."""
    refresh: float = 30.0
    """How long a read configuration is used before it is read again."""
    intake: int = 1000
    """Events waiting to be matched at most; past that, new ones are dropped."""
    delivery: DeliverySettings = field(default_factory=DeliverySettings)

    @property
    def enabled(self) -> bool:
        """Any alerts to honour: the platform's, or the tenants' own."""
        return bool(self.namespace) or self.tenants


@dataclass(frozen=True)
class ArtifactSettings:
    """Flux artifacts: where verified trees are kept, how much they may cost, how long a download may take."""

    directory: Path = field(
        default_factory=lambda: Path(tempfile.gettempdir()) / f"stageset-artifacts-{os.getpid()}")
    # Past this many bytes on disk, least recently read artifacts are deleted.
    max_bytes: int | None = 1024 * 1024 * 1024
    # Past this many bytes of trees its downloads stored, a namespace's least recently read
    # artifacts are deleted (one tenant cannot fill the store and evict everyone else's).
    max_tenant_bytes: int | None = 256 * 1024 * 1024
    limits: ArtifactLimits = field(default_factory=ArtifactLimits)
    # One download, every redirect included, ends after this many seconds.
    timeout: float = 60.0
    # Discovery of Flux's source kinds (watches for CRDs installed after start) runs this often,
    # and at once when a StageSet names a kind no watch covers.
    discovery_interval: float = 30.0


@dataclass(frozen=True)
class ControllerSettings:
    # None watches every namespace; otherwise one namespace-scoped watch per entry.
    watch_namespaces: tuple[str, ...] | None = None
    # Label shards: only StageSets and GitRepositories this selector matches are listed and
    # watched (the apiserver selects); None: all of them.
    watch_label_selector: LabelSelector | None = None
    # Main shard only: the sharding.fluxcd.io/key values other shards serve; StageSets and
    # GitRepositories labelled with any other key are reported (NoShard), never reconciled.
    shard_keys: tuple[str, ...] | None = None
    # Label shards: where a shard records that it stopped writing a StageSet that left it (a Lease
    # per StageSet, in the release namespace: stageset.controller.handoff); None: no record is
    # written or waited for.  A shard that gains a StageSet waits at most ``shard_handoff_timeout``
    # seconds for that record.
    shard_handoff_namespace: str | None = None
    shard_handoff_timeout: float = 30.0
    # Single-tenant mode: StageSets without serviceAccountName apply as the controller.
    cluster_admin: bool = False
    # StageSets, stages and GitRepositories without serviceAccountName act as this account of
    # their own namespace (never as the controller); None: no default.
    default_service_account: str | None = None
    no_cross_namespace_refs: bool = False
    # Platform targets: the namespaces whose StageTargets are honoured (and whose Secrets the controller
    # reads, as itself); empty: no StageTarget is, and every spec.targetRef is refused.
    target_namespaces: tuple[str, ...] = ()
    # Remote clusters (platform targets and spec.kubeConfig contents) kept connected at once, each
    # with its discovery; past it the least recently used is dropped and connected again when used.
    max_remote_targets: int = 64
    # Workload identity (spec.kubeConfig.configMapRef, a StageTarget's too): the controller requests
    # tokens for ServiceAccounts (create serviceaccounts/token) and reaches remotes that trust this
    # cluster's issuer with them.  Off: every configMapRef is refused and no token is ever requested.
    workload_identity: bool = False
    # A StageSet waiting for an object of another kind in spec.dependsOn is woken by a watch as its
    # identity (one per cluster, identity, kind and namespace, held while someone waits), at most this
    # many at once (``--max-dependency-watches``; 0: none); past that, it looks again at its retry.
    max_dependency_watches: int = 100
    # Concurrent StageSet reconciles, and (a separate pool) concurrent GitRepository fetches.
    workers: int = 4
    source_workers: int = 4
    # At most this many workers of each pool serve one namespace at once, so one tenant's slow
    # sources or stages cannot hold every worker; 0 means half of each pool (rounded up).
    max_workers_per_namespace: int = 0
    mirror_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "stageset-mirrors")
    # Bound on the Git mirrors' disk use; least recently used mirrors are evicted past it.
    mirror_max_bytes: int | None = None
    # Development only: allow plain http:// Git URLs.
    allow_insecure_sources: bool = False
    # Single-tenant only: allow file:// Git URLs and local paths.
    allow_local_sources: bool = False
    # What one fetch or read of a Git source may cost (sizes, counts).
    source_limits: Limits = field(default_factory=Limits)
    # Independent stages of one StageSet applied at once.
    stage_parallelism: int = 4
    # A reconcile waits this long for readiness, then frees its worker and comes back after
    # ``readiness_requeue``; the stage timeout spans reconciles.
    readiness_slice: float = 3.0
    readiness_requeue: float = 1.0
    # Stages waiting for readiness watch what they wait for (as their identity), at most this many
    # watches at once (``--max-readiness-watches``; 0: never, poll); past that, they poll.  A
    # StageSet whose waiting stages are all watched is woken by their changes and otherwise looked
    # at again only every ``watched_requeue`` seconds.
    max_readiness_watches: int = 100
    watched_requeue: float = 30.0
    # What StageSets applied is watched as whoever applied it (one watch per cluster, identity, kind
    # and namespace; their kubeConfig Secrets too), at most this many watches (``--max-drift-watches``;
    # 0: none, drift is noticed at each StageSet's interval only); past that, StageSets fall back
    # to their interval for what no watch covers (controller/drift/).
    max_drift_watches: int = 500
    # A new StageSet (or a new generation) whose pass only waits for its source or a dependency,
    # having written nothing, says so in status only after this many seconds: a source fetched
    # sooner is never shown as not ready, and costs no writes (controller/stageset/holding.py); 0: at once.
    first_wait_grace: float = 1.0
    # ... and while it waits only for GitRepositories that have said nothing yet (their first fetch
    # queued or running; their conclusion wakes it), at most this long.
    first_fetch_wait: float = 60.0
    # How often a StageSet without spec.interval is reconciled (seconds; the reference's default).
    default_interval: float = 600.0
    # After this long, a deleted StageSet whose objects cannot be removed is released anyway
    # (the reference's default: an hour, so a target that is down for a while orphans nothing).
    max_teardown_wait: float = 3600.0
    # Every watched kind is listed again this often (seconds): events a watch lost are seen.
    resync_period: float = 300.0
    # What one stage's build may read, parse and produce (depth, nodes, bytes, objects, time).
    build_limits: BuildLimits = field(default_factory=BuildLimits)
    # On stop, in-flight reconciles get this long (all workers together) to finish or give up.
    shutdown_timeout: float = 10.0
    # A reconcile that fails is retried after backoff_base seconds, doubling up to backoff_cap.
    backoff_base: float = 0.5
    backoff_cap: float = 300.0
    # Every non-ready condition message ends with ``runbook: <base><reason>/``.
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    # The apply engine's own settings (parallelism within a stage, polling, CRD and delete waits).
    apply: ApplySettings = field(default_factory=ApplySettings)
    # What an omitted sourceRef.kind means: our GitRepository, or (the reference's meaning) Flux's
    # ExternalArtifact.
    default_source_kind: DefaultSourceKind = DefaultSourceKind.GIT_REPOSITORY
    artifacts: ArtifactSettings = field(default_factory=ArtifactSettings)
    # ``--allowed-action-hosts``: the hosts an ``http`` action may call (shell wildcards); none when
    # empty.  The address guard applies as well (off only with ``allow_insecure_sources``).
    allowed_action_hosts: tuple[str, ...] = ()
    # ``--notification-namespace``: where NotificationProviders, NotificationAlerts and their Secrets
    # are read (with the controller's identity); off (no notifications) by default.
    notifications: NotificationSettings = field(default_factory=NotificationSettings)

    def namespace_cap(self, pool: int) -> int:
        """How many of a pool's ``pool`` workers one namespace may hold at once."""
        if self.max_workers_per_namespace > 0:
            return min(self.max_workers_per_namespace, pool)
        return max(1, (pool + 1) // 2)
