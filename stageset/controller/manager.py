"""Runs the controller: what the features declare — watches, the watch cache, work queues and workers.

The manager knows no kind by name and builds no feature.  :func:`~stageset.controller.wiring.wire`
joins every feature's own ``setup`` into a :class:`~stageset.controller.setup.Setup`, handing each
the :class:`~stageset.controller.shared.Shared` parts (the client pool, the settings, the event
recorder, the metrics, the clock and this manager's hooks).  For each
:class:`~stageset.controller.setup.Controller` in it the manager lists and watches its kind, caches
it (:mod:`stageset.controller.cache`) and runs a pool of workers named after it.  A watch event is
handed to the controller's guard first (if it declares one), then to its index hook and the indexes
other features declared on its kind, then every watch declared on that kind compares its state and
queues the keys its mapping names (the object's own key for the controller's trigger); a
controller's guard also runs around each of its reconciles.  Work is routed by the type of its key
(:mod:`stageset.controller.keys`): an ``ObjectKey`` runs its kind's reconciler in its kind's pool, a
``JobKey`` its runner in the pool the runner names, a ``ReportKey`` the reports' runner in theirs.
The listeners a setup declares are subscribed to the event recorder; its closers are closed once
the workers have stopped (the notifier sends what is queued, the readiness watches end).

Identity: the watches of the kinds controllers are ``For``, and every status write, use the
controller's own identity; everything a reconcile applies goes through the per-tenant clients
the reconcilers ask :class:`ClientPool` for.

Watches are namespace-scoped when ``watch_namespaces`` is set (one list/watch per namespace), so a
sharded release never needs cluster-wide list rights; a controller that declares its own
``namespaces`` (the platform's StageTargets) is watched in those instead, without a label selector.
With ``watch_label_selector`` (label shards, :mod:`stageset.controller.sharding`) the lists and
watches carry the selector: the apiserver sends only this shard's objects, and an object relabelled
away arrives as ``DELETED`` — forgotten here, never torn down (teardown follows a
``deletionTimestamp`` only); the hand-off between shards (:mod:`stageset.controller.handoff`) is
then declared as the guard of every sharded kind. Declared
:class:`~stageset.controller.setup.Reports` (the main shard's report of objects no shard serves)
watch under their own selector, uncached and not waited for.

Objects in the watch cache are read-only: each reconcile works on its own copy, and its own
writes reach the cache as values (``on_write``), kept until the watch has caught up with them.

Observability hooks live here once for every kind: every watch event updates the object's
metrics (and a deletion removes them), every reconcile runs with its log fields bound
(:mod:`stageset.controller.logs`), is counted and timed (:mod:`stageset.controller.metrics`), and
is followed by what its controller declared of its transitions (a Ready condition that turned
False told as a Warning event: :class:`~stageset.controller.events.ReadyWarnings`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from stageset.controller import logs
from stageset.controller.cache import ObjectCache, States
from stageset.controller.clock import Clock, system_clock
from stageset.controller.events import EventRecorder
from stageset.controller.health import Lifecycle
from stageset.controller.keys import JobKey, ObjectKey, ReportKey, WorkKey
from stageset.controller.memory import Trimmer
from stageset.controller.metrics import Metrics
from stageset.controller.queue import Backoff, WorkQueue
from stageset.controller.redact import REGISTRY
from stageset.controller.result import Result, TerminalError
from stageset.controller.settings import ControllerSettings
from stageset.controller.setup import CREATED_OR_CHANGED, Controller, Event, Reports, Setup, Watch
from stageset.controller.shared import Shared
from stageset.controller.wiring import Store, Wired, wire
from stageset.kube.client import ClientPool, KubeClient, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Handler, Reflector, wait_synced
from stageset.kube.watches import WatchPool

Indexed = Callable[[Event, ObjectKey, KubeObject], None]

log = logging.getLogger(__name__)


def wait_until_set(event: threading.Event) -> None:
    """Block until ``event`` is set, waking twice a second.

    A signal the kernel delivers to another thread runs its Python handler only when the main
    thread next runs bytecode; a wait without a timeout may never return to let it (SIGTERM was
    seen to go unanswered that way)."""
    while not event.wait(0.5):
        pass


def _event(kind: str) -> Event:
    return Event.DELETED if kind == "DELETED" else Event.ADDED if kind == "ADDED" else Event.MODIFIED


@dataclass(frozen=True)
class Pool:
    """One controller's work queue and the number of its workers (named after its kind)."""

    name: str
    workers: int
    queue: WorkQueue[WorkKey]


def watches_by_kind(setup: Setup) -> dict[str, tuple[Watch, ...]]:
    """Per cached kind, every watch of it: its controller's own trigger first, then the watches
    other controllers (or it) declared, in declaration order.  A watch of a kind no controller is
    ``For`` is refused (nothing would list it)."""
    found: dict[str, list[Watch]] = {
        c.kind: [Watch(kind=c.kind, state=c.trigger, fires=CREATED_OR_CHANGED, keys=lambda key: (key,))]
        for c in setup.controllers}
    for controller in setup.controllers:
        for watch in controller.watches:
            if watch.kind not in found:
                raise ValueError(f"{controller.kind} watches {watch.kind}, which no controller is For")
            found[watch.kind].append(watch)
    return {kind: tuple(watches) for kind, watches in found.items()}


def indexes_by_kind(setup: Setup) -> dict[str, tuple[Indexed, ...]]:
    """Per cached kind, what is told each of its events before any key is queued: its controller's
    own index hook first, then the indexes other features declared on it.  An index of a kind no
    controller is ``For`` is refused (nothing would list it)."""
    found: dict[str, list[Indexed]] = {c.kind: [] if c.indexed is None else [c.indexed]
                                       for c in setup.controllers}
    for index in setup.indexes:
        if index.kind not in found:
            raise ValueError(f"an index of {index.kind} is declared, which no controller is For")
        found[index.kind].append(index.indexed)
    return {kind: tuple(hooks) for kind, hooks in found.items()}


class Manager:
    def __init__(self, *, clients: ClientPool, settings: ControllerSettings, store: Store | None = None,
                 clock: Clock = system_clock, metrics: Metrics | None = None,
                 lifecycle: Callable[[threading.Event], Lifecycle] | None = None):
        self._settings = settings
        self.stop = threading.Event()
        self.metrics = metrics or Metrics()
        clients.observe(self.metrics.request)
        # Probes, start-up waits and leader election (controller/health.py); None: none of them.
        self.lifecycle = lifecycle(self.stop) if lifecycle else None
        if self.lifecycle is not None and self.lifecycle.elector is not None:
            leading = self.lifecycle.elector.leading
            self.metrics.leader.set_function(lambda: 1 if leading.is_set() else 0)
        self.trimmer = Trimmer()
        self.cache = ObjectCache()
        admin = clients.client()
        # What every feature records through; the listeners its setup declares hear each new event.
        self.events = EventRecorder(admin, clock=clock)
        shared = Shared(clients=clients, settings=settings, events=self.events, metrics=self.metrics,
                        clock=clock, on_write=self.cache.wrote, synced=self._caches_synced,
                        leading=self._leading)
        self.wired: Wired = wire(shared, enqueue=self._enqueue, stop=self.stop, store=store)
        setup = self.wired.setup
        self._controllers = {controller.kind: controller for controller in setup.controllers}
        self._jobs = {jobs.runner: jobs for jobs in setup.jobs}
        self._reports = setup.reports
        self.pools = self._pools(setup)
        self._watches = watches_by_kind(setup)
        self._runnables = setup.runnables
        self._closers = setup.closers
        self._indexes = indexes_by_kind(setup)
        for listener in setup.listeners:
            self.events.subscribe(listener)
        undeclared = [r for r in setup.caches if r not in setup.runnables]
        if undeclared:
            raise ValueError(f"{len(undeclared)} cache(s) not among the runnables: never started")
        selector = settings.watch_label_selector
        self._reflectors = [
            self._reflector(admin, controller.resource, namespace, self._handler(controller),
                            selector=None if selector is None or controller.namespaces else str(selector))
            for controller in setup.controllers
            for namespace in controller.namespaces or settings.watch_namespaces or (None,)]
        self._report_watches = [] if setup.reports is None else [
            self._reflector(admin, resource, namespace, self._report_handler(setup.reports, resource.kind),
                            selector=setup.reports.label_selector)
            for namespace in settings.watch_namespaces or (None,) for resource in setup.reports.resources]
        # What "synced" waits for: every cached kind, and the runnables declared as caches (the
        # StageTargets' Secret watch), so no reconcile runs on an index not filled yet.
        self._synced_events = [*(r.synced for r in self._reflectors), *(r.synced for r in setup.caches)]
        self.metrics.caches_synced.set_function(self._caches_synced)

    @property
    def watches(self) -> WatchPool | None:
        """The readiness watch pool the wiring built and handed the features (tests look into it)."""
        return self.wired.watches

    def _caches_synced(self) -> bool:
        return all(event.is_set() for event in self._synced_events)

    def _leading(self) -> bool:
        """Whether this process may reconcile now: without leader election always, else while it leads."""
        elector = None if self.lifecycle is None else self.lifecycle.elector
        return elector is None or elector.leading.is_set()

    def _pools(self, setup: Setup) -> dict[str, Pool]:
        """One pool per controller, each capped per namespace: slow Git servers cannot hold up
        applying, and one tenant cannot hold every worker of a pool."""
        backoff = Backoff(base=self._settings.backoff_base, cap=self._settings.backoff_cap)
        pools: dict[str, Pool] = {}
        for controller in setup.controllers:
            size = controller.workers
            queue = WorkQueue[WorkKey](backoff=backoff, shard=lambda key: key.namespace,
                                       max_per_shard=self._settings.namespace_cap(size))
            self.metrics.pool(controller.kind, workers=size)
            queue.observer = self.metrics.queue(controller.kind, depth=queue.__len__,
                                                unfinished=queue.unfinished_seconds,
                                                longest=queue.longest_running_seconds)
            pools[controller.kind] = Pool(name=controller.kind, workers=size, queue=queue)
        for named in (*(jobs.pool for jobs in setup.jobs), *([setup.reports.pool] if setup.reports else [])):
            if named not in pools:
                raise ValueError(f"work is declared for the pool {named!r}, which no controller runs")
        return pools

    def _reflector(self, admin: KubeClient, resource: Resource, namespace: str | None, handler: Handler, *,
                   selector: str | None) -> Reflector:
        return Reflector(client=admin, resource=resource, namespace=namespace, handler=handler,
                         stop=self.stop, resync=self._settings.resync_period, label_selector=selector)

    # -- events -------------------------------------------------------------------

    def _handler(self, controller: Controller) -> Handler:
        watches = self._watches[controller.kind]

        def states(obj: KubeObject) -> States:
            return tuple(watch.state(obj) for watch in watches)

        def handle(event: str, obj: KubeObject) -> None:
            self._observed(controller, _event(event), obj, watches, states)
        return handle

    def _observed(self, controller: Controller, event: Event, obj: KubeObject, watches: tuple[Watch, ...],
                  states: Callable[[KubeObject], States]) -> None:
        metadata = obj.get("metadata", {})
        # Never read by a reconcile, and often the largest part of an object: the cache keeps
        # every object, so it is dropped as it arrives (as controller-runtime's
        # TransformStripManagedFields does).  ``obj`` is fresh from the watch, not yet shared.
        metadata.pop("managedFields", None)
        key = ObjectKey.of(obj, kind=controller.kind)
        if controller.guard is not None:
            controller.guard.observe(key, event, obj, known=key in self.cache)
        gone = event is Event.DELETED
        shard = self._settings.watch_label_selector
        if gone and not metadata.get("deletionTimestamp") and shard is not None:
            # Gone from this shard's watch: deleted (without a finalizer of ours) or relabelled
            # to another shard.  Either way forgotten; nothing is torn down.
            log.info("%s %s/%s left this shard's watch (deleted, or its labels no longer match)", *key.ref)
        for indexed in self._indexes[controller.kind]:
            indexed(event, key, obj)  # before any key is queued: a reconcile reads the indexes
        if gone:
            self.metrics.forget(key.ref)
            self.events.forget(key.namespace, key.name)
        else:
            self.metrics.observe(key.ref, obj)
        before, now = self.cache.update(key, None if gone else obj, states=states)
        if gone:
            REGISTRY.drop(key.ref)  # its Secret values leave the log filter with it
        self._triggered(key, watches, before, now)

    def _triggered(self, key: ObjectKey, watches: tuple[Watch, ...], before: States | None,
                   now: States | None) -> None:
        """Queue the keys of every watch whose state moved as its predicate says (in watch order:
        the object's own key first)."""
        for i, watch in enumerate(watches):
            if watch.fires.fires(None if before is None else before[i], None if now is None else now[i]):
                for target in watch.keys(key):
                    self._enqueue(target)

    def _report_handler(self, reports: Reports, kind: str) -> Handler:
        def handle(event: str, obj: KubeObject) -> None:
            if (key := reports.handle(kind, _event(event), obj)) is not None:
                self._enqueue(key)
        return handle

    # -- workers ------------------------------------------------------------------

    def _pool(self, key: WorkKey) -> Pool:
        match key:
            case ObjectKey():
                return self.pools[key.kind]
            case JobKey():
                return self.pools[self._jobs[key.runner].pool]
            case ReportKey():
                assert self._reports is not None
                return self.pools[self._reports.pool]
            case _:
                assert_never(key)

    def _enqueue(self, key: WorkKey) -> None:
        self._pool(key).queue.add(key)

    def _work(self, queue: WorkQueue[WorkKey]) -> None:
        while (key := queue.get()) is not None:
            try:
                self._run(queue, key)
            finally:
                queue.done(key)
                idle = len(queue) == 0
                if idle:  # deflate the cached objects that stopped changing (controller/cache.py)
                    self.cache.settle()
                # Give the pass's freed memory back to the kernel (controller/memory.py).
                self.trimmer.after_work(idle=idle)

    def _run(self, queue: WorkQueue[WorkKey], key: WorkKey) -> None:
        """One key's work.  The object handed to a reconcile lives only as long as this call: a
        StageSet can be megabytes (its status), and a deleted one's would outlive it."""
        match key:
            case ObjectKey():
                obj = self.cache.get(key)
                if obj is not None:
                    self._reconcile(queue, key, obj)
            case JobKey():
                jobs = self._jobs[key.runner]
                self._task(queue, key, lambda: jobs.run(key))
            case ReportKey():
                reports = self._reports
                assert reports is not None
                self._task(queue, key, lambda: reports.run(key))
            case _:
                assert_never(key)

    @staticmethod
    def _task(queue: WorkQueue[WorkKey], key: WorkKey, run: Callable[[], Result]) -> None:
        """A job or a report; ``backoff`` (or a failure its runner did not catch) retries it with the
        key's backoff."""
        try:
            result = run()
        except Exception:  # never lose a worker; the runners tell their own failures
            log.exception("%s failed", key)
            result = Result(backoff=True)
        if result.backoff:
            queue.add_rate_limited(key)
        else:
            queue.forget(key)

    def _latest(self, key: ObjectKey, obj: KubeObject) -> KubeObject:
        """The object as the cache and our own writes know it now (``obj`` once it is gone)."""
        cached = self.cache.get(key)
        return obj if cached is None else cached

    def _reconcile(self, queue: WorkQueue[WorkKey], key: ObjectKey, obj: KubeObject) -> None:
        self.metrics.working(key.kind, 1)
        started = time.monotonic()
        outcome = "error"
        try:
            with logs.bind(**{key.kind.lower(): f"{key.namespace}/{key.name}"},
                           reconcileID=logs.new_reconcile_id()):
                outcome = self._reconcile_once(queue, key, obj)
        finally:
            self.metrics.working(key.kind, -1)
            self.metrics.reconciled(key.ref, result=outcome, seconds=time.monotonic() - started)
            # What the reconcile changed, told as its controller declared (its Ready→False event).
            transitions = self._controllers[key.kind].transitions
            if transitions is not None:
                transitions(key.ref, obj, self._latest(key, obj))

    def _reconcile_once(self, queue: WorkQueue[WorkKey], key: ObjectKey, obj: KubeObject) -> str:
        """One reconcile; returns controller-runtime's result word for the metrics."""
        started = time.monotonic()
        try:
            controller = self._controllers[key.kind]
            reconcile = controller.reconciler.reconcile
            result = reconcile(obj) if controller.guard is None else controller.guard.run(key, obj, reconcile)
        except TerminalError as error:
            log.warning("%s %s/%s: %s; not retried until it changes", *key.ref, error)
            queue.forget(key)
            return "terminal"
        except UnreachableError as error:
            # The apiserver itself cannot be reached (it restarts, the network drops): no bug, no
            # traceback; retried with the key's backoff.
            failures = queue.failures(key)
            delay = queue.add_rate_limited(key)
            log.log(logging.WARNING if failures == 0 else logging.DEBUG,
                    "reconciling %s %s/%s: the apiserver cannot be reached (%s); retrying in %.1fs",
                    *key.ref, error.why, delay)
            return "error"
        except Exception as error:
            # Never crash on user data: log (the traceback once per failure streak), back off.
            failures = queue.failures(key)
            delay = queue.add_rate_limited(key, at_least=getattr(error, "retry_after", None) or 0.0)
            if failures == 0:
                log.exception("reconciling %s %s/%s failed; retrying in %.1fs", *key.ref, delay)
            else:
                log.warning("reconciling %s %s/%s failed again (%d in a row): %s: %s; retrying in %.1fs",
                            *key.ref, failures + 1, type(error).__name__, error, delay)
            return "error"
        elapsed = time.monotonic() - started
        if result.backoff:
            # The failure is in the object's status; one log line per failure streak.
            failures = queue.failures(key)
            delay = queue.add_rate_limited(key, at_most=result.requeue_after)
            log.log(logging.WARNING if failures == 0 else logging.DEBUG,
                    "reconciling %s %s/%s failed (see its status); retrying in %.1fs", *key.ref, delay)
            return "error"
        queue.forget(key)
        log.debug("reconciled %s %s/%s in %.2fs; next in %s", *key.ref, elapsed,
                  "-" if result.requeue_after is None else f"{result.requeue_after:.0f}s")
        if result.requeue_after is not None and not self.stop.is_set():
            queue.add_after(key, result.requeue_after, wanted=result.wanted)
        return "success" if result.requeue_after is None else "requeue_after"

    def run(self) -> None:
        """Run until :attr:`stop` is set."""
        if self.lifecycle:
            self.lifecycle.start()
        for started in (*self._reflectors, *self._report_watches, *self._runnables):
            started.start()
        if self._synced():
            self._run_workers()
        else:
            for pool in self.pools.values():
                pool.queue.shutdown()
        if self.lifecycle:
            self.lifecycle.after_workers()

    def _run_workers(self) -> None:
        """Every pool's workers, until :attr:`stop` is set."""
        workers = self._start_workers()
        wait_until_set(self.stop)
        for pool in self.pools.values():
            pool.queue.shutdown()
        # One deadline for all workers: in-flight passes finish or are abandoned within it.
        deadline = time.monotonic() + self._settings.shutdown_timeout
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
        for close in self._closers:  # what is queued gets what is left of the deadline, then is dropped
            close(max(0.0, deadline - time.monotonic()))

    def _synced(self) -> bool:
        """Wait for the caches (then the Lease, with a lifecycle); ``False``: stopped meanwhile, no
        workers are to start."""
        if self.lifecycle:
            return self.lifecycle.before_workers(self._synced_events)
        if not wait_synced(self._synced_events, timeout=60, stop=self.stop) and not self.stop.is_set():
            log.warning("caches not synced after 60s; starting workers anyway")
        return True

    def _start_workers(self) -> list[threading.Thread]:
        workers = [threading.Thread(target=self._work, args=(pool.queue,), daemon=True,
                                    name=f"{pool.name.lower()}-worker-{i}")
                   for pool in self.pools.values() for i in range(pool.workers)]
        for worker in workers:
            worker.start()
        cap = self._settings.namespace_cap
        log.info("controller started: %s; namespaces: %s, labels: %s",
                 ", ".join(f"{pool.workers} {pool.name} workers (at most {cap(pool.workers)} per namespace)"
                           for pool in self.pools.values()),
                 ", ".join(self._settings.watch_namespaces or ("all",)),
                 self._settings.watch_label_selector or "all")
        return workers
