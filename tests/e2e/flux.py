"""Flux source objects for e2e tests: statuses written as source-controller writes them.

:func:`publish` serves a tarball on the loopback :class:`~tests.artifactserver.ArtifactServer` and
sets the source object's ``status`` (through the status subresource, as the admin — as
source-controller or an ExternalArtifact producer would): a ``Ready`` condition and
``artifact {url, digest, revision, path, lastUpdateTime, size}``.
"""

from __future__ import annotations

import datetime
from typing import Any

from stageset.kube.client import ApiError, KubeClient
from tests.artifactserver import ArtifactServer, digest_of, tarball

FLUX = "source.toolkit.fluxcd.io"
PLURALS = {"ExternalArtifact": "externalartifacts", "GitRepository": "gitrepositories",
           "OCIRepository": "ocirepositories", "Bucket": "buckets"}
SPECS: dict[str, dict[str, Any]] = {
    "ExternalArtifact": {},
    "OCIRepository": {"interval": "10m", "url": "oci://registry.invalid/app", "suspend": True},
    "Bucket": {"interval": "10m", "bucketName": "app", "endpoint": "minio.invalid", "suspend": True},
    "GitRepository": {"interval": "10m", "url": "https://git.invalid/app", "suspend": True},
}


def path(kind: str, namespace: str, name: str) -> str:
    return f"/apis/{FLUX}/v1/namespaces/{namespace}/{PLURALS[kind]}/{name}"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure(admin: KubeClient, kind: str, namespace: str, name: str, *,
           spec: dict[str, Any] | None = None) -> str:
    """The source object, created (suspended, so a running source-controller leaves it alone) if absent."""
    where = path(kind, namespace, name)
    try:
        admin.get(where)
    except ApiError as error:
        if not error.not_found:
            raise
        admin.apply(where, {"apiVersion": f"{FLUX}/v1", "kind": kind,
                            "metadata": {"name": name, "namespace": namespace},
                            "spec": spec if spec is not None else SPECS[kind]}, field_manager="e2e-flux")
    return where


def set_status(admin: KubeClient, where: str, *, ready: dict[str, str],
               artifact: dict[str, Any] | None) -> None:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "lastTransitionTime": now(), **ready}]}
    status["artifact"] = artifact
    admin.request("PATCH", f"{where}/status", content_type="application/merge-patch+json",
                  body={"status": status})


def publish(admin: KubeClient, server: ArtifactServer, kind: str, namespace: str, name: str, *,
            files: dict[str, str] | None = None, body: bytes | None = None, revision: str = "latest@sha256:1",
            digest: str | None = None, spec: dict[str, Any] | None = None, **route: Any) -> str:
    """Serve the artifact and write the status naming it; returns the object's path."""
    data = body if body is not None else tarball(files or {})
    file = f"{kind.lower()}/{namespace}/{name}/{digest_of(data)[7:23]}.tar.gz"
    url = server.publish(file, data, **route)
    where = ensure(admin, kind, namespace, name, spec=spec)
    set_status(admin, where, ready={"status": "True", "reason": "Succeeded", "message": "stored artifact"},
               artifact={"url": url, "digest": digest or digest_of(data), "revision": revision,
                         "path": file, "size": len(data), "lastUpdateTime": now()})
    return where
