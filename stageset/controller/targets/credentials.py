"""Where a remote cluster's credentials come from: the one seam every remote connection goes through.

A connection (:class:`~stageset.controller.targets.clusters.Target`) is made from
:class:`Credentials`: a kubeconfig and the key the connection is kept under.  The key names the
content (a rotated credential is a new connection; the old one ages out of the bounded cache) and
whatever else changes what the cluster answers.  Two sources today, one rule for both:

- a StageSet's ``spec.kubeConfig.secretRef`` — a Secret of the StageSet's own namespace, read **as
  the StageSet's identity** (:class:`KubeconfigSecret`; the caller binds the client: ``spec.
  serviceAccountName``), keyed ``<namespace>/<secret>#<digest>``;
- a platform StageTarget's ``spec.kubeConfig.secretRef`` — a Secret of a target namespace, read
  **as the controller** (:class:`~stageset.controller.targets.platform.PlatformTargets`), keyed
  ``target:<namespace>/<name>#<digest>``.

Both read the Secret through :func:`read_kubeconfig_secret`.  A new way to obtain credentials — a
kubeconfig without credentials in a ConfigMap and a token the controller requests for the tenant's
ServiceAccount (workload identity) — is one more :class:`CredentialSource`: it reads as the client
it is handed, returns :class:`Credentials` whose key also names the identity the token is for, and
:class:`~stageset.controller.targets.clusters.Targets` connects, caches, and finds it again after a
move (:meth:`CredentialSource.kept`) without knowing where it came from.

Identity: :class:`KubeconfigSecret` reads with the client handed in (the tenant's);
:func:`read_kubeconfig_secret` with whatever client its caller binds.  Nothing here reaches the
remote cluster.

Invariants: a kubeconfig's content is never logged, named in a message or an event, or written to
status — messages name the Secret and the key only; the digest in a key is of the content, never
the content.  A kubeconfig is accepted with inline data only (:mod:`stageset.kube.remote`).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Protocol

from stageset.api.common import SecretKeyRef
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.accounts import AccountCheck, read_named
from stageset.kube.client import ApiError, ClusterKey, KubeClient
from stageset.kube.types import KubeObject


@dataclass(frozen=True)
class Credentials:
    """A kubeconfig as read, and the connection it makes."""

    cluster: ClusterKey
    """The key its connection is kept under: one per content (:func:`content_key`)."""
    kubeconfig: bytes
    version: str = ""
    """The ``resourceVersion`` of the object it was read from ("" when unknown)."""


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
    """Where a StageSet's ``spec.kubeConfig`` credentials come from (:class:`KubeconfigSecret` today)."""

    def read(self, client: KubeClient, *, namespace: str, ref: SecretKeyRef) -> Credentials:
        """The credentials ``ref`` names in ``namespace``, read as ``client``'s identity; raises
        :class:`~stageset.apply.errors.StageError` naming what the user wrote."""
        ...

    def kept(self, *, namespace: str, ref: SecretKeyRef) -> str:
        """The prefix of the keys :meth:`read` gives for ``ref`` whatever its content: how a connection
        made through it is found again after its content changed (a move's previous cluster)."""
        ...


class KubeconfigSecret:
    """``spec.kubeConfig.secretRef``: a Secret of the StageSet's own namespace, read as its identity."""

    def __init__(self, *, accounts: AccountCheck | None = None):
        self._accounts = accounts

    def kept(self, *, namespace: str, ref: SecretKeyRef) -> str:
        return f"{namespace}/{ref.name}#"  # as read() keys it

    def read(self, client: KubeClient, *, namespace: str, ref: SecretKeyRef) -> Credentials:
        secret = read_named(client, f"/api/v1/namespaces/{namespace}/secrets/{ref.name}",
                            what=f"Secret {namespace}/{ref.name} (spec.kubeConfig)",
                            missing_reason=Reason.STAGE_FAILED,
                            missing_message=f"spec.kubeConfig: Secret {namespace}/{ref.name} not found",
                            accounts=self._accounts)
        try:
            raw, version = kubeconfig_of(secret, namespace=namespace, name=ref.name, key=ref.key)
        except SecretUnusable as error:
            raise StageError(Reason.INVALID_SPEC, f"spec.kubeConfig: {error}") from error
        return Credentials(cluster=content_key(f"{namespace}/{ref.name}", raw), kubeconfig=raw,
                           version=version)
