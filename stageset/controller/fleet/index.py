"""What the FleetRollout reconciler knows of StageSets and rollouts: small views kept from the watch.

The manager tells this index every StageSet event (an index the fleet's setup declares on the
StageSet kind, told after the StageSet controller's own hook) and every FleetRollout event, before
any key is queued; a rollout's
reconcile reads the index, never the apiserver.  Per StageSet only what a rollout decides on is
kept (:class:`Seen`: labels, the held revisions, the applied ones, Ready at its generation, the
release annotation) — never its spec, objects or anything read from a tenant's sources or
Secrets.

Identity: none; nothing here makes a request.  Thread-safe (the watch threads write, the
workers read).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stageset.api.fleet import ANNOTATION_FLEET_RELEASE, FleetRelease, FleetRollout, read_release
from stageset.controller.conditions import READY, find_condition, ready_at_generation
from stageset.controller.fleet.selection import Candidate, selecting, selects
from stageset.controller.keys import ObjectKey
from stageset.controller.setup import Event
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
        self._gone: dict[Key, set[str]] = {}
        """Rollouts a deleted StageSet was a member of (queued once on its deletion)."""

    # -- told by the watches ------------------------------------------------------------------

    def stageset(self, event: Event, key: ObjectKey, obj: KubeObject) -> None:
        ref = (key.namespace, key.name)
        with self._lock:
            if event is Event.DELETED:
                was = self._stagesets.pop(ref, None)
                if was is not None:
                    self._gone[ref] = self._selecting(was) | names(was.release)
                return
            self._stagesets[ref] = seen(obj)

    def rollout(self, event: Event, key: ObjectKey, obj: KubeObject) -> None:
        with self._lock:
            if event is Event.DELETED:
                self._rollouts.pop(key.name, None)
                return
            try:
                self._rollouts[key.name] = FleetRollout.model_validate({**obj, "status": None})
            except ValidationError:
                # Refused (InvalidSpec in its status): it selects nothing, holds nothing.
                self._rollouts.pop(key.name, None)

    # -- read by the reconciler and the watch mappings -----------------------------------------

    def _candidate(self, view: Seen) -> Candidate:
        return Candidate(namespace=view.namespace, name=view.name, labels=view.labels,
                         namespace_labels=self._namespace_labels(view.namespace))

    def _selecting(self, view: Seen) -> set[str]:
        return set(selecting(self._rollouts.values(), self._candidate(view)))

    def rollouts_for(self, ref: Key) -> list[str]:
        """The rollouts to requeue on an event of StageSet ``ref``: those selecting it and those its
        annotation names (one that let go of it takes its annotation back)."""
        with self._lock:
            view = self._stagesets.get(ref)
            if view is None:
                return sorted(self._gone.pop(ref, set()))
            return sorted(self._selecting(view) | (names(view.release) & set(self._rollouts)))

    def selected_by(self, namespace: str, name: str) -> list[str]:
        """The rollouts that select StageSet ``namespace/name`` as the watch last showed it: a member's
        pass holds its new revisions when one does and no release is written on it yet (fail closed)."""
        with self._lock:
            view = self._stagesets.get((namespace, name))
            return [] if view is None else sorted(self._selecting(view))

    def members(self, rollout: FleetRollout) -> list[tuple[Seen, list[str]]]:
        """Every StageSet ``rollout`` selects, with the other rollouts selecting it too."""
        name = str(rollout.metadata.get("name", ""))
        with self._lock:
            found = []
            for view in self._stagesets.values():
                candidate = self._candidate(view)
                if selects(rollout, labels=candidate.labels, namespace_labels=candidate.namespace_labels):
                    others = [r for r in selecting(self._rollouts.values(), candidate) if r != name]
                    found.append((view, others))
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
                if candidate.namespace_labels is None and any(
                        r.spec.namespace_selector is not None for r in self._rollouts.values()):
                    continue
                if not selecting(self._rollouts.values(), candidate):
                    found.append(view)
            return found

    def get(self, ref: Key) -> Seen | None:
        with self._lock:
            return self._stagesets.get(ref)
