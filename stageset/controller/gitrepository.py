"""The GitRepository reconciler: resolve the ref, fetch into the shared mirror, report the artifact.

Identity: the GitRepository's ``secretRef`` is read as its ``serviceAccountName``
(the controller's own identity when none is set — which, in multi-tenant mode,
has no Secret read and so fails closed).  Status is written as the controller.

When the remote is down or the ref vanishes, the last artifact stays in status and
in the mirror: StageSets keep applying what they last had.

Each commit is served to this GitRepository (by uid) only after the mirror proved it
readable with this GitRepository's own credentials, and StageSets read only commits served
to the GitRepository they name (:func:`artifact_consumer`; see :mod:`sources.mirror`).
"""

from __future__ import annotations

import base64
import logging
import random
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from sources import Credentials, MirrorStore, RefSelector, SourceError
from sources import errors as source_errors
from stageset.api import GitRepository, parse_duration
from stageset.controller.conditions import now
from stageset.controller.status import StatusReport, validation_message
from stageset.kube.client import ApiError, ClientPool, Identity
from stageset.kube.mapping import Resource

log = logging.getLogger(__name__)

# Called with (namespace, name, revision) when a GitRepository's artifact changes.
RevisionListener = Callable[[str, str, str], None]

_REASONS: list[tuple[type[Exception], str]] = [
    (source_errors.InvalidRefError, "InvalidSpec"),
    (source_errors.AuthenticationError, "AuthenticationFailed"),
    (source_errors.RefNotFoundError, "RefNotFound"),
    (source_errors.LimitExceededError, "LimitExceeded"),
    (source_errors.UrlPolicyError, "InvalidURL"),
    (source_errors.UnsafePathError, "UnsafePath"),
]


def artifact_consumer(metadata: dict[str, Any]) -> str:
    """Who a GitRepository's commits are served to in the shared mirror: this object (by
    uid), so a reader can only read what this GitRepository itself was served."""
    return f"{metadata['namespace']}/{metadata['name']}/{metadata.get('uid', '')}"


def _reason(error: SourceError) -> str:
    for kind, reason in _REASONS:
        if isinstance(error, kind):
            return reason
    return "GitOperationFailed"


def _raw(data: dict[str, str], key: str) -> bytes | None:
    value = data.get(key)
    return base64.b64decode(value) if value else None


def _decode(data: dict[str, str], key: str) -> str | None:
    value = _raw(data, key)
    return value.decode() if value is not None else None


class GitRepositoryReconciler:
    def __init__(self, *, clients: ClientPool, store: MirrorStore, resource: Resource,
                 on_revision: RevisionListener):
        self._clients = clients
        self._store = store
        self._resource = resource
        self._on_revision = on_revision

    def _credentials(self, repo: GitRepository, namespace: str) -> Credentials | None:
        if repo.spec.secret_ref is None:
            return None
        identity = (Identity.service_account(namespace=namespace, name=repo.spec.service_account_name)
                    if repo.spec.service_account_name else Identity())
        secret = self._clients.client(identity).get(
            f"/api/v1/namespaces/{namespace}/secrets/{repo.spec.secret_ref.name}")
        data: dict[str, str] = secret.get("data") or {}
        return Credentials(
            username=_decode(data, "username"),
            password=_decode(data, "password"),
            bearer_token=_decode(data, "bearerToken"),
            ca_pem=_raw(data, "caFile") or _raw(data, "ca.crt"),
            identity=_raw(data, "identity"),
            known_hosts=_raw(data, "known_hosts"),
        )

    def reconcile(self, raw: dict[str, Any]) -> float | None:
        """Returns seconds until the next poll."""
        metadata = raw["metadata"]
        namespace = metadata["namespace"]
        report = StatusReport(client=self._clients.client(), resource=self._resource, obj=raw)
        try:
            repo = GitRepository.model_validate(raw)
        except ValidationError as error:
            report.conclude(ready=False, reason="InvalidSpec", message=validation_message(error),
                            stalled=True)
            return None
        interval = parse_duration(repo.spec.interval).total_seconds()
        if repo.spec.suspend:
            report.conclude(ready=False, reason="Suspended", message="reconciliation is suspended")
            return None
        ref = repo.spec.ref
        try:
            selector = RefSelector(branch=ref.branch, tag=ref.tag, semver=ref.semver, name=ref.name,
                                   commit=ref.commit) if ref else RefSelector()
            credentials = self._credentials(repo, namespace)
            snapshot = self._store.fetch(repo.spec.url, ref=selector, credentials=credentials,
                                         timeout=parse_duration(repo.spec.timeout).total_seconds(),
                                         consumer=artifact_consumer(metadata))
        except ApiError as error:
            reason = "RBACDenied" if error.forbidden else "SecretNotFound" if error.not_found else "Failed"
            secret = repo.spec.secret_ref.name if repo.spec.secret_ref else ""
            report.conclude(ready=False, reason=reason,
                            message=f"reading secretRef {secret}: {error.message}")
            return interval
        except SourceError as error:
            # Keep status.artifact: dependents go on using the last good revision.
            reason = _reason(error)
            report.conclude(ready=False, reason=reason, message=str(error), stalled=reason == "InvalidSpec")
            return interval
        previous = (report.status.get("artifact") or {}).get("revision")
        if previous != snapshot.revision:
            # The root tree id is a content digest of the whole tree, for free.
            tree = self._store.tree_hash(repo.spec.url, commit=snapshot.commit, path="./")
            report.status["artifact"] = {"revision": snapshot.revision, "digest": f"sha1:{tree}",
                                         "lastUpdateTime": now()}
        report.conclude(ready=True, reason="Succeeded",
                        message=f"stored artifact for revision '{snapshot.revision}'")
        if previous != snapshot.revision or snapshot.fetched:
            # Also after a fetch of a known revision: a restarted controller's fresh mirror
            # now holds it, so StageSets waiting for the artifact can go on.
            self._on_revision(namespace, metadata["name"], snapshot.revision)
        return interval * random.uniform(0.9, 1.1)  # noqa: S311 - jitter, not crypto
