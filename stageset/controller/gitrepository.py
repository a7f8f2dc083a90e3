"""The GitRepository reconciler: resolve the ref, fetch into the shared mirror, report the artifact.

Identity: the GitRepository's ``secretRef`` is read as its ``serviceAccountName`` (see
:mod:`stageset.controller.identity`: without one, only single-tenant mode reads it as the
controller; multi-tenant mode fails closed with ``RBACDenied``).  Status is written as the
controller.

Status is written by one :class:`~stageset.controller.status.StatusWriter` per reconcile, on
a copy of the object handed over (the watch cache's objects are read-only).

When the remote is down or the ref vanishes, the last artifact stays in status and
in the mirror: StageSets keep applying what they last had.

Each commit is served to this GitRepository (by uid) only after the mirror proved it
readable with this GitRepository's own credentials, and StageSets read only commits served
to the GitRepository they name (:func:`artifact_consumer`; see :mod:`sources.mirror`).

What requeues a GitRepository: :meth:`GitRepositoryReconciler.controller` (declared to the
manager by :func:`setup`, :mod:`stageset.controller.setup`).

Each fetch is counted and timed per URL as shown without credentials (metrics), a new
revision is told as a ``NewArtifact`` event, and failures are logged (the source layer's
messages name the URL without credentials; the log filter redacts the Secret's values too).
"""

from __future__ import annotations

import base64
import copy
import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

from pydantic import ValidationError

from sources import Credentials, RefSelector, Snapshot, SourceError
from sources import errors as source_errors
from sources.urls import UrlPolicy, parse_url
from stageset.api import Artifact, GitRepository, GitRepositoryStatus, duration_seconds
from stageset.api.vocabulary import EventReason, Reason
from stageset.apply.errors import StageError
from stageset.controller import logs
from stageset.controller.clock import Clock, system_clock
from stageset.controller.consumers import artifact_consumer as artifact_consumer  # re-exported
from stageset.controller.events import EventRecorder, ReadyWarnings, normal
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES
from stageset.controller.metrics import Metrics
from stageset.controller.redact import REGISTRY, Redactor
from stageset.controller.result import Result, TerminalError
from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL
from stageset.controller.setup import Controller, Setup, reconcile_trigger
from stageset.controller.shared import Shared
from stageset.controller.status import StatusWriter, WriteListener, validation_message
from stageset.kube.client import ApiError, ClientPool
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

# Called with (namespace, name, revision) when a GitRepository's artifact changes.
RevisionListener = Callable[[str, str, str], None]

_REASONS: list[tuple[type[Exception], Reason]] = [
    (source_errors.InvalidRefError, Reason.INVALID_SPEC),
    (source_errors.AuthenticationError, Reason.AUTHENTICATION_FAILED),
    (source_errors.RefNotFoundError, Reason.REF_NOT_FOUND),
    (source_errors.LimitExceededError, Reason.LIMIT_EXCEEDED),
    (source_errors.UrlPolicyError, Reason.INVALID_URL),
    (source_errors.UnsafePathError, Reason.UNSAFE_PATH),
]


class Fetcher(Protocol):
    """What this reconciler needs of the Git mirror (:class:`sources.MirrorStore`)."""

    def fetch(self, url: str, *, ref: RefSelector | None = None, credentials: Credentials | None = None,
              timeout: float = 60.0, consumer: str | None = None) -> Snapshot: ...

    def tree_hash(self, url: str, *, commit: str, path: str = "./") -> str: ...


def source_reason(error: SourceError) -> Reason:
    for kind, reason in _REASONS:
        if isinstance(error, kind):
            return reason
    return Reason.GIT_OPERATION_FAILED


def _raw(data: dict[str, str], key: str) -> bytes | None:
    value = data.get(key)
    return base64.b64decode(value) if value else None


def _decode(data: dict[str, str], key: str) -> str | None:
    value = _raw(data, key)
    return value.decode() if value is not None else None


def credentials_from(data: dict[str, str]) -> Credentials:
    """Git credentials from a ``secretRef`` Secret's (base64) data, as Flux reads them."""
    return Credentials(
        username=_decode(data, "username"),
        password=_decode(data, "password"),
        bearer_token=_decode(data, "bearerToken"),
        ca_pem=_raw(data, "caFile") or _raw(data, "ca.crt"),
        identity=_raw(data, "identity"),
        known_hosts=_raw(data, "known_hosts"),
    )


def secret_values(data: dict[str, str]) -> list[str]:
    """The values of a ``secretRef`` Secret that must never appear in a message."""
    return [v for v in (_decode(data, key) for key in ("password", "bearerToken")) if v]


def display_url(url: str) -> str:
    """The URL as messages and metrics show it: no userinfo, query or fragment."""
    try:
        return parse_url(url, UrlPolicy(allow_http=True, allow_file=True)).display
    except SourceError:
        return "invalid"


class GitRepositoryReconciler:
    def __init__(self, *, clients: ClientPool, store: Fetcher, resource: Resource,
                 on_revision: RevisionListener, identities: IdentityPolicy, clock: Clock = system_clock,
                 events: EventRecorder | None = None, metrics: Metrics | None = None,
                 runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL, on_write: WriteListener | None = None):
        self._clients = clients
        self._on_write = on_write
        self._runbooks = runbook_base_url
        self._store = store
        self._resource = resource
        self._on_revision = on_revision
        self._identities = identities
        self._clock = clock
        self._events = events
        self._metrics = metrics

    def controller(self, *, workers: int) -> Controller:
        """What this reconciler watches (its ``SetupWithManager``): its own kind only — a new
        generation, a ``requestedAt`` or a deletion requeues a GitRepository; a status write does
        not.  The StageSets naming one are woken by the StageSet reconciler's watch of this kind.  A
        Ready that turns ``False`` is told as a Warning (:class:`ReadyWarnings`)."""
        return Controller(resource=self._resource, reconciler=self, workers=workers,
                          trigger=reconcile_trigger,
                          transitions=None if self._events is None else ReadyWarnings(self._events))

    def _credentials(self, repo: GitRepository, redactor: Redactor) -> Credentials | None:
        if repo.spec.secret_ref is None:
            return None
        namespace = str(repo.metadata["namespace"])
        secret = self._clients.client(self._identities.for_gitrepository(repo)).get(
            f"/api/v1/namespaces/{namespace}/secrets/{repo.spec.secret_ref.name}")
        data: dict[str, str] = secret.get("data") or {}
        # A server or a library may echo a credential in an error: it never reaches status or logs.
        redactor.add(secret_values(data))
        REGISTRY.set(("GitRepository", namespace, repo.metadata["name"]), redactor.values)
        return credentials_from(data)

    def reconcile(self, raw: KubeObject) -> Result:
        """Fetch the ref; returns when to poll again (``raw``, from the watch cache: read, never changed)."""
        raw = copy.deepcopy(raw)
        meta = raw["metadata"]
        redactor = Redactor(REGISTRY.of(("GitRepository", meta["namespace"], meta["name"])))
        try:
            report = StatusWriter(client=self._clients.client(), resource=self._resource, obj=raw,
                                  model=GitRepositoryStatus, clock=self._clock, redact=redactor,
                                  runbook_base_url=self._runbooks, on_write=self._on_write)
        except ValidationError as error:
            raise TerminalError(f"cannot read the GitRepository's status ({validation_message(error)})") \
                from error
        try:
            repo = GitRepository.model_validate({**raw, "status": None})
        except ValidationError as error:
            report.conclude(ready=False, reason=Reason.INVALID_SPEC, message=validation_message(error),
                            stalled=True)
            return Result()
        if repo.spec.suspend:
            report.conclude(ready=False, reason=Reason.SUSPENDED, message="reconciliation is suspended")
            return Result()
        interval = duration_seconds(repo.spec.interval)
        snapshot = self._fetch(repo, report, redactor)
        if snapshot is None:
            # Retried with the key's backoff (a flapping server is fetched again within seconds,
            # a dead one less and less often), never later than the interval.
            return Result(backoff=True, requeue_after=interval)
        with logs.bind(revision=snapshot.revision):
            return self._store_artifact(raw, repo, snapshot, report, redactor, interval)

    def _store_artifact(self, raw: KubeObject, repo: GitRepository, snapshot: Snapshot,
                        report: StatusWriter[GitRepositoryStatus], redactor: Redactor, interval: float
                        ) -> Result:
        status = report.status
        previous = status.artifact.revision if status.artifact else None
        if previous != snapshot.revision:
            # The root tree id is a content digest of the whole tree, for free.
            tree = self._store.tree_hash(repo.spec.url, commit=snapshot.commit, path="./")
            status = status.model_copy(update={"artifact": Artifact(
                revision=snapshot.revision, digest=f"sha1:{tree}", last_update_time=report.now())})
        report.conclude(ready=True, reason=Reason.SUCCEEDED,
                        message=f"stored artifact for revision '{snapshot.revision}'", status=status)
        if previous != snapshot.revision and self._events is not None:
            self._events.emit(normal(raw, EventReason.NEW_ARTIFACT,
                                     f"stored artifact for revision '{snapshot.revision}'", action="Fetch",
                                     redact=redactor))
        if previous != snapshot.revision or snapshot.fetched:
            # Also after a fetch of a known revision: a restarted controller's fresh mirror
            # now holds it, so StageSets waiting for the artifact can go on.
            meta = raw["metadata"]
            self._on_revision(str(meta["namespace"]), str(meta["name"]), snapshot.revision)
        return Result(requeue_after=interval * random.uniform(0.9, 1.1))  # noqa: S311 - jitter, not crypto

    def _fetch(self, repo: GitRepository, report: StatusWriter[GitRepositoryStatus], redactor: Redactor
               ) -> Snapshot | None:
        """The fetched snapshot, or ``None`` with the failure reported (the last artifact kept:
        dependents go on using the last good revision)."""
        ref = repo.spec.ref
        try:
            selector = RefSelector(branch=ref.branch, tag=ref.tag, semver=ref.semver, name=ref.name,
                                   commit=ref.commit) if ref else RefSelector()
            credentials = self._credentials(repo, redactor)
            return self._timed_fetch(repo, selector, credentials)
        except StageError as error:
            log.warning("denied: %s", error.message)
            report.conclude(ready=False, reason=error.reason, message=error.message)
        except ApiError as error:
            reason = Reason.RBAC_DENIED if error.forbidden else \
                Reason.SECRET_NOT_FOUND if error.not_found else Reason.FAILED
            secret = repo.spec.secret_ref.name if repo.spec.secret_ref else ""
            message = f"reading secretRef {secret}: {error.message}"
            log.warning("%s%s", "denied: " if error.forbidden else "", message)
            report.conclude(ready=False, reason=reason, message=message)
        except SourceError as error:
            reason = source_reason(error)
            log.warning("fetch failed (%s): %s", reason.value, error)
            report.conclude(ready=False, reason=reason, message=str(error),
                            stalled=reason is Reason.INVALID_SPEC)
        return None

    def _timed_fetch(self, repo: GitRepository, selector: RefSelector, credentials: Credentials | None
                     ) -> Snapshot:
        started = time.monotonic()
        result = "failed"
        try:
            snapshot = self._store.fetch(repo.spec.url, ref=selector, credentials=credentials,
                                         timeout=duration_seconds(repo.spec.timeout),
                                         consumer=artifact_consumer(repo.metadata))
            result = "fetched" if snapshot.fetched else "unchanged"
            return snapshot
        finally:
            if self._metrics is not None:
                meta = repo.metadata
                self._metrics.fetched(("GitRepository", str(meta["namespace"]), str(meta["name"])),
                                      url=display_url(repo.spec.url), result=result,
                                      seconds=time.monotonic() - started)


def setup(shared: Shared, *, store: Fetcher, identities: IdentityPolicy,
          on_revision: RevisionListener) -> Setup:
    """The GitRepository feature: its reconciler over the shared mirror, ``For`` GitRepositories in
    the source pool (``--source-workers``); ``on_revision`` wakes the StageSets naming one."""
    settings = shared.settings
    reconciler = GitRepositoryReconciler(clients=shared.clients, store=store, resource=GITREPOSITORIES,
                                         on_revision=on_revision, identities=identities, clock=shared.clock,
                                         events=shared.events, metrics=shared.metrics,
                                         runbook_base_url=settings.runbook_base_url, on_write=shared.on_write)
    return Setup(controllers=(reconciler.controller(workers=settings.source_workers),))
