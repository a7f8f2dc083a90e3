"""The watches one readiness wait uses (:mod:`stageset.apply.wait`), from a shared pool of them.

Identity: watches are opened through the ``source`` (:class:`stageset.kube.watches.WatchPool`) as
the ``client``'s identity — the stage's — so a wait sees only what that identity may watch.

Invariants:
- An object the stage writes is watched by its owner labels (one watch per kind and namespace of a
  stage); one it only checks or keeps as it found it, by its name.
- What a watch holds is used only when it is synced and not older than what our own write
  returned; otherwise the wait reads the object instead.
- Every listener a wait adds is removed when it ends (:meth:`Watching.close`); the owner's wake-up
  stays until nothing is left to wait for (:meth:`Watching.done`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from stageset.apply.changeset import Action
from stageset.apply.core import AppliedObject
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watches import Watched


class WatchSource(Protocol):
    """Selected watches as an identity (:class:`stageset.kube.watches.WatchPool`)."""

    def watch(self, client: KubeClient, resource: Resource, namespace: str | None, *,
              label_selector: str = "", field_selector: str = "", existing_only: bool = False
              ) -> Watched | None: ...


def _older(found: KubeObject, known: KubeObject | None) -> bool:
    """Is ``found`` (from a watch) older than ``known`` (what our own write returned)?  etcd's
    resourceVersions are numbers; anything else counts as older (read it instead)."""
    if known is None:
        return False
    mine = str((known.get("metadata") or {}).get("resourceVersion") or "")
    theirs = str((found.get("metadata") or {}).get("resourceVersion") or "")
    if not mine:
        return False
    return not (mine.isdigit() and theirs.isdigit()) or int(theirs) < int(mine)


class Watching:
    """The watches one readiness wait uses: opened for what is still awaited after its first round."""

    def __init__(self, source: WatchSource | None, client: KubeClient, *, changed: threading.Event,
                 wake: tuple[Hashable, Callable[[], None]] | None):
        self._source = source
        self._client = client
        self._changed = changed
        self._wake = wake
        self._opened: dict[tuple[str, str, str], Watched | None] = {}

    def _selection(self, item: AppliedObject) -> tuple[str | None, str, str]:
        """(namespace, label selector, field selector): an object the stage writes carries its owner
        labels; one it only checks (or keeps as it found it) is selected by name."""
        meta = item.manifest["metadata"]
        namespace = meta.get("namespace") if item.resource.namespaced else None
        labels = meta.get("labels") or {}
        owner = {k: labels.get(k) for k in (LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE)}
        if item.action is not Action.SKIPPED and all(owner.values()):
            return namespace, ",".join(f"{k}={v}" for k, v in sorted(owner.items())), ""
        return namespace, "", f"metadata.name={meta['name']}"

    def _watched(self, item: AppliedObject, *, open_watch: bool = True) -> Watched | None:
        if self._source is None:
            return None
        namespace, labels, fields = self._selection(item)
        key = (item.resource.collection_path(namespace), labels, fields)
        if key not in self._opened:
            found = self._source.watch(self._client, item.resource, namespace, label_selector=labels,
                                       field_selector=fields, existing_only=not open_watch)
            if found is None and not open_watch:
                return None  # asked again (and opened) in a later round
            if found is not None:
                found.listen(id(self._changed), self._changed.set)
                if self._wake is not None:
                    found.listen(*self._wake)
            self._opened[key] = found
        return self._opened[key]

    def read(self, item: AppliedObject, *, open_watch: bool = True) -> KubeObject | None:
        """The object as its watch holds it; ``None``: read it instead (no watch, not synced yet, or
        not among what the watch holds).  ``open_watch=False``: only a watch already open serves."""
        watched = self._watched(item, open_watch=open_watch)
        if watched is None or not watched.synced.is_set():
            return None
        found = watched.get(str(item.manifest["metadata"]["name"]))
        if found is None or _older(found, item.live):
            return None  # not (yet) seen there, or the watch has not caught up with our own write
        return {"apiVersion": item.manifest.get("apiVersion"), "kind": item.manifest.get("kind"), **found}

    def cover(self, items: list[AppliedObject]) -> bool:
        """Are all of ``items`` watched (opening what is missing)?"""
        return self._source is not None and all(
            (watched := self._watched(item)) is not None and watched.synced.is_set() for item in items)

    def wait(self, *, stop: threading.Event, until: float) -> None:
        while not self._changed.is_set() and not stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                break
            self._changed.wait(min(0.5, left))  # in slices: a stop is seen within half a second
        self._changed.clear()

    def done(self) -> None:
        """Nothing left to wait for: the owner need not be woken any more."""
        for watched in self._opened.values():
            if watched is not None and self._wake is not None:
                watched.unlisten(self._wake[0])

    def close(self) -> None:
        for watched in self._opened.values():
            if watched is not None:
                watched.unlisten(id(self._changed))
