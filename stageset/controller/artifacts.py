"""Artifacts for StageSets: downloads run in the source pool, StageSets wait for them and are woken.

Identity: downloads carry no identity at all (Flux serves artifacts without credentials); the
URL and digest come from a source object the *tenant* read
(:mod:`~stageset.controller.render.reads`), and a tree is handed to a stage only once **its own
source's URL** served that digest to this controller (:meth:`ArtifactStore.proven
<sources.artifacts.ArtifactStore.proven>`): naming another tenant's digest with a URL that serves
nothing gets a download that fails, and nothing of the stored tree.

How a stage gets its tree (:meth:`ArtifactFetcher.tree`, called while rendering):

* proven for its URL already: read it from disk (the index in memory, each file read when the
  build asks for it) — no download, and the render cache keyed by the digest skips the build too;
* not proven: a download job is queued in the **source pool** — the pool that fetches Git, with
  its per-namespace cap, keyed by the StageSet's namespace — and the stage waits
  (``ArtifactNotFound``, phase Pending: objects kept, nothing pruned).  A StageSet worker never
  waits on an artifact server, and one tenant's slow or hostile server holds at most its own
  namespace's share of the source pool.  When the job ends the StageSets naming the source are
  requeued at once (:attr:`wake`).  The digest being stored for another URL changes nothing but
  the cost: the file is downloaded and verified, not unpacked again.
* a download that failed for a reason retrying cannot fix — digest mismatch, an unsafe or
  oversized archive, a refused address, an unverifiable digest — fails the stage with that
  reason and is **not retried until the source names another artifact** (another digest or URL);
* a failure that may pass (connection, HTTP status, time limit) is retried with the source
  pool's backoff while StageSets still ask for it, and the stage waits meanwhile, saying why.

The tree a download stores is charged to the namespace that asked (the store's per-tenant disk
budget, ``--artifact-tenant-max-size``).

A source in another namespace than the StageSet is reported without its URL or the server's
words (``cross_namespace``).  Digests are logged at debug level only: at info and above a log
line names the namespace and the URL's host and path, never a digest (a digest someone else's
source names is nobody's business in a shared log).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from sources.archive import ArchiveError
from sources.artifacts import ArtifactStore, NotStoredError
from sources.digests import Digest, DigestError, DigestMismatchError
from sources.download import display
from sources.errors import (
    LimitExceededError,
    SourceError,
    TransferError,
    UnsafePathError,
    UrlPolicyError,
)
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.keys import JobKey
from stageset.controller.render.cache import SourceRoot
from stageset.controller.render.reads import ArtifactSource
from stageset.controller.result import Result
from stageset.controller.sourcekinds import SourceObject

log = logging.getLogger(__name__)

JOB_KIND = "Artifact"
"""The job runner of downloads: ``JobKey(JOB_KIND, namespace, job)`` keys, run in the source pool."""
_TERMINAL = (DigestError, DigestMismatchError, UnsafePathError, LimitExceededError, ArchiveError,
             UrlPolicyError)
_WANTED_FOR = 600.0
"""A failing download is retried only while a StageSet asked for it within this many seconds."""
_MAX_FAILURES = 1024


@dataclass(frozen=True)
class Failure:
    terminal: bool
    message: str
    """What went wrong, with the URL (shown only for sources of the StageSet's own namespace)."""
    scrubbed: str
    """The same without the URL or the server's words."""


@dataclass
class _Job:
    digest: Digest
    url: str
    wanted: float
    origins: set[SourceObject] = field(default_factory=set)


def job_name(digest: Digest, url: str) -> str:
    return f"{digest.key[:23]}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


class ArtifactFetcher:
    def __init__(self, *, store: ArtifactStore, timeout: float, schedule: Callable[[str, str], None],
                 wake: Callable[[set[SourceObject]], None], clock: Callable[[], float] = time.monotonic,
                 stop: threading.Event | None = None):
        self.store = store
        self._stop = stop
        self._timeout = timeout
        self._schedule = schedule
        """``schedule(namespace, job)``: queue the job in the source pool."""
        self.wake = wake
        """``wake(origins)``: requeue the StageSets naming these source objects."""
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._failures: OrderedDict[tuple[str, str], Failure] = OrderedDict()

    # -- rendering side (StageSet workers) ---------------------------------------------------------

    def require(self, source: ArtifactSource, *, stage: str, requester: str) -> Digest:
        """Return once the source's artifact is stored; else :class:`StageError` — waiting (a download
        is queued) or failed.  Never downloads here."""
        what = f"stage {stage!r}: {source.what}"
        try:
            digest = Digest.parse(source.digest)
        except DigestError as error:
            raise StageError(Reason.STAGE_FAILED, f"{what}: {error}") from None
        if self.store.proven(digest, url=source.url):
            return digest
        name = job_name(digest, source.url)
        with self._lock:
            failure = self._failures.get((digest.key, source.url))
            fresh = False
            if failure is None or not failure.terminal:
                job = self._jobs.get((requester, name))
                if job is None:
                    fresh = True
                    job = self._jobs[(requester, name)] = _Job(digest=digest, url=source.url,
                                                               wanted=self._clock())
                job.wanted = self._clock()
                job.origins.add(source.origin)
        told = "" if failure is None else failure.scrubbed if source.cross_namespace else failure.message
        if failure is not None and failure.terminal:
            raise StageError(Reason.STAGE_FAILED, f"{what}: artifact {source.revision}: {told}")
        if fresh:
            self._schedule(requester, name)
        if failure is not None:
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"{what}: artifact {source.revision} cannot be "
                             f"downloaded yet: {told}; retrying with backoff")
        raise StageError(Reason.ARTIFACT_NOT_FOUND, f"{what}: downloading artifact {source.revision}")

    def tree(self, source: ArtifactSource, *, stage: str, requester: str) -> SourceRoot:
        """The source's files (read from the store), or :class:`StageError` as :meth:`require`."""
        digest = self.require(source, stage=stage, requester=requester)
        try:
            stored = self.store.read(digest, url=source.url)
        except NotStoredError:
            # Evicted since: queue it again.
            return self.tree(source, stage=stage, requester=requester)
        return SourceRoot(files=stored, unreadable=stored.unreadable, on_disk=True)

    # -- the source pool's side ---------------------------------------------------------------------

    def job(self, key: JobKey) -> Result:
        """One download job as a worker of the source pool runs it (never raises)."""
        try:
            return self.run(key.namespace, key.name)
        except Exception:  # never lose a worker to a download
            log.exception("artifact download %s/%s failed", key.namespace, key.name)
            return Result(backoff=True)

    def run(self, namespace: str, name: str) -> Result:
        """One download job; ``backoff=True`` to be retried (a transient failure still wanted)."""
        with self._lock:
            job = self._jobs.get((namespace, name))
        if job is None:
            return Result()
        key = (job.digest.key, job.url)
        try:
            stored = self.store.fetch(job.url, job.digest, timeout=self._timeout, tenant=namespace,
                                      cancel=self._stop)
        except _TERMINAL as error:
            log.debug("artifact %s from %s refused: %s", job.digest, display(job.url), error)
            log.warning("an artifact for namespace %s from %s was refused: %s", namespace, display(job.url),
                        _scrubbed(error))
            self._finish(namespace, name, job, Failure(True, str(error), _scrubbed(error)))
            return Result()
        except (TransferError, SourceError, OSError) as error:
            message = str(error) if isinstance(error, SourceError) else f"{type(error).__name__}: {error}"
            log.debug("artifact %s from %s not downloaded: %s", job.digest, display(job.url), message)
            log.warning("an artifact for namespace %s from %s was not downloaded: %s", namespace,
                        display(job.url), message)
            with self._lock:
                self._remember(key, Failure(False, message, "the artifact server cannot be reached"))
                wanted = self._clock() - job.wanted < _WANTED_FOR
                if not wanted:
                    self._jobs.pop((namespace, name), None)
                origins = set(job.origins)
            self.wake(origins)
            return Result(backoff=True) if wanted else Result()
        if stored.downloaded:
            log.debug("artifact %s downloaded from %s (%d bytes stored)", job.digest, display(job.url),
                      stored.size)
            log.info("an artifact for namespace %s was downloaded from %s (%d bytes stored)", namespace,
                     display(job.url), stored.size)
        self._finish(namespace, name, job, None)
        return Result()

    def _finish(self, namespace: str, name: str, job: _Job, failure: Failure | None) -> None:
        with self._lock:
            key = (job.digest.key, job.url)
            if failure is None:
                self._failures.pop(key, None)
            else:
                self._remember(key, failure)
            self._jobs.pop((namespace, name), None)
            origins = set(job.origins)
        self.wake(origins)

    def _remember(self, key: tuple[str, str], failure: Failure) -> None:
        self._failures[key] = failure
        self._failures.move_to_end(key)
        while len(self._failures) > _MAX_FAILURES:
            self._failures.popitem(last=False)


def _scrubbed(error: BaseException) -> str:
    """A refusal described without the URL or anything the server sent."""
    if isinstance(error, DigestError):
        return "its digest cannot be verified"
    if isinstance(error, DigestMismatchError):
        return "digest mismatch: the downloaded file is not the one status.artifact.digest names"
    if isinstance(error, UrlPolicyError):
        return "its URL is refused by this controller's address guard or URL policy"
    if isinstance(error, LimitExceededError):
        return "it exceeds this controller's artifact limits"
    return "it is not a safe, readable tarball"
