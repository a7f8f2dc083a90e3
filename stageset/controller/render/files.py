"""Where a stage's files come from: the seam of the one render pipeline
(:class:`~stageset.controller.render.service.RenderService`).

- :class:`Files` — a stage's source files: how the render cache keys them, how to read them;
- :class:`SourceFiles` — where they come from, supplied by the caller: the controller's
  :class:`~stageset.controller.render.stores.MirrorFiles`, the CLI's local mirror, downloads or
  checkout (:mod:`stageset.cli.sourcefiles`);
- :func:`mirror_files` — a commit's files from a Git mirror, served only to its consumer (both
  callers' mirrors).

Identity: nothing here makes a request; the source object was read as the stage's identity before
(:mod:`stageset.controller.render.reads`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stageset.api import Stage
from stageset.controller.render.cache import SourceRoot
from stageset.controller.render.reads import ArtifactSource, Source
from stageset.kube.client import Identity


@dataclass(frozen=True)
class Files:
    """A stage's source files: how the render cache keys them, and how to read them."""

    url: str
    """Where (the cache key's URL; artifacts share :data:`ARTIFACT_URL`)."""
    commit: str
    """Which content: a commit, an artifact's digest; equal ``(url, commit, ignore)`` hold equal files."""
    read_root: Callable[[], SourceRoot]
    """The whole source root (a build may load ``../`` bases)."""
    ignore: str | None = None
    read_path: Callable[[], SourceRoot] | None = None
    """Only the stage's own directory (keys relative to it): enough for a plain path."""


class TreeReader(Protocol):
    """A Git mirror's tree reads (:class:`sources.MirrorStore`), as both callers hold one."""

    def read_tree(self, url: str, *, commit: str, path: str = "./", ignore: str | None = None,
                  consumer: str | None = None, unreadable: dict[str, str] | None = None
                  ) -> dict[str, bytes]: ...


def mirror_files(store: TreeReader, *, url: str, commit: str, ignore: str | None, consumer: str,
                 stage_path: str) -> Files:
    """A commit's files from a Git mirror, served only to ``consumer`` (the GitRepository by uid,
    once its own credentials proved the commit readable): the whole root, as the GitRepository was
    served it (a submodule or a link leaving the root fails only a build that loads it), or only the
    stage's own directory, enough for a plain path."""
    def read(path: str) -> SourceRoot:
        unreadable: dict[str, str] = {}
        files = store.read_tree(url, commit=commit, path=path, ignore=ignore, consumer=consumer,
                                unreadable=unreadable)
        return SourceRoot(files=files, unreadable=unreadable)

    return Files(url=url, commit=commit, ignore=ignore, read_root=lambda: read("./"),
                 read_path=lambda: read(stage_path))


@dataclass(frozen=True)
class Checkout:
    """Files that stand in for a stage's source (the CLI's ``--source-dir``): its object is not read."""

    revision: str
    """What the stage shows as its revision (``local:DIR``)."""
    files: Files


class SourceFiles(Protocol):
    """Where a stage's files come from, once its source object has been read as the tenant."""

    def checkout(self, stage: Stage) -> Checkout | None:
        """Files standing in for the stage's source; ``None``: read the source (the controller always)."""
        ...

    def git(self, source: Source, *, stage: Stage, identity: Identity, pinned: bool) -> Files:
        """The GitRepository's commit, served only as ``source.consumer``; ``pinned``: a recorded
        revision, not the current one."""
        ...

    def artifact(self, source: ArtifactSource, *, stage: Stage, namespace: str) -> Files:
        """The artifact the tenant's read of its source object named (by digest)."""
        ...


ARTIFACT_URL = "artifact:"
"""The render cache's URL for artifacts: the digest alone names the content."""
