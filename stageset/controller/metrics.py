"""Prometheus metrics: controller-runtime's names for the shared parts, ``stageset_*`` for ours.

Identity: none.  The metrics count what this process did and saw; serving ``/metrics``
(:mod:`stageset.controller.health`, ``--metrics-address``) makes no request to any cluster.

Metrics are a tenant-isolation surface (the platform team scrapes them; tenants may see
dashboards).  Label values are only names the platform team can already list:
kinds, namespaces, tenants (a Namespace's ``stages.metio.wtf/tenant`` label, which only
whoever may label Namespaces sets), object and stage names, a Git URL as shown without credentials,
HTTP verbs and status codes, and words of our own vocabulary (phases, condition
statuses, change actions).  Never a Secret value, a message, a ServiceAccount name, or
anything a server sent.  A request's identity is only its kind: ``controller`` or
``tenant``.

Series that name an object (``kind``/``namespace``/``name``) live as long as the object:
:meth:`Metrics.observe` (every watch event) keeps them, :meth:`Metrics.forget` (its
deletion) removes every one of them, and a reconcile that finishes after the deletion
records nothing.  Git series (per URL) go when no GitRepository fetches the URL any more.

Names and meanings are listed in ``docs/operations.md``; the dashboard and alert rules in
``helm/stageset/files/`` use them, and a test checks those against a real scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from stageset.apply.changeset import Action, ChangeSet
from stageset.controller.objectmetrics import ObjectSeries
from stageset.controller.tenants import TenantLabels
from stageset.controller.urlmetrics import UrlSeries
from stageset.kube.client import LOCAL, RequestRecord
from stageset.kube.types import KubeObject

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# controller-runtime exposes no ``*_created`` series; neither do we.
disable_created_metrics()  # type: ignore[no-untyped-call]

ObjectKey = tuple[str, str, str]  # (kind, namespace, name)

# controller-runtime's buckets for reconcile time, and client-go's for the work queue.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7,
                     0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20,
                     25, 30, 40, 50, 60)
QUEUE_BUCKETS = tuple(1e-8 * 10**i for i in range(12))
# Per object (Flux's gotk_reconcile_duration_seconds): few buckets, there is one set per object.
OBJECT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
FETCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
HANDOFF_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# Actions a stage's apply counts (deletions are prune's, skips are readyChecks references).
APPLY_ACTIONS = (Action.CREATED, Action.CONFIGURED, Action.RECREATED, Action.UNCHANGED)


def controller_name(kind: str) -> str:
    """controller-runtime names a controller after its kind, lowercased."""
    return kind.lower()


def _version() -> str:
    try:
        return metadata.version("stageset")
    except metadata.PackageNotFoundError:
        return "unknown"


M = TypeVar("M", Counter, Gauge, Histogram)


class Series(Generic[M]):
    """One series :class:`Metrics` declares: made in each instance's registry, read as its attribute."""

    def __init__(self, make: Callable[[CollectorRegistry], M]):
        self.make: Callable[[CollectorRegistry], M] = make
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, obj: None, owner: type) -> Series[M]: ...

    @overload
    def __get__(self, obj: Metrics, owner: type) -> M: ...

    def __get__(self, obj: Metrics | None, owner: type) -> Series[M] | M:
        if obj is None:
            return self
        made: M = obj._series[self.attr]
        return made


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Series[Counter]:
    return Series(lambda registry: Counter(name, documentation, labels, registry=registry))


def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Series[Gauge]:
    return Series(lambda registry: Gauge(name, documentation, labels, registry=registry))


def histogram(name: str, documentation: str, labels: Sequence[str] = (), *,
              buckets: Sequence[float]) -> Series[Histogram]:
    return Series(lambda registry: Histogram(name, documentation, labels, buckets=buckets, registry=registry))


def _declared(cls: type) -> Iterator[tuple[str, Series[Any]]]:
    """The series ``cls`` declares, in declaration order (the registry's, and the exposition's)."""
    for name, value in vars(cls).items():
        if isinstance(value, Series):
            yield name, value



class QueueMetrics:
    """client-go's workqueue metrics for one queue (``name``); what :class:`WorkQueue` reports to.

    Depth, unfinished work and the longest running processor are read from the queue when
    scraped (:meth:`Metrics.queue`); the rest is counted as it happens.
    """

    def __init__(self, metrics: Metrics, name: str):
        self._adds = metrics.queue_adds.labels(name)
        self._retries = metrics.queue_retries.labels(name)
        self._waited = metrics.queue_duration.labels(name)
        self._worked = metrics.work_duration.labels(name)

    def added(self) -> None:
        self._adds.inc()

    def retried(self) -> None:
        self._retries.inc()

    def waited(self, seconds: float) -> None:
        self._waited.observe(seconds)

    def worked(self, seconds: float) -> None:
        self._worked.observe(seconds)


class Metrics:
    """Every series this process exposes, in one registry (injected, so tests get their own).

    The series are declared below as a table of :class:`Series` descriptors — one line each: kind,
    name, help, labels — made in this instance's registry when it is built and read as attributes
    (``metrics.reconcile_total``); the collectors that write per-object and per-URL series when
    scraped, and the series with a fixed value, are set up in ``__init__``."""

    # -- controller-runtime -----------------------------------------------------------
    reconcile_total = counter(
        "controller_runtime_reconcile_total",
        "Reconciles per controller and result "
        "(success, error, requeue, requeue_after).",
        ["controller", "result"])
    reconcile_errors = counter(
        "controller_runtime_reconcile_errors_total",
        "Reconciles that failed (retried with backoff).",
        ["controller"])
    terminal_errors = counter(
        "controller_runtime_terminal_reconcile_errors_total",
        "Reconciles that failed and are not retried until the object changes.",
        ["controller"])
    reconcile_time = histogram(
        "controller_runtime_reconcile_time_seconds",
        "How long reconciles took.",
        ["controller"],
        buckets=RECONCILE_BUCKETS)
    active_workers = gauge(
        "controller_runtime_active_workers",
        "Workers reconciling right now.",
        ["controller"])
    max_concurrent = gauge(
        "controller_runtime_max_concurrent_reconciles",
        "Workers of the controller's pool.",
        ["controller"])
    # -- client-go workqueue ------------------------------------------------------------
    queue_depth = gauge("workqueue_depth", "Keys waiting in the queue.", ["name"])
    queue_adds = counter("workqueue_adds_total", "Keys added to the queue.", ["name"])
    queue_duration = histogram(
        "workqueue_queue_duration_seconds",
        "How long a key waited in the queue before a worker took it.",
        ["name"],
        buckets=QUEUE_BUCKETS)
    work_duration = histogram(
        "workqueue_work_duration_seconds",
        "How long a worker took over a key.",
        ["name"],
        buckets=QUEUE_BUCKETS)
    unfinished_work = gauge(
        "workqueue_unfinished_work_seconds",
        "Seconds of work in progress not yet done (sum over keys).",
        ["name"])
    longest_running = gauge(
        "workqueue_longest_running_processor_seconds",
        "Seconds the longest running worker has held "
        "its key.",
        ["name"])
    queue_retries = counter(
        "workqueue_retries_total",
        "Keys re-added with backoff after a failure.",
        ["name"])
    # -- the process --------------------------------------------------------------------
    build_info = gauge("stageset_build_info", "The running stageset version (always 1).", ["version"])
    caches_synced = gauge("stageset_caches_synced", "1 once every watch has listed its objects.")
    leader = gauge(
        "stageset_leader",
        "1 while this process may reconcile (holds the release's "
        "Lease, or runs without leader election).")
    unserved = gauge(
        "stageset_unserved_objects",
        "Objects whose sharding.fluxcd.io/key names no shard of the release "
        "(main shard with --shard-keys only): no controller reconciles them.",
        ["kind"])
    shard_handoffs = counter(
        "stageset_shard_handoffs_total",
        "StageSets this label shard gained from another (relabelled), "
        "by how the hand-off ended: released (the shard that lost it had already recorded that it "
        "stopped writing it), waited (this shard waited for that record first), timeout (no record "
        "came within --shard-handoff-timeout: the other shard was taken for gone).",
        ["outcome"])
    shard_handoff_wait = histogram(
        "stageset_shard_handoff_wait_seconds",
        "How long a label shard waited, before its first write "
        "to a StageSet it gained, for the shard that lost it to stop writing it.",
        buckets=HANDOFF_BUCKETS)
    shard_writes_fenced = counter(
        "stageset_shard_writes_fenced_total",
        "Writes a pass did not send because its object had left "
        "this label shard while the pass ran (the pass ends there; the other shard reconciles it).")
    readiness_watches = gauge(
        "stageset_readiness_watches",
        "Watches open for stages waiting for readiness (at most "
        "--max-readiness-watches).")
    readiness_watches_refused = counter(
        "stageset_readiness_watches_refused_total",
        "Watches a waiting stage asked for while "
        "--max-readiness-watches were open: it polled instead.")
    # -- drift by watch (controller/drift): no per-StageSet labels; stageset_drifted_objects
    # (per StageSet, Warn mode) is an object series.
    drift_watches = gauge(
        "stageset_drift_watches",
        "Watches open on what StageSets applied (and on their kubeConfig "
        "Secrets), each as the identity that applied it (at most --max-drift-watches).")
    drift_watches_refused = counter(
        "stageset_drift_watches_refused_total",
        "Drift watches a StageSet needed while "
        "--max-drift-watches were open: it fell back to its interval for those objects.")
    drift_unwatched = gauge(
        "stageset_drift_unwatched_stagesets",
        "StageSets whose drift is noticed only at their interval "
        "for some of what they applied: a watch refused by the bound, or one that does not work "
        "(its identity may not watch that kind there, its cluster is down; retried).")
    drift_passes = counter(
        "stageset_drift_passes_total",
        "Passes queued because a watch saw a change that was not ours "
        "(an edit of a field we manage, a delete, an owner label removed, a rotated kubeConfig Secret).")
    # -- steering a release ---------------------------------------------------------------
    promotions = counter(
        "stageset_stage_promotions_total",
        "Stages promoted past their gate, by how (soak: the soak "
        "ended; manual: stageset promote).",
        ["namespace", "name", "stage", "how"])
    promotion_pending = gauge(
        "stageset_stage_promotion_pending",
        "1 while a stage is Ready and held by its promotion gate "
        "(soaking or awaiting a promotion).",
        ["namespace", "name", "stage"])
    update_deferred = counter(
        "stageset_update_deferred_total",
        "New revisions held back by closed update windows (once per "
        "new set held).",
        ["namespace", "name"])
    rollbacks = counter(
        "stageset_rollbacks_total",
        "Failed releases rolled back, by result (rolled_back, unavailable: "
        "the last good revision is gone, failed: restoring a stage failed and is retried).",
        ["namespace", "name", "result"])
    # -- notifications (controller/notifications): labels are the provider's name and type,
    # platform-owned objects of the notification namespace; never a tenant's name or a message.
    notifications_sent = counter(
        "stageset_notifications_sent_total",
        "Notifications a provider's receiver accepted (a 2xx).",
        ["provider", "type"])
    notification_failures = counter(
        "stageset_notification_failures_total",
        "Notifications that could not be sent: every attempt "
        "failed, the receiver refused, or the provider cannot send (its Secret, its address).",
        ["provider", "type"])
    notifications_dropped = counter(
        "stageset_notifications_dropped_total",
        "Notifications dropped before sending (queue_full: the "
        "provider's rate-limited queue was full; intake_full: the notifier's queue was full, provider "
        "empty; too_many_providers).",
        ["provider", "reason"])
    # -- fleet rollouts (platform objects: cluster-scoped, named by the platform) -------------
    fleet_wave_members = gauge(
        "stageset_fleet_wave_members",
        "Members of a FleetRollout's wave, by whether they are Ready at "
        "the revisions released to them.",
        ["rollout", "wave", "ready"])
    fleet_wave_phase = gauge(
        "stageset_fleet_wave_phase",
        "1 for the phase a FleetRollout's wave is in (Waiting, Open, "
        "Soaking, Done, Halted), 0 for the others.",
        ["rollout", "wave", "phase"])
    fleet_waves_opened = counter(
        "stageset_fleet_waves_opened_total",
        "Waves a FleetRollout opened.",
        ["rollout", "wave"])
    fleet_halts = counter(
        "stageset_fleet_halts_total",
        "Rounds a FleetRollout halted (a member of an open wave failed).",
        ["rollout"])
    # -- Git (per repository URL: the collector set up in __init__) ---------------------------
    mirror_bytes = gauge("stageset_git_mirror_bytes", "Disk used by the Git mirrors.")
    # -- the apiserver ----------------------------------------------------------------------
    requests = counter(
        "stageset_apiserver_requests_total",
        "Requests to apiservers by verb, identity kind (controller "
        "or tenant), cluster (local or remote) and HTTP status code (<error>: no answer).",
        ["verb", "identity", "cluster", "code"])
    request_duration = histogram(
        "stageset_apiserver_request_duration_seconds",
        "How long requests took until the answer began.",
        ["verb", "identity"],
        buckets=REQUEST_BUCKETS)

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self._series: dict[str, Any] = {
            name: series.make(self.registry) for name, series in _declared(Metrics)}
        self.build_info.labels(_version()).set(1)
        self.leader.set(1)
        # Per object (Flux's gotk_* series): plain numbers, written when scraped.  Their `tenant`
        # label: the namespace's stages.metio.wtf/tenant label (controller/tenants.py, fed by a
        # metadata-only Namespace watch, controller/namespaces.py), never a label on the object itself.
        self.tenants = TenantLabels()
        self.objects = ObjectSeries(buckets=OBJECT_BUCKETS, tenant_of=self.tenants.of)
        self.registry.register(self.objects)
        # Per repository URL (stageset_git_fetches_total, stageset_git_fetch_duration_seconds): plain
        # numbers, written when scraped.
        self.git = UrlSeries(buckets=FETCH_BUCKETS)
        self.registry.register(self.git)

        self._lock = threading.Lock()
        self._alive: set[ObjectKey] = set()
        self._gated: dict[ObjectKey, set[str]] = {}  # StageSets: stages with a promotion gate
        self._urls: dict[str, set[ObjectKey]] = {}
        self._url_of: dict[ObjectKey, str] = {}

    # -- serving ---------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The text format, as ``/metrics`` serves it."""
        return generate_latest(self.registry)

    # -- controllers and queues ------------------------------------------------------------

    def pool(self, kind: str, *, workers: int) -> None:
        self.max_concurrent.labels(controller_name(kind)).set(workers)
        self.active_workers.labels(controller_name(kind)).set(0)

    def queue(self, kind: str, *, depth: Callable[[], int], unfinished: Callable[[], float],
              longest: Callable[[], float]) -> QueueMetrics:
        """The queue of ``kind``'s controller: gauges read from it at scrape time."""
        name = controller_name(kind)
        self.queue_depth.labels(name).set_function(depth)
        self.unfinished_work.labels(name).set_function(unfinished)
        self.longest_running.labels(name).set_function(longest)
        return QueueMetrics(self, name)

    def mirror(self, disk_usage: Callable[[], int]) -> None:
        self.mirror_bytes.set_function(disk_usage)

    def working(self, kind: str, delta: int) -> None:
        self.active_workers.labels(controller_name(kind)).inc(delta)

    def reconciled(self, key: ObjectKey, *, result: str, seconds: float) -> None:
        """One reconcile: ``result`` is controller-runtime's (success, error, requeue, requeue_after)
        or ``terminal`` (an error not retried)."""
        controller = controller_name(key[0])
        self.reconcile_time.labels(controller).observe(seconds)
        if result == "terminal":
            self.terminal_errors.labels(controller).inc()
            self.reconcile_errors.labels(controller).inc()
            result = "error"
        elif result == "error":
            self.reconcile_errors.labels(controller).inc()
        self.reconcile_total.labels(controller, result).inc()
        self.objects.duration(key, seconds)

    # -- per object ------------------------------------------------------------------------

    def observe(self, key: ObjectKey, obj: KubeObject) -> None:
        """An object as the watch sees it: its conditions, suspension and (StageSets) stage phases."""
        status = obj.get("status") or {}
        conditions = {str(c.get("type")): str(c.get("status")) for c in status.get("conditions") or []
                      if isinstance(c, Mapping)}
        stages = None
        if key[0] == "StageSet":
            stages = [(str(stage["name"]), str(stage.get("phase") or ""),
                       stage["objects"] if isinstance(stage.get("objects"), int) else None)
                      for stage in status.get("stages") or []
                      if isinstance(stage, Mapping) and stage.get("name")]
        suspended = bool((obj.get("spec") or {}).get("suspend"))
        with self._lock:
            self._alive.add(key)
            # Before a first status every condition value is 0: the object is known, nothing judged yet.
            self.objects.observe(key, conditions=conditions, suspended=suspended, stages=stages)
            if stages is not None:
                self._observe_gates(key, status.get("stages") or [])

    def _observe_gates(self, key: ObjectKey, stages: Iterable[Any]) -> None:
        """The promotion-gate series of a StageSet's gated stages (the caller holds the lock): only
        gated stages have them, so an ungated StageSet costs nothing here."""
        _, namespace, name = key
        gated: set[str] = set()
        for stage in stages:
            gate = stage.get("promotionState") if isinstance(stage, Mapping) else None
            if not isinstance(gate, Mapping) or not stage.get("name"):
                continue
            stage_name = str(stage["name"])
            gated.add(stage_name)
            held = gate.get("phase") in ("Soaking", "AwaitingManual")
            self.promotion_pending.labels(namespace, name, stage_name).set(1 if held else 0)
        # A stage no longer gated (or removed from the spec) takes its gate series with it.
        for gone in self._gated.get(key, set()) - gated:
            for metric in (self.promotion_pending, self.promotions):
                metric.remove_by_labels({"namespace": namespace, "name": name, "stage": gone})
        if gated:
            self._gated[key] = gated
        else:
            self._gated.pop(key, None)

    def forget(self, key: ObjectKey) -> None:
        """The object is deleted: every series naming it goes (and its URL's, if no one else uses it)."""
        with self._lock:
            self._alive.discard(key)
            self.objects.forget(key)
            self._gated.pop(key, None)
            if key[0] == "StageSet":
                steering: tuple[Gauge | Counter, ...] = (
                    self.promotions, self.promotion_pending, self.update_deferred, self.rollbacks)
                for each in steering:
                    each.remove_by_labels({"namespace": key[1], "name": key[2]})
            self._release_url(key)

    def applied(self, stageset: tuple[str, str], stage: str, changes: ChangeSet) -> None:
        """What one stage's apply did to each object (every action counted, created at 0 too, so
        rate() sees the first increase)."""
        key: ObjectKey = ("StageSet", *stageset)
        counts = {action.value.lower(): changes.count(action) for action in APPLY_ACTIONS}
        self.objects.applied(key, stage, counts, len(changes.drifted))

    def pruned(self, stageset: tuple[str, str], *, deleted: int, failed: int) -> None:
        self.objects.pruned(("StageSet", *stageset), deleted=deleted, failed=failed)

    def drifted(self, stageset: tuple[str, str], count: int | None) -> None:
        """Objects a ``Warn`` StageSet's last pass left drifted (``None``: not in Warn mode, no series)."""
        self.objects.drifted(("StageSet", *stageset), count)

    def promoted(self, stageset: tuple[str, str], stage: str, *, how: str) -> None:
        """A stage passed its promotion gate (``how``: soak, manual)."""
        with self._lock:
            if ("StageSet", *stageset) in self._alive:
                self.promotions.labels(*stageset, stage, how).inc()

    def notification_sent(self, provider: str, type_: str) -> None:
        self.notifications_sent.labels(provider, type_).inc()

    def notification_failed(self, provider: str, type_: str) -> None:
        self.notification_failures.labels(provider, type_).inc()

    def notification_dropped(self, provider: str, reason: str) -> None:
        self.notifications_dropped.labels(provider, reason).inc()

    def deferred(self, stageset: tuple[str, str]) -> None:
        """Update windows hold back a new set of revisions."""
        with self._lock:
            if ("StageSet", *stageset) in self._alive:
                self.update_deferred.labels(*stageset).inc()

    def rolled_back(self, stageset: tuple[str, str], *, result: str) -> None:
        """A failed release: rolled_back, unavailable or failed."""
        with self._lock:
            if ("StageSet", *stageset) in self._alive:
                self.rollbacks.labels(*stageset, result).inc()

    # -- fleet rollouts ---------------------------------------------------------------------

    def fleet_waves(self, rollout: str, waves: Iterable[Any]) -> None:
        """The waves of a FleetRollout as its last decision left them (``WaveStatus`` values); a wave
        no longer declared takes its series with it."""
        with self._lock:
            for metric in (self.fleet_wave_members, self.fleet_wave_phase):
                metric.remove_by_labels({"rollout": rollout})
            for wave in waves:
                self.fleet_wave_members.labels(rollout, wave.name, "true").set(wave.ready)
                self.fleet_wave_members.labels(rollout, wave.name, "false").set(wave.members - wave.ready)
                for phase in ("Waiting", "Open", "Soaking", "Done", "Halted"):
                    self.fleet_wave_phase.labels(rollout, wave.name, phase).set(
                        1 if wave.phase.value == phase else 0)

    def fleet_wave_opened(self, rollout: str, wave: str) -> None:
        self.fleet_waves_opened.labels(rollout, wave).inc()

    def fleet_halted(self, rollout: str) -> None:
        self.fleet_halts.labels(rollout).inc()

    def fleet_forget(self, rollout: str) -> None:
        """A FleetRollout is deleted: its series go."""
        with self._lock:
            for metric in (self.fleet_wave_members, self.fleet_wave_phase, self.fleet_waves_opened,
                           self.fleet_halts):
                metric.remove_by_labels({"rollout": rollout})

    # -- Git ---------------------------------------------------------------------------------

    def fetched(self, repository: ObjectKey, *, url: str, result: str, seconds: float) -> None:
        """One fetch for GitRepository ``repository`` of ``url`` (its display form: no credentials)."""
        with self._lock:
            if repository not in self._alive:
                return
            if self._url_of.get(repository) != url:
                self._release_url(repository)
                self._url_of[repository] = url
                self._urls.setdefault(url, set()).add(repository)
            self.git.fetched(url, result=result, seconds=seconds)

    def _release_url(self, repository: ObjectKey) -> None:
        url = self._url_of.pop(repository, None)
        if url is None:
            return
        users = self._urls.get(url, set())
        users.discard(repository)
        if users:
            return
        self._urls.pop(url, None)
        self.git.forget(url)

    # -- the apiserver ---------------------------------------------------------------------

    def request(self, record: RequestRecord) -> None:
        """A :class:`~stageset.kube.client.ClientPool` observer: one request made."""
        identity = "controller" if record.identity.user is None else "tenant"
        cluster = "local" if record.cluster == LOCAL else "remote"
        code = "<error>" if record.code is None else str(record.code)
        self.requests.labels(record.verb, identity, cluster, code).inc()
        self.request_duration.labels(record.verb, identity).observe(record.seconds)
