"""``-w``/``--watch`` of the CLI: what a list holds, then every change after it, by watch.

A :class:`~stageset.kube.watch.Reflector` per scope (namespace and selectors, narrowed on the
server) runs on its own thread and hands what it sees to the command's thread; :func:`follow`
yields the first list's objects as one batch, then each change.  The reflector's periodic relist
re-sends objects that did not change: those are dropped here (same ``resourceVersion``), so a
line is printed only for a real change.  The caller ends it (Ctrl-C: the command returns, exit
code 0, as ``kubectl get -w`` does).

Identity: whatever ``client`` is -- the user's (``--as`` included); only ``list`` and ``watch``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

EVENTS = Resource(group="", version="v1", kind="Event", plural="events", namespaced=True)
POLL = 0.5  # how often the command's thread looks up from the queue (so Ctrl-C is seen at once)


@dataclass(frozen=True)
class Scope:
    """One list/watch: a namespace (``None``: every namespace) and server-side selectors."""

    namespace: str | None
    label_selector: str | None = None
    field_selector: str | None = None


@dataclass(frozen=True)
class Change:
    type: str
    """``ADDED`` (first seen), ``MODIFIED`` or ``DELETED``."""
    obj: KubeObject


def _key(obj: KubeObject) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))


class _Versions:
    """The ``resourceVersion`` last handed on of each object: a relist that re-sends an unchanged
    object is no change."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str], str] = {}

    def change(self, kind: str, obj: KubeObject) -> Change | None:
        key = _key(obj)
        if kind == "DELETED":
            return Change("DELETED", obj) if self._seen.pop(key, None) is not None else None
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        before = self._seen.get(key)
        if before == version:
            return None
        self._seen[key] = version
        return Change("ADDED" if before is None else "MODIFIED", obj)


def _probe(client: KubeClient, resource: Resource, scopes: Sequence[Scope]) -> None:
    """A list refused (403, an unknown kind) is the command's error, not a reflector's retry loop."""
    for scope in scopes:
        selectors = {k: v for k, v in (("labelSelector", scope.label_selector),
                                       ("fieldSelector", scope.field_selector)) if v}
        client.request("GET", resource.collection_path(scope.namespace), query={"limit": 1, **selectors})


def follow(client: KubeClient, resource: Resource, scopes: Sequence[Scope], *,
           stop: threading.Event | None = None) -> Iterator[list[Change]]:
    """The first list of every scope (one batch), then each change (a batch of one), until
    ``stop`` is set or the caller stops iterating."""
    stop = stop or threading.Event()
    handed: queue.Queue[tuple[str, KubeObject]] = queue.Queue()
    reflectors = [Reflector(client=client, resource=resource, namespace=scope.namespace,
                            handler=lambda kind, obj: handed.put((kind, obj)), stop=stop,
                            label_selector=scope.label_selector, field_selector=scope.field_selector)
                  for scope in scopes]
    versions = _Versions()
    _probe(client, resource, scopes)
    try:
        for reflector in reflectors:
            reflector.start()
        for reflector in reflectors:
            while not reflector.synced.wait(POLL):
                if stop.is_set():
                    return
        first: list[Change] = []
        while not handed.empty():
            if (change := versions.change(*handed.get_nowait())) is not None:
                first.append(change)
        yield first
        while not stop.is_set():
            try:
                kind, obj = handed.get(timeout=POLL)
            except queue.Empty:
                continue
            if (change := versions.change(kind, obj)) is not None:
                yield [change]
    finally:
        stop.set()
