"""A small recording fake of our own :class:`KubeClient` for seam tests: objects by path, the writes a
writer or a prune makes (merge patches, finalizer JSON patches, deletes), each answered with a new
resourceVersion.  No discovery, watches or authorization: those are the in-process fake's
(``tests/inprocess/fakes.py``), for tests that run the whole reconciler."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stageset.kube.client import ApiError, Identity, KubeClient, QueryValue
from stageset.kube.types import KubeObject


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


@dataclass
class RecordingClient(KubeClient):
    objects: dict[str, KubeObject] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    failures: dict[tuple[str, str], ApiError] = field(default_factory=dict)
    identity: Identity = field(default_factory=Identity)

    def __post_init__(self) -> None:
        self._versions = itertools.count(100)

    def put(self, path: str, obj: KubeObject) -> KubeObject:
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def request(self, method: str, path: str, *, query: Mapping[str, QueryValue] | None = None,
                body: Any = None, content_type: str = "application/json", timeout: float | None = None
                ) -> KubeObject:
        del query, timeout
        self.requests.append((method, path, copy.deepcopy(body)))
        if (method, path) in self.failures:
            raise self.failures[(method, path)]
        target = path.removesuffix("/status")
        if target not in self.objects:
            raise ApiError(status=404, reason="NotFound", message=f"{path} not found")
        obj = copy.deepcopy(self.objects[target])
        if method == "GET":
            return obj
        if method == "DELETE":
            del self.objects[target]
            return {"kind": "Status", "status": "Success"}
        if content_type == "application/json-patch+json":
            for op in body:
                if op["op"] == "test" and obj["metadata"].get("resourceVersion") != op["value"]:
                    raise ApiError(status=422, reason="Invalid", message="the test operation failed")
                if op["op"] != "test":
                    obj["metadata"]["finalizers"] = op["value"]
        elif path.endswith("/status"):
            obj["status"] = merge(obj.get("status") or {}, body["status"])
        else:
            obj = merge(obj, body)
        return self.put(target, obj)

    def writes(self) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] != "GET"]
