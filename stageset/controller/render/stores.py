"""The controller's :class:`~stageset.controller.render.files.SourceFiles`: its shared Git mirror and
its artifact store.

- the shared Git mirror holds only commits the GitRepository's own credentials fetched and serves a
  GitRepository only those (its uid-qualified consumer, :mod:`sources.mirror`);
- the artifact store hands out only the digest the tenant's own read of the source object named
  (:mod:`stageset.controller.artifacts`).

Both are this process's and reached through the protocols here (:class:`SourceTrees`,
:class:`ArtifactTrees`); the render service never imports a store (an import-linter contract).

Identity: nothing here makes a request.
"""

from __future__ import annotations

from typing import Protocol

from stageset.api import Stage
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.render.cache import SourceRoot
from stageset.controller.render.files import ARTIFACT_URL, Checkout, Files, mirror_files
from stageset.controller.render.reads import ArtifactSource, Source
from stageset.kube.client import Identity


class SourceTrees(Protocol):
    """What rendering needs of the Git mirror (:class:`sources.MirrorStore`)."""

    def tree_hash(self, url: str, *, commit: str, path: str = "./") -> str: ...

    def is_served(self, url: str, *, commit: str, consumer: str) -> bool: ...

    def read_tree(self, url: str, *, commit: str, path: str = "./", ignore: str | None = None,
                  consumer: str | None = None, unreadable: dict[str, str] | None = None
                  ) -> dict[str, bytes]: ...


class ArtifactTrees(Protocol):
    """What rendering needs of artifacts (:class:`stageset.controller.artifacts.ArtifactFetcher`)."""

    def require(self, source: ArtifactSource, *, stage: str, requester: str) -> object: ...

    def tree(self, source: ArtifactSource, *, stage: str, requester: str) -> SourceRoot: ...


class MirrorFiles:
    """The controller's :class:`~stageset.controller.render.files.SourceFiles`: the shared
    Git mirror (a GitRepository is served only the commits fetched with its own credentials) and
    the artifact store (only the digest the tenant's read of the source named)."""

    def __init__(self, *, store: SourceTrees, artifacts: ArtifactTrees | None = None):
        self._store = store
        self._artifacts = artifacts

    def checkout(self, stage: Stage) -> Checkout | None:
        del stage
        return None  # the controller always reads the stage's source

    def git(self, source: Source, *, stage: Stage, identity: Identity, pinned: bool) -> Files:
        del identity  # the mirror is this process's; what it serves is decided by the consumer
        url, commit, ignore, consumer = source.url, source.commit, source.ignore, source.consumer
        if pinned and not self._store.is_served(url, commit=commit, consumer=consumer):
            raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE, f"stage {stage.name!r}: GitRepository "
                             f"{source.name}: revision {source.revision} is no longer in the controller's "
                             "Git mirror")
        if not self._store.is_served(url, commit=commit, consumer=consumer):
            # Only what this GitRepository was served, never another commit of a shared mirror
            # (a status a tenant wrote, or a commit another tenant's credentials fetched).
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: GitRepository "
                             f"{source.name}: revision {source.revision} has not been "
                             "fetched for it (yet)")
        return mirror_files(self._store, url=url, commit=commit, ignore=ignore, consumer=consumer,
                            stage_path=stage.path)

    def artifact(self, source: ArtifactSource, *, stage: Stage, namespace: str) -> Files:
        if self._artifacts is None:
            raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {source.what}: this controller "
                             "does not read artifacts")
        artifacts = self._artifacts
        # Asked before the render cache: a digest the store cannot serve (not downloaded yet, or
        # refused) says so even when another stage rendered it once.  Reading it waits for a miss.
        artifacts.require(source, stage=stage.name, requester=namespace)
        return Files(url=ARTIFACT_URL, commit=source.digest,
                     read_root=lambda: artifacts.tree(source, stage=stage.name, requester=namespace))
