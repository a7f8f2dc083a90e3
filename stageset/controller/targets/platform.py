"""Platform targets: the clusters the platform registers as ``StageTarget`` objects, and which
StageSets may use each (``spec.targetRef``).

Identity: every read here is the controller's own — the StageTargets come from its watch of the
target namespaces (``--target-namespaces``), their kubeconfig Secrets are read with its own
credentials (a Role in each target namespace grants it; no tenant has any right there), and the
Secrets' changes come from its own metadata-only watch.  A tenant's identity is never used to
read a target, so a tenant needs no right on one and never sees its credentials.

Invariants:

- One answer for every refusal: a StageSet whose ``targetRef`` names no StageTarget, one outside
  the target namespaces, or one that does not list the StageSet's namespace in
  ``allowedNamespaces`` gets the same :func:`unavailable` message, naming the target it asked for
  and its own namespace, never anything of the kubeconfig (its server URL included); nothing is
  sent to any remote cluster for it.  A tenant cannot tell a target that exists from one that
  does not.
- One connection per target: every StageSet on a target shares its :class:`Target` (one client
  per identity, one discovery).  The Secret is read again only when its watched
  ``resourceVersion`` moved, when the StageTarget is reconciled (:meth:`PlatformTargets.refresh`),
  or when the bounded cache of remotes dropped the connection.
- A kubeconfig whose content changed is a new connection (a new cluster key); its
  :attr:`Target.id` is :func:`stageset.kube.remote.cluster_id` (server URL and CA fingerprint), so
  a rotated credential keeps the id and a Secret that names another cluster changes it (what
  re-targeting compares).  The old connection is not closed here: it ages out of the bounded cache.
- ``allowedNamespaces`` is read from the watch cache at each use: a namespace withdrawn is refused
  at its StageSets' next pass (the StageTarget's change wakes them), and nothing is deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pydantic import ValidationError

from stageset.api import StageSet, StageTarget
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.keys import ObjectKey
from stageset.controller.setup import Event
from stageset.controller.targets.credentials import (
    Credentials,
    SecretUnusable,
    content_key,
    read_kubeconfig_secret,
)
from stageset.kube.client import ApiError, ClusterKey, KubeClient
from stageset.kube.types import KubeObject

TargetName = tuple[str, str]
"""A StageTarget, as (namespace, name)."""


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Remotes(Protocol[T_co]):
    """The bounded cache of remote clusters (:class:`~stageset.controller.targets.clusters.Targets`,
    whose :class:`~stageset.controller.targets.clusters.Target` is ``T_co``), handed in by the caller:
    this registry sits below it."""

    def cached(self, cluster: ClusterKey) -> T_co | None: ...

    def connect(self, credentials: Credentials, *, name: str = "") -> T_co: ...


def unavailable(*, target: TargetName, namespace: str) -> StageError:
    """The one refusal of a ``targetRef``: the same words whether the target is missing, outside the
    target namespaces, or does not allow ``namespace`` (never the server or the kubeconfig)."""
    return StageError(Reason.TARGET_NOT_AVAILABLE,
                      f"spec.targetRef: StageTarget {target[0]}/{target[1]} is not available to namespace "
                      f"{namespace} (it does not exist, or its owner does not allow this namespace); "
                      "nothing was sent to any cluster")


def not_ready(target: TargetName) -> StageError:
    """An allowed target whose kubeconfig cannot be used now: its owner sees why in its status."""
    return StageError(Reason.CLUSTER_UNREACHABLE,
                      f"spec.targetRef: StageTarget {target[0]}/{target[1]} is not ready (its owner sees why "
                      "in its status); retrying")


@dataclass(frozen=True)
class TargetSpec:
    """What the index keeps of a StageTarget: its Secret and the namespaces it allows."""

    secret: str
    key: str
    allowed: frozenset[str]


@dataclass(frozen=True)
class Connection:
    """A target's current connection: the cluster key of its kubeconfig content, and the Secret's
    ``resourceVersion`` it was read at."""

    cluster: ClusterKey
    secret: tuple[str, str]
    secret_version: str


def newer(version: str, *, than: str) -> bool:
    """Whether the watch saw a Secret version after the one read (etcd's versions are numbers; any
    other change of an opaque one counts as newer)."""
    if version.isdigit() and than.isdigit():
        return int(version) > int(than)
    return version != than


def spec_of(obj: KubeObject) -> TargetSpec | None:
    """A StageTarget's spec, or ``None`` when it does not parse (refused like a missing one)."""
    try:
        target = StageTarget.model_validate({**obj, "status": None})
    except ValidationError:
        return None
    ref = target.spec.kube_config.secret_ref
    return TargetSpec(secret=ref.name, key=ref.key, allowed=frozenset(target.spec.allowed_namespaces))


class PlatformTargets:
    def __init__(self, *, admin: KubeClient, namespaces: tuple[str, ...], kind: str = "StageTarget"):
        self._admin = admin
        self._namespaces = frozenset(namespaces)
        self._kind = kind
        self._lock = threading.Lock()
        self._specs: dict[TargetName, TargetSpec] = {}
        self._secret_versions: dict[tuple[str, str], str] = {}
        self._connections: dict[TargetName, Connection] = {}
        self._connecting: dict[TargetName, threading.Lock] = {}
        self.secret_reads = 0
        """Kubeconfig Secrets read so far (tests and the bench count them)."""

    # -- the watches --------------------------------------------------------------

    def observe(self, event: Event, key: ObjectKey, obj: KubeObject) -> None:
        """A StageTarget's watch event (the StageTarget controller's index hook): its spec, kept for
        every StageSet's check; only the target namespaces' ever arrive."""
        name = (key.namespace, key.name)
        spec = None if event is Event.DELETED or key.namespace not in self._namespaces else spec_of(obj)
        with self._lock:
            if spec is None:
                self._specs.pop(name, None)
                self._connections.pop(name, None)
            else:
                self._specs[name] = spec

    def secret_changed(self, event: str, obj: KubeObject) -> list[ObjectKey]:
        """A Secret's metadata-only watch event in a target namespace: the StageTargets to reconcile
        (those naming it, when its ``resourceVersion`` moved)."""
        meta = obj.get("metadata") or {}
        secret = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        version = "" if event == "DELETED" else str(meta.get("resourceVersion", ""))
        with self._lock:
            if self._secret_versions.get(secret) == version:
                return []
            if version:
                self._secret_versions[secret] = version
            else:
                self._secret_versions.pop(secret, None)
            return [ObjectKey(self._kind, namespace, name)
                    for (namespace, name), spec in sorted(self._specs.items())
                    if namespace == secret[0] and spec.secret == secret[1]]

    # -- StageSets ----------------------------------------------------------------

    def target(self, stageset: StageSet, *, remotes: Remotes[T]) -> T:
        """The cluster ``stageset.spec.targetRef`` names, or :class:`StageError` (:func:`unavailable`
        for every refusal, before any request)."""
        ref = stageset.spec.target_ref
        assert ref is not None
        name, namespace = (ref.namespace, ref.name), str(stageset.metadata["namespace"])
        with self._lock:
            spec = self._specs.get(name)
        if ref.namespace not in self._namespaces or spec is None or namespace not in spec.allowed:
            raise unavailable(target=name, namespace=namespace)
        try:
            return self._connected(name, spec, remotes=remotes, fresh=False)
        except (SecretUnusable, ValueError, ApiError) as error:
            raise not_ready(name) from error

    # -- the StageTarget reconciler -------------------------------------------------

    def refresh(self, name: TargetName, *, remotes: Remotes[T]) -> tuple[T, Connection]:
        """Read the target's Secret now and connect (again, if its content changed): the StageTarget
        reconcile.  Raises :class:`SecretUnusable`, ``KubeconfigError`` or ``ApiError``."""
        with self._lock:
            spec = self._specs.get(name)
        if spec is None:
            raise SecretUnusable(f"StageTarget {name[0]}/{name[1]} is not in the watch cache", missing=True)
        target = self._connected(name, spec, remotes=remotes, fresh=True)
        with self._lock:
            return target, self._connections[name]

    # -- connecting -----------------------------------------------------------------

    @contextmanager
    def _one_at_a_time(self, name: TargetName) -> Iterator[None]:
        """One connect per target at once (the others wait and share it); other targets go on."""
        with self._lock:
            lock = self._connecting.setdefault(name, threading.Lock())
        with lock:
            yield

    def _current(self, name: TargetName, spec: TargetSpec, *, remotes: Remotes[T]) -> T | None:
        with self._lock:
            connection = self._connections.get(name)
            if connection is None or connection.secret != (spec.secret, spec.key):
                return None
            watched = self._secret_versions.get((name[0], spec.secret))
        if watched is not None and newer(watched, than=connection.secret_version):
            return None  # the Secret changed since it was read
        return remotes.cached(connection.cluster)

    def _connected(self, name: TargetName, spec: TargetSpec, *, remotes: Remotes[T], fresh: bool) -> T:
        with self._one_at_a_time(name):
            if not fresh and (found := self._current(name, spec, remotes=remotes)) is not None:
                return found
            credentials = self._read_secret(name, spec)
            cluster = credentials.cluster
            target = remotes.cached(cluster) or remotes.connect(credentials, name=f"{name[0]}/{name[1]}")
            with self._lock:
                if name in self._specs:  # not deleted meanwhile
                    self._connections[name] = Connection(cluster=cluster, secret=(spec.secret, spec.key),
                                                         secret_version=credentials.version)
            return target

    def _read_secret(self, name: TargetName, spec: TargetSpec) -> Credentials:
        """The target's kubeconfig, read as the controller (:mod:`.credentials`)."""
        self.secret_reads += 1
        raw, version = read_kubeconfig_secret(self._admin, namespace=name[0], name=spec.secret, key=spec.key)
        return Credentials(cluster=content_key(f"target:{name[0]}/{name[1]}", raw), kubeconfig=raw,
                           version=version)
