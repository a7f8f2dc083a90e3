"""Shared bare mirrors of remote repositories: fetch once, read many times.

Why mirrors: many GitRepositories (and through them many StageSets) point at the same
repository.  Each normalised URL (:attr:`sources.urls.RemoteUrl.key`) gets one bare
repository under ``root/<sha256(key)[:16]>``; every caller's fetch lands there, and trees
are read straight from its object store (:mod:`sources.tree`), with no work tree.

A fetch goes:

1. **List refs** (``ls-remote``) with the *caller's* credentials.  This is the change
   check, and it is also what makes sharing a mirror across tenants safe: nobody gets a
   snapshot without the remote accepting their credentials for that URL first.  It runs
   outside any lock, so callers of one URL list in parallel.
2. **Resolve** the :class:`~sources.refs.RefSelector` against the listing (pure, see
   :mod:`sources.refs`).
3. Under the URL's lock: if the wanted commit is already in the mirror, stop — an
   unchanged remote costs one ``ls-remote`` and no fetch, and twenty threads asking for the
   same new commit fetch it once.  Otherwise fetch just that commit, shallow (depth 1),
   negotiating from the commits the mirror already has.  A pinned commit that the server
   will not send by id is found by deepening the whole history instead.

Threading: dulwich ``Repo`` objects are not thread-safe, so every operation opens its own
and closes it.  Only fetches (writers) take the per-URL lock; readers need none, because
dulwich only reads a pack once its index is written, and objects never change.

Mirrors only grow in this version: history that was force-pushed away stays until the
directory is removed.  Eviction (LRU by last use) is future work.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dulwich.errors import NotGitRepository
from dulwich.object_store import ObjectStoreGraphWalker
from dulwich.objects import Commit, ObjectID, Tag
from dulwich.refs import Ref
from dulwich.repo import Repo

from sources.credentials import Credentials
from sources.errors import GitOperationError, RefNotFoundError
from sources.refs import PEELED_SUFFIX, RefSelector, Resolution, resolve, valid_ref_name
from sources.revision import format_revision
from sources.transport import INFINITE_DEPTH, Remote
from sources.tree import Limits, read_tree, subtree_id
from sources.urls import RemoteUrl, UrlPolicy, parse_url


@dataclass(frozen=True)
class Snapshot:
    """The outcome of a fetch: which commit the selector resolved to, now in the mirror.

    ``url`` is the URL without credentials; ``ref_name`` is the branch or tag short name,
    the full ref for ``ref.name``, or None for a bare commit pin; ``fetched`` tells
    whether this call transferred objects (False when the mirror already had the commit).
    """

    url: str
    ref_name: str | None
    commit: str
    fetched: bool

    @property
    def revision(self) -> str:
        """Flux's revision string, e.g. ``main@sha1:<commit>``."""
        return format_revision(self.ref_name, self.commit)


class _MirrorRepo(Repo):
    """A mirror; negotiates fetches from every commit its refs keep, not only branches."""

    def get_graph_walker(self, heads: list[ObjectID] | None = None) -> ObjectStoreGraphWalker:
        if heads is None:
            heads = [sha for name, sha in self.refs.as_dict().items()
                     if name != b"HEAD" and sha in self.object_store]
        walker: ObjectStoreGraphWalker = super().get_graph_walker(heads)
        return walker


class MirrorStore:
    """Fetches remotes into shared bare mirrors under ``root`` and reads trees from them."""

    def __init__(self, *, root: Path, policy: UrlPolicy | None = None,
                 limits: Limits | None = None) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)
        self._policy = policy or UrlPolicy()
        self._limits = limits or Limits()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # -- public API --------------------------------------------------------------------

    def fetch(self, url: str, *, ref: RefSelector | None = None,
              credentials: Credentials | None = None, timeout: float = 60.0) -> Snapshot:
        """Resolve ``ref`` on the remote and make sure its commit is in the mirror."""
        selector = ref or RefSelector()
        remote_url = parse_url(url, self._policy)
        remote = Remote(url=remote_url, credentials=credentials, timeout=timeout)
        listing = remote.list_refs(selector.ref_prefixes())
        resolution = resolve(selector, listing.refs, listing.symrefs, url=remote_url.display)
        lock = self._lock_for(remote_url.key)
        if not lock.acquire(timeout=timeout):
            raise GitOperationError(
                f"timed out after {timeout:g}s waiting for another fetch of {remote_url.display}"
            )
        try:
            path = self._ensure_mirror(remote_url)
            with _MirrorRepo(str(path)) as repo:
                fetched = False
                if ObjectID(resolution.commit.encode("ascii")) not in repo.object_store:
                    self._fetch_wanted(remote, repo, resolution, pinned=selector.commit)
                    fetched = True
                commit = self._peel(repo, resolution, url=remote_url.display)
                if resolution.ref is not None and resolution.ref.startswith("refs/") and (
                    valid_ref_name(resolution.ref)
                ):
                    # Kept so later fetches negotiate from it (see _MirrorRepo).
                    repo.refs[Ref(resolution.ref.encode())] = ObjectID(commit.encode("ascii"))
        finally:
            lock.release()
        return Snapshot(url=remote_url.display, ref_name=resolution.ref_name, commit=commit,
                        fetched=fetched)

    def read_tree(self, url: str, *, commit: str, path: str = "./",
                  ignore: str | None = None, limits: Limits | None = None) -> dict[str, bytes]:
        """Files under ``path`` at ``commit`` (already fetched): relative path -> bytes."""
        remote_url = parse_url(url, self._policy)
        with self._open(remote_url, commit=commit) as repo:
            return read_tree(repo.object_store, commit=commit, path=path, ignore=ignore,
                             limits=limits or self._limits)

    def tree_hash(self, url: str, *, commit: str, path: str = "./") -> str:
        """The Git tree id of ``path`` at ``commit``: equal ids mean equal content."""
        remote_url = parse_url(url, self._policy)
        with self._open(remote_url, commit=commit) as repo:
            return subtree_id(repo.object_store, commit=commit, path=path)

    def mirror_path(self, url: str) -> Path:
        """Where the mirror of ``url`` lives (whether or not it exists yet)."""
        return self._path_for(parse_url(url, self._policy))

    # -- internals ---------------------------------------------------------------------

    def _path_for(self, remote_url: RemoteUrl) -> Path:
        digest = hashlib.sha256(remote_url.key.encode()).hexdigest()[:16]
        return self._root / digest

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def _open(self, remote_url: RemoteUrl, *, commit: str) -> _MirrorRepo:
        try:
            return _MirrorRepo(str(self._path_for(remote_url)))
        except NotGitRepository:
            raise RefNotFoundError(
                f"commit {commit} of {remote_url.display} is not in the mirror; fetch it first"
            ) from None

    def _ensure_mirror(self, remote_url: RemoteUrl) -> Path:
        """Create the bare mirror if needed (atomically: init aside, then rename)."""
        path = self._path_for(remote_url)
        if (path / "HEAD").exists():
            return path
        staging = Path(tempfile.mkdtemp(prefix=".init-", dir=self._root))
        try:
            with Repo.init_bare(str(staging)) as repo:
                config = repo.get_config()
                # For people inspecting the disk; never contains credentials.
                config.set((b"stageset",), b"url", remote_url.display.encode())
                config.write_to_path()
            try:
                os.rename(staging, path)
            except OSError:
                if not (path / "HEAD").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return path

    def _fetch_wanted(self, remote: Remote, repo: Repo, resolution: Resolution, *,
                      pinned: str | None) -> None:
        if pinned is None:
            remote.fetch(repo, wants=[resolution.want], depth=1)
            if ObjectID(resolution.want.encode("ascii")) not in repo.object_store:
                raise GitOperationError(
                    f"fetching from {remote.url.display} failed: the remote did not send "
                    f"{resolution.want} ({resolution.ref_name})"
                )
            return
        # Most servers (git over HTTP, GitHub, GitLab) send any reachable commit by id;
        # others only send advertised tips, so fall back to fetching all history.
        with contextlib.suppress(GitOperationError):
            remote.fetch(repo, wants=[pinned], depth=1)
        if ObjectID(pinned.encode("ascii")) in repo.object_store:
            return
        listing = remote.list_refs()
        tips = sorted({sha for name, sha in listing.refs.items()
                       if (name.startswith(("refs/heads/", "refs/tags/")) or name == "HEAD")
                       and not name.endswith(PEELED_SUFFIX)})
        if tips:
            remote.fetch(repo, wants=tips, depth=INFINITE_DEPTH)
        if ObjectID(pinned.encode("ascii")) not in repo.object_store:
            raise RefNotFoundError(f"commit {pinned} not found in {remote.url.display}")

    @staticmethod
    def _peel(repo: Repo, resolution: Resolution, *, url: str) -> str:
        """The commit ``resolution.want`` is or points to (annotated tags are peeled)."""
        sha = ObjectID(resolution.want.encode("ascii"))
        if sha not in repo.object_store:
            sha = ObjectID(resolution.commit.encode("ascii"))
        obj = repo.object_store[sha]
        while isinstance(obj, Tag):
            obj = repo.object_store[obj.object[1]]
        if not isinstance(obj, Commit):
            raise RefNotFoundError(
                f"{resolution.ref_name or resolution.want} in {url} points to a "
                f"{obj.type_name.decode()}, not a commit"
            )
        return str(obj.id.decode("ascii"))
