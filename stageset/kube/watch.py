"""Our own list/watch loop: resourceVersion tracking, bookmarks, 410 Gone -> relist.

The official ``Watch`` helper loses track of resourceVersion across reconnects, so
we own the loop.  A :class:`Reflector` lists once, emits every object as ``ADDED``
(a relist emits ``DELETED`` for objects that vanished meanwhile), then watches from
the list's resourceVersion with bookmarks; on a timeout it re-watches from the last
seen version; on 410 it relists.  ``namespace`` scopes both calls to one namespace,
so sharding by namespace never issues a cluster-wide watch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import urllib3

from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, WatchEvent

log = logging.getLogger(__name__)

Handler = Callable[[str, KubeObject], None]
_WATCH_SECONDS = 290


def object_key(obj: KubeObject) -> tuple[str, str]:
    metadata = obj.get("metadata", {})
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


class Reflector:
    """Keeps ``handler`` informed of every change to one resource (optionally in one namespace)."""

    def __init__(self, *, client: KubeClient, resource: Resource, namespace: str | None,
                 handler: Handler, stop: threading.Event):
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._handler = handler
        self._stop = stop
        # Only the keys: the handler keeps the objects; a relist needs just what vanished.
        self._known: set[tuple[str, str]] = set()
        self.synced = threading.Event()

    def _path(self) -> str:
        return self._resource.collection_path(self._namespace)

    def _list(self) -> str:
        listing = self._client.request("GET", self._path(), query={"limit": 500})
        items = list(listing.get("items", []))
        while listing.get("metadata", {}).get("continue"):
            listing = self._client.request(
                "GET", self._path(), query={"limit": 500, "continue": listing["metadata"]["continue"]}
            )
            items.extend(listing.get("items", []))
        for item in items:
            item.setdefault("apiVersion", self._resource.api_version)
            item.setdefault("kind", self._resource.kind)
        fresh = {object_key(item) for item in items}
        for namespace, name in sorted(self._known - fresh):
            self._handler("DELETED", {"apiVersion": self._resource.api_version, "kind": self._resource.kind,
                                      "metadata": {"namespace": namespace, "name": name}})
        self._known = fresh
        for item in items:
            self._handler("ADDED", item)
        return str(listing.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, resource_version: str) -> str:
        query: dict[str, str | int | bool] = {
            "watch": True, "resourceVersion": resource_version, "allowWatchBookmarks": True,
            "timeoutSeconds": _WATCH_SECONDS}
        for line in self._client.stream(self._path(), query=query, timeout=_WATCH_SECONDS + 30):
            if self._stop.is_set():
                break
            event: WatchEvent = {"type": str(line.get("type", "")), "object": line.get("object") or {}}
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                code = int(obj.get("code", 0))
                raise ApiError(status=code, reason=str(obj.get("reason", "")),
                               message=str(obj.get("message", "")), body=obj)
            resource_version = str(obj.get("metadata", {}).get("resourceVersion", resource_version))
            if kind == "BOOKMARK":
                continue
            key = object_key(obj)
            if kind == "DELETED":
                self._known.discard(key)
            else:
                self._known.add(key)
            self._handler(kind, obj)
        return resource_version

    def run(self) -> None:
        resource_version = ""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list()
                    self.synced.set()
                resource_version = self._watch(resource_version)
                backoff = 0.5
            except ApiError as error:
                if self._stop.is_set():
                    return
                if error.gone:
                    log.info("watch of %s expired (410); relisting", self._resource.plural)
                    resource_version = ""
                    continue
                log.warning("watch of %s failed: %s", self._resource.plural, error)
                resource_version = "" if error.status in (403, 404) else resource_version
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
                if self._stop.is_set():
                    return
                log.warning("watch of %s interrupted: %s", self._resource.plural, error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"watch-{self._resource.plural}", daemon=True)
        thread.start()
        return thread


def wait_synced(reflectors: list[Reflector], *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)
