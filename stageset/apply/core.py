"""The apply engine's shared core: a stage's objects bound to API paths, and the state every verb shares.

The engine is split by verb, as Flux's ``ssa`` package splits its ResourceManager: the warm check
(:mod:`stageset.apply.warm`), the dry-run and ``stageset diff`` preview
(:mod:`stageset.apply.preview`), apply and write (:mod:`stageset.apply.write`), deletion for
recreation (:mod:`stageset.apply.delete`) and the readiness wait (:mod:`stageset.apply.wait`).
Each verb is a function over an :class:`ApplyCore`, which holds only what they all need:
discovery, the settings, and the two bounded maps a warm pass trusts (what our last write left,
:mod:`stageset.apply.versions`; who showed which rights, :mod:`stageset.apply.rights`).
:class:`stageset.apply.engine.StageApplier` is the core with one method per verb.

Identity: the core makes no request of its own except discovery (``mapper``), made with the
controller's identity (or, on a remote cluster, the kubeconfig's).  Every verb makes its requests
through the ``client`` it is handed, which the controller binds to the stage's identity.

Invariants:
- The core holds no per-stage state: one instance is shared by every worker (and, for
  ``versions`` and ``rights``, by every target); a stage's state lives in its
  :class:`AppliedObject` items, which one pass owns.
- Keys into ``versions`` and ``rights`` always name the cluster and the identity: what one
  identity saw or showed is never used for another.
- Work over a stage's objects runs at most ``parallelism`` at once on one process-wide pool
  (:meth:`ApplyCore.each`); every item is stepped, the first error in item order is raised.
- Error messages name only what the user wrote (objects, identities) and what the apiserver said.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stageset.api import InventoryEntry
from stageset.api.vocabulary import Reason
from stageset.apply.changeset import WRITES, Action, Change, ChangeSet
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId, describe, entry, manifest_hash, object_id
from stageset.apply.rights import ShownRights
from stageset.apply.settings import ApplySettings
from stageset.apply.versions import LiveVersions
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource, RestMapper, UnknownKindError
from stageset.kube.types import KubeObject


@dataclass
class AppliedObject:
    resource: Resource
    path: str
    manifest: KubeObject
    id: ObjectId
    digest: str
    live: KubeObject | None = None
    dry_run: KubeObject | None = None
    # Planned by the preview (RECREATED: an immutable change the conflict policy recreates;
    # SKIPPED: one it keeps as it is), final after the write.  A reference (readyChecks) is
    # never written: SKIPPED.
    action: Action = Action.UNCHANGED
    drifted: bool = False
    """Someone else changed (or deleted) it since we applied this very manifest: restored (a write),
    or with ``warn_drift`` left as it is (``SKIPPED``)."""
    differs: tuple[str, ...] = ()
    """Left drifted: the field paths that differ from what a write would make of it."""

    @property
    def wrote(self) -> bool:
        return self.action in WRITES

    def entry(self) -> InventoryEntry:
        return entry(self.id, version=str(self.manifest.get("apiVersion")), digest=self.digest)

    def change(self) -> Change:
        return Change(id=self.id, action=self.action, drift=self.drifted, fields=self.differs,
                      gone=self.drifted and self.live is None)


@dataclass
class StageResult:
    objects: list[AppliedObject] = field(default_factory=list)

    @property
    def changes(self) -> ChangeSet:
        return ChangeSet([o.change() for o in self.objects])

    @property
    def writes(self) -> int:
        return sum(1 for o in self.objects if o.wrote)

    @property
    def drifted(self) -> list[AppliedObject]:
        """Objects someone else changed: restored, or (``warn_drift``) left as they are."""
        return [o for o in self.objects if o.drifted]


def comparable(obj: KubeObject | None) -> Any:
    """The object minus what changes without meaning (managedFields timestamps)."""
    if obj is None:
        return None
    metadata = dict(obj.get("metadata", {}))
    metadata["managedFields"] = [{k: v for k, v in f.items() if k != "time"}
                                 for f in metadata.get("managedFields", [])]
    return {**obj, "metadata": metadata}


def is_immutable_error(error: ApiError) -> bool:
    return error.invalid and ("immutable" in error.message or "may not change" in error.message)


def apply_error(item: AppliedObject, error: ApiError, identity: str) -> StageError:
    """What a refused dry-run, write or delete of ``item`` fails the stage with."""
    what = describe(item.manifest)
    if error.forbidden:
        return StageError(Reason.RBAC_DENIED, f"{identity} may not apply {what}: {error.message}")
    if is_immutable_error(error):
        return StageError(Reason.STAGE_FAILED, f"{what} changed an immutable field ({error.message}); "
                          "set force: true on the stage to recreate it, or a conflictPolicy "
                          "(Recreate or KeepExisting) for it")
    if error.invalid:
        return StageError(Reason.STAGE_FAILED, f"{what} is invalid: {error.message}")
    return StageError(Reason.STAGE_FAILED, f"applying {what} failed: {error.status} {error.message}")


def read_error(item: AppliedObject, error: ApiError, identity: str) -> StageError:
    """What a failed read of ``item`` (other than not found) fails the stage with."""
    what = describe(item.manifest)
    if error.forbidden:
        return StageError(Reason.RBAC_DENIED, f"{identity} may not read {what}")
    return StageError(Reason.STAGE_FAILED, f"reading {what} failed: {error.status} {error.message}")


def namespace_of(item: AppliedObject) -> str | None:
    namespace = item.manifest["metadata"].get("namespace")
    return str(namespace) if namespace else None


def created_namespaces(labelled: list[KubeObject]) -> frozenset[str]:
    """The Namespaces a stage creates itself: its objects there cannot be dry-run before they exist."""
    return frozenset(str(o["metadata"]["name"]) for o in labelled
                     if o.get("kind") == "Namespace" and o.get("apiVersion") == "v1")


_Item = TypeVar("_Item")
"""What :meth:`ApplyCore.each` steps through: a stage's objects, or the access reviews they need."""

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
POOL_THREADS = 32
"""Threads every stage's dry-runs and writes share (each stage still takes at most ``parallelism``)."""


def _shared_pool() -> ThreadPoolExecutor:
    global _POOL  # one pool per process, made on first use
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="apply")
        return _POOL


class ApplyCore:
    """What every verb of the engine shares; holds only settings and the warm-pass maps."""

    def __init__(self, *, mapper: RestMapper, settings: ApplySettings | None = None,
                 versions: LiveVersions | None = None, rights: ShownRights | None = None):
        self.mapper = mapper
        self.settings = settings or ApplySettings()
        self.versions = versions if versions is not None else LiveVersions(
            max_bytes=self.settings.versions_max_bytes)
        """What each object looked like after our last write or check (shared by the targets)."""
        self.rights = rights if rights is not None else ShownRights(max_age=self.settings.rights_max_age)
        """When each identity last showed it may write a kind in a namespace (shared by the targets)."""

    def resolve(self, obj: KubeObject, default_namespace: str) -> tuple[KubeObject, Resource | None]:
        """Default a namespaced object's namespace; the resource is ``None`` while its kind is unserved."""
        try:
            resource = self.mapper.for_object(obj)
        except UnknownKindError:
            return obj, None
        manifest = obj
        if resource.namespaced and not obj["metadata"].get("namespace"):
            manifest = {**obj, "metadata": {**obj["metadata"], "namespace": default_namespace}}
        if not resource.namespaced and obj["metadata"].get("namespace"):
            manifest = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
        return manifest, resource

    def bind_object(self, obj: KubeObject, default_namespace: str) -> AppliedObject | None:
        """``obj`` bound to its API path; ``None`` while its kind is unserved."""
        manifest, resource = self.resolve(obj, default_namespace)
        if resource is None:
            return None
        path = resource.object_path(name=manifest["metadata"]["name"],
                                    namespace=manifest["metadata"].get("namespace"))
        return AppliedObject(resource=resource, path=path, manifest=manifest, id=object_id(manifest),
                             digest=manifest_hash(manifest))

    def reference(self, obj: KubeObject, default_namespace: str) -> AppliedObject | None:
        """An object the stage waits for but does not apply (``readyChecks.checks``);
        ``None`` when the cluster serves no such kind."""
        item = self.bind_object(obj, default_namespace)
        if item is not None:
            item.action = Action.SKIPPED
        return item

    def version_key(self, client: KubeClient, path: str) -> tuple[str, str, str]:
        """``versions`` (and ``rights``) keys: the cluster, ``client``'s identity, an API path."""
        return client.cluster.name, client.identity.user or "", path

    def rights_key(self, client: KubeClient, resource: Resource, namespace: str | None
                   ) -> tuple[str, str, str]:
        """Rights are per identity, kind and namespace: the collection's path names the last two."""
        return self.version_key(client, resource.collection_path(namespace))

    def each(self, items: list[_Item], step: Callable[[_Item], None]) -> None:
        """``step`` for every item, at most ``parallelism`` at once, on the engine's shared threads
        (a pool per call cost thread start-ups on every stage: a tenth of the controller's CPU in
        a cold run of 1000 StageSets).  Every item is stepped; the first error (in item order) is
        raised once all have finished."""
        if len(items) <= 1:
            for item in items:
                step(item)
            return
        pool = _shared_pool()
        ahead = iter(enumerate(items))
        futures: dict[Future[None], int] = {}
        errors: dict[int, BaseException] = {}
        for index, item in itertools.islice(ahead, self.settings.parallelism):
            futures[pool.submit(step, item)] = index
        while futures:
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            for future in done:
                index = futures.pop(future)
                error = future.exception()
                if error is not None:
                    errors[index] = error
            for index, item in itertools.islice(ahead, len(done)):
                futures[pool.submit(step, item)] = index
        if errors:
            raise errors[min(errors)]
