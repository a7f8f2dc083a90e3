"""A stage's source content at a recorded revision: the one seam rollback and update windows read
old content through.

:class:`RevisionContent` is what the pass needs of a source kind: :meth:`~RevisionContent.at` turns
the source as its object says today into the source at an earlier revision (or says it is gone),
and :meth:`~RevisionContent.keep` asks the source's store to keep a stage's revisions readable.

- **Git** (:class:`GitRevisions`): the commit the revision names, read from the controller's
  shared mirror, which serves a GitRepository only commits it fetched for it.  A stage's last good
  and applied commits are kept (:meth:`sources.MirrorStore.keep`), so they stay readable after the
  branch moved on and through compaction — while the stage's StageSet refreshes them (every pass
  does), for at most :data:`sources.compact.SERVED_TTL` without, and while the mirror is not evicted
  for disk space (``--mirror-max-bytes``) or lost with the controller's volume.  Then the revision
  is gone: a rollback fails with ``PreviousRevisionUnavailable``.
- **Flux artifacts** (issue 16) implement the same two methods: the last good content is available
  only while the artifact store (or the artifact's URL) still serves that revision; ``keep`` is
  theirs to make meaningful or a no-op.

Identity: none here; the returned source is read by the renderer as the stage's identity, and the
mirror only serves commits fetched for that GitRepository's own credentials.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol, runtime_checkable

from sources import parse_revision
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.render.reads import Source

log = logging.getLogger(__name__)


class RevisionContent(Protocol):
    def at(self, source: Source, revision: str) -> Source:
        """``source`` at ``revision``; :class:`StageError` (``PreviousRevisionUnavailable``) when
        that revision cannot be read any more."""
        ...

    def keep(self, source: Source, *, holder: str, revisions: list[str]) -> None:
        """Keep ``revisions`` of ``source`` readable for ``holder`` (replacing what it kept)."""
        ...


@runtime_checkable
class Keeper(Protocol):
    """What :class:`GitRevisions` needs of the mirror (:class:`sources.MirrorStore`)."""

    def keep(self, url: str, *, consumer: str, holder: str, commits: list[str]) -> list[str]: ...


class GitRevisions:
    def __init__(self, store: Keeper | None):
        self._store = store

    def at(self, source: Source, revision: str) -> Source:
        try:
            _, commit = parse_revision(revision)
        except ValueError as error:
            raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE,
                             f"{revision!r} is not a Git revision") from error
        return replace(source, revision=revision, commit=commit)

    def keep(self, source: Source, *, holder: str, revisions: list[str]) -> None:
        if self._store is None:
            return
        commits = []
        for revision in revisions:
            try:
                commits.append(parse_revision(revision)[1])
            except ValueError:
                continue
        kept = self._store.keep(source.url, consumer=source.consumer, holder=holder, commits=commits)
        if len(kept) < len(set(commits)):
            log.debug("kept %d of %d commit(s) of %s for %s", len(kept), len(set(commits)), source.name,
                      holder)
