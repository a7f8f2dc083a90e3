"""Recording fakes of the project's own client layer (``KubeClient``, ``ClientPool``) and Git mirror.

A :class:`FakeCluster` is a small in-memory apiserver: objects by path, discovery, an
allow-list authorizer, server-side apply (returning the stored object unchanged when the
manifest changes nothing, as a real apiserver does), merge and JSON patches, finalizers
and deletion, watch streams.  Every request is recorded with the identity that made it,
so tests assert exactly which requests a scenario makes: identity, verb, path.

This fakes *our* client (``KubeClient.request``/``stream``), never the ``kubernetes``
package: everything above the transport — the apply engine, the reconcilers, the
manager — runs for real.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from sources import RefNotFoundError, RefSelector, Snapshot
from sources.credentials import Credentials
from stageset.controller.sharding import LabelSelector
from stageset.kube.client import LOCAL, ApiError, ClientPool, ClusterKey, Identity, KubeClient, QueryValue
from stageset.kube.types import KubeObject
from tests.recording import merge

CONTROLLER = "controller"  # how requests made as the controller's own identity are recorded
SELF_SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"

# Discovery served by every fake cluster: (apiVersion, kind, plural, namespaced).
KINDS = [
    ("v1", "ConfigMap", "configmaps", True),
    ("v1", "Secret", "secrets", True),
    ("v1", "Namespace", "namespaces", False),
    ("v1", "Event", "events", True),
    ("events.k8s.io/v1", "Event", "events", True),
    ("v1", "ServiceAccount", "serviceaccounts", True),
    ("apps/v1", "Deployment", "deployments", True),
    ("batch/v1", "Job", "jobs", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    ("stages.metio.wtf/v1", "StageSet", "stagesets", True),
    ("stages.metio.wtf/v1", "GitRepository", "gitrepositories", True),
    ("source.toolkit.fluxcd.io/v1", "ExternalArtifact", "externalartifacts", True),
    ("source.toolkit.fluxcd.io/v1", "GitRepository", "gitrepositories", True),
    ("source.toolkit.fluxcd.io/v1", "OCIRepository", "ocirepositories", True),
    ("source.toolkit.fluxcd.io/v1", "Bucket", "buckets", True),
    ("coordination.k8s.io/v1", "Lease", "leases", True),
    # What spec.dependsOn may wait for (tests/inprocess/test_object_dependencies.py).
    ("db.example/v1", "Database", "databases", True),
    ("helm.toolkit.fluxcd.io/v2", "HelmRelease", "helmreleases", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False),
]
ALL_VERBS = "get,list,watch,create,apply,patch,delete"
_VOLATILE = ("resourceVersion", "managedFields", "generation", "uid", "creationTimestamp")


@dataclass(frozen=True)
class Request:
    user: str
    verb: str  # get, list, watch, create, apply, patch, delete
    path: str
    dry_run: bool = False

    @property
    def write(self) -> bool:
        return self.verb in ("create", "apply", "patch", "delete") and not self.dry_run


@dataclass(frozen=True)
class Parsed:
    api_version: str
    namespace: str | None
    plural: str
    name: str | None
    subresource: str | None

    @property
    def object_path(self) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        where = f"/namespaces/{self.namespace}" if self.namespace and self.plural != "namespaces" else ""
        return f"{base}{where}/{self.plural}/{self.name}"


def parse_path(path: str) -> Parsed | None:
    """An object or collection path; ``None`` for a discovery document."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        api_version, rest = parts[1], parts[2:]
    else:
        api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    if not rest:
        return None
    namespace = rest[1] if rest[0] == "namespaces" and len(rest) >= 3 else None
    rest = rest[2:] if namespace is not None else rest
    return Parsed(api_version, namespace, rest[0], *(rest[i] if len(rest) > i else None for i in (1, 2)))


def _not_found(parsed: Parsed) -> ApiError:
    return ApiError(status=404, reason="NotFound", message=f'{parsed.plural} "{parsed.name}" not found')


def _content(obj: KubeObject) -> KubeObject:
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _VOLATILE}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": metadata}


@dataclass
class FakeCluster:
    name: str = "local"
    objects: dict[str, KubeObject] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    # Allow rules: (user, path prefix, verbs); the controller may do anything unless restricted.
    grants: list[tuple[str, str, frozenset[str]]] = field(default_factory=list)
    controller_prefixes: tuple[str, ...] | None = None
    # Injected failures: (verb, path, dry_run or None for both) -> error.
    failures: dict[tuple[str, str, bool | None], ApiError] = field(default_factory=dict)
    events: list[tuple[int, str, KubeObject]] = field(default_factory=list)
    # Set to make every request fail as a cluster that does not answer would.
    down: Exception | None = None
    # Seconds a watch event waits before it is delivered (a loaded apiserver's watch lags).
    watch_lag: float = 0.0
    # API versions discovery does not list (a CRD not installed yet).
    unserved: set[str] = field(default_factory=set)
    # Answer SelfSubjectAccessReviews from the grants (off: a review is not answered, as before).
    reviews: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._versions = itertools.count(2)  # as etcd: its first write is revision 2
        self._recorded: dict[int, float] = {}  # event version -> when it happened

    # -- set-up -------------------------------------------------------------------------

    def grant(self, user: str, prefix: str, verbs: str = ALL_VERBS) -> None:
        """Let ``user`` use ``verbs`` on every path under ``prefix``."""
        self.grants.append((user, prefix, frozenset(verbs.split(","))))

    def grant_namespace(self, user: str, namespace: str, verbs: str = ALL_VERBS) -> None:
        """Roughly ``edit`` in one namespace: every verb on every namespaced kind there."""
        self.grants.append((user, f"namespace:{namespace}", frozenset(verbs.split(","))))

    def put(self, obj: KubeObject) -> KubeObject:
        """Store ``obj`` as an admin would create it (no request recorded)."""
        with self._lock:
            return self._store(self._path_of(obj), copy.deepcopy(obj), event="ADDED")

    def edit(self, path: str, change: Callable[[KubeObject], None]) -> KubeObject:
        """Change a stored object as a hand edit would (a new resourceVersion, a watch event)."""
        with self._lock:
            obj = copy.deepcopy(self.objects[path])
            change(obj)
            return self._store(path, obj, event="MODIFIED")

    def get(self, path: str) -> KubeObject | None:
        with self._lock:
            found = self.objects.get(path)
            return copy.deepcopy(found) if found is not None else None

    def set_status(self, path: str, status: KubeObject) -> None:
        with self._lock:
            obj = self.objects[path]
            obj["status"] = merge(obj.get("status") or {}, status)
            self._store(path, obj, event="MODIFIED")

    def remove(self, path: str) -> None:
        with self._lock:
            obj = self.objects.pop(path)
            self._record_event("DELETED", obj)

    # -- what tests read ---------------------------------------------------------------

    def by(self, user: str, *, writes_only: bool = False) -> list[Request]:
        return [r for r in self.requests if r.user == user and (r.write or not writes_only)]

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.write]

    def clear(self) -> None:
        self.requests.clear()

    # -- the apiserver -----------------------------------------------------------------

    def _allowed(self, user: str, verb: str, path: str) -> bool:
        parsed = parse_path(path)
        if parsed is None:
            return True  # discovery: every authenticated user
        if user == CONTROLLER:
            return (
                self.controller_prefixes is None
                or path.startswith(self.controller_prefixes)
                or (parsed.plural == "events" and verb in ("create", "patch"))
            )
        for who, scope, verbs in self.grants:
            if who != user or verb not in verbs:
                continue
            if scope.startswith("namespace:"):
                if parsed.namespace == scope.removeprefix("namespace:") and parsed.plural != "namespaces":
                    return True
            elif path.startswith(scope):
                return True
        return False

    def handle(self, *, user: str, method: str, path: str, query: Mapping[str, QueryValue] | None, body: Any,
               content_type: str) -> KubeObject:
        if self.reviews and method == "POST" and path == SELF_SUBJECT_ACCESS_REVIEWS:
            return self._review(user, body)
        query = query or {}
        dry_run = query.get("dryRun") == "All"
        parsed = parse_path(path)
        verb = self._verb(method, content_type, parsed)
        with self._lock:
            self.requests.append(Request(user=user, verb=verb, path=path, dry_run=dry_run))
            if self.down is not None:
                raise self.down
            for key in ((verb, path, dry_run), (verb, path, None)):
                if key in self.failures:
                    raise self.failures[key]
            if not self._allowed(user, verb, path):
                raise ApiError(status=403, reason="Forbidden",
                               message=f'{path} is forbidden: User "{user}" cannot {verb} it')
            if parsed is None:
                return self._discovery(path)
            if verb == "list":
                return self._list(parsed, str(query.get("labelSelector") or ""))
            if verb == "get":
                return self._read(parsed)
            if verb == "apply":
                return self._apply(parsed, body, dry_run=dry_run)
            if verb == "patch":
                return self._patch(parsed, body, content_type)
            if verb == "delete":
                return self._delete(parsed, dry_run=dry_run)
            return self._create(parsed, body)

    def _review(self, user: str, body: Any) -> KubeObject:
        """A SelfSubjectAccessReview, answered from the grants as the apiserver's authorizer would
        (recorded as a ``create`` of the review, which stores nothing)."""
        attributes = (body.get("spec") or {}).get("resourceAttributes") or {}
        group, plural = attributes.get("group") or "", attributes.get("resource") or ""
        version = next((v for v, _, p, _ in KINDS if p == plural and v.rpartition("/")[0] == group), "v1")
        root = "/api" if not group else "/apis"
        namespace = f"/namespaces/{attributes['namespace']}" if attributes.get("namespace") else ""
        name = f"/{attributes['name']}" if attributes.get("name") else ""
        target = f"{root}/{version}{namespace}/{plural}{name}"
        verb = str(attributes.get("verb") or "")
        with self._lock:
            self.requests.append(Request(user=user, verb="create", path=SELF_SUBJECT_ACCESS_REVIEWS))
            allowed = self._allowed(user, verb, target)
        return {**body, "status": {"allowed": allowed}}

    @staticmethod
    def _verb(method: str, content_type: str, parsed: Parsed | None) -> str:
        if method == "GET":
            return "get" if parsed is None or parsed.name else "list"
        if method == "PATCH":
            return "apply" if content_type == "application/apply-patch+yaml" else "patch"
        return {"POST": "create", "DELETE": "delete", "PUT": "update"}[method]

    def _discovery(self, path: str) -> KubeObject:
        api_version = path.removeprefix("/api/").removeprefix("/apis/")
        if api_version in self.unserved:
            raise ApiError(status=404, reason="NotFound", message=f"{path} not found")
        resources = [
            {"name": plural, "kind": kind, "namespaced": namespaced,
             "verbs": ["get", "list", "watch", "create", "patch", "delete"]}
            for version, kind, plural, namespaced in KINDS
            if version == api_version
        ]
        if not resources:
            raise ApiError(status=404, reason="NotFound", message=f"{path} not found")
        return {"kind": "APIResourceList", "groupVersion": api_version, "resources": resources}

    def _list(self, parsed: Parsed, selector: str = "") -> KubeObject:
        wanted = LabelSelector.parse(selector) if selector else None  # as the apiserver selects
        def listed(path: str, meta: KubeObject) -> bool:
            return (parse_path(path) or parsed).plural == parsed.plural \
                and (parse_path(path) or parsed).api_version == parsed.api_version \
                and parsed.namespace in (None, meta.get("namespace")) \
                and (wanted is None or wanted.matches(meta.get("labels")))

        items = [copy.deepcopy(o) for p, o in sorted(self.objects.items())
                 if listed(p, o.get("metadata") or {})]
        return {"items": items, "metadata": {"resourceVersion": str(self._current())}}

    def _read(self, parsed: Parsed) -> KubeObject:
        found = self.objects.get(parsed.object_path)
        if found is None:
            raise _not_found(parsed)
        return copy.deepcopy(found)

    def _apply(self, parsed: Parsed, body: Any, *, dry_run: bool) -> KubeObject:
        manifest = json.loads(body) if isinstance(body, bytes) else copy.deepcopy(body)
        existing = self.objects.get(parsed.object_path)
        wanted = (manifest.get("metadata") or {}).get("resourceVersion")
        if existing is not None and wanted and wanted != existing["metadata"].get("resourceVersion"):
            # A resourceVersion in an apply is a precondition, as on a real apiserver.
            raise ApiError(status=409, reason="Conflict", message="the object has been modified")
        if existing is not None and _content(existing) == _content(manifest):
            return copy.deepcopy(existing)
        result = copy.deepcopy(manifest)
        metadata = result.setdefault("metadata", {})
        if parsed.namespace:
            metadata["namespace"] = parsed.namespace
        if existing is not None:
            for key in ("uid", "creationTimestamp", "generation", "finalizers", "deletionTimestamp"):
                if key in existing["metadata"]:
                    metadata.setdefault(key, existing["metadata"][key])
            metadata["generation"] = int(existing["metadata"].get("generation", 1)) + 1
            if "status" in existing:
                result["status"] = existing["status"]
            metadata["resourceVersion"] = existing["metadata"]["resourceVersion"]
        else:
            metadata.update(uid=str(uuid.uuid4()), generation=1)
        if dry_run:
            if existing is None:
                metadata.pop("resourceVersion", None)
            return result
        return self._store(parsed.object_path, result, event="MODIFIED" if existing else "ADDED")

    def _patch(self, parsed: Parsed, body: Any, content_type: str) -> KubeObject:
        obj = self.objects.get(parsed.object_path)
        if obj is None:
            raise _not_found(parsed)
        obj = copy.deepcopy(obj)
        if content_type == "application/json-patch+json":
            for op in body:
                if op["op"] == "test":
                    if obj["metadata"].get("resourceVersion") != op["value"]:
                        raise ApiError(status=422, reason="Invalid", message="the test operation failed")
                else:
                    obj["metadata"]["finalizers"] = op["value"]
            if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
                self.objects.pop(parsed.object_path)
                self._record_event("DELETED", obj)
                return obj
        elif parsed.subresource == "status":
            obj["status"] = merge(obj.get("status") or {}, body.get("status") or {})
        else:
            obj = merge(obj, body)
        return self._store(parsed.object_path, obj, event="MODIFIED")

    def _delete(self, parsed: Parsed, *, dry_run: bool) -> KubeObject:
        obj = self.objects.get(parsed.object_path)
        if obj is None:
            raise _not_found(parsed)
        if dry_run:
            return copy.deepcopy(obj)
        if obj["metadata"].get("finalizers"):
            obj["metadata"].setdefault("deletionTimestamp", "2000-01-01T00:00:00Z")
            return self._store(parsed.object_path, obj, event="MODIFIED")
        self.objects.pop(parsed.object_path)
        self._record_event("DELETED", obj)
        return {"kind": "Status", "status": "Success"}

    def _create(self, parsed: Parsed, body: Any) -> KubeObject:
        obj = copy.deepcopy(body)
        name = obj["metadata"]["name"]
        path = Parsed(parsed.api_version, parsed.namespace, parsed.plural, name, None).object_path
        if path in self.objects:
            raise ApiError(status=409, reason="AlreadyExists", message=f'"{name}" already exists')
        obj["metadata"].setdefault("namespace", parsed.namespace)
        return self._store(path, obj, event="ADDED")

    # -- storage and watches ------------------------------------------------------------

    def _path_of(self, obj: KubeObject) -> str:
        version, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = next((p, n) for v, k, p, n in KINDS if v == version and k == kind)
        metadata = obj["metadata"]
        return Parsed(version, metadata.get("namespace") if namespaced else None, plural, metadata["name"],
                      None).object_path

    def _current(self) -> int:
        return self.events[-1][0] if self.events else 0

    def _store(self, path: str, obj: KubeObject, *, event: str) -> KubeObject:
        metadata = obj.setdefault("metadata", {})
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("generation", 1)
        metadata["resourceVersion"] = str(next(self._versions))
        self.objects[path] = obj
        self._record_event(event, obj)
        return copy.deepcopy(obj)

    def _record_event(self, kind: str, obj: KubeObject) -> None:
        version = int(obj["metadata"].get("resourceVersion") or next(self._versions))
        if kind == "DELETED":
            version = next(self._versions)
        self.events.append((version, kind, copy.deepcopy(obj)))
        self._recorded[version] = time.monotonic()
        self._lock.notify_all()

    def watch(self, path: str, *, since: int, idle: float, stop: Callable[[], bool],
              selector: LabelSelector | None = None) -> Iterator[KubeObject]:
        """Events of the collection at ``path`` newer than ``since``; ends after ``idle`` quiet seconds.
        With a label ``selector``, as the apiserver's watch: an object that starts matching is
        ``ADDED``, one that stops matching ``DELETED``."""
        parsed = parse_path(path)
        assert parsed is not None
        seen = since
        deadline = time.monotonic() + idle
        while not stop() and time.monotonic() < deadline:
            with self._lock:
                fresh = [(v, k, o) for v, k, o in self.events if v > seen]
                if fresh and self.watch_lag:
                    due = time.monotonic() - self.watch_lag
                    fresh = [e for e in fresh if self._recorded.get(e[0], 0.0) <= due]
                    fresh = fresh[:1] if fresh else []  # in order: one at a time, each when due
                if not fresh:
                    self._lock.wait(timeout=0.05)
                    continue
            for version, kind, obj in fresh:
                seen = max(seen, version)
                target = self._path_of(obj)
                found = parse_path(target)
                if found is None or found.plural != parsed.plural or \
                        (parsed.namespace and found.namespace != parsed.namespace):
                    continue
                if selector is not None:
                    kind = self._selected(kind, version, target, obj, selector)
                    if kind is None:
                        continue
                deadline = time.monotonic() + idle
                yield {"type": kind, "object": copy.deepcopy(obj)}

    def _selected(self, kind: str, version: int, target: str, obj: KubeObject, selector: LabelSelector
                  ) -> str | None:
        """The event a label-selected watch sends for this one (``None``: none)."""
        with self._lock:
            before = next((o for v, k, o in reversed(self.events)
                           if v < version and k != "DELETED" and self._path_of(o) == target), None)
        was = before is not None and kind != "ADDED" and selector.matches(before["metadata"].get("labels"))
        now = kind != "DELETED" and selector.matches(obj["metadata"].get("labels"))
        if kind == "DELETED":
            return "DELETED" if was or selector.matches(obj["metadata"].get("labels")) else None
        if was and now:
            return "MODIFIED"
        return "ADDED" if now else "DELETED" if was else None


class FakeKubeClient(KubeClient):
    """A :class:`KubeClient` whose requests go to a :class:`FakeCluster` (nothing else differs)."""

    def __init__(self, *, cluster: FakeCluster, identity: Identity):
        self.identity = identity
        self._cluster = cluster

    @property
    def user(self) -> str:
        return self.identity.user or CONTROLLER

    def _request(self, method: str, path: str, *, query: Mapping[str, QueryValue] | None, body: Any,
                 content_type: str, timeout: float | None, status: list[int] | None,
                 accept: str | None) -> KubeObject:
        # What is sent: KubeClient.request (the write fence, stageset/kube/fence.py) comes first.
        del timeout, accept  # the fake answers at once, always with whole objects
        existed = status is not None and self._cluster.get(path) is not None
        answer = self._cluster.handle(user=self.user, method=method, path=path, query=query, body=body,
                                      content_type=content_type)
        if status is not None:
            status.append(200 if existed or method != "PATCH" else 201)
        return answer

    @property
    def cluster(self) -> ClusterKey:
        return ClusterKey(self._cluster.name)

    def stream(self, path: str, *, query: Mapping[str, QueryValue], timeout: float,
               accept: str | None = None, opened: Callable[[Callable[[], None] | None], None] | None = None,
               chunk: int = 0) -> Iterator[KubeObject]:
        del timeout, accept, chunk
        watch = Request(user=self.user, verb="watch", path=f"{path}?{urlencode(dict(query))}")
        self._cluster.requests.append(watch)
        since = int(str(query.get("resourceVersion") or 0))
        selector = str(query.get("labelSelector") or "")
        aborted = threading.Event()  # a held watch closed: its stream ends at once, as a real one does
        if opened is not None:
            opened(aborted.set)
        yield from self._cluster.watch(path, since=since, idle=0.5, stop=aborted.is_set,
                                       selector=LabelSelector.parse(selector) if selector else None)

    def close(self) -> None:
        return None


class FakeClientPool(ClientPool):
    """One :class:`FakeKubeClient` per (cluster, identity), as the real pool caches clients."""

    def __init__(self, local: FakeCluster, **remotes: FakeCluster):
        self.clusters: dict[str, FakeCluster] = {"local": local, **remotes}
        self._clients: dict[tuple[ClusterKey, Identity], KubeClient] = {}
        self._lock = threading.Lock()
        self.forgotten: list[ClusterKey] = []
        self._observer = None

    def register(self, cluster: ClusterKey, configuration: Any) -> None:
        # A remote named by its server URL's host (tests create FakeClusters named after them).
        with self._lock:
            host = str(configuration.host).removeprefix("https://").split(":")[0]
            self.clusters.setdefault(cluster.name, self.clusters.get(host) or FakeCluster(name=host))

    def forget(self, cluster: ClusterKey) -> None:
        with self._lock:
            self.forgotten.append(cluster)
            self.clusters.pop(cluster.name, None)
            self._clients = {k: c for k, c in self._clients.items() if k[0] != cluster}

    def client(self, identity: Identity = Identity(), cluster: ClusterKey = LOCAL) -> KubeClient:  # noqa: B008
        with self._lock:
            key = (cluster, identity)
            found = self._clients.get(key)
            if found is None:
                found = FakeKubeClient(cluster=self.clusters[cluster.name], identity=identity)
                self._clients[key] = found
            return found

    def close(self) -> None:
        return None


@dataclass
class FakeSources:
    """The Git mirror as the reconcilers use it: repositories of ``{path: text}`` per commit."""

    repos: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # url -> commit -> files
    heads: dict[str, str] = field(default_factory=dict)  # url -> commit of "main"
    fetches: list[tuple[str, Credentials | None]] = field(default_factory=list)
    served: set[tuple[str, str, str]] = field(default_factory=set)  # (url, commit, consumer)

    def commit(self, url: str, files: dict[str, str]) -> str:
        sha = hashlib.sha1(json.dumps([url, files], sort_keys=True).encode()).hexdigest()  # noqa: S324
        self.repos.setdefault(url, {})[sha] = dict(files)
        self.heads[url] = sha
        return sha

    def revision(self, url: str) -> str:
        return f"main@sha1:{self.heads[url]}"

    def fetch(self, url: str, *, ref: RefSelector | None = None, credentials: Credentials | None = None,
              timeout: float = 60.0, consumer: str | None = None) -> Snapshot:
        del ref, timeout  # always "main", at once
        self.fetches.append((url, credentials))
        if url not in self.heads:
            raise RefNotFoundError(f"{url}: no branch main")
        if consumer is not None:
            self.served.add((url, self.heads[url], consumer))
        return Snapshot(url=url, ref_name="main", commit=self.heads[url], fetched=False)

    def _files(self, url: str, commit: str, path: str) -> dict[str, str]:
        try:
            files = self.repos[url][commit]
        except KeyError as error:
            raise RefNotFoundError(f"commit {commit} is not in the mirror of {url}") from error
        prefix = path.removeprefix("./").strip("/")
        prefix = f"{prefix}/" if prefix else ""
        return {p.removeprefix(prefix): text for p, text in files.items() if p.startswith(prefix)}

    def is_served(self, url: str, *, commit: str, consumer: str) -> bool:
        return (url, commit, consumer) in self.served

    def tree_hash(self, url: str, *, commit: str, path: str = "./") -> str:
        files = self._files(url, commit, path)
        return hashlib.sha1(json.dumps(files, sort_keys=True).encode()).hexdigest()  # noqa: S324

    def read_tree(self, url: str, *, commit: str, path: str = "./", ignore: str | None = None,
                  consumer: str | None = None, unreadable: dict[str, str] | None = None) -> dict[str, bytes]:
        del ignore, unreadable
        if consumer is not None and not self.is_served(url, commit=commit, consumer=consumer):
            raise RefNotFoundError(f"commit {commit} of {url} was not served to {consumer}")
        return {p: text.encode() for p, text in self._files(url, commit, path).items()}
