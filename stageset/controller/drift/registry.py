"""Drift watches: what StageSets applied, watched as whoever applied it; a change that is not ours
queues the StageSet that owns the object.

**What is watched.**  For every (cluster, identity, kind, namespace) a stage applied into, one held
watch of the shared pool (:meth:`stageset.kube.watches.WatchPool.hold`), selected by the presence of
the owner labels (:data:`SELECTOR`) — so every StageSet applying there as the same identity shares
it — metadata only, and opened with the stage's own client: on a remote cluster through the one
connection its target keeps, as the stage's identity there.  It starts from the newest
``resourceVersion`` the pass saw (no list), is held while any StageSet needs it and closed when the
last one stops (:meth:`DriftWatches.settle`, :meth:`DriftWatches.forget`).  A StageSet's
``spec.kubeConfig`` Secret (or its workload-identity ConfigMap) is watched the same way (by name,
metadata only, as the StageSet's identity, from the version its pass read): a rotation queues the
StageSet.

**What triggers a pass.**  Each object a stage applied is kept as its pass left it
(:class:`~stageset.controller.drift.judge.Fingerprint`); an event about it is judged against that
(:func:`~stageset.controller.drift.judge.judge`): an edit of a field we manage, a delete, an owner
label removed queue its StageSet; our own writes, status updates, defaulted fields and changes to
fields we do not manage do not.  Events that arrive while a pass over the owner runs are held and
judged when it settles, against what it left (so its own writes, prunes and moves trigger nothing).
The pass that follows is the normal one: it decides what to write (``DriftCorrected``), or in
``Warn`` mode what to report.  Objects in a terminating namespace are not acted on (their deletion
is the namespace's).

**Bounds and fallback.**  At most ``capacity`` watches (``--max-drift-watches``; the kubeConfig
Secret watches included).  A StageSet that needs one more when the bound is reached keeps what it
has and falls back to its interval for the rest, as does one whose watch cannot be opened (its
identity may not watch that kind there, its cluster is down): the pool retries those, and this
registry asks again at the StageSet's next pass.  Both are counted (:meth:`DriftWatches.unwatched`,
``refused``); nothing here ever fails a StageSet.

Identity: every watch is opened with the client the StageSet's pass used for that stage (its
identity on its cluster) or, for the Secret, the client of the StageSet's identity on this cluster;
an event is only ever matched against objects registered under the same watch key, so what one
identity saw never reaches another's StageSet.  Nothing here writes, or reads anything but watches.

Memory: per applied object one small entry (its path, owner, fingerprint: about 300 bytes), per
watch a thread and a connection; nothing of an object's content is kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.controller.drift.judge import Fingerprint, Verdict, fingerprint, judge
from stageset.controller.kinds import SECRETS
from stageset.kube.client import KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Handler, Listed
from stageset.kube.watches import Key

log = logging.getLogger(__name__)

SELECTOR = ",".join((LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE))
"""Every object a StageSet applied carries its owner labels: one watch per kind and namespace serves
every StageSet applying there as the same identity."""

DEFAULT_CAPACITY = 500
MAX_PENDING = 64
"""Events held for one StageSet while its pass runs; past that, it is simply queued again."""

Ref = tuple[str, str]
"""A StageSet: (namespace, name)."""
ObjectPath = tuple[str, str]
"""An applied object: (cluster, API path)."""


class HeldWatches(Protocol):
    """The held watches of :class:`stageset.kube.watches.WatchPool`."""

    def hold(self, holder: Hashable, client: KubeClient, resource: Resource, namespace: str | None, *,
             handler: Handler, listed: Listed | None = None, label_selector: str = "",
             field_selector: str = "", resource_version: str = "", metadata_only: bool = True) -> Key: ...

    def release(self, holder: Hashable, key: Key, *, drain: bool = False) -> None: ...

    def healthy(self, key: Key) -> bool | None: ...


@dataclass(frozen=True)
class Applied:
    """One object a stage applied, as its pass left it (``live``: ``None`` when it is not there)."""

    resource: Resource
    namespace: str | None
    name: str
    live: KubeObject | None


@dataclass(frozen=True)
class SecretWatch:
    """The object a StageSet's ``spec.kubeConfig`` names — its Secret (or, with workload identity, its
    ConfigMap) — as its pass read it (``client``: its identity here)."""

    client: KubeClient
    namespace: str
    name: str
    version: str
    resource: Resource = SECRETS


@dataclass(slots=True)
class _Object:
    owner: Ref
    stage: str
    watch: Key
    name: tuple[str, str]
    known: Fingerprint | None


@dataclass
class _Open:
    """What a watch key is opened with (the first stage that needs it)."""

    client: KubeClient
    resource: Resource
    namespace: str | None
    version: str


@dataclass
class _Stage:
    opens: dict[Key, _Open] = field(default_factory=dict)
    objects: set[ObjectPath] = field(default_factory=set)


@dataclass
class _Owner:
    stages: dict[str, _Stage] = field(default_factory=dict)
    held: set[Key] = field(default_factory=set)
    refused: set[Key] = field(default_factory=set)
    busy: bool = False
    pending: list[tuple[Key, Resource, str, KubeObject]] = field(default_factory=list)
    overflow: bool = False
    secret: Key | None = None
    secret_version: str = ""


def namespace_of(key: Key) -> str:
    """The namespace a watch key's collection path is in ("": cluster-wide)."""
    _, found, rest = key[2].partition("/namespaces/")
    return rest.split("/", 1)[0] if found and "/" in rest else ""


def _newest(versions: Collection[str]) -> str:
    numeric = [int(v) for v in versions if v.isdigit()]
    return str(max(numeric)) if numeric else ""


class DriftWatches:
    def __init__(self, *, pool: HeldWatches, enqueue: Callable[[str, str], None],
                 capacity: int = DEFAULT_CAPACITY, terminating: Callable[[str], bool] = lambda _: False,
                 on_refused: Callable[[], None] | None = None, on_trigger: Callable[[], None] | None = None):
        self._pool = pool
        self._enqueue = enqueue
        self._capacity = capacity
        self._terminating = terminating
        self._on_refused = on_refused
        self._on_trigger = on_trigger
        self._lock = threading.Lock()
        self._owners: dict[Ref, _Owner] = {}
        self._objects: dict[ObjectPath, _Object] = {}
        self._by_watch: dict[Key, set[ObjectPath]] = {}
        self._users: dict[Key, set[Ref]] = {}
        """Every watch this registry holds, and the StageSets that need it (applied or Secret)."""
        self.refused = 0
        """Watches asked for while ``capacity`` were held (those StageSets fell back to their interval)."""
        self.triggered = 0
        """Passes queued by a change that was not ours."""

    # -- what passes tell ------------------------------------------------------------------------

    def begin(self, ref: Ref) -> None:
        """A pass over ``ref`` starts: its events are held until it settles."""
        with self._lock:
            self._owners.setdefault(ref, _Owner()).busy = True

    def applied(self, ref: Ref, stage: str, client: KubeClient, objects: Collection[Applied]) -> None:
        """Stage ``stage`` of ``ref`` applied ``objects`` (all it owns now) as ``client``'s identity on
        ``client``'s cluster: they replace what it applied before."""
        cluster = client.cluster.name
        with self._lock:
            owner = self._owners.setdefault(ref, _Owner())
            self._drop_stage(ref, owner, stage)
            entry = _Stage()
            versions: dict[Key, list[str]] = {}
            for item in objects:
                namespace = item.namespace if item.resource.namespaced else None
                key = (cluster, client.identity.user or "", item.resource.collection_path(namespace),
                       SELECTOR, "")
                path = (cluster, item.resource.object_path(name=item.name, namespace=namespace))
                known = fingerprint(item.live)
                self._objects[path] = _Object(owner=ref, stage=stage, watch=key,
                                              name=(namespace or "", item.name), known=known)
                self._by_watch.setdefault(key, set()).add(path)
                entry.objects.add(path)
                entry.opens.setdefault(key, _Open(client=client, resource=item.resource, namespace=namespace,
                                                  version=""))
                if known is not None:
                    versions.setdefault(key, []).append(known.version)
            for key, opened in entry.opens.items():
                opened.version = _newest(versions.get(key, ()))
            owner.stages[stage] = entry

    def settle(self, ref: Ref, *, stages: Collection[str], secret: SecretWatch | None = None,
               keep_secret: bool = False) -> None:
        """The pass over ``ref`` ended; ``stages``: the stages its spec names now (the rest are dropped),
        ``secret``: its kubeConfig Secret as read (``None``: none — or, with ``keep_secret``, the pass
        did not get that far: what was watched stays).  Watches it needs are held (as far as the bound
        allows), those it no longer needs released, and the events held meanwhile judged against what
        the pass left."""
        with self._lock:
            owner = self._owners.setdefault(ref, _Owner())
            for name in [n for n in owner.stages if n not in stages]:
                self._drop_stage(ref, owner, name)
            opened, closed = self._needed(ref, owner)
            secrets: list[Key] = []
            if secret is not None and stages:
                secrets, more = self._secret(ref, owner, secret)
                closed += more
            elif (not keep_secret or not stages) and owner.secret is not None:
                closed += self._unuse(ref, owner, owner.secret)
                owner.secret = None
            pending, owner.pending = owner.pending, []
            overflow, owner.overflow = owner.overflow, False
            owner.busy = False
            if not owner.stages and owner.secret is None:
                del self._owners[ref]
        for key in closed:
            self._release(key)
        for key, how in opened:
            self._pool.hold(self, how.client, how.resource, how.namespace, label_selector=SELECTOR,
                            resource_version=how.version, handler=self._handler(key, how.resource),
                            listed=self._lister(key, how.resource))
        if secret is not None:
            for key in secrets:
                self._pool.hold(self, secret.client, secret.resource, secret.namespace,
                                field_selector=f"metadata.name={secret.name}",
                                resource_version=secret.version,
                                handler=self._secret_handler(key))
        # A forget() that ran while these were opened (the StageSet deleted meanwhile) let them go.
        for key in [k for k, _ in opened] + secrets:
            with self._lock:
                orphaned = key not in self._users
            if orphaned:
                self._release(key)
        if overflow:
            self._trigger(ref, why="changes while its pass ran")
        for key, resource, event, obj in pending:
            self._event(key, resource, event, obj)

    def forget(self, ref: Ref) -> None:
        """``ref`` needs no watch any more (deleted, being torn down, suspended, its spec invalid)."""
        closed: list[Key] = []
        with self._lock:
            owner = self._owners.pop(ref, None)
            if owner is None:
                return
            for name in list(owner.stages):
                self._drop_stage(ref, owner, name)
            for key in list(owner.held):
                closed += self._unuse(ref, owner, key)
        for key in closed:
            self._release(key)

    # -- what the metrics and tests read ---------------------------------------------------------

    def watches(self) -> int:
        """Watches held (applied objects and kubeConfig Secrets)."""
        with self._lock:
            return len(self._users)

    def objects(self) -> int:
        with self._lock:
            return len(self._objects)

    def unwatched(self) -> int:
        """StageSets falling back to their interval for some of what they applied: a watch refused by
        the bound, or one that does not work (refused by RBAC, its cluster down)."""
        with self._lock:
            owners = [(set(o.held), bool(o.refused)) for o in self._owners.values()]
        return sum(1 for held, refused in owners
                   if refused or any(self._pool.healthy(key) is False for key in held))

    # -- inside ------------------------------------------------------------------------------

    def _release(self, key: Key) -> None:
        """Let the pool close watch ``key`` — a watch of a namespace being deleted is drained instead
        (no request, not even a close, is sent into it any more)."""
        namespace = namespace_of(key)
        self._pool.release(self, key, drain=bool(namespace) and self._terminating(namespace))

    def _needed(self, ref: Ref, owner: _Owner) -> tuple[list[tuple[Key, _Open]], list[Key]]:
        """Hold what ``ref``'s stages need, as far as the bound allows, and let go of the rest (lock
        held); returns (the watches to open, the keys to release)."""
        needed: dict[Key, _Open] = {}
        for entry in owner.stages.values():
            for key, how in entry.opens.items():
                needed.setdefault(key, how)
        closed: list[Key] = []
        for key in owner.held - set(needed) - ({owner.secret} if owner.secret else set()):
            closed += self._unuse(ref, owner, key)
        owner.refused &= set(needed)
        opened: list[tuple[Key, _Open]] = []
        for key, how in needed.items():
            if key in owner.held:
                continue
            if key not in self._users:
                if len(self._users) >= self._capacity:
                    self._refuse(owner, key)
                    continue
                self._users[key] = set()
                opened.append((key, how))
            self._users[key].add(ref)
            owner.held.add(key)
            owner.refused.discard(key)
        return opened, closed

    def _refuse(self, owner: _Owner, key: Key) -> None:
        """The bound is reached: ``owner`` falls back to its interval for ``key`` (counted once)."""
        if key not in owner.refused:
            self.refused += 1
            if self._on_refused is not None:
                self._on_refused()
        owner.refused.add(key)

    def _secret(self, ref: Ref, owner: _Owner, secret: SecretWatch) -> tuple[list[Key], list[Key]]:
        """Hold the watch of the kubeConfig Secret (lock held); returns (to open, to release)."""
        key: Key = (secret.client.cluster.name, secret.client.identity.user or "",
                    secret.resource.collection_path(secret.namespace), "", f"metadata.name={secret.name}")
        owner.secret_version = secret.version
        if owner.secret == key:
            return [], []
        closed = [] if owner.secret is None else self._unuse(ref, owner, owner.secret)
        owner.secret = None
        if key not in self._users:
            if len(self._users) >= self._capacity:
                self._refuse(owner, key)
                return [], closed
            self._users[key] = {ref}
            owner.secret, owner.held = key, owner.held | {key}
            return [key], closed
        self._users[key].add(ref)
        owner.secret, owner.held = key, owner.held | {key}
        return [], closed

    def _unuse(self, ref: Ref, owner: _Owner, key: Key) -> list[Key]:
        """``ref`` stops needing ``key`` (lock held); the key to release if nobody else needs it."""
        owner.held.discard(key)
        users = self._users.get(key)
        if users is None:
            return []
        users.discard(ref)
        if users:
            return []
        del self._users[key]
        return [key]

    def _drop_stage(self, ref: Ref, owner: _Owner, stage: str) -> None:
        entry = owner.stages.pop(stage, None)
        if entry is None:
            return
        for path in entry.objects:
            found = self._objects.get(path)
            if found is None or found.owner != ref or found.stage != stage:
                continue  # another StageSet (or stage) registered it since
            del self._objects[path]
            paths = self._by_watch.get(found.watch)
            if paths is not None:
                paths.discard(path)
                if not paths:
                    del self._by_watch[found.watch]

    def _handler(self, key: Key, resource: Resource) -> Handler:
        def handle(event: str, obj: KubeObject) -> None:
            self._event(key, resource, event, obj)
        return handle

    def _lister(self, key: Key, resource: Resource) -> Listed:
        def listed(names: set[tuple[str, str]]) -> None:
            self._listed(key, resource, names)
        return listed

    def _secret_handler(self, key: Key) -> Handler:
        def handle(event: str, obj: KubeObject) -> None:
            self._secret_event(key, event, obj)
        return handle

    def _event(self, key: Key, resource: Resource, event: str, obj: KubeObject) -> None:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "") if resource.namespaced else ""
        if namespace and self._terminating(namespace):
            return
        name = str(meta.get("name", ""))
        path = (key[0], resource.object_path(name=name, namespace=namespace or None))
        with self._lock:
            found = self._objects.get(path)
            if found is None or found.watch != key:
                return  # not applied by a StageSet under this watch's identity
            owner = self._owners.get(found.owner)
            if owner is None:
                return
            if owner.busy:
                if len(owner.pending) < MAX_PENDING:
                    owner.pending.append((key, resource, event, obj))
                else:
                    owner.overflow = True
                return
            verdict = judge(event, obj, found.known)
            if verdict is not Verdict.DRIFT:
                return
            # One drift, one pass: what follows (status updates of the edited object) is judged
            # against the edited state.
            found.known = None if event == "DELETED" else fingerprint(obj)
            ref = found.owner
        what = f"{resource.kind} {namespace + '/' if namespace else ''}{name}"
        self._trigger(ref, why=f"{what} {'deleted or unlabelled' if event == 'DELETED' else 'changed'}")

    def _listed(self, key: Key, resource: Resource, names: set[tuple[str, str]]) -> None:
        """A (re)list of watch ``key`` found ``names``: every object registered there and not found
        was deleted (or unlabelled) while nothing watched."""
        with self._lock:
            gone = [self._objects[path] for path in self._by_watch.get(key, ())
                    if path in self._objects and self._objects[path].name not in names]
        for found in gone:
            namespace, name = found.name
            self._event(key, resource, "DELETED", {"metadata": {"namespace": namespace, "name": name}})

    def _secret_event(self, key: Key, event: str, obj: KubeObject) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        woken: list[Ref] = []
        with self._lock:
            for ref in self._users.get(key, ()):
                owner = self._owners.get(ref)
                if owner is None or owner.secret != key:
                    continue
                if event != "DELETED" and version and (version == owner.secret_version or (
                        version.isdigit() and owner.secret_version.isdigit()
                        and int(version) < int(owner.secret_version))):
                    continue
                owner.secret_version = version
                woken.append(ref)
        for ref in woken:
            self._trigger(ref, why="its kubeConfig Secret changed")

    def _trigger(self, ref: Ref, *, why: str) -> None:
        log.info("StageSet %s/%s: %s; reconciling now", ref[0], ref[1], why)
        self.triggered += 1
        if self._on_trigger is not None:
            self._on_trigger()
        self._enqueue(*ref)
