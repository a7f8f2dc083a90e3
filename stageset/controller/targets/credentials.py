"""Where a remote cluster's credentials come from: the one seam every remote connection goes through.

A connection (:class:`~stageset.controller.targets.clusters.Target`) is made from
:class:`Credentials`: a kubeconfig, or a workload-identity :class:`Federation` (the cluster's address
and CA, and whose tokens each identity's requests carry), and the key the connection is kept under.
The key names the content (a rotated credential is a new connection; the old one ages out of the
bounded cache) and whatever else changes what the cluster answers — for workload identity, the
ServiceAccount whose token discovery uses.  The sources:

- a StageSet's ``spec.kubeConfig.secretRef`` — a Secret of the StageSet's own namespace, read **as
  the StageSet's identity** (:class:`KubeconfigSecret`; the caller binds the client: ``spec.
  serviceAccountName``), keyed ``<namespace>/<secret>#<digest>``;
- a StageSet's ``spec.kubeConfig.configMapRef`` — a ConfigMap of its own namespace, read as the
  StageSet's identity, and tokens this cluster issues for the StageSet's ServiceAccounts
  (:class:`~stageset.controller.targets.workload.WorkloadIdentity`), keyed
  ``cm:<namespace>/<configmap>@<account>#<digest>``;
- a platform StageTarget's ``spec.kubeConfig`` (either kind) — read **as the controller**
  (:class:`~stageset.controller.targets.platform.PlatformTargets`), keyed
  ``target:<namespace>/<name>#<digest>``.

:class:`KubeConfigSources` hands a StageSet's ``spec.kubeConfig`` to the source of its kind.  A new
way to obtain credentials is one more :class:`CredentialSource`: it reads as the client it is
handed, returns :class:`Credentials`, and :class:`~stageset.controller.targets.clusters.Targets`
connects, caches, and finds it again after a move (:meth:`CredentialSource.kept`) without knowing
where it came from.

Identity: :class:`KubeconfigSecret` reads with the client handed in (the tenant's);
:func:`read_kubeconfig_secret` with whatever client its caller binds.  Nothing here reaches the
remote cluster.

Invariants: a kubeconfig's content (or a token) is never logged, named in a message or an event, or
written to status — messages name the Secret or ConfigMap and the key only; the digest in a key is
of the content, never the content.  A kubeconfig is accepted with inline data only
(:mod:`stageset.kube.remote`).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Protocol

from stageset.api.stageset import KubeConfigRef
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.accounts import AccountCheck, read_named
from stageset.kube.client import ApiError, BearerFor, ClusterKey, KubeClient
from stageset.kube.federation import WorkloadConfig
from stageset.kube.types import KubeObject


@dataclass(frozen=True)
class Federation:
    """A workload-identity cluster: its checked ConfigMap, and each identity's token there."""

    config: WorkloadConfig
    bearers: BearerFor
    """The token an identity's requests carry (a refusal for an identity that may not be used)."""


@dataclass(frozen=True)
class Credentials:
    """A kubeconfig as read (or a workload-identity cluster), and the connection it makes."""

    cluster: ClusterKey
    """The key its connection is kept under: one per content (:func:`content_key`)."""
    kubeconfig: bytes = b""
    version: str = ""
    """The ``resourceVersion`` of the object it was read from ("" when unknown)."""
    federation: Federation | None = None
    """Set for workload identity (then ``kubeconfig`` is empty): no credential is stored anywhere."""


def content_key(prefix: str, raw: bytes) -> ClusterKey:
    """``<prefix>#<16 hex of the content's sha256>``: equal content, one connection."""
    return ClusterKey(f"{prefix}#{hashlib.sha256(raw).hexdigest()[:16]}")


class SecretUnusable(Exception):
    """A kubeconfig Secret is missing or lacks its key; the message names which (never a value)."""

    def __init__(self, message: str, *, missing: bool):
        super().__init__(message)
        self.missing = missing


def kubeconfig_of(secret: KubeObject, *, namespace: str, name: str, key: str) -> tuple[bytes, str]:
    """The kubeconfig Secret ``namespace/name`` holds under ``key``, and its ``resourceVersion``; raises
    :class:`SecretUnusable` (``missing=False``) when it has no such key."""
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        raise SecretUnusable(f"Secret {namespace}/{name} has no key {key!r}", missing=False)
    return base64.b64decode(encoded), str((secret.get("metadata") or {}).get("resourceVersion", ""))


def read_kubeconfig_secret(client: KubeClient, *, namespace: str, name: str, key: str) -> tuple[bytes, str]:
    """The kubeconfig in Secret ``namespace/name`` under ``key``, and the Secret's ``resourceVersion``,
    read as ``client``'s identity.  Raises :class:`SecretUnusable` (missing, or no such key) or
    :class:`~stageset.kube.client.ApiError`."""
    try:
        secret = client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    except ApiError as error:
        if error.not_found:
            raise SecretUnusable(f"Secret {namespace}/{name} not found", missing=True) from error
        raise
    return kubeconfig_of(secret, namespace=namespace, name=name, key=key)


class CredentialSource(Protocol):
    """Where a StageSet's ``spec.kubeConfig`` credentials come from (:class:`KubeConfigSources`)."""

    def read(self, client: KubeClient, *, namespace: str, ref: KubeConfigRef) -> Credentials:
        """The credentials ``ref`` names in ``namespace``, read as ``client``'s identity (the
        StageSet's); raises :class:`~stageset.apply.errors.StageError` naming what the user wrote."""
        ...

    def kept(self, *, namespace: str, ref: KubeConfigRef) -> str:
        """The prefix of the keys :meth:`read` gives for ``ref`` whatever
        its content: how a connection made through it is found again after its content changed (a
        move's previous cluster)."""
        ...


class KubeconfigSecret:
    """``spec.kubeConfig.secretRef``: a Secret of the StageSet's own namespace, read as its identity."""

    def __init__(self, *, accounts: AccountCheck | None = None):
        self._accounts = accounts

    def kept(self, *, namespace: str, ref: KubeConfigRef) -> str:
        assert ref.secret_ref is not None
        return f"{namespace}/{ref.secret_ref.name}#"  # as read() keys it

    def read(self, client: KubeClient, *, namespace: str, ref: KubeConfigRef) -> Credentials:
        secret_ref = ref.secret_ref
        assert secret_ref is not None
        name = secret_ref.name
        secret = read_named(client, f"/api/v1/namespaces/{namespace}/secrets/{name}",
                            what=f"Secret {namespace}/{name} (spec.kubeConfig)",
                            missing_reason=Reason.STAGE_FAILED,
                            missing_message=f"spec.kubeConfig: Secret {namespace}/{name} not found",
                            accounts=self._accounts)
        try:
            raw, version = kubeconfig_of(secret, namespace=namespace, name=name, key=secret_ref.key)
        except SecretUnusable as error:
            raise StageError(Reason.INVALID_SPEC, f"spec.kubeConfig: {error}") from error
        return Credentials(cluster=content_key(f"{namespace}/{name}", raw), kubeconfig=raw, version=version)


class Unavailable:
    """A kind of ``spec.kubeConfig`` this process does not offer: refused before anything is read."""

    def __init__(self, message: str):
        self._message = message

    def kept(self, *, namespace: str, ref: KubeConfigRef) -> str:  # noqa: ARG002 - the same for every ref
        return "\0"  # no key starts with it: nothing is ever kept

    def read(self, client: KubeClient, *, namespace: str, ref: KubeConfigRef) -> Credentials:  # noqa: ARG002
        raise StageError(Reason.INVALID_SPEC, self._message)


WORKLOAD_IDENTITY_OFF = ("spec.kubeConfig.configMapRef: workload identity is not enabled on this controller; "
                         "the platform enables it with --workload-identity (the chart's "
                         "targets.workloadIdentity), or use spec.kubeConfig.secretRef")


class KubeConfigSources:
    """A StageSet's ``spec.kubeConfig`` handed to the source of its kind: ``secretRef`` to ``secrets``,
    ``configMapRef`` to ``config_maps`` (by default refused: workload identity is off)."""

    def __init__(self, *, secrets: CredentialSource, config_maps: CredentialSource | None = None):
        self._secrets = secrets
        self._config_maps = config_maps or Unavailable(WORKLOAD_IDENTITY_OFF)

    def _source(self, ref: KubeConfigRef) -> CredentialSource:
        return self._secrets if ref.secret_ref is not None else self._config_maps

    def read(self, client: KubeClient, *, namespace: str, ref: KubeConfigRef) -> Credentials:
        return self._source(ref).read(client, namespace=namespace, ref=ref)

    def kept(self, *, namespace: str, ref: KubeConfigRef) -> str:
        return self._source(ref).kept(namespace=namespace, ref=ref)
