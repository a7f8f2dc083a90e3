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
dulwich only reads a pack once its index is written, and objects never change.  Readers
are counted instead, so that eviction never removes a mirror under them.

Disk use is bounded by ``max_bytes``: after a fetch that grew the store, the least recently
used mirrors (by last fetch or read) are removed until the total fits again.  A mirror is
never evicted while it is being fetched into (its lock is held) or read, nor the one just
fetched.  Removal is atomic (rename aside, then delete), so a reader that comes later gets
:class:`~sources.errors.NotFetchedError` — the next ``fetch`` brings the commit back —
rather than a half-deleted repository.  History force-pushed away stays in a mirror until
it is evicted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dulwich.errors import NotGitRepository
from dulwich.object_store import ObjectStoreGraphWalker
from dulwich.objects import Commit, ObjectID, Tag
from dulwich.refs import Ref
from dulwich.repo import Repo

from sources.credentials import Credentials
from sources.errors import GitOperationError, NotFetchedError, RefNotFoundError
from sources.refs import PEELED_SUFFIX, RefSelector, Resolution, resolve, valid_ref_name
from sources.revision import format_revision
from sources.ssh import default_scratch_dir
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


_USED_MARKER = "stageset-last-used"
"""A file in each mirror whose mtime records its last fetch, so LRU order survives restarts."""


def _disk_usage(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (like ``du``); 0 if it vanished."""
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(directory, name))
                total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


class MirrorStore:
    """Fetches remotes into shared bare mirrors under ``root`` and reads trees from them.

    ``max_bytes`` bounds the mirrors' total disk use (None: unbounded); least recently used
    mirrors are evicted past it.  ``ssh_scratch_dir`` is where SSH key files live for the
    length of a connection (default: ``/dev/shm`` when usable, else the temp directory).
    """

    def __init__(self, *, root: Path, policy: UrlPolicy | None = None,
                 limits: Limits | None = None, max_bytes: int | None = None,
                 ssh_scratch_dir: Path | None = None) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)
        self._policy = policy or UrlPolicy()
        self._limits = limits or Limits()
        self._max_bytes = max_bytes
        self._scratch = ssh_scratch_dir if ssh_scratch_dir is not None else default_scratch_dir()
        self._locks: dict[str, threading.Lock] = {}
        self._readers: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._sizes: dict[str, int] = {}
        self._locks_guard = threading.Lock()
        self._evicting = threading.Lock()
        self.evictions = 0
        """How many mirrors were evicted by this store (for metrics and tests)."""
        self._adopt_existing()

    # -- public API --------------------------------------------------------------------

    def fetch(self, url: str, *, ref: RefSelector | None = None,
              credentials: Credentials | None = None, timeout: float = 60.0) -> Snapshot:
        """Resolve ``ref`` on the remote and make sure its commit is in the mirror."""
        selector = ref or RefSelector()
        remote_url = parse_url(url, self._policy)
        remote = Remote(url=remote_url, credentials=credentials, timeout=timeout,
                        scratch_dir=self._scratch)
        listing = remote.list_refs(selector.ref_prefixes())
        resolution = resolve(selector, listing.refs, listing.symrefs, url=remote_url.display)
        name = self._name_for(remote_url)
        lock = self._lock_for(name)
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
            self._touch(name, persist=True)
            if fetched or name not in self._sizes:
                self._sizes[name] = _disk_usage(path)
        finally:
            lock.release()
        if fetched:
            self.evict(keep=name)
        return Snapshot(url=remote_url.display, ref_name=resolution.ref_name, commit=commit,
                        fetched=fetched)

    def read_tree(self, url: str, *, commit: str, path: str = "./",
                  ignore: str | None = None, limits: Limits | None = None) -> dict[str, bytes]:
        """Files under ``path`` at ``commit`` (already fetched): relative path -> bytes."""
        remote_url = parse_url(url, self._policy)
        with self._reading(remote_url, commit=commit) as repo:
            return read_tree(repo.object_store, commit=commit, path=path, ignore=ignore,
                             limits=limits or self._limits)

    def tree_hash(self, url: str, *, commit: str, path: str = "./") -> str:
        """The Git tree id of ``path`` at ``commit``: equal ids mean equal content."""
        remote_url = parse_url(url, self._policy)
        with self._reading(remote_url, commit=commit) as repo:
            return subtree_id(repo.object_store, commit=commit, path=path)

    def mirror_path(self, url: str) -> Path:
        """Where the mirror of ``url`` lives (whether or not it exists yet)."""
        return self._path_for(parse_url(url, self._policy))

    def disk_usage(self) -> int:
        """Bytes the mirrors use on disk, as last measured (after each fetch)."""
        with self._locks_guard:
            return sum(self._sizes.values())

    def evict(self, *, keep: str | None = None) -> list[str]:
        """Remove least recently used mirrors until the total fits ``max_bytes``.

        Skips mirrors being fetched into or read, and ``keep`` (a mirror directory name).
        Returns the directory names removed.  Called after every fetch that grew a mirror;
        public for callers that want to shrink the store at other times.
        """
        if self._max_bytes is None or not self._evicting.acquire(blocking=False):
            return []
        removed: list[str] = []
        try:
            with self._locks_guard:
                order = sorted(self._sizes, key=lambda n: self._last_used.get(n, 0.0))
                total = sum(self._sizes.values())
            for name in order:
                if total <= self._max_bytes:
                    break
                if name == keep:
                    continue
                detached = self._detach(name)
                if detached is None:
                    continue
                doomed, size = detached
                total -= size
                shutil.rmtree(doomed, ignore_errors=True)
                removed.append(name)
                self.evictions += 1
        finally:
            self._evicting.release()
        return removed

    # -- internals ---------------------------------------------------------------------

    def _name_for(self, remote_url: RemoteUrl) -> str:
        return hashlib.sha256(remote_url.key.encode()).hexdigest()[:16]

    def _path_for(self, remote_url: RemoteUrl) -> Path:
        return self._root / self._name_for(remote_url)

    def _lock_for(self, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(name, threading.Lock())

    def _touch(self, name: str, *, persist: bool = False) -> None:
        now = time.time()
        with self._locks_guard:
            # Strictly increasing, so the order is total even within one clock tick.
            latest = max(self._last_used.values(), default=0.0)
            self._last_used[name] = max(now, latest + 1e-6)
        if persist:
            with contextlib.suppress(OSError):
                (self._root / name / _USED_MARKER).touch()

    def _detach(self, name: str) -> tuple[Path, int] | None:
        """Atomically move mirror ``name`` aside if nobody uses it; None if busy.

        Returns where it went and the size it was accounted with.
        """
        with self._locks_guard:
            if self._readers.get(name, 0):
                return None
            lock = self._locks.setdefault(name, threading.Lock())
            if not lock.acquire(blocking=False):
                return None
            try:
                aside = self._root / f".evict-{name}-{os.getpid()}-{threading.get_ident()}"
                try:
                    os.rename(self._root / name, aside)
                except FileNotFoundError:
                    return None
                self._last_used.pop(name, None)
                return aside, self._sizes.pop(name, 0)
            finally:
                lock.release()

    def _adopt_existing(self) -> None:
        """Account for mirrors left by an earlier process; clear its unfinished work."""
        for entry in self._root.iterdir():
            if entry.name.startswith((".evict-", ".init-")):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir() and (entry / "HEAD").exists():
                marker = entry / _USED_MARKER
                used = marker.stat().st_mtime if marker.exists() else entry.stat().st_mtime
                self._last_used[entry.name] = used
                self._sizes[entry.name] = _disk_usage(entry)

    @contextlib.contextmanager
    def _reading(self, remote_url: RemoteUrl, *, commit: str) -> Iterator[_MirrorRepo]:
        """The mirror opened for reading; it cannot be evicted until the block ends."""
        name = self._name_for(remote_url)
        with self._locks_guard:
            self._readers[name] = self._readers.get(name, 0) + 1
        try:
            try:
                repo = _MirrorRepo(str(self._root / name))
            except NotGitRepository:
                raise NotFetchedError(
                    f"commit {commit} of {remote_url.display} is not in the mirror; fetch it "
                    "first"
                ) from None
            self._touch(name)
            with repo:
                yield repo
        finally:
            with self._locks_guard:
                self._readers[name] -= 1

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
        # Blobs over the per-file limit could never be read; the server may leave them out.
        blob_limit = self._limits.max_file_bytes + 1
        if pinned is None:
            remote.fetch(repo, wants=[resolution.want], depth=1, blob_limit=blob_limit)
            if ObjectID(resolution.want.encode("ascii")) not in repo.object_store:
                raise GitOperationError(
                    f"fetching from {remote.url.display} failed: the remote did not send "
                    f"{resolution.want} ({resolution.ref_name})"
                )
            return
        # Most servers (git over HTTP, GitHub, GitLab) send any reachable commit by id;
        # others only send advertised tips, so fall back to fetching all history.
        with contextlib.suppress(GitOperationError):
            remote.fetch(repo, wants=[pinned], depth=1, blob_limit=blob_limit)
        if ObjectID(pinned.encode("ascii")) in repo.object_store:
            return
        listing = remote.list_refs()
        tips = sorted({sha for name, sha in listing.refs.items()
                       if (name.startswith(("refs/heads/", "refs/tags/")) or name == "HEAD")
                       and not name.endswith(PEELED_SUFFIX)})
        if tips:
            remote.fetch(repo, wants=tips, depth=INFINITE_DEPTH, blob_limit=blob_limit)
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
