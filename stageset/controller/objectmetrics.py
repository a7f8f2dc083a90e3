"""The per-object series (Flux's ``gotk_*`` kind), kept as plain numbers and exposed at scrape time.

A labelled child of a prometheus_client metric is a full object with its own lock and value
objects: the 25 or so series of one StageSet cost about 20 KiB that way, more than the StageSet
itself in the watch cache, and memory must stay flat as StageSets grow into the thousands.
:class:`ObjectSeries` keeps, per object, only the numbers (conditions as three words, phases
and counts per stage, a histogram as a short list) and writes the same series, with the same
names, help, types and labels, when ``/metrics`` is scraped (a custom collector).

Every series also carries ``tenant``: the namespace's tenant as ``tenant_of`` says at scrape time
(:class:`~stageset.controller.tenants.TenantLabels`: the Namespace's label, never the object's);
empty, and so absent from the exposition, for a namespace of no tenant.

What each series means is :mod:`stageset.controller.metrics`' to say (and ``docs/operations.md``'s);
their lifetimes are its rules: kept by :meth:`~stageset.controller.metrics.Metrics.observe`,
removed by :meth:`~stageset.controller.metrics.Metrics.forget`.  Identity: none.  Thread-safe.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from stageset.api.vocabulary import ConditionStatus, ConditionType, StagePhase

ObjectKey = tuple[str, str, str]  # (kind, namespace, name)

CONDITIONS = (ConditionType.READY, ConditionType.STALLED, ConditionType.RECONCILING)
ACTIONS = ("created", "configured", "recreated", "unchanged")
PRUNE_RESULTS = ("deleted", "failed")


@dataclass
class _Stage:
    shown: bool = False  # in the StageSet's status now: its phase and objects are series
    phase: str = ""
    objects: int | None = None
    applied: list[int] | None = None  # per ACTIONS, once a stage's apply was counted
    drift: int | None = None


@dataclass
class _Object:
    conditions: tuple[str | None, ...] = (None, None, None)  # per CONDITIONS
    suspended: bool = False
    stages: dict[str, _Stage] = field(default_factory=dict)
    pruned: list[int] | None = None  # per PRUNE_RESULTS
    durations: list[float] | None = None  # per bucket (not cumulative), then +Inf, then the sum
    drifted: int | None = None  # objects a Warn StageSet left drifted, as its last pass found them



def cumulative_buckets(bounds: Sequence[float], counts: Sequence[float]) -> list[tuple[str, float]]:
    """A histogram's buckets as prometheus writes them: ``le`` labels (``bounds`` then +Inf) and
    cumulative counts, from a count per bucket (``counts``: one more than ``bounds``)."""
    cumulative, buckets = 0.0, []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        cumulative += count
        buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
    return buckets

class ObjectSeries(Collector):
    def __init__(self, *, buckets: Sequence[float], tenant_of: Callable[[str], str] = lambda _namespace: ""):
        self._buckets = tuple(buckets)
        self._tenant_of = tenant_of
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, _Object] = {}

    # -- updates (called by Metrics, under its rules) ----------------------------------------

    def observe(self, key: ObjectKey, *, conditions: Mapping[str, str], suspended: bool,
                stages: Iterable[tuple[str, str, int | None]] | None) -> None:
        """The object as last seen; ``stages`` (StageSets): (name, phase, objects) of each stage in
        status — a stage no longer there loses its series."""
        with self._lock:
            found = self._objects.setdefault(key, _Object())
            found.conditions = tuple(conditions.get(c.value) for c in CONDITIONS)
            found.suspended = suspended
            if stages is None:
                return
            seen: dict[str, _Stage] = {}
            for name, phase, objects in stages:
                stage = found.stages.get(name) or _Stage()
                stage.shown = True
                stage.phase = phase
                if objects is not None:
                    stage.objects = objects
                seen[name] = stage
            # Counters of a stage gone from status stay until the StageSet goes (as before: only
            # its phase and objects were removed); keep them, drop phase and objects.
            for name, stage in found.stages.items():
                if name not in seen and (stage.applied is not None or stage.drift is not None):
                    seen[name] = _Stage(objects=stage.objects, applied=stage.applied, drift=stage.drift)
            found.stages = seen

    def forget(self, key: ObjectKey) -> None:
        with self._lock:
            self._objects.pop(key, None)

    def alive(self, key: ObjectKey) -> bool:
        with self._lock:
            return key in self._objects

    def applied(self, key: ObjectKey, stage: str, counts: Mapping[str, int], drifted: int) -> None:
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                return
            entry = found.stages.setdefault(stage, _Stage())
            entry.applied = [(entry.applied[i] if entry.applied else 0) + counts.get(a, 0)
                             for i, a in enumerate(ACTIONS)]
            entry.drift = (entry.drift or 0) + drifted

    def drifted(self, key: ObjectKey, count: int | None) -> None:
        """How many objects a StageSet's last pass left drifted (``None``: no series: not in Warn mode)."""
        with self._lock:
            found = self._objects.get(key)
            if found is not None:
                found.drifted = count

    def pruned(self, key: ObjectKey, *, deleted: int, failed: int) -> None:
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                return
            before = found.pruned or [0, 0]
            found.pruned = [before[0] + deleted, before[1] + failed]

    def duration(self, key: ObjectKey, seconds: float) -> None:
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                return
            if found.durations is None:
                found.durations = [0.0] * (len(self._buckets) + 2)
            found.durations[bisect.bisect_left(self._buckets, seconds)] += 1
            found.durations[-1] += seconds

    # -- the scrape --------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            objects = [(key, _snapshot(obj)) for key, obj in self._objects.items()]
        duration = HistogramMetricFamily(
            "stageset_reconcile_duration_seconds", "How long each object's reconciles took.",
            labels=["kind", "namespace", "name", "tenant"])
        condition = GaugeMetricFamily(
            "stageset_reconcile_condition", "1 for the status each condition of an object has now, 0 for "
            "the others.", labels=["kind", "namespace", "name", "type", "status", "tenant"])
        suspended = GaugeMetricFamily("stageset_suspended", "1 while the object's spec.suspend is true.",
                                      labels=["kind", "namespace", "name", "tenant"])
        phase = GaugeMetricFamily(
            "stageset_stage_phase", "1 for the phase each stage of a StageSet is in now, 0 for the others.",
            labels=["namespace", "name", "stage", "phase", "tenant"])
        stage_objects = GaugeMetricFamily("stageset_stage_objects", "Objects each stage applied last.",
                                          labels=["namespace", "name", "stage", "tenant"])
        applied = CounterMetricFamily(
            "stageset_objects_applied", "Objects a stage's apply handled, by what it did "
            "(created, configured, recreated, unchanged).",
            labels=["namespace", "name", "stage", "action", "tenant"])
        pruned = CounterMetricFamily(
            "stageset_objects_pruned", "Objects no longer in Git, by what prune did (deleted, failed).",
            labels=["namespace", "name", "result", "tenant"])
        drift = CounterMetricFamily("stageset_drift_corrections", "Objects changed by someone else and "
                                    "restored.", labels=["namespace", "name", "stage", "tenant"])
        drifted = GaugeMetricFamily(
            "stageset_drifted_objects", "Objects a StageSet in driftDetection.mode Warn left as someone else "
            "changed them, as its last pass found them (0 when none; no series in Correct mode).",
            labels=["namespace", "name", "tenant"])
        tenants: dict[str, str] = {}
        for (kind, namespace, name), obj in objects:
            if namespace not in tenants:
                tenants[namespace] = self._tenant_of(namespace)
            tenant = tenants[namespace]
            for type_, current in zip(CONDITIONS, obj.conditions, strict=True):
                for value in ConditionStatus:
                    condition.add_metric([kind, namespace, name, type_.value, value.value, tenant],
                                         1 if current == value.value else 0)
            suspended.add_metric([kind, namespace, name, tenant], 1 if obj.suspended else 0)
            if obj.durations is not None:
                duration.add_metric([kind, namespace, name, tenant],
                                    cumulative_buckets(self._buckets, obj.durations[:-1]), obj.durations[-1])
            for stage_name, stage in obj.stages.items():
                if stage.shown:
                    for each in StagePhase:
                        phase.add_metric([namespace, name, stage_name, each.value, tenant],
                                         1 if stage.phase == each.value else 0)
                    if stage.objects is not None:
                        stage_objects.add_metric([namespace, name, stage_name, tenant], stage.objects)
                if stage.applied is not None:
                    for action, count in zip(ACTIONS, stage.applied, strict=True):
                        applied.add_metric([namespace, name, stage_name, action, tenant], count)
                if stage.drift is not None:
                    drift.add_metric([namespace, name, stage_name, tenant], stage.drift)
            _totals(obj, pruned, drifted, [namespace, name, tenant])
        yield from (duration, condition, suspended, phase, stage_objects, applied, pruned, drift, drifted)


def _totals(obj: _Object, pruned: CounterMetricFamily, drifted: GaugeMetricFamily, labels: list[str]) -> None:
    """A StageSet's prune counts and its drifted objects, where it has them."""
    namespace, name, tenant = labels
    if obj.pruned is not None:
        for result, count in zip(PRUNE_RESULTS, obj.pruned, strict=True):
            pruned.add_metric([namespace, name, result, tenant], count)
    if obj.drifted is not None:
        drifted.add_metric([namespace, name, tenant], obj.drifted)


def _snapshot(obj: _Object) -> _Object:
    """A copy to expose without holding the lock while the text is written."""
    return _Object(conditions=obj.conditions, suspended=obj.suspended,
                   stages={n: _Stage(s.shown, s.phase, s.objects, list(s.applied) if s.applied else None,
                                     s.drift) for n, s in obj.stages.items()},
                   pruned=list(obj.pruned) if obj.pruned else None,
                   durations=list(obj.durations) if obj.durations else None, drifted=obj.drifted)
