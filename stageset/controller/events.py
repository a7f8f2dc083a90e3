"""Kubernetes Events about our objects (``events.k8s.io/v1``; ``kubectl describe`` and
``kubectl events`` show them).

One typed value, one call: every event is an :class:`ObjectEvent` (its subject, type, a reason
from the reason enums, the message, the revision it is about, the action), built by the
reconciler-side helpers :func:`warning` and :func:`normal`, and recorded by
:meth:`EventRecorder.emit`, the one place that turns the revision into the Event's
``stages.metio.wtf/revision`` annotation and tells the listeners (each subscribed to the kinds it
declared: :class:`Subscription`).

Identity: events are created and patched with the controller's own identity (the chart's
ClusterRole may create and patch Events).  Messages name objects and reasons; every message
passes the caller's redactor as it is built, and the subject's (every Secret value its reconciles
read, :data:`~stageset.controller.redact.REGISTRY`) before it is cut to the apiserver's bound
(:func:`~stageset.controller.redact.bounded`), so Secret values never leave through an event, in
any encoding the redactor knows.  A failure to record an event is logged and otherwise ignored --
events are advisory.

Repeats are aggregated as client-go's event recorder does: an event equal to one recorded in
the last :data:`SERIES_WINDOW` seconds (same object, type, reason, action, note and annotations
-- so the revision an event is annotated with is always the one it reports) does not
create an Event object; it patches the first one's ``series`` (``count``, ``lastObservedTime``).
After a quiet window a repeat starts a new Event.  The cache of recent events is bounded
(least recently used entries go first).

What the controller records (reasons in :mod:`stageset.api.vocabulary`):

- a Warning with the Ready reason whenever an object's Ready condition turns ``False`` or
  changes its reason while ``False`` (:func:`ready_transition`), as the policy each controller
  declares says (:class:`ReadyWarnings`), except for the reasons of a state someone chose
  (``NO_TRANSITION_EVENT``: a suspend, a held release);
- a Normal ``Suspended`` / ``Resumed`` when an object enters or leaves the suspended state
  (:func:`suspend_transition`, told by :class:`ReadyWarnings` too): no failure, so no failing
  commit status and no red message;
- a Normal ``ReconciliationSucceeded`` when a StageSet is Ready after a change, naming what
  changed (:func:`change_summary`), and a Normal ``NewArtifact`` for a new Git revision;
- Warnings ``DriftCorrected``, ``PruneFailed`` and ``TeardownForced``.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from stageset.api.vocabulary import (
    EVENT_REVISION_ANNOTATION,
    NO_TRANSITION_EVENT,
    EventReason,
    EventType,
    Reason,
)
from stageset.apply.changeset import WRITES, Change
from stageset.controller.clock import Clock, system_clock
from stageset.controller.redact import REGISTRY, Redactor, bounded
from stageset.kube.client import ApiError, KubeClient, UnreachableError
from stageset.kube.types import KubeObject, metadata

log = logging.getLogger(__name__)

MAX_NOTE = 1024  # the apiserver refuses longer notes
SERIES_WINDOW = 6 * 60.0  # client-go's: a series not seen for this long is finished
CACHE_SIZE = 4096
CONTROLLER = "stages.metio.wtf/stageset-controller"
LISTED = 10  # objects named in a summary before "and N more"

Redact = Callable[[str], str]


def _unchanged(text: str) -> str:
    return text


def micro_time(moment: datetime.datetime) -> str:
    """Kubernetes' MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def subject(change: Change) -> str:
    """``Kind/namespace/name`` (``Kind/name`` when cluster-scoped), as Flux's change sets name objects."""
    oid = change.id
    return "/".join(part for part in (oid.kind, oid.namespace, oid.name) if part)


def change_summary(changes: Iterable[Change], *, pruned: int = 0) -> str:
    """``ConfigMap/shop/x configured, Deployment/shop/web created, 2 pruned`` ("" when nothing changed)."""
    written = sorted((c for c in changes if c.action in WRITES), key=subject)
    parts = [f"{subject(c)} {c.action.value.lower()}" for c in written[:LISTED]]
    if len(written) > LISTED:
        parts.append(f"and {len(written) - LISTED} more")
    if pruned:
        parts.append(f"{pruned} pruned")
    return ", ".join(parts)


def ready_condition(obj: KubeObject) -> Mapping[str, str] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"), None)


REVISION_ANNOTATION = EVENT_REVISION_ANNOTATION


def failing_revision(obj: KubeObject, attempted: Mapping[str, str]) -> str:
    """The revision a StageSet's failure is about (joined by ``, ``): what its last pass attempted
    for its failed stages (``attempted``, by stage), else for every stage, else the revisions its
    status names; "" when none is known."""
    stages = [s for s in (obj.get("status") or {}).get("stages") or [] if isinstance(s, Mapping)]
    failed = {str(s.get("name")) for s in stages if s.get("phase") == "Failed"}
    chosen = [r for n, r in attempted.items() if n in failed] or list(attempted.values()) \
        or [str(s["revision"]) for s in stages if s.get("revision")]
    return ", ".join(sorted({r for r in chosen if r}))


def ready_transition(before: Mapping[str, str] | None, after: Mapping[str, str] | None) -> bool:
    """Did Ready turn ``False`` (or change its reason while ``False``)?"""
    if after is None or after.get("status") != "False":
        return False
    return before is None or before.get("status") != "False" or before.get("reason") != after.get("reason")


def suspend_transition(before: Mapping[str, str] | None,
                       after: Mapping[str, str] | None) -> EventReason | None:
    """Did Ready enter the ``Suspended`` reason (``SUSPENDED``) or leave it (``RESUMED``)?"""
    was = before is not None and before.get("reason") == Reason.SUSPENDED.value
    now = after is not None and after.get("reason") == Reason.SUSPENDED.value
    if now and not was:
        return EventReason.SUSPENDED
    if was and not now and after is not None:
        return EventReason.RESUMED
    return None


@dataclass(frozen=True)
class Subject:
    """The object an event regards: one of our objects, as its watch or a reconcile read it."""

    api_version: str
    kind: str
    namespace: str
    """Its namespace (empty for a cluster-scoped object: its events go to ``default``)."""
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: KubeObject) -> Subject:
        meta = metadata(obj)
        return cls(api_version=str(obj.get("apiVersion") or ""), kind=str(obj.get("kind") or ""),
                   namespace=str(meta.get("namespace") or ""), name=str(meta["name"]),
                   uid=str(meta.get("uid") or ""), labels=dict(meta.get("labels") or {}))

    @property
    def ref(self) -> tuple[str, str, str]:
        """``(kind, namespace, name)``: how the redaction registry and the metrics name it."""
        return self.kind, self.namespace, self.name


@dataclass(frozen=True)
class ObjectEvent:
    """One event about one of our objects, as every reconciler tells it: built by :func:`warning`
    or :func:`normal` (the message already passed the caller's redactor) and handed to the one
    :meth:`EventRecorder.emit`."""

    subject: Subject
    type: EventType
    reason: EventReason | Reason
    message: str
    revision: str = ""
    """The revision the event is about ("" when none): annotated ``stages.metio.wtf/revision`` on the
    Event — here, and nowhere else — so a notification sets that commit's status."""
    action: str = "Reconcile"

    @property
    def annotations(self) -> dict[str, str]:
        return {REVISION_ANNOTATION: self.revision} if self.revision else {}


def warning(obj: KubeObject, reason: EventReason | Reason, message: str, *, action: str = "Reconcile",
            revision: str = "", redact: Redact | None = None) -> ObjectEvent:
    """A Warning about ``obj``; ``redact`` (the pass's redactor) cleans the message as it is built."""
    return ObjectEvent(subject=Subject.of(obj), type=EventType.WARNING, reason=reason,
                       message=(redact or _unchanged)(message), revision=revision, action=action)


def normal(obj: KubeObject, reason: EventReason | Reason, message: str, *, action: str = "Reconcile",
           revision: str = "", redact: Redact | None = None) -> ObjectEvent:
    """A Normal event about ``obj`` (as :func:`warning`)."""
    return ObjectEvent(subject=Subject.of(obj), type=EventType.NORMAL, reason=reason,
                       message=(redact or _unchanged)(message), revision=revision, action=action)


@dataclass(frozen=True)
class Recorded:
    """An event as recorded (its note redacted and bounded), for what listens to the recorder
    (notifications).  Told once per new Event, never for a repeat folded into a series."""

    regarding: Mapping[str, str]
    """``apiVersion``, ``kind``, ``namespace``, ``name``, ``uid`` of the object."""
    labels: Mapping[str, str]
    type: EventType
    reason: str
    note: str
    annotations: Mapping[str, str]
    time: str


Listener = Callable[[Recorded], None]


@dataclass(frozen=True)
class Subscription:
    """A listener of the recorder and the kinds it hears (a feature declares it in its setup)."""

    kinds: frozenset[str]
    """The kinds of object whose events it is told (``Subject.kind``)."""
    tell: Listener
    """Must not block (the notifier only queues)."""


@dataclass
class _Series:
    name: str
    namespace: str
    count: int
    last: datetime.datetime


class EventRecorder:
    def __init__(self, client: KubeClient, *, controller: str = CONTROLLER, instance: str | None = None,
                 clock: Clock = system_clock, window: float = SERIES_WINDOW, cache_size: int = CACHE_SIZE,
                 listener: Listener | None = None):
        self._client = client
        # Told every new event (not its repeats) of the kinds they subscribed to; ``listener``: every kind.
        self._listeners: list[tuple[frozenset[str] | None, Listener]] = [] if listener is None \
            else [(None, listener)]
        self._controller = controller
        self._instance = (instance or f"stageset-controller-{socket.gethostname()}")[:128]
        self._clock = clock
        self._window = window
        self._size = cache_size
        self._lock = threading.Lock()
        self._recent: OrderedDict[tuple[str, ...], _Series] = OrderedDict()
        # Per StageSet, the revisions its last pass set out to apply, by stage (bounded like the
        # series cache): what a failure event names, since status keeps only applied revisions.
        self._attempted: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()

    def subscribe(self, subscription: Subscription) -> None:
        """Tell ``subscription`` every new event of its kinds from now on (declared in a feature's setup)."""
        self._listeners.append((subscription.kinds, subscription.tell))

    def attempting(self, namespace: str, name: str, revisions: Mapping[str, str]) -> None:
        """A pass of the StageSet sets out to apply ``revisions`` (by stage)."""
        with self._lock:
            self._attempted[(namespace, name)] = dict(revisions)
            self._attempted.move_to_end((namespace, name))
            while len(self._attempted) > self._size:
                self._attempted.popitem(last=False)

    def attempted(self, namespace: str, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self._attempted.get((namespace, name), {}))

    def emit(self, event: ObjectEvent) -> None:
        """Record ``event`` (a repeat within the window counts on the first one's series).  Its
        message passes the subject's redactor (:data:`~stageset.controller.redact.REGISTRY`: every
        Secret value its reconciles read) once more before it is cut to the apiserver's bound."""
        subject = event.subject
        namespace = subject.namespace or "default"
        # Redacted whole, then cut: a cut never leaves the start of a Secret value for the redactor to miss.
        note = bounded(event.message, limit=MAX_NOTE, redact=Redactor(REGISTRY.of(subject.ref)))
        annotations = event.annotations
        # The annotations (the revision applied) are part of the key: a repeat at another revision is
        # a new Event, never folded into one that names the old revision (a revert A -> B -> A).
        key = (namespace, subject.kind, subject.name, subject.uid, event.type.value, event.reason.value,
               event.action, note, *(f"{k}={v}" for k, v in sorted(annotations.items())))
        now = self._clock()
        with self._lock:
            series = self._recent.get(key)
            if series is not None and (now - series.last).total_seconds() < self._window:
                series.count += 1
                series.last = now
                self._recent.move_to_end(key)
                repeat: _Series | None = _Series(series.name, namespace, series.count, now)
            else:
                repeat = None
        if repeat is None:
            self._tell(event, namespace=namespace, note=note, now=now)
        try:
            if repeat is not None and self._patch_series(repeat):
                return
            name = self._create(event, namespace=namespace, note=note, now=now)
        except (ApiError, UnreachableError) as error:
            log.warning("could not record event %s on %s/%s: %s", event.reason.value, namespace, subject.name,
                        error)
            return
        with self._lock:
            self._recent[key] = _Series(name, namespace, 1, now)
            self._recent.move_to_end(key)
            while len(self._recent) > self._size:
                self._recent.popitem(last=False)

    def _tell(self, event: ObjectEvent, *, namespace: str, note: str, now: datetime.datetime) -> None:
        subject = event.subject
        listeners = [tell for kinds, tell in self._listeners if kinds is None or subject.kind in kinds]
        if not listeners:
            return
        regarding = {"apiVersion": subject.api_version, "kind": subject.kind, "namespace": namespace,
                     "name": subject.name, "uid": subject.uid}
        recorded = Recorded(regarding=regarding, labels=dict(subject.labels), type=event.type,
                            reason=event.reason.value, note=note, annotations=event.annotations,
                            time=micro_time(now))
        for listener in listeners:
            try:
                listener(recorded)
            except Exception:  # advisory, like the event itself: a listener's fault never fails a reconcile
                log.exception("an event listener failed on %s %s/%s", event.reason.value, namespace,
                              subject.name)

    def forget(self, namespace: str, name: str) -> None:
        """The object is gone: its recent events no longer aggregate (and free their cache entries)."""
        with self._lock:
            for key in [k for k in self._recent if k[0] == namespace and k[2] == name]:
                del self._recent[key]
            self._attempted.pop((namespace, name), None)

    def _path(self, namespace: str) -> str:
        return f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"

    def _patch_series(self, series: _Series) -> bool:
        """Count a repeat on the Event already recorded; ``False`` when that Event is gone (expired)."""
        try:
            self._client.request("PATCH", f"{self._path(series.namespace)}/{series.name}",
                                 content_type="application/merge-patch+json",
                                 body={"series": {"count": series.count,
                                                  "lastObservedTime": micro_time(series.last)}})
        except ApiError as error:
            if error.not_found:
                return False
            raise
        return True

    def _create(self, event: ObjectEvent, *, namespace: str, note: str, now: datetime.datetime) -> str:
        subject = event.subject
        # As client-go names events: the object's name and a unique suffix (within 253 characters).
        name = f"{subject.name[:236]}.{uuid.uuid4().hex[:16]}"
        event_meta: dict[str, object] = {"name": name, "namespace": namespace}
        if event.annotations:
            event_meta["annotations"] = event.annotations
        regarding = {"apiVersion": subject.api_version, "kind": subject.kind, "name": subject.name,
                     "namespace": namespace, "uid": subject.uid}
        self._client.request("POST", self._path(namespace), body={
            "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": event_meta,
            "eventTime": micro_time(now), "reportingController": self._controller,
            "reportingInstance": self._instance, "action": event.action, "reason": event.reason.value,
            "type": event.type.value, "note": note,
            "regarding": {k: v for k, v in regarding.items() if v},
        })
        return name


class ReadyWarnings:
    """A controller's Ready→False event policy, declared on its
    :attr:`~stageset.controller.setup.Controller.transitions`: after a reconcile that turned Ready
    ``False`` (or changed its reason while ``False``, :func:`ready_transition`), a Warning with Ready's
    reason and message — except the reasons in :data:`~stageset.api.vocabulary.NO_TRANSITION_EVENT`
    (a release held as asked, a rollback the reconciler told itself, a suspend); entering or leaving
    the suspended state is a Normal ``Suspended`` / ``Resumed`` (:func:`suspend_transition`).
    ``revision`` (the StageSet's) names the revision that failed, annotated on the event so a
    notification sets its commit's status.

    The message passes the object's redactor (:data:`~stageset.controller.redact.REGISTRY`) as every
    event's does."""

    def __init__(self, events: EventRecorder, *, revision: Callable[[KubeObject], str] | None = None):
        self._events = events
        self._revision = revision

    def __call__(self, ref: tuple[str, str, str], before: KubeObject, after: KubeObject) -> None:
        """``ref``: the object's (kind, namespace, name); ``before``: as its reconcile was handed it;
        ``after``: as the cache knows it now (its own writes included)."""
        condition = ready_condition(after)
        change = suspend_transition(ready_condition(before), condition)
        if change is not None:  # a state someone chose: told as one, never as a failure
            said = ("reconciliation is suspended (spec.suspend): nothing is applied, pruned or corrected "
                    "until it is resumed; what was applied stays" if change is EventReason.SUSPENDED
                    else "reconciliation resumed (spec.suspend is false)")
            self._events.emit(normal(before, change, said))
        if condition is None or not ready_transition(ready_condition(before), condition):
            return
        try:
            reason = Reason(condition.get("reason", ""))
        except ValueError:
            return
        if reason in NO_TRANSITION_EVENT:
            return
        revision = self._revision(after) if self._revision is not None else ""
        self._events.emit(warning(before, reason, str(condition.get("message", "")), revision=revision,
                                  redact=Redactor(REGISTRY.of(ref))))
