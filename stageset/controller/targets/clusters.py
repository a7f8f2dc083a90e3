"""The cluster a StageSet applies to: this one, the one its ``spec.kubeConfig`` names, or the
platform's StageTarget its ``spec.targetRef`` names.  The face of :mod:`stageset.controller.targets`:
what a StageSet pass asks of its clusters.

Identity: the kubeConfig Secret (or workload-identity ConfigMap) is read from this cluster as the
StageSet's identity (``spec.serviceAccountName``) through the credential seam
(:class:`~stageset.controller.targets.credentials.CredentialSource`); a StageTarget and its Secret
or ConfigMap are read as the controller itself, never as the tenant
(:mod:`~stageset.controller.targets.platform`).  Requests to a kubeconfig's remote use its
credentials, impersonating the stage's ServiceAccount there exactly as here; discovery there uses
the kubeconfig's own identity.  Requests to a workload-identity remote carry a token this cluster
issued for the ServiceAccount each is made as, and no impersonation header (the client pool adds
the token per identity: :mod:`~stageset.controller.targets.workload`).  A kubeconfig is only ever
accepted with inline data (:mod:`stageset.kube.remote`): no commands, files or proxies.

One :class:`Target` (client configuration and discovery cache) per kubeconfig content, shared by
every StageSet using it, at most ``capacity`` of them (``--max-remote-targets``, default
:data:`MAX_REMOTES`): the least recently used is dropped (with its clients) past that, and built
again — the Secret read, discovery run — when a StageSet uses it next.  A rotated kubeconfig is
new content, so the old one ages out instead of staying forever.

:meth:`Targets.previous` finds the cluster a stage was applied on before a move (by the target id
and kubeConfig Secret or ConfigMap its inventory or record names): this cluster, a cached remote
reached through that same Secret (or ConfigMap) of the same namespace, or through that same
StageTarget (so a Secret whose content now names another cluster still reaches the old one while its
connection is kept), or the Secret (ConfigMap) read again — and only if it still names that cluster.
Never another namespace's Secret, ConfigMap or credentials: a record a tenant could edit names only
objects of its own namespace, read as its own identity.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from stageset.api import THIS_CLUSTER, AppliedTarget, StageSet
from stageset.api.stageset import KubeConfigRef
from stageset.api.vocabulary import Reason
from stageset.apply.engine import StageApplier
from stageset.apply.errors import StageError
from stageset.apply.prune import ClientFor
from stageset.apply.settings import ApplySettings
from stageset.controller.accounts import AccountCheck
from stageset.controller.identity import IdentityPolicy
from stageset.controller.targets.credentials import (
    Credentials,
    CredentialSource,
    KubeconfigSecret,
    KubeConfigSources,
)
from stageset.controller.targets.platform import PlatformTargets, unavailable
from stageset.kube.client import LOCAL, ClientPool, ClusterKey, Identity, KubeClient
from stageset.kube.federation import federated_remote
from stageset.kube.mapping import RestMapper
from stageset.kube.remote import KubeconfigError, parse_remote_kubeconfig

# The target id of the cluster the controller runs in.
LOCAL_TARGET = THIS_CLUSTER

# Remote clusters (distinct kubeconfig contents) kept at once by default (``--max-remote-targets``):
# discovery of each is cached.
MAX_REMOTES = 64
MAX_SECRETS_READ = 100_000
"""kubeConfig Secrets whose read version is remembered (least recently read out first)."""


def credential_object(namespace: str, ref: KubeConfigRef) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of the object ``spec.kubeConfig`` names: its Secret, or its ConfigMap."""
    if ref.secret_ref is not None:
        return "Secret", namespace, ref.secret_ref.name
    if ref.config_map_ref is not None:
        return "ConfigMap", namespace, ref.config_map_ref.name
    return None


def where(target: str, *, stage_target: str = "") -> str:
    """A target id as messages name it: its server URL, or "this cluster" — never a credential; a
    platform StageTarget (``stage_target``: ``namespace/name``) by its name only (its server is the
    platform's, not the tenant's to read)."""
    if stage_target:
        return f"StageTarget {stage_target}"
    return "this cluster" if target == LOCAL_TARGET else target.partition("#")[0]


def named(applied: AppliedTarget | None) -> str:
    """Where an inventory was applied, as messages name it (:func:`where`)."""
    if applied is None:
        return where(LOCAL_TARGET)
    ref = applied.target_ref
    return where(applied.id, stage_target=f"{ref.namespace}/{ref.name}" if ref is not None else "")


@dataclass(frozen=True)
class Target:
    """A cluster, and the apply engine bound to its discovery."""

    cluster: ClusterKey
    applier: StageApplier
    server: str = ""
    """The remote's URL (empty for this cluster), for messages."""
    id: str = LOCAL_TARGET
    """Which cluster, stably (:func:`stageset.kube.remote.cluster_id`; :data:`LOCAL_TARGET` for this one):
    what an inventory records it was applied on, so a changed target is seen as a move."""
    name: str = ""
    """The platform StageTarget (``namespace/name``) this cluster is, if it is one."""

    @property
    def remote(self) -> bool:
        return self.cluster != LOCAL

    @property
    def named(self) -> str:
        """This cluster as move events name it (:func:`where`)."""
        return where(self.id, stage_target=self.name)

    @property
    def where(self) -> str:
        """The cluster as a tenant's messages name it: a StageTarget by its name only (its server is
        the platform's), a kubeConfig by its server."""
        if self.name:
            return f"spec.targetRef: the cluster of StageTarget {self.name}"
        return f"spec.kubeConfig: the cluster at {self.server}"


def reached_through(applied: AppliedTarget) -> KubeConfigRef | None:
    """The ``spec.kubeConfig`` an inventory's remote was reached through (``None``: none recorded)."""
    if applied.kube_config is not None:
        return KubeConfigRef(secret_ref=applied.kube_config)
    if applied.config_map_ref is not None:
        return KubeConfigRef(config_map_ref=applied.config_map_ref)
    return None


def inventory_clients(*, clients: ClientPool, identities: IdentityPolicy, namespace: str, target: Target
                      ) -> ClientFor:
    """The client for the identity an inventory records, on ``target`` (prune, rebuild, teardown);
    ``None`` where that identity may no longer be used (:meth:`IdentityPolicy.for_inventory`)."""
    def client_for(account: str | None) -> KubeClient | None:
        identity = identities.for_inventory(account, namespace)
        return None if identity is None else clients.client(identity, target.cluster)
    return client_for


class Targets:
    def __init__(self, *, clients: ClientPool, settings: ApplySettings, local: StageApplier,
                 accounts: AccountCheck | None = None, capacity: int = MAX_REMOTES,
                 platform: PlatformTargets | None = None, credentials: CredentialSource | None = None):
        self._clients = clients
        self.platform = platform
        # How spec.kubeConfig is read (as the StageSet's identity): the seam a new credential plugs into.
        # By default a Secret's kubeconfig only (configMapRef refused: workload identity is off).
        self._credentials = credentials or KubeConfigSources(secrets=KubeconfigSecret(accounts=accounts))
        self._settings = settings
        self._capacity = capacity
        self.local = Target(LOCAL, local)
        self._remotes: OrderedDict[ClusterKey, Target] = OrderedDict()
        self._lock = threading.Lock()
        # The resourceVersion each spec.kubeConfig Secret (or ConfigMap) was last read at (the drift
        # watches watch it from there: a rotation queues its StageSets).  One entry per object, bounded.
        self._read: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._remotes)

    def resolve(self, client: KubeClient, stageset: StageSet) -> Target:
        """``client`` is bound to the StageSet's identity (it reads the kubeConfig Secret)."""
        ref = stageset.spec.kube_config
        if ref is None:
            return self.local
        return self.reach(client, namespace=str(stageset.metadata["namespace"]), ref=ref)

    def credential_version(self, namespace: str, ref: KubeConfigRef) -> str:
        """The ``resourceVersion`` the object ``spec.kubeConfig`` names in ``namespace`` (its Secret, or
        its ConfigMap) was last read at ("": unknown)."""
        read = credential_object(namespace, ref)
        with self._lock:
            return self._read.get(read, "") if read is not None else ""

    def previous(self, client: KubeClient, *, stageset: StageSet, applied: AppliedTarget | None) -> Target:
        """The cluster a stage was applied on before a move (see the module docstring); raises
        :class:`StageError` (``ClusterUnreachable``) when it can no longer be reached.  A platform
        StageTarget is reached as ``spec.targetRef`` is (read as the controller, only while it still
        allows the StageSet's namespace)."""
        if applied is None or applied.id == LOCAL_TARGET:
            return self.local
        namespace = str(stageset.metadata["namespace"])
        server = applied.id.partition("#")[0]
        if applied.target_ref is not None:
            spec = stageset.spec.model_copy(update={"target_ref": applied.target_ref, "kube_config": None})
            # Still allowed to this namespace (read as the controller), or refused here.
            found = self.for_target_ref(stageset.model_copy(update={"spec": spec}))
            if found.id == applied.id:
                return found
            # The platform pointed the target's Secret at another cluster: the old one is reached
            # through the connection still kept for that same StageTarget, while it is kept.
            kept = self._kept(f"target:{applied.target_ref.namespace}/{applied.target_ref.name}#", applied.id)
            if kept is not None:
                return kept
            raise StageError(Reason.CLUSTER_UNREACHABLE,
                             f"StageTarget {applied.target_ref.namespace}/{applied.target_ref.name} now "
                             "names another cluster, and no connection to the one before is left")
        ref = reached_through(applied)
        if ref is None:
            raise StageError(Reason.CLUSTER_UNREACHABLE,
                             f"the cluster at {server}: no kubeConfig Secret or ConfigMap recorded")
        cached = self._kept(self._credentials.kept(namespace=namespace, ref=ref), applied.id)
        if cached is not None:
            return cached
        target = self.reach(client, namespace=namespace, ref=ref)
        if target.id != applied.id:
            holder = f"Secret {namespace}/{ref.secret_ref.name}" if ref.secret_ref is not None else \
                f"ConfigMap {namespace}/{ref.config_map_ref.name}" if ref.config_map_ref is not None else "it"
            raise StageError(Reason.CLUSTER_UNREACHABLE,
                             f"the cluster at {server}: {holder} now names another cluster, and no "
                             "credentials for it are left")
        return target

    def _kept(self, prefix: str, cluster_id: str) -> Target | None:
        """The most recently used connection kept under a key starting with ``prefix`` (one Secret, or
        one StageTarget) to the cluster ``cluster_id``."""
        with self._lock:
            return next((t for key, t in reversed(self._remotes.items())
                         if key.name.startswith(prefix) and t.id == cluster_id), None)

    def reach(self, client: KubeClient, *, namespace: str, ref: KubeConfigRef) -> Target:
        """The cluster ``spec.kubeConfig`` ``ref`` names in ``namespace`` (read as ``client``'s identity)."""
        credentials = self._credentials.read(client, namespace=namespace, ref=ref)
        read = credential_object(namespace, ref)
        if credentials.version and read is not None:
            with self._lock:
                self._read[read] = credentials.version
                self._read.move_to_end(read)
                while len(self._read) > MAX_SECRETS_READ:
                    self._read.popitem(last=False)
        if (found := self.cached(credentials.cluster)) is not None:
            return found
        try:
            return self.connect(credentials)
        except KubeconfigError as error:
            raise StageError(Reason.INVALID_SPEC, f"spec.kubeConfig: {error}") from error

    def for_target_ref(self, stageset: StageSet) -> Target:
        """The platform target ``spec.targetRef`` names (read as the controller), or :class:`StageError`:
        the same refusal for a missing, foreign or disallowed target when targets are off too."""
        ref = stageset.spec.target_ref
        assert ref is not None
        if self.platform is None:
            raise unavailable(target=(ref.namespace, ref.name), namespace=str(stageset.metadata["namespace"]))
        return self.platform.target(stageset, remotes=self)

    def cached(self, cluster: ClusterKey) -> Target | None:
        """The connected cluster of this key (now the most recently used), if it is still kept."""
        with self._lock:
            found = self._remotes.get(cluster)
            if found is not None:
                self._remotes.move_to_end(cluster)
            return found

    def connect(self, credentials: Credentials, *, name: str = "") -> Target:
        """Connect to ``credentials`` under their key (one key per content; the one already connected
        if another thread was first); raises :class:`KubeconfigError`.  No request is made: discovery
        runs when a stage first resolves a kind.  ``name``: the platform StageTarget it is."""
        cluster, raw, federation = credentials.cluster, credentials.kubeconfig, credentials.federation
        with self._lock:
            found = self._remotes.get(cluster)
            if found is not None:
                self._remotes.move_to_end(cluster)
                return found
            if federation is not None:  # workload identity: each identity's own token, no impersonation
                remote = federated_remote(federation.config)
                self._clients.register(cluster, remote.configuration, bearers=federation.bearers)
            else:
                remote = parse_remote_kubeconfig(raw)
                self._clients.register(cluster, remote.configuration)
            discovery = self._clients.client(Identity(), cluster)
            target = Target(cluster, StageApplier(mapper=RestMapper(discovery), settings=self._settings,
                                                  versions=self.local.applier.versions,
                                                  rights=self.local.applier.rights),
                            server=remote.server, id=remote.cluster_id, name=name)
            self._remotes[cluster] = target
            while len(self._remotes) > self._capacity:
                evicted, _ = self._remotes.popitem(last=False)
                self._clients.forget(evicted)
            return target
