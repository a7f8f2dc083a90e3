"""Apply one stage: dry-run everything as the tenant, write only what differs, phase by phase.

Identity: every request made here goes through the ``client`` handed in, which the
controller binds to the stage's identity (the tenant's ServiceAccount, or the
controller itself in single-tenant mode).  Discovery (``mapper``) is the only read
made with the controller's identity (or, on a remote cluster, the kubeconfig's).

Invariants:
- A stage the tenant may not fully write changes nothing: all objects whose kinds
  are served are server-side dry-run first; any denial or validation error fails
  the stage before the first real write.
- An object whose dry-run result equals the live object costs no write, so a warm
  no-op reconcile writes nothing.
- A warm pass costs no dry-run for an object nobody changed: an object in the inventory whose
  manifest is the one applied last time, and whose resourceVersion (from one label-selected
  list per kind and namespace, as the stage's identity) is still the one our last write or
  check left (:mod:`stageset.apply.versions`), is unchanged — provided the identity may still
  write such objects there: one object per kind and namespace is still dry-run, so rights taken
  away fail the pass with RBACDenied as before — except in a periodic pass (``recheck_rights``
  false) when the identity showed those rights within ``--rights-recheck-interval``
  (:mod:`stageset.apply.rights`): then the list alone decides, and the pass writes nothing
  either way.  Any other object takes the dry-run path, so drift is still found and corrected.
- On a stage's first apply one object is not dry-run: the first object the stage writes (new to
  the inventory, in the first phase), written only after every other object's dry-run passed.
  Its own write is its check: when it fails, nothing else has been written (and its dry-run
  then says why, or resolves an immutable-field conflict, as for any other object).
- A changed object whose manifest is the one we applied last time was changed by
  someone else: that is drift, corrected and reported.  A new manifest is not drift.
- A change the apiserver refuses as immutable gets the stage's conflict policy
  (:mod:`stageset.apply.conflicts`): fail, recreate, or keep the live object untouched.

The result is a :class:`~stageset.apply.changeset.ChangeSet`: one action per object.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from stageset.api import InventoryEntry
from stageset.api.stageset import ConflictAction
from stageset.api.vocabulary import Reason
from stageset.apply.changeset import WRITES, Action, Change, ChangeSet
from stageset.apply.conflicts import ConflictResolver
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId, describe, entry, manifest_hash, object_id
from stageset.apply.ownership import (
    FIELD_MANAGER,
    LABEL_NAME,
    LABEL_NAMESPACE,
    LABEL_STAGE,
    StageOwner,
    label_object,
)
from stageset.apply.plan import phases
from stageset.apply.readiness import Readiness, Status, readiness
from stageset.apply.rights import ShownRights
from stageset.apply.settings import ApplySettings
from stageset.apply.versions import LiveVersions, Seen
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource, RestMapper, UnknownKindError
from stageset.kube.types import KubeObject
from stageset.kube.watches import Watched


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

    @property
    def wrote(self) -> bool:
        return self.action in WRITES

    def entry(self) -> InventoryEntry:
        return entry(self.id, version=str(self.manifest.get("apiVersion")), digest=self.digest)

    def change(self) -> Change:
        return Change(id=self.id, action=self.action, drift=self.drifted)


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
        return [o for o in self.objects if o.drifted]


@dataclass
class Preview:
    """What applying a stage would do (:meth:`StageApplier.preview`)."""

    objects: list[AppliedObject]
    pending: list[KubeObject]
    """Manifests that cannot be dry-run before an earlier phase of the stage is written (their
    kind's CRD, or their Namespace, is in the same stage): they would be created then."""

    @property
    def changes(self) -> ChangeSet:
        return ChangeSet([o.change() for o in self.objects])


def _comparable(obj: KubeObject | None) -> Any:
    """The object minus what changes without meaning (managedFields timestamps)."""
    if obj is None:
        return None
    metadata = dict(obj.get("metadata", {}))
    metadata["managedFields"] = [{k: v for k, v in f.items() if k != "time"}
                                 for f in metadata.get("managedFields", [])]
    return {**obj, "metadata": metadata}


def _is_immutable_error(error: ApiError) -> bool:
    return error.invalid and ("immutable" in error.message or "may not change" in error.message)


def _error_for(item: AppliedObject, error: ApiError, identity: str) -> StageError:
    what = describe(item.manifest)
    if error.forbidden:
        return StageError(Reason.RBAC_DENIED, f"{identity} may not apply {what}: {error.message}")
    if _is_immutable_error(error):
        return StageError(Reason.STAGE_FAILED, f"{what} changed an immutable field ({error.message}); "
                          "set force: true on the stage to recreate it, or a conflictPolicy "
                          "(Recreate or KeepExisting) for it")
    if error.invalid:
        return StageError(Reason.STAGE_FAILED, f"{what} is invalid: {error.message}")
    return StageError(Reason.STAGE_FAILED, f"applying {what} failed: {error.status} {error.message}")


def _read_error(item: AppliedObject, error: ApiError, identity: str) -> StageError:
    what = describe(item.manifest)
    if error.forbidden:
        return StageError(Reason.RBAC_DENIED, f"{identity} may not read {what}")
    return StageError(Reason.STAGE_FAILED, f"reading {what} failed: {error.status} {error.message}")


def _pilot(first_phase: list[KubeObject], bound: Mapping[int, AppliedObject | None],
           previous: Mapping[ObjectId, InventoryEntry], created: frozenset[str], settled: set[int]
           ) -> AppliedObject | None:
    """The object a stage writes first without a dry-run: the first of its first phase that is new
    to the inventory (a known one's dry-run also tells whether it needs a write at all), of a
    served kind, not in a Namespace this stage creates, and sharing its kind and namespace with
    another new object of the stage — whose dry-run, made first, shows the identity may create
    and patch such objects there, so a denial of the write itself is all but ruled out."""
    fresh = [item for obj in first_phase if (item := bound.get(id(obj))) is not None
             and item.id not in previous and id(item) not in settled]
    for item in fresh:
        namespace = item.manifest["metadata"].get("namespace")
        if str(namespace or "") in created:
            continue
        if any(other is not item and other.resource == item.resource
               and other.manifest["metadata"].get("namespace") == namespace for other in fresh):
            return item
    return None


def _namespace(item: AppliedObject) -> str | None:
    namespace = item.manifest["metadata"].get("namespace")
    return str(namespace) if namespace else None


class HealthJudge(Protocol):
    """Readiness by the stage's own rules (:class:`stageset.apply.health.HealthChecks`)."""

    def __bool__(self) -> bool: ...

    def judge(self, live: KubeObject, *, what: str) -> Readiness | None: ...


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


WATCHED_RECHECK = 10.0
"""When every object awaited is watched, judge again at least this often anyway (seconds)."""


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


class _Watching:
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


class StageApplier:
    """Applies stages; one instance is shared by all workers (it holds only settings)."""

    def __init__(self, *, mapper: RestMapper, settings: ApplySettings | None = None,
                 versions: LiveVersions | None = None, rights: ShownRights | None = None):
        self._mapper = mapper
        self._settings = settings or ApplySettings()
        self.versions = versions if versions is not None else LiveVersions(
            max_bytes=self._settings.versions_max_bytes)
        """What each object looked like after our last write or check (shared by the targets)."""
        self.rights = rights if rights is not None else ShownRights(max_age=self._settings.rights_max_age)
        """When each identity last showed it may write a kind in a namespace (shared by the targets)."""

    def resolve(self, obj: KubeObject, default_namespace: str) -> tuple[KubeObject, Resource | None]:
        """Default a namespaced object's namespace; the resource is ``None`` while its kind is unserved."""
        try:
            resource = self._mapper.for_object(obj)
        except UnknownKindError:
            return obj, None
        manifest = obj
        if resource.namespaced and not obj["metadata"].get("namespace"):
            manifest = {**obj, "metadata": {**obj["metadata"], "namespace": default_namespace}}
        if not resource.namespaced and obj["metadata"].get("namespace"):
            manifest = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
        return manifest, resource

    def reference(self, obj: KubeObject, default_namespace: str) -> AppliedObject | None:
        """An object the stage waits for but does not apply (``readyChecks.checks``);
        ``None`` when the cluster serves no such kind."""
        item = self._bind(obj, default_namespace)
        if item is not None:
            item.action = Action.SKIPPED
        return item

    def _bind(self, obj: KubeObject, default_namespace: str) -> AppliedObject | None:
        manifest, resource = self.resolve(obj, default_namespace)
        if resource is None:
            return None
        path = resource.object_path(name=manifest["metadata"]["name"],
                                    namespace=manifest["metadata"].get("namespace"))
        return AppliedObject(resource=resource, path=path, manifest=manifest, id=object_id(manifest),
                             digest=manifest_hash(manifest))

    def _each(self, items: list[AppliedObject], step: Callable[[AppliedObject], None]) -> None:
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
        for index, item in itertools.islice(ahead, self._settings.parallelism):
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

    def _preview(self, client: KubeClient, items: list[AppliedObject], *, conflicts: ConflictResolver,
                 previous: Mapping[ObjectId, InventoryEntry], created: frozenset[str] = frozenset(),
                 read_live: bool = False) -> list[AppliedObject]:
        """Dry-run each object's apply (and read the live one if we applied it before, or
        ``read_live``); raise on the first kind of failure.  Returns the objects that could not
        be dry-run because their namespace is one of ``created`` (Namespaces of this very stage,
        not written yet): they are previewed again in their phase, once it exists."""
        failures: list[StageError] = []
        deferred: list[AppliedObject] = []
        lock = threading.Lock()

        def preview(item: AppliedObject) -> None:
            # Only an object we applied before can be unchanged: reading the others would
            # only tell us to write them anyway (saves a read per object on first apply).
            try:
                item.live = client.get(item.path) if read_live or item.id in previous else None
            except ApiError as error:
                if not error.not_found:
                    with lock:
                        failures.append(_error_for(item, error, client.identity.describe()))
                    return
                item.live = None
            try:
                item.dry_run = client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER,
                                            dry_run=True)
            except ApiError as error:
                if _is_immutable_error(error):
                    resolution = conflicts.resolve(item.manifest)
                    if resolution.action is ConflictAction.RECREATE:
                        item.action = Action.RECREATED
                        return
                    if resolution.action is ConflictAction.KEEP_EXISTING:
                        item.action = Action.SKIPPED  # left exactly as it is; still waited for
                        return
                    if resolution.refusal:
                        with lock:
                            failures.append(StageError(Reason.STAGE_FAILED, f"{describe(item.manifest)} "
                                                       f"changed an immutable field: {resolution.refusal}"))
                        return
                details = error.body.get("details") or {}
                if error.not_found and details.get("kind") == "namespaces" and details.get("name") in created:
                    with lock:
                        deferred.append(item)
                    return
                with lock:
                    failures.append(_error_for(item, error, client.identity.describe()))

        self._each(items, preview)
        if failures:
            denied = [f for f in failures if f.reason is Reason.RBAC_DENIED]
            first = (denied or failures)[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise StageError(first.reason, first.message + more)
        return deferred

    def _delete_and_wait(self, client: KubeClient, item: AppliedObject) -> None:
        try:
            # Background: the object goes at once; the garbage collector removes its dependents.
            client.delete(item.path, propagation="Background")
        except ApiError as error:
            if not error.not_found:
                raise _error_for(item, error, client.identity.describe()) from error
        deadline = time.monotonic() + self._settings.delete_timeout
        while time.monotonic() < deadline:
            try:
                client.get(item.path)
            except ApiError as error:
                if error.not_found:
                    return
                raise
            time.sleep(self._settings.poll_interval)
        raise StageError(Reason.STAGE_FAILED,
                         f"{describe(item.manifest)} was not deleted for recreation in time")

    def _write(self, client: KubeClient, items: list[AppliedObject],
               previous: Mapping[ObjectId, InventoryEntry]) -> None:
        def write(item: AppliedObject) -> None:
            if item.action is Action.SKIPPED:
                return  # conflictPolicy KeepExisting: the live object stays as it is
            recreate = item.action is Action.RECREATED
            if not recreate and item.id in previous and item.dry_run is not None and \
                    _comparable(item.dry_run) == _comparable(item.live):
                item.action = Action.UNCHANGED  # already as wanted: no write
                return
            if recreate:
                self._delete_and_wait(client, item)
            existed = item.live is not None
            try:
                item.live = client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER)
            except ApiError as error:
                raise _error_for(item, error, client.identity.describe()) from error
            if not recreate:
                # Not read first (new to the inventory): a dry-run of an existing object carries
                # its resourceVersion, one of a create does not.
                existed = existed or bool(((item.dry_run or {}).get("metadata") or {}).get("resourceVersion"))
                item.action = Action.CONFIGURED if existed else Action.CREATED
            before = previous.get(item.id)
            item.drifted = before is not None and before.h == item.digest and not recreate

        self._each(items, write)

    def _wait_established(self, client: KubeClient, items: list[AppliedObject]) -> None:
        """CRDs of this phase must serve before the next phase creates their objects."""
        crds = [i for i in items if i.manifest.get("kind") == "CustomResourceDefinition"]
        if not crds:
            return
        verdict = self.wait_ready(client=client, applied=crds, timeout=self._settings.crd_timeout,
                                  stop=threading.Event())
        if verdict.status is not Status.CURRENT:
            raise StageError(Reason.STAGE_FAILED,
                             f"CustomResourceDefinitions not established: {verdict.message}")

    def bind(self, *, owner: StageOwner, objects: list[KubeObject], default_namespace: str
             ) -> StageResult | None:
        """The stage's objects bound to their paths without touching them (for re-checking
        readiness of a stage applied earlier); ``None`` if a kind is not served."""
        bound = [self._bind(label_object(obj, owner), default_namespace) for obj in objects]
        if any(item is None for item in bound):
            return None
        return StageResult(objects=[item for item in bound if item is not None])

    def apply(self, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
              default_namespace: str, force: bool = False, conflicts: ConflictResolver | None = None,
              previous: Mapping[ObjectId, InventoryEntry] | None = None,
              recheck_rights: bool = True) -> StageResult:
        """Apply ``objects`` as ``client``'s identity; raise :class:`StageError` on failure.

        ``conflicts`` answers immutable-field conflicts (default: fail, or recreate with ``force``).
        ``recheck_rights=False`` (a periodic pass): unchanged objects of a kind and namespace where
        the identity showed its rights within ``rights_max_age`` are not dry-run."""
        previous = previous or {}
        conflicts = conflicts or ConflictResolver.forcing(force)
        labelled = [label_object(obj, owner) for obj in objects]
        bound = [self._bind(obj, default_namespace) for obj in labelled]
        created = frozenset(str(o["metadata"]["name"]) for o in labelled
                            if o.get("kind") == "Namespace" and o.get("apiVersion") == "v1")
        served = [b for b in bound if b is not None]
        try:
            return self._apply(client, labelled=labelled, bound=bound, served=served, created=created,
                               default_namespace=default_namespace, conflicts=conflicts, previous=previous,
                               owner=owner, recheck_rights=recheck_rights)
        except StageError as error:
            if error.reason is Reason.RBAC_DENIED:
                # Refused somewhere in the stage: every kind and namespace it writes is asked again
                # by the next pass of any stage of this identity.
                for item in served:
                    self.rights.denied(self._rights_key(client, item.resource, _namespace(item)))
            raise

    def _apply(self, client: KubeClient, *, labelled: list[KubeObject], bound: list[AppliedObject | None],
               served: list[AppliedObject], created: frozenset[str], default_namespace: str,
               conflicts: ConflictResolver, previous: Mapping[ObjectId, InventoryEntry], owner: StageOwner,
               recheck_rights: bool) -> StageResult:
        settled = self._unchanged(client, owner, served, previous, recheck_rights=recheck_rights)
        pending = [b for b in served if id(b) not in settled]
        bound_by_object = {id(obj): item for obj, item in zip(labelled, bound, strict=True)}
        pilot = _pilot(phases(labelled)[0] if labelled else [], bound_by_object, previous, created, settled)
        deferred = {id(item) for item in self._preview(client, [b for b in pending if b is not pilot],
                                                        conflicts=conflicts, previous=previous,
                                                        created=created)}
        result = StageResult()
        for phase in phases(labelled):
            items: list[AppliedObject] = []
            late: list[AppliedObject] = []
            for obj in phase:
                item = bound_by_object[id(obj)]
                if item is None:
                    # Its kind appeared in an earlier phase of this stage (a CRD): preview it now.
                    item = self._bind(obj, default_namespace)
                    if item is None:
                        raise StageError(Reason.STAGE_FAILED, f"{describe(obj)}: the cluster serves no "
                                         f"kind {obj.get('kind')} in {obj.get('apiVersion')}")
                    late.append(item)
                elif id(item) in deferred:
                    late.append(item)  # its namespace is written by an earlier phase of this stage
                items.append(item)
            self._preview(client, late, conflicts=conflicts, previous=previous)
            if pilot is not None and pilot in items:
                self._write_pilot(client, pilot, conflicts=conflicts, previous=previous)
            self._write(client, [i for i in items if i is not pilot and id(i) not in settled], previous)
            self._wait_established(client, items)
            result.objects.extend(items)
        self._remember(client, result.objects)
        # Every object not settled by the list was dry-run or written, successfully: its identity
        # has shown it may write that kind there.
        for item in result.objects:
            if id(item) not in settled and item.action is not Action.SKIPPED:
                self.rights.shown(self._rights_key(client, item.resource, _namespace(item)))
        return result

    # -- the warm path: versions instead of dry-runs -------------------------------------------

    def _key(self, client: KubeClient, path: str) -> tuple[str, str, str]:
        return client.cluster.name, client.identity.user or "", path

    def _rights_key(self, client: KubeClient, resource: Resource, namespace: str | None
                    ) -> tuple[str, str, str]:
        """Rights are per identity, kind and namespace: the collection's path names the last two."""
        return self._key(client, resource.collection_path(namespace))

    def _unchanged(self, client: KubeClient, owner: StageOwner, items: list[AppliedObject],
                   previous: Mapping[ObjectId, InventoryEntry], *, recheck_rights: bool = True) -> set[int]:
        """The objects nobody changed since our last write or check (their ``id()``); each gets
        the listed object as ``live`` and ``dry_run`` (readiness is judged from it) and action
        ``UNCHANGED``.  One label-selected list per kind and namespace, as ``client``; a list
        that fails (the identity may not list that kind) leaves its objects to the dry-run path.
        With ``recheck_rights`` (or rights not shown recently) one object per kind and namespace is
        dry-run first."""
        groups: dict[tuple[Resource, str], list[tuple[AppliedObject, Seen]]] = {}
        for item in items:
            before = previous.get(item.id)
            seen = self.versions.get(self._key(client, item.path)) if before is not None else None
            if before is None or before.h != item.digest or seen is None or seen.digest != item.digest:
                continue
            namespace = str(item.manifest["metadata"].get("namespace") or "")
            groups.setdefault((item.resource, namespace), []).append((item, seen))
        settled: set[int] = set()
        selector = ",".join(f"{k}={v}" for k, v in sorted(owner.labels().items()))
        for (resource, namespace), members in groups.items():
            # Nothing is written when nothing changed, but a pass still says whether the identity
            # may write what it owns: one object of the group is dry-run (rights taken away are
            # RBACDenied now, not at the next change; what admission says of it is heard too).
            probe: AppliedObject | None = members[0][0]
            rights = self._rights_key(client, resource, namespace or None)
            if not recheck_rights and self.rights.fresh(rights):
                probe = None  # a periodic pass, and the identity showed these rights recently
            try:
                checked = None if probe is None else client.apply(
                    probe.path, probe.manifest, field_manager=FIELD_MANAGER, dry_run=True)
                live = self._list(client, resource, namespace or None, selector)
            except ApiError:
                continue  # the dry-run path says what is wrong (a denial there forgets the rights)
            if probe is not None:
                self.rights.shown(rights)
            for item, seen in members:
                found = live.get(str(item.manifest["metadata"]["name"]))
                if found is None or str((found.get("metadata") or {}).get("resourceVersion")) != seen.version:
                    continue
                found = {"apiVersion": item.manifest.get("apiVersion"), "kind": item.manifest.get("kind"),
                         **found}
                if item is probe and _comparable(checked) != _comparable(found):
                    continue
                item.live = item.dry_run = found
                item.action = Action.UNCHANGED
                settled.add(id(item))
        return settled

    @staticmethod
    def _list(client: KubeClient, resource: Resource, namespace: str | None, selector: str
              ) -> dict[str, KubeObject]:
        """Objects of ``resource`` in ``namespace`` carrying the stage's owner labels, by name."""
        found: dict[str, KubeObject] = {}
        query: dict[str, str | int | bool] = {"labelSelector": selector, "limit": 500}
        path = resource.collection_path(namespace)
        while True:
            page = client.request("GET", path, query=query)
            for obj in page.get("items") or []:
                found[str((obj.get("metadata") or {}).get("name"))] = obj
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found
            query = {**query, "continue": str(token)}

    def _remember(self, client: KubeClient, items: list[AppliedObject]) -> None:
        """Each object as this pass left it: written, or found as wanted."""
        for item in items:
            version = str(((item.live or {}).get("metadata") or {}).get("resourceVersion") or "")
            key = self._key(client, item.path)
            if item.action in (Action.CREATED, Action.CONFIGURED, Action.RECREATED, Action.UNCHANGED) \
                    and version:
                self.versions.put(key, Seen(version=version, digest=item.digest))
            else:
                self.versions.drop(key)

    def _write_pilot(self, client: KubeClient, item: AppliedObject, *, conflicts: ConflictResolver,
                     previous: Mapping[ObjectId, InventoryEntry]) -> None:
        """The stage's first write, made without a dry-run once every other object's passed: when it
        fails nothing else has been written, and its dry-run says why (or resolves an
        immutable-field conflict) before it is written as any other object would be."""
        status: list[int] = []
        try:
            item.live = client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER, status=status)
        except ApiError:
            self._preview(client, [item], conflicts=conflicts, previous=previous)
            self._write(client, [item], previous)
            return
        item.action = Action.CREATED if status == [201] else Action.CONFIGURED

    def preview(self, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
                default_namespace: str, conflicts: ConflictResolver | None = None) -> Preview:
        """What :meth:`apply` would change, writing nothing (``stageset diff``).

        The same preview step as :meth:`apply` — labelled, bound, every object read and
        server-side dry-run as ``client``'s identity — then each object's planned action:
        ``UNCHANGED`` when the dry-run equals the live object, ``CREATED``, ``CONFIGURED``, or
        ``RECREATED`` / ``SKIPPED`` (an immutable change the stage's conflict policy recreates or
        keeps).  Raises :class:`StageError` as :meth:`apply` does (a denial fails the whole stage)."""
        labelled = [label_object(obj, owner) for obj in objects]
        bound = [(obj, self._bind(obj, default_namespace)) for obj in labelled]
        created = frozenset(str(o["metadata"]["name"]) for o in labelled
                            if o.get("kind") == "Namespace" and o.get("apiVersion") == "v1")
        deferred = {id(item) for item in self._preview(
            client, [item for _, item in bound if item is not None],
            conflicts=conflicts or ConflictResolver.forcing(False), previous={}, created=created,
            read_live=True)}
        items = [item for _, item in bound if item is not None and id(item) not in deferred]
        pending = [obj for obj, item in bound if item is None or id(item) in deferred]
        for item in items:
            if item.action in (Action.RECREATED, Action.SKIPPED):
                continue
            if item.live is None:
                item.action = Action.CREATED
            elif _comparable(item.dry_run) == _comparable(item.live):
                item.action = Action.UNCHANGED
            else:
                item.action = Action.CONFIGURED
        return Preview(objects=items, pending=pending)

    def wait_ready(self, *, client: KubeClient, applied: list[AppliedObject], timeout: float,
                   stop: threading.Event, progress: Callable[[Readiness], None] | None = None,
                   health: HealthJudge | None = None, references: Sequence[KubeObject] = (),
                   default_namespace: str = "", watches: WatchSource | None = None,
                   wake: tuple[Hashable, Callable[[], None]] | None = None) -> Readiness:
        """Wait until every object is Current, one Failed, or ``timeout`` passes.

        With ``watches``, objects still awaited after the first round are watched as ``client``'s
        identity (:mod:`stageset.kube.watches`: label-selected by the stage's owner labels, or by
        name for an object the stage did not write) and judged from what the watch holds, woken by
        its events — no reads while nothing changes; an object the pool has no room for is read
        every ``poll_interval`` as before.  ``wake`` (a key and a callback) keeps listening after an
        unfinished wait returns, so the waiter's owner is woken by the next change.

        ``references`` (``readyChecks.checks``, as ``{apiVersion, kind, metadata}`` stubs) are
        waited for too, as the reference waits for them: a namespaced one without a namespace is
        in ``default_namespace``, a cluster-scoped one has none, and one whose kind the cluster
        does not serve (yet: its CRD may come from another release) is waited for, its kind
        looked up again each round.  ``health`` judges the kinds it has expressions for
        (``readyChecks.exprs``); kstatus the rest.  ``progress`` hears what is still awaited
        after each round that leaves something to wait for (the first object not ready, and how
        many more).  An object that cannot be read (other than not found) is a
        :class:`StageError`."""
        deadline = time.monotonic() + timeout
        # First round: judge each object from what we already hold — the apply response for an
        # object we wrote, the preview for one we did not — and read it only if that says wait.
        known: dict[int, KubeObject | None] = {
            id(item): (item.live if item.wrote else item.dry_run) for item in applied}
        pending = list(applied)
        unserved = list(references)
        changed = threading.Event()
        watching = _Watching(watches, client, changed=changed, wake=wake)
        try:
            return self._wait_rounds(client=client, pending=pending, unserved=unserved, known=known,
                                     deadline=deadline, stop=stop, progress=progress, health=health,
                                     default_namespace=default_namespace, watching=watching)
        finally:
            watching.close()

    def _wait_rounds(self, *, client: KubeClient, pending: list[AppliedObject], unserved: list[KubeObject],
                     known: dict[int, KubeObject | None], deadline: float, stop: threading.Event,
                     progress: Callable[[Readiness], None] | None, health: HealthJudge | None,
                     default_namespace: str, watching: _Watching) -> Readiness:
        first = True
        while True:
            still: list[AppliedObject] = []
            waiting: list[str] = []
            bound = [(stub, self.reference(stub, default_namespace)) for stub in unserved]
            pending.extend(item for _, item in bound if item is not None)
            unserved = [stub for stub, item in bound if item is None]
            for item in pending:
                live = known.pop(id(item), None)
                if live is None:
                    # A watch opened by an earlier round (or pass) serves it; the first round of a
                    # wait opens none (what it holds is often ready at once).
                    live = watching.read(item, open_watch=not first)
                if live is None:
                    try:
                        live = client.get(item.path)
                    except ApiError as error:
                        if not error.not_found:
                            raise _read_error(item, error, client.identity.describe()) from error
                        still.append(item)
                        waiting.append(f"{describe(item.manifest)} not found")
                        continue
                verdict = (health.judge(live, what=describe(item.manifest)) if health else None) \
                    or readiness(live)
                if verdict.status is Status.FAILED:
                    watching.done()
                    return Readiness(Status.FAILED, f"{describe(item.manifest)}: {verdict.message}")
                if verdict.status is Status.IN_PROGRESS:
                    still.append(item)
                    waiting.append(f"{describe(item.manifest)}: {verdict.message}")
            waiting.extend(f"{describe(stub)}: the cluster does not serve {stub['apiVersion']} "
                           f"{stub['kind']} (yet)" for stub in unserved)
            if not still and not unserved:
                watching.done()
                return Readiness(Status.CURRENT)
            more = f" (and {len(waiting) - 1} more not ready)" if len(waiting) > 1 else ""
            # Every object still awaited is watched (its changes wake us) once the watches are in.
            watched = not unserved and watching.cover(still)
            last = Readiness(Status.IN_PROGRESS, waiting[0] + more, watched=watched)
            if time.monotonic() >= deadline or stop.is_set():
                return last
            if progress is not None:
                progress(last)
            pending = still
            first = False
            watching.wait(stop=stop, until=min(deadline, time.monotonic() + (
                WATCHED_RECHECK if watched else self._settings.poll_interval)))
