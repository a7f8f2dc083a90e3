"""REST mapping: (apiVersion, kind) -> URL path, from the apiserver's discovery documents.

Discovery is read per group-version on first use and cached; a miss re-reads that
group-version once, because a CRD applied earlier in the same stage adds kinds.
Discovery is read with the controller's own identity: it reveals only which kinds
exist, which every authenticated user may see (``system:discovery``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from urllib.parse import quote

from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject


class UnknownKindError(LookupError):
    """The cluster serves no such kind (CRD missing or not yet established)."""


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{quote(namespace)}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(self, *, name: str, namespace: str | None = None) -> str:
        return f"{self.collection_path(namespace)}/{quote(name)}"


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


class RestMapper:
    """Caches discovery per group-version; thread-safe."""

    def __init__(self, client: KubeClient):
        self._client = client
        self._lock = threading.Lock()
        self._by_group_version: dict[str, dict[str, Resource]] = {}
        # One discovery of a group-version at a time: passes that miss it together (many StageSets
        # on a target just connected) wait for the first one's answer instead of each asking.
        self._discovering: dict[str, threading.Lock] = {}

    def _discover(self, api_version: str) -> dict[str, Resource]:
        group, version = split_api_version(api_version)
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            document = self._client.get(path)
        except ApiError as error:
            if error.not_found:
                return {}
            raise
        kinds: dict[str, Resource] = {}
        for entry in document.get("resources", []):
            if "/" in entry["name"]:  # subresources such as deployments/status
                continue
            kinds[entry["kind"]] = Resource(group=group, version=version, kind=entry["kind"],
                                            plural=entry["name"], namespaced=bool(entry["namespaced"]))
        return kinds

    def resolve(self, api_version: str, kind: str) -> Resource:
        with self._lock:
            known = self._by_group_version.get(api_version)
            single = self._discovering.setdefault(api_version, threading.Lock())
        if known is not None and kind in known:
            return known[kind]
        with single:
            with self._lock:
                now_known = self._by_group_version.get(api_version)
            if now_known is not known and now_known is not None and kind in now_known:
                return now_known[kind]  # another pass discovered it while this one waited
            fresh = self._discover(api_version)
            with self._lock:
                self._by_group_version[api_version] = fresh
        if kind not in fresh:
            raise UnknownKindError(f"the cluster serves no kind {kind} in {api_version}")
        return fresh[kind]

    def for_object(self, obj: KubeObject) -> Resource:
        return self.resolve(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))

    def object_path(self, obj: KubeObject, *, default_namespace: str | None = None) -> str:
        resource = self.for_object(obj)
        metadata = obj.get("metadata", {})
        namespace = metadata.get("namespace") or default_namespace
        return resource.object_path(name=metadata["name"],
                                    namespace=namespace if resource.namespaced else None)
