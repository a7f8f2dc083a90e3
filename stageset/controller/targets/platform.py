"""Platform targets: the clusters the platform registers as ``StageTarget`` objects, and which
StageSets may use each (``spec.targetRef``).

Identity: every read here is the controller's own — the StageTargets come from its watch of the
target namespaces (``--target-namespaces``), their kubeconfig Secrets (or workload-identity
ConfigMaps) are read with its own credentials (a Role in each target namespace grants it; no tenant
has any right there), and their changes come from its own metadata-only watches.  A tenant's
identity is never used to read a target, so a tenant needs no right on one and never sees its
credentials.  A workload-identity target (``kubeConfig.configMapRef``,
:mod:`~stageset.controller.targets.workload`): the controller requests, as itself, tokens for the
ConfigMap's ``serviceAccountName`` of the target namespace (the platform's identity there: discovery,
``/version``) and for each stage's own ServiceAccount — only of a namespace the target allows at
the time of the request — so every write there is the tenant's own federated identity, with no
impersonation.

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
    Federation,
    SecretUnusable,
    content_key,
    read_kubeconfig_secret,
)
from stageset.controller.targets.workload import LocalAudiences, bearers_for, digest
from stageset.kube.client import ApiError, ClusterKey, KubeClient
from stageset.kube.federation import WorkloadConfigError, parse_workload_config
from stageset.kube.tokens import Account, TokenRequester, TokenUnavailable
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
    """An allowed target whose credentials cannot be used now (a Secret not written yet, as while a
    vcluster is still exporting its kubeconfig; one refused; a cluster down): its owner sees why in
    its status.  The StageSet waits, and the target's own change wakes it."""
    return StageError(Reason.CLUSTER_UNREACHABLE,
                      f"spec.targetRef: StageTarget {target[0]}/{target[1]} is not ready: its cluster is not "
                      "available yet (its owner sees why in its status); nothing was sent; retrying")


SECRET, CONFIG_MAP = "Secret", "ConfigMap"


@dataclass(frozen=True)
class TargetSpec:
    """What the index keeps of a StageTarget: its Secret (and key) or ConfigMap, and the namespaces
    it allows."""

    secret: str
    key: str
    allowed: frozenset[str]
    kind: str = SECRET
    """``Secret`` (a kubeconfig under ``key``) or ``ConfigMap`` (workload identity; ``key`` unused)."""

    @property
    def source(self) -> tuple[str, str]:
        """The object read: (kind, name)."""
        return (self.kind, self.secret)


class WorkloadUnusable(ValueError):
    """A StageTarget's workload-identity ConfigMap cannot be used; the message names the key."""


@dataclass(frozen=True)
class Connection:
    """A target's current connection: the cluster key of its content, and the ``resourceVersion`` of
    the Secret (or ConfigMap) it was read at."""

    cluster: ClusterKey
    secret: tuple[str, str]
    secret_version: str
    kind: str = SECRET


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
    allowed = frozenset(target.spec.allowed_namespaces)
    config_map = target.spec.kube_config.config_map_ref
    if config_map is not None:
        return TargetSpec(secret=config_map.name, key="", allowed=allowed, kind=CONFIG_MAP)
    ref = target.spec.kube_config.secret_ref
    assert ref is not None
    return TargetSpec(secret=ref.name, key=ref.key, allowed=allowed)


class TargetWorkload:
    """What a workload-identity StageTarget needs: the controller's TokenRequests and this cluster's
    own audiences (refused there as in a StageSet's ConfigMap)."""

    def __init__(self, *, tokens: TokenRequester, audiences: LocalAudiences):
        self.tokens = tokens
        self.audiences = audiences


class PlatformTargets:
    def __init__(self, *, admin: KubeClient, namespaces: tuple[str, ...], kind: str = "StageTarget",
                 workload: TargetWorkload | None = None):
        self._admin = admin
        self.workload = workload
        """Workload identity (``kubeConfig.configMapRef``); ``None``: such targets are refused."""
        self._namespaces = frozenset(namespaces)
        self._kind = kind
        self._lock = threading.Lock()
        self._specs: dict[TargetName, TargetSpec] = {}
        self._secret_versions: dict[tuple[str, str, str], str] = {}
        """The watched ``resourceVersion`` of each (kind, namespace, name): Secrets and ConfigMaps."""
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

    def secret_changed(self, event: str, obj: KubeObject, *, kind: str = SECRET) -> list[ObjectKey]:
        """A Secret's (or with ``kind``, a ConfigMap's) metadata-only watch event in a target namespace:
        the StageTargets to reconcile (those naming it, when its ``resourceVersion`` moved)."""
        meta = obj.get("metadata") or {}
        namespace_, name_ = str(meta.get("namespace", "")), str(meta.get("name", ""))
        watched = (kind, namespace_, name_)
        version = "" if event == "DELETED" else str(meta.get("resourceVersion", ""))
        with self._lock:
            if self._secret_versions.get(watched) == version:
                return []
            if version:
                self._secret_versions[watched] = version
            else:
                self._secret_versions.pop(watched, None)
            return [ObjectKey(self._kind, namespace, name)
                    for (namespace, name), spec in sorted(self._specs.items())
                    if namespace == namespace_ and spec.source == (kind, name_)]

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
        except (SecretUnusable, ValueError, ApiError, TokenUnavailable) as error:
            raise not_ready(name) from error

    # -- the StageTarget reconciler -------------------------------------------------

    def refresh(self, name: TargetName, *, remotes: Remotes[T]) -> tuple[T, Connection]:
        """Read the target's Secret (or ConfigMap) now and connect (again, if its content changed): the
        StageTarget reconcile.  Raises :class:`SecretUnusable`, ``KubeconfigError``,
        :class:`WorkloadUnusable`, ``TokenUnavailable`` or ``ApiError``."""
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
            read = None if connection is None else (connection.kind, *connection.secret)
            if connection is None or read != (spec.kind, spec.secret, spec.key):
                return None
            watched = self._secret_versions.get((spec.kind, name[0], spec.secret))
        if watched is not None and newer(watched, than=connection.secret_version):
            return None  # the Secret changed since it was read
        return remotes.cached(connection.cluster)

    def _connected(self, name: TargetName, spec: TargetSpec, *, remotes: Remotes[T], fresh: bool) -> T:
        with self._one_at_a_time(name):
            if not fresh and (found := self._current(name, spec, remotes=remotes)) is not None:
                return found
            credentials = self._read_config_map(name, spec) if spec.kind == CONFIG_MAP \
                else self._read_secret(name, spec)
            cluster = credentials.cluster
            target = remotes.cached(cluster) or remotes.connect(credentials, name=f"{name[0]}/{name[1]}")
            with self._lock:
                if name in self._specs:  # not deleted meanwhile
                    self._connections[name] = Connection(cluster=cluster, secret=(spec.secret, spec.key),
                                                         secret_version=credentials.version, kind=spec.kind)
            return target

    def _read_secret(self, name: TargetName, spec: TargetSpec) -> Credentials:
        """The target's kubeconfig, read as the controller (:mod:`.credentials`)."""
        self.secret_reads += 1
        raw, version = read_kubeconfig_secret(self._admin, namespace=name[0], name=spec.secret, key=spec.key)
        return Credentials(cluster=content_key(f"target:{name[0]}/{name[1]}", raw), kubeconfig=raw,
                           version=version)

    def _read_config_map(self, name: TargetName, spec: TargetSpec) -> Credentials:
        """The target's workload-identity ConfigMap, read as the controller, and the platform account's
        first token (so a missing account is reported before anything connects)."""
        where = f"ConfigMap {name[0]}/{spec.secret}"
        if self.workload is None:
            raise WorkloadUnusable("configMapRef: workload identity is not enabled on this controller "
                                   "(--workload-identity; the chart's targets.workloadIdentity)")
        self.secret_reads += 1
        try:
            found = self._admin.get(f"/api/v1/namespaces/{name[0]}/configmaps/{spec.secret}")
        except ApiError as error:
            if error.not_found:
                raise SecretUnusable(f"{where} not found", missing=True) from error
            raise
        try:
            config = parse_workload_config(found.get("data"))
        except WorkloadConfigError as error:
            raise WorkloadUnusable(f"configMapRef: {where}: {error}") from error
        if config.service_account is None:
            raise WorkloadUnusable(f"configMapRef: {where}: key 'serviceAccountName' is missing: a "
                                   f"StageTarget's ConfigMap names the ServiceAccount of namespace {name[0]} "
                                   "whose token the controller's own requests there carry")
        if (local := self.workload.audiences.own(config.audiences)) is not None:
            raise WorkloadUnusable(f"configMapRef: {where}: the audience {local!r} is this cluster's own "
                                   "API audience; name the remote's audience")
        own = Account(name[0], config.service_account)
        self.workload.tokens.token(own, config.audiences)  # raises TokenUnavailable before connecting
        bearers = bearers_for(tokens=self.workload.tokens, config=config, own=own,
                              may_act=lambda namespace: self._allows(name, namespace),
                              scope=f"only ServiceAccounts of the namespaces StageTarget {name[0]}/{name[1]} "
                                    "allows may act there")
        version = str((found.get("metadata") or {}).get("resourceVersion", ""))
        return Credentials(cluster=ClusterKey(f"target:{name[0]}/{name[1]}#{digest(config)}"),
                           version=version, federation=Federation(config=config, bearers=bearers))

    def _allows(self, name: TargetName, namespace: str) -> bool:
        """Whether the target allows ``namespace`` now (asked at each token request)."""
        with self._lock:
            spec = self._specs.get(name)
        return spec is not None and namespace in spec.allowed
