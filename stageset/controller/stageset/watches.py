"""What the StageSet reconciler watches and which StageSets each event requeues (its ``SetupWithManager``).

- ``For`` StageSets (:func:`trigger`): a new generation, a ``requestedAt``, a deletion, a
  promote/update-now annotation (a request is an annotation, so it is named here), or the
  release a FleetRollout wrote (``stages.metio.wtf/fleet-release``: a wave opened for it), or its
  hand-over record (``stages.metio.wtf/handed-over``: a StageSet naming it in ``spec.supersedes``
  took objects over, which it now lets go).
  Status writes alone requeue nothing.  A Ready that turns ``False`` is told as a Warning
  annotated with the revision that failed (:class:`~stageset.controller.events.ReadyWarnings`),
  except a release held as asked or a rollback the pass told itself.
- ``Watches`` StageSets (:func:`as_dependency`): a StageSet turning (un)Ready at its generation,
  applying a new revision (``minVersion``) or releasing a held one wakes the StageSets whose
  ``spec.dependsOn`` names it, at once.
- ``Watches`` GitRepositories (:func:`~stageset.controller.sourcekinds.trigger`): a change of
  its artifact or readiness — a failure too, so the StageSets say so now rather than at their
  next retry — wakes exactly the StageSets whose stages name it.
- ``Watches`` StageTargets (:func:`target_trigger`, only with ``--target-namespaces``): a new
  generation (``allowedNamespaces`` changed), a kubeconfig Secret read at a new version (rotated,
  or naming another cluster) or a change of its readiness wakes exactly the StageSets whose
  ``spec.targetRef`` names it, at once (indexed beside the sources they name).
- From outside the watches, through :meth:`SourceIndex.wake`: a Flux source's change
  (:mod:`~stageset.controller.fluxwatch`), an artifact download that ended
  (:mod:`~stageset.controller.artifacts`), a GitRepository's new revision (also a known one a
  restarted controller's fresh mirror now holds: :meth:`StageSetWatches.revised`).  A readiness
  watch that sees what a stage waits for change queues its StageSet itself (the stage's ``wake``,
  :mod:`~stageset.controller.stageset.stage`), and so does the held watch of an object of another
  kind a StageSet's ``spec.dependsOn`` waits for (:mod:`~stageset.controller.stageset.dependencywatches`).

The StageSet watch keeps two indexes before any key is queued for the event: the dependency
graph (:class:`~stageset.controller.dependencies.DependencyIndex`; a reconcile finds cycles
through it, so it must see the object's own edges) and the sources each StageSet names
(:class:`SourceIndex`, so a source's change finds its StageSets without a scan of the cache).
A StageSet naming a Flux kind no watch covers yet has discovery asked at once (``poke``: its
CRD may be new).

Identity: none; nothing here makes a request (``poke`` asks discovery, as the controller).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from stageset.api.fleet import ANNOTATION_FLEET_RELEASE
from stageset.api.release import ANNOTATION_PROMOTE, ANNOTATION_UPDATE_NOW
from stageset.apply.handover import ANNOTATION as HANDED_OVER
from stageset.apply.record import problem_of
from stageset.controller.conditions import ready_at_generation
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.events import EventRecorder, ReadyWarnings, failing_revision
from stageset.controller.keys import ObjectKey
from stageset.controller.result import Result
from stageset.controller.setup import (
    ANY_CHANGE,
    CHANGED_OR_GONE,
    Controller,
    Enqueue,
    Event,
    Watch,
    reconcile_trigger,
)
from stageset.controller.sourcekinds import (
    EXTERNAL_ARTIFACT,
    FLUX_GROUP,
    OUR_GROUP,
    DefaultSourceKind,
    SourceObject,
    referenced,
)
from stageset.controller.sourcekinds import trigger as source_trigger
from stageset.controller.stageset.awaited import names_stageset
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)


class Reconciles(Protocol):
    """The StageSet reconciler as the manager runs it."""

    def reconcile(self, raw: KubeObject) -> Result: ...

    def forget(self, namespace: str, name: str) -> None: ...


def trigger(obj: KubeObject) -> tuple[Any, ...]:
    """What, when changed, calls for a reconcile of a StageSet (of its durable record, only whether it
    can be used: a tenant's edit that breaks it, or removing one that did, is acted on at once; the
    controller's own growing of it is not a trigger)."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    return (*reconcile_trigger(obj), annotations.get(ANNOTATION_PROMOTE),
            annotations.get(ANNOTATION_UPDATE_NOW), annotations.get(ANNOTATION_FLEET_RELEASE),
            annotations.get(HANDED_OVER), problem_of(obj) is None)


def as_dependency(obj: KubeObject) -> tuple[Any, ...]:
    """What a dependent StageSet waits on: Ready at the generation, the revision applied
    (``minVersion``), and whether an update window holds a new revision back."""
    status = obj.get("status") or {}
    held = bool((status.get("pendingUpdate") or {}).get("revisions"))
    return ready_at_generation(obj), status.get("lastAppliedRevision"), held


def target_trigger(obj: KubeObject) -> tuple[Any, ...]:
    """What of a StageTarget its StageSets act on: its spec (``allowedNamespaces``), the version of
    the kubeconfig Secret last read and whether it is Ready."""
    status = obj.get("status") or {}
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return obj.get("metadata", {}).get("generation"), status.get("observedSecretVersion"), ready


def target_named(obj: KubeObject, *, kind: str) -> set[SourceObject]:
    """The StageTarget a StageSet's ``spec.targetRef`` names, as the source index keys it."""
    ref = (obj.get("spec") or {}).get("targetRef") or {}
    if not ref.get("name") or not ref.get("namespace"):
        return set()
    return {SourceObject(OUR_GROUP, kind, str(ref["namespace"]), str(ref["name"]))}


def depends_on(key: ObjectKey, obj: KubeObject, *, no_cross_namespace_refs: bool) -> list[tuple[str, str]]:
    """The StageSets ``obj``'s ``spec.dependsOn`` names, as (namespace, name); entries naming objects of
    other kinds are no edges of the StageSet graph (their watches: ``dependencywatches``)."""
    found = [(dep.get("namespace") or key.namespace, dep.get("name", ""))
             for dep in (obj.get("spec") or {}).get("dependsOn") or [] if names_stageset(dep)]
    if no_cross_namespace_refs:
        # Refused references are no edges: cycles never span namespaces on such a controller.
        found = [dep for dep in found if dep[0] == key.namespace]
    return found


class SourceIndex:
    """StageSets by the sources they name, and back: a source's change requeues its StageSets.
    The StageTarget a StageSet's ``targetRef`` names is kept here too (its kind tells it apart)."""

    def __init__(self, *, enqueue: Enqueue):
        self._enqueue = enqueue
        self._lock = threading.Lock()
        self._by_source: dict[SourceObject, set[ObjectKey]] = {}
        self._sources_of: dict[ObjectKey, set[SourceObject]] = {}

    def update(self, key: ObjectKey, sources: set[SourceObject] | None) -> None:
        """Record which sources StageSet ``key`` names (``None``: it is gone)."""
        with self._lock:
            for source in self._sources_of.pop(key, set()) - (sources or set()):
                named = self._by_source.get(source)
                if named is not None:
                    named.discard(key)
                    if not named:
                        del self._by_source[source]
            if sources:
                self._sources_of[key] = sources
                for source in sources:
                    self._by_source.setdefault(source, set()).add(key)

    def naming(self, sources: Iterable[SourceObject]) -> list[ObjectKey]:
        """The StageSets whose stages name one of ``sources``, in key order."""
        with self._lock:
            return sorted({key for source in sources for key in self._by_source.get(source, ())})

    def wake(self, sources: set[SourceObject]) -> None:
        """Requeue exactly the StageSets whose stages name one of ``sources``."""
        for key in self.naming(sources):
            self._enqueue(key)


class StageSetWatches:
    def __init__(self, *, reconciler: Reconciles, resource: Resource, source_kind: str,
                 index: DependencyIndex, sources: SourceIndex, poke: Callable[[str], None],
                 default_source_kind: DefaultSourceKind, no_cross_namespace_refs: bool,
                 target_kind: str | None = None, events: EventRecorder | None = None):
        self._reconciler = reconciler
        self._events = events
        self._resource = resource
        self._source_kind = source_kind
        self._index = index
        self._sources = sources
        self._poke = poke
        self._default_source_kind = default_source_kind
        self._no_cross_namespace_refs = no_cross_namespace_refs
        self._target_kind = target_kind

    def controller(self, *, workers: int) -> Controller:
        kind = self._resource.kind
        return Controller(
            resource=self._resource, reconciler=self._reconciler, workers=workers, trigger=trigger,
            watches=(Watch(kind=kind, state=as_dependency, fires=ANY_CHANGE, keys=self._dependents),
                     Watch(kind=self._source_kind, state=source_trigger, fires=CHANGED_OR_GONE,
                           keys=self._naming),
                     *([] if self._target_kind is None else
                       [Watch(kind=self._target_kind, state=target_trigger, fires=ANY_CHANGE,
                              keys=self._naming)])),
            indexed=self._indexed,
            transitions=None if self._events is None else ReadyWarnings(self._events,
                                                                        revision=self._failed_at))

    def _failed_at(self, obj: KubeObject) -> str:
        """The revision a StageSet's failure is about: what its last pass attempted for its failed
        stages (:func:`~stageset.controller.events.failing_revision`)."""
        assert self._events is not None
        meta = obj.get("metadata") or {}
        attempted = self._events.attempted(str(meta.get("namespace", "")), str(meta.get("name", "")))
        return failing_revision(obj, attempted)

    def revised(self, namespace: str, name: str, revision: str) -> None:
        """A GitRepository's artifact changed (or a fetch stored a known revision anew)."""
        log.info("%s %s/%s now at %s", self._source_kind, namespace, name, revision)
        self._sources.wake({SourceObject(OUR_GROUP, self._source_kind, namespace, name)})

    def _indexed(self, event: Event, key: ObjectKey, obj: KubeObject) -> None:
        ref = (key.namespace, key.name)
        if event is Event.DELETED:
            self._index.remove(ref)
            self._reconciler.forget(key.namespace, key.name)
            self._sources.update(key, None)
            return
        self._index.update(ref, depends_on(key, obj, no_cross_namespace_refs=self._no_cross_namespace_refs))
        named = referenced(obj, self._default_source_kind)
        for source in named:
            # A Flux kind no watch covers yet: look for it now (its CRD may be new).
            if source.group == FLUX_GROUP:
                self._poke(source.kind)
            elif source.group != OUR_GROUP:
                self._poke(EXTERNAL_ARTIFACT)
        if self._target_kind is not None:
            named |= target_named(obj, kind=self._target_kind)
        self._sources.update(key, named)

    def _dependents(self, key: ObjectKey) -> list[ObjectKey]:
        return [ObjectKey(key.kind, namespace, name) for namespace, name in
                self._index.dependents((key.namespace, key.name))]

    def _naming(self, key: ObjectKey) -> list[ObjectKey]:
        return self._sources.naming({SourceObject(OUR_GROUP, key.kind, key.namespace, key.name)})
