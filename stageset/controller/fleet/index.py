"""What the FleetRollout reconciler knows of StageSets and rollouts: small views kept from the watch.

The manager tells this index every StageSet event (an index the fleet's setup declares on the
StageSet kind, told after the StageSet controller's own hook) and every FleetRollout event, before
any key is queued; a rollout's
reconcile reads the index, never the apiserver.  Per StageSet only what a rollout decides on is
kept (:class:`Seen`: labels, the held revisions, the applied ones, Ready at its generation, the
release annotation) — never its spec, objects or anything read from a tenant's sources or
Secrets.  Per rollout: its spec, and what its status records for each member
(``status.releases``) — what a member's pass takes its release from (:meth:`FleetIndex.view`).

A rollout whose spec no longer parses (``InvalidSpec``: stored before a rule it breaks existed,
such as the required ``namespaceSelector``) is kept as **refused** when its label selector still
parses: it selects by that selector and holds what it selects (fail closed), so an upgrade never
lets its members ship at once.

Identity: none; nothing here makes a request.  Thread-safe (the watch threads write, the
workers read).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stageset.api.actions import LabelSelector
from stageset.api.fleet import (
    ANNOTATION_FLEET_RELEASE,
    FleetRelease,
    FleetRollout,
    FleetView,
    MemberRelease,
    read_release,
)
from stageset.controller.conditions import READY, find_condition, ready_at_generation
from stageset.controller.fleet.selection import Candidate, matches, selecting, selects
from stageset.controller.keys import ObjectKey
from stageset.controller.setup import Event
from stageset.controller.status import validation_message
from stageset.kube.types import KubeObject, conditions

Key = tuple[str, str]


@dataclass(frozen=True)
class Seen:
    """One StageSet as a rollout needs it."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    pending: Mapping[str, str] = field(default_factory=dict)
    applied: frozenset[str] = frozenset()
    ready: bool = False
    reason: str = ""
    release: FleetRelease | None = None
    annotation: str | None = None
    """The raw release annotation (compared before a write)."""


def seen(obj: KubeObject) -> Seen:
    """The view of a raw StageSet (from the watch)."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    pending = (status.get("pendingUpdate") or {}).get("revisions") or {}
    applied = frozenset(str(s["revision"]) for s in status.get("stages") or []
                        if isinstance(s, Mapping) and s.get("revision"))
    ready = find_condition(conditions(obj), READY)
    annotations = metadata.get("annotations") or {}
    raw = annotations.get(ANNOTATION_FLEET_RELEASE)
    return Seen(namespace=str(metadata.get("namespace") or ""), name=str(metadata.get("name") or ""),
                labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
                pending={str(k): str(v) for k, v in pending.items()} if isinstance(pending, Mapping) else {},
                applied=applied, ready=ready_at_generation(obj), reason=str(ready.get("reason") or ""),
                release=read_release(annotations), annotation=None if raw is None else str(raw))


def state(obj: KubeObject) -> tuple[Any, ...]:
    """What of a StageSet, when changed, may change a rollout's decision (the watch's state)."""
    view = seen(obj)
    return (tuple(sorted(view.labels.items())), tuple(sorted(view.pending.items())), view.applied, view.ready,
            view.reason, view.annotation)


@dataclass(frozen=True)
class Refused:
    """A rollout whose spec does not parse, kept for its label selector: it holds what it selects."""

    selector: LabelSelector
    namespace_selector: LabelSelector | None
    why: str

    def picks(self, labels: Mapping[str, str], namespace_labels: Mapping[str, str] | None) -> bool:
        if not matches(self.selector, labels):
            return False
        wanted = self.namespace_selector
        return wanted is None or not wanted.query() or namespace_labels is None \
            or matches(wanted, namespace_labels)


def refused(obj: KubeObject, error: ValidationError) -> Refused | None:
    """``obj`` (a rollout its model refuses) kept for its selectors, when they still parse."""
    spec = obj.get("spec") or {}
    try:
        selector = LabelSelector.model_validate(spec.get("selector"))
    except ValidationError:
        return None
    try:
        wanted = LabelSelector.model_validate(spec["namespaceSelector"]) if spec.get("namespaceSelector") \
            else None
    except ValidationError:
        wanted = None
    return Refused(selector=selector, namespace_selector=wanted, why=validation_message(error))


def records_of(obj: KubeObject) -> dict[Key, MemberRelease]:
    """What a rollout's status records for its members (an entry that does not parse records nothing)."""
    found: dict[Key, MemberRelease] = {}
    for raw in (obj.get("status") or {}).get("releases") or []:
        try:
            record = MemberRelease.model_validate(raw)
        except ValidationError:
            continue
        found[(record.namespace, record.name)] = record
    return found


def names(release: FleetRelease | None) -> set[str]:
    """The rollouts a release annotation names."""
    if release is None:
        return set()
    return {part.strip() for part in release.rollout.split(",") if part.strip()}


class FleetIndex:
    def __init__(self, *, namespace_labels: Callable[[str], dict[str, str] | None]):
        self._namespace_labels = namespace_labels
        self._lock = threading.Lock()
        self._stagesets: dict[Key, Seen] = {}
        self._rollouts: dict[str, FleetRollout] = {}
        self._refused: dict[str, Refused] = {}
        self._records: dict[str, dict[Key, MemberRelease]] = {}
        self._gone: dict[Key, set[str]] = {}
        """Rollouts a deleted StageSet was a member of (queued once on its deletion)."""

    # -- told by the watches ------------------------------------------------------------------

    def stageset(self, event: Event, key: ObjectKey, obj: KubeObject) -> None:
        ref = (key.namespace, key.name)
        with self._lock:
            if event is Event.DELETED:
                was = self._stagesets.pop(ref, None)
                if was is not None:
                    self._gone[ref] = self._selecting(was) | names(was.release) | self._recording(ref)
                return
            self._stagesets[ref] = seen(obj)

    def rollout(self, event: Event, key: ObjectKey, obj: KubeObject) -> list[Key]:
        """Take a rollout's event; returns the members whose record changed (their passes decide
        again what they may apply)."""
        with self._lock:
            before = self._records.get(key.name, {})
            if event is Event.DELETED:
                self._rollouts.pop(key.name, None)
                self._refused.pop(key.name, None)
                self._records.pop(key.name, None)
                return sorted(before)
            try:
                self._rollouts[key.name] = FleetRollout.model_validate({**obj, "status": None})
                self._refused.pop(key.name, None)
            except ValidationError as error:
                # Refused (InvalidSpec in its status): kept for its label selector, it holds what
                # it selects (an upgrade that makes it invalid never frees its members).
                self._rollouts.pop(key.name, None)
                kept = refused(obj, error)
                if kept is None:
                    self._refused.pop(key.name, None)
                else:
                    self._refused[key.name] = kept
            after = records_of(obj)
            self._records[key.name] = after
            return sorted(ref for ref in {*before, *after} if before.get(ref) != after.get(ref))

    # -- read by the reconciler and the watch mappings -----------------------------------------

    def _candidate(self, view: Seen) -> Candidate:
        return Candidate(namespace=view.namespace, name=view.name, labels=view.labels,
                         namespace_labels=self._namespace_labels(view.namespace))

    def _selecting(self, view: Seen) -> set[str]:
        return set(selecting(self._rollouts.values(), self._candidate(view)))

    def _recording(self, ref: Key) -> set[str]:
        return {name for name, records in self._records.items() if ref in records and name in self._rollouts}

    def _refusing(self, view: Seen) -> set[str]:
        labels = self._namespace_labels(view.namespace)
        return {name for name, kept in self._refused.items() if kept.picks(view.labels, labels)}

    def _unknown(self, view: Seen) -> set[str]:
        """Rollouts whose label selector picks it while its namespace's labels are not known."""
        if self._namespace_labels(view.namespace) is not None:
            return set()
        return {str(r.metadata.get("name", "")) for r in self._rollouts.values()
                if matches(r.spec.selector, view.labels)}

    def rollouts_for(self, ref: Key) -> list[str]:
        """The rollouts to requeue on an event of StageSet ``ref``: those selecting it, those recording
        it, and those its annotation names (one that let go of it takes its annotation back)."""
        with self._lock:
            view = self._stagesets.get(ref)
            if view is None:
                return sorted(self._gone.pop(ref, set()))
            return sorted(self._selecting(view) | self._recording(ref)
                          | (names(view.release) & set(self._rollouts)))

    def selected_by(self, namespace: str, name: str) -> list[str]:
        """The rollouts that select StageSet ``namespace/name`` as the watch last showed it."""
        with self._lock:
            view = self._stagesets.get((namespace, name))
            return [] if view is None else sorted(self._selecting(view))

    def view(self, namespace: str, name: str) -> FleetView:
        """What a member's pass knows of the rollouts (:class:`~stageset.api.fleet.FleetView`): which
        select it, what their statuses record for it, which refused or unsure ones hold it."""
        ref = (namespace, name)
        with self._lock:
            seen = self._stagesets.get(ref)
            records = {rollout: self._records[rollout][ref].release(rollout)
                       for rollout in sorted(self._recording(ref))}
            if seen is None:
                return FleetView(records=records)
            return FleetView(selected_by=tuple(sorted(self._selecting(seen))), records=records,
                             refused={r: self._refused[r].why for r in sorted(self._refusing(seen))},
                             unknown=tuple(sorted(self._unknown(seen))))

    def members(self, rollout: FleetRollout) -> list[tuple[Seen, list[str], bool]]:
        """Every StageSet ``rollout`` selects — and every one its status records whose namespace it
        still selects (a member that changed its labels mid-round) — with the other rollouts holding
        it too, and whether its labels select it now."""
        name = str(rollout.metadata.get("name", ""))
        wanted = rollout.spec.namespace_selector
        with self._lock:
            recorded = self._records.get(name, {})
            found = []
            for ref, view in self._stagesets.items():
                candidate = self._candidate(view)
                selected = selects(rollout, labels=candidate.labels,
                                   namespace_labels=candidate.namespace_labels)
                kept = ref in recorded and candidate.namespace_labels is not None \
                    and matches(wanted, candidate.namespace_labels)
                if selected or kept:
                    others = [r for r in selecting(self._rollouts.values(), candidate) if r != name]
                    others += sorted(self._refusing(view) - {name})
                    found.append((view, others, selected))
            return sorted(found, key=lambda item: (item[0].namespace, item[0].name))

    def orphans(self, *, rollout: str | None = None) -> list[Seen]:
        """StageSets whose annotation names a rollout (``rollout``, or any) that does not select them
        (deleted, or let go).  Unknown namespace labels are no evidence: such a StageSet is left be."""
        with self._lock:
            found = []
            for view in self._stagesets.values():
                named = names(view.release)
                if view.annotation is None or (rollout is not None and rollout not in named):
                    continue
                candidate = self._candidate(view)
                if candidate.namespace_labels is None:
                    continue  # unknown namespace labels are no evidence
                if not selecting(self._rollouts.values(), candidate) and not self._refusing(view) \
                        and not self._recording((view.namespace, view.name)):
                    found.append(view)
            return found

    def get(self, ref: Key) -> Seen | None:
        with self._lock:
            return self._stagesets.get(ref)
