"""Shared bare mirrors of remote repositories: fetch once, read many times.

Identity: every network operation uses the caller's own :class:`~sources.Credentials` (the
GitRepository's Secret, read as its ServiceAccount); the mirror on disk is the controller's.

Why mirrors: many GitRepositories (and through them many StageSets) point at the same
repository.  Each repository (:attr:`sources.urls.RemoteUrl.key`, which keeps everything
that can change what a server returns) gets one bare repository under
``root/<sha256(key)[:16]>``; every caller's fetch lands there, and trees are read straight
from its object store (:mod:`sources.tree`), with no work tree.

**A caller is only served commits its own credentials can fetch.**  A mirror holds what
*every* caller of that URL fetched, so "the commit is in the mirror" proves nothing about
this caller, and neither does a successful ref listing (servers show different users
different refs: per-ref permissions, hidden refs).  So each commit served is proven for
the caller first, in this order, cheapest first:

1. it is the tip of a ref the caller's own listing advertised (branches, tags, semver,
   ``ref.name``, the remote HEAD: always the case unless ``ref.commit`` is set);
2. it is reachable, within :data:`PROOF_WALK` commits, from such a tip through commits
   in the mirror (commit ids are hashes of their content, so parents found in the mirror
   are the real history, whoever fetched them; history reachable from a ref a server
   shows you is history it lets you fetch);
3. otherwise the server is asked for it **with the caller's credentials**, even when the
   mirror already has it (the request then names it as a "have" too, so nothing is
   transferred): the server decides.  Servers speaking protocol version 2 (git, GitHub,
   GitLab, Bitbucket, Gitea) send any commit they let the caller read;
4. a server that refuses and speaks only protocol version 0 sends only what it advertised:
   then the named branch (or the remote HEAD) is deepened, with the caller's credentials,
   to at most :data:`PIN_HISTORY` commits, and step 2 is tried again.  That is the most a
   pinned commit ever costs: never a fetch of all history of every ref, whatever
   ``ref.commit`` says.

A commit that fails all four is :class:`~sources.errors.RefNotFoundError` (not found, or
not readable with these credentials — the message cannot and does not tell which).

**Readers only read what their source was served.**  ``fetch(..., consumer=...)`` records
the commit as served to that consumer (the controller passes the GitRepository's
namespace, name and uid) in the mirror (``stageset-served/``, so restarts keep it; an
evicted mirror takes its records with it).  :meth:`MirrorStore.is_served` and the
``consumer=`` argument of the read methods check it, so a reader (a StageSet) can only read
the commits its GitRepository was served — not any commit of a mirror someone else filled,
whatever revision a status claims.

A fetch goes:

1. **List refs** (``ls-remote``) with the caller's credentials: the change check, and the
   first proof.  It runs outside any lock, so callers of one URL list in parallel.
2. **Resolve** the :class:`~sources.refs.RefSelector` against the listing (pure, see
   :mod:`sources.refs`).
3. Under the URL's lock: prove a pinned commit as above; if the wanted commit is already in
   the mirror, stop — an unchanged remote costs one ``ls-remote`` and no fetch, and twenty
   threads asking for the same new commit fetch it once.  Otherwise fetch just that commit,
   shallow (depth 1), negotiating from the commits the mirror already has, through the
   bounded pack check of :mod:`sources.pack`.  Over HTTP every fetch of the call reuses step
   1's discovery (:mod:`sources.transport`): a cold fetch is 3 requests (``info/refs``,
   ``ls-refs``, ``fetch``), an unchanged remote 2; the wants still come from the caller's
   own listing only, and each fetch request still carries the caller's credentials.

The whole call (listing, proofs, fetches, waiting for the lock) has one deadline:
``timeout``.

Threading: dulwich ``Repo`` objects are not thread-safe, so every operation opens its own
and closes it.  Only fetches (writers) take the per-URL lock; readers need none, because
dulwich only reads a pack once its index is written, and objects never change.  Readers
are counted instead, so that eviction never removes a mirror under them.

Disk use is bounded by ``max_bytes``, the mirrors' budget: **before** a fetch downloads, the
least recently used mirrors (by last fetch or read) are removed until the mirrors on disk plus
the most that fetch may bring (``Limits.max_fetch_bytes``, which bounds its raw pack) fit in it,
and after a fetch that grew the store, until the total fits again.  So one fetch never takes
the store past its budget; fetches running at once may each add up to ``max_fetch_bytes``
(the chart's volume adds that headroom, docs/sizing.md).  A mirror is never evicted while it
is being fetched into (its lock is held) or read, nor the one being fetched.  Removal is atomic
(rename aside, then delete), so a reader that comes later gets
:class:`~sources.errors.NotFetchedError` — the next ``fetch`` brings the commit back —
rather than a half-deleted repository.

**Kept commits.**  A reader may ask the mirror to keep commits it was served beyond the newest
few (``keep(..., holder=...)``): the controller keeps each stage's last good and applied commits,
so a rollback (or an update window's drift correction) can read them after the branch moved on.
A kept commit stays served to that consumer and survives compaction for as long as its holder
refreshes it (at least every :data:`sources.compact.SERVED_TTL`), the consumer's records exist and
the mirror is not evicted for disk space; then it is gone like any other.

A mirror does not grow with its history either: after a fetch that leaves it with more than
:data:`sources.compact.COMPACT_AFTER_PACKS` packs, it is rebuilt aside with only the
commits still served to someone or named by its refs (trees included, history not) and
swapped in atomically, under its fetch lock and only while nobody reads it
(:mod:`sources.compact`).

**A cache, not a database** (:mod:`sources.cachefiles`): refs, the shallow list and the
repository's own files are written aside and renamed into place, with no lock file and no
``fsync``; a write is bracketed by a marker naming its writer.  A mirror found damaged — an
unfinished write, or, for a mirror last known whole in another boot, any checksum that does not
match — is moved aside and removed like an evicted one (:attr:`MirrorStore.discarded` counts
them), never read: its commits are fetched again.  A mirror is checked when a store adopts it
from disk, and again whenever reading or fetching into it fails other than on purpose (a
:class:`~sources.errors.SourceError`); a fetch that finds its mirror damaged starts over in a
new one, once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dulwich.object_store import DiskObjectStore, ObjectStoreGraphWalker
from dulwich.objects import Commit, ObjectID, Tag
from dulwich.repo import Repo

from sources import cachefiles
from sources.compact import compacted_copy, kept_commits, needs_compaction
from sources.credentials import Credentials
from sources.errors import (
    GitOperationError,
    NotFetchedError,
    RefNotFoundError,
    SourceError,
    UrlPolicyError,
)
from sources.limits import Limits
from sources.refs import PEELED_SUFFIX, RefSelector, Resolution, resolve, valid_ref_name
from sources.revision import format_revision
from sources.ssh import default_scratch_dir
from sources.transport import Deadline, Listing, Remote, WantRefusedError
from sources.tree import IgnoreCache, TreeCache, read_tree, subtree_id
from sources.urls import RemoteUrl, UrlPolicy, parse_url

PROOF_WALK = 1000
"""Commits walked in the mirror, from the tips a caller was shown, to find a pinned commit."""

PIN_HISTORY = 1000
"""The most commits of one branch fetched to find a pinned commit on a server that only
sends advertised tips (protocol version 0 without ``allow-*-sha1-in-want``)."""

_PIN_STEPS = (50, PIN_HISTORY)

SERVED_DIR = "stageset-served"
"""Per mirror: which commits were served to which consumer (one file per consumer)."""

_SERVED_KEEP = 16
"""Commits remembered per consumer (the newest), so a status a little behind still reads."""

_DEBRIS_AGE = 600.0
"""Seconds after which an unfinished ``.init-``/``.evict-`` directory is debris, not another process's
work in progress (mirror roots may be shared by CLI processes)."""

KEPT_DIR = "stageset-kept"
"""Per mirror: commits kept for a consumer beyond the newest few, one file per holder."""

_KEPT_PER_HOLDER = 4
"""Commits one holder may keep (a stage keeps its last good and its applied commit)."""



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


class _MirrorRepo(cachefiles.CacheRepo):
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


def _clear_debris(mirror: Path, *, now: float) -> None:
    """Files a writer that died left aside in ``mirror`` (never used: only renamed-in files are)."""
    for directory, prefix in ((mirror, cachefiles.STAGING_PREFIX), (mirror / "objects", "tmp_pack_")):
        with contextlib.suppress(OSError):
            for leftover in directory.iterdir():
                with contextlib.suppress(OSError):
                    if leftover.name.startswith(prefix) and (
                            now - leftover.stat().st_mtime > _DEBRIS_AGE):
                        leftover.unlink()


def _consumer_file(consumer: str) -> str:
    return hashlib.sha256(consumer.encode()).hexdigest()[:32]


def _peeled_commit(repo: Repo, sha: ObjectID) -> ObjectID | None:
    """The commit ``sha`` is or (through tags) points to, if the mirror has it."""
    for _ in range(16):
        if sha not in repo.object_store:
            return None
        obj = repo.object_store[sha]
        if isinstance(obj, Commit):
            return sha
        if not isinstance(obj, Tag):
            return None
        sha = obj.object[1]
    return None


def _write_fetch(remote: Remote, repo: Repo, *, wants: list[str], depth: int, blob_limit: int,
                 listing: Listing, haves: list[str] | None = None) -> int:
    """:meth:`Remote.fetch` into ``repo``, bracketed as a write (:func:`sources.cachefiles.writing`)."""
    with cachefiles.writing(Path(repo.path)):
        return remote.fetch(repo, wants=wants, depth=depth, blob_limit=blob_limit,
                            haves=haves or [], listing=listing)


def reachable(repo: Repo, *, tips: Iterable[str], target: str, limit: int) -> bool:
    """Whether ``target`` is one of ``tips`` or an ancestor within ``limit`` commits, using
    only commits present in ``repo`` (a shallow mirror's walk stops where history ends)."""
    want = ObjectID(target.encode("ascii"))
    queue: deque[ObjectID] = deque()
    for tip in tips:
        commit = _peeled_commit(repo, ObjectID(tip.encode("ascii")))
        if commit is not None:
            queue.append(commit)
    seen: set[ObjectID] = set()
    while queue and len(seen) < limit:
        sha = queue.popleft()
        if sha in seen:
            continue
        seen.add(sha)
        if sha == want:
            return True
        if sha not in repo.object_store:
            continue
        obj = repo.object_store[sha]
        if isinstance(obj, Commit):
            queue.extend(parent for parent in obj.parents if parent not in seen)
    return False


class MirrorStore:
    """Fetches remotes into shared bare mirrors under ``root`` and reads trees from them.

    ``max_bytes`` bounds the mirrors' total disk use (None: unbounded); least recently used
    mirrors are evicted past it.  ``ssh_scratch_dir`` is where SSH key files live for the
    length of a connection (default: ``/dev/shm`` when usable, else the temp directory).
    Local repositories (when the policy allows them) are never served from ``root`` or the
    scratch directory.
    """

    def __init__(self, *, root: Path, policy: UrlPolicy | None = None,
                 limits: Limits | None = None, max_bytes: int | None = None,
                 ssh_scratch_dir: Path | None = None) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)
        self._scratch = ssh_scratch_dir if ssh_scratch_dir is not None else default_scratch_dir()
        self._policy = (policy or UrlPolicy()).forbidding(self._root, ssh_scratch_dir)
        self._limits = limits or Limits()
        self._max_bytes = max_bytes
        self._locks: dict[str, threading.Lock] = {}
        self._readers: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._sizes: dict[str, int] = {}
        self._locks_guard = threading.Lock()
        self._evicting = threading.Lock()
        self._ignores = IgnoreCache()
        self._trees = TreeCache()
        self.evictions = 0
        """How many mirrors were evicted by this store (for metrics and tests)."""
        self.compactions = 0
        """How many times a mirror was compacted (:mod:`sources.compact`)."""
        self.discarded = 0
        """How many mirrors were found damaged and discarded (:mod:`sources.cachefiles`)."""
        self._damaged: set[str] = set()
        # Mirrors found damaged while someone read them: refused to new readers, discarded by
        # the next fetch once nobody reads them.
        self._adopt_existing()

    # -- public API --------------------------------------------------------------------

    def fetch(self, url: str, *, ref: RefSelector | None = None,
              credentials: Credentials | None = None, timeout: float = 60.0,
              consumer: str | None = None) -> Snapshot:
        """Resolve ``ref`` on the remote and make sure its commit is in the mirror.

        Every commit served is proven readable with ``credentials`` first (see the module
        docstring).  With ``consumer``, the commit is recorded as served to it, for
        :meth:`is_served` and the ``consumer=`` checks of the read methods.  ``timeout``
        bounds the whole call.
        """
        selector = ref or RefSelector()
        remote_url = parse_url(url, self._policy)
        deadline = Deadline(timeout)
        remote = Remote(url=remote_url, credentials=credentials, timeout=timeout,
                        scratch_dir=self._scratch, deadline=deadline, limits=self._limits)
        listing = remote.list_refs(selector.ref_prefixes())
        resolution = resolve(selector, listing.refs, listing.symrefs, url=remote_url.display)
        name = self._name_for(remote_url)
        lock = self._lock_for(name)
        if not lock.acquire(timeout=max(0.0, deadline.remaining())):
            raise GitOperationError(
                f"timed out after {timeout:g}s waiting for another fetch of {remote_url.display}"
            )
        try:
            path = self._ensure_mirror(remote_url, name=name)
            try:
                commit, fetched = self._fetch_into(path, remote, listing, selector, resolution,
                                                   name=name)
            except Exception as error:
                if not self._found_damaged(name, path, deep=not isinstance(error, SourceError)):
                    raise
                # Discarded: start over, once, in a new mirror.
                path = self._ensure_mirror(remote_url, name=name)
                commit, fetched = self._fetch_into(path, remote, listing, selector, resolution,
                                                   name=name)
            if consumer is not None:
                self._record_served(name, consumer, commit)
            self._touch(name, persist=True)
            if fetched and needs_compaction(path):
                self._compact(name, path)
            if fetched or name not in self._sizes:
                self._sizes[name] = _disk_usage(path)
        finally:
            lock.release()
        if fetched:
            self.evict(keep=name)
        return Snapshot(url=remote_url.display, ref_name=resolution.ref_name, commit=commit,
                        fetched=fetched)

    def _fetch_into(self, path: Path, remote: Remote, listing: Listing, selector: RefSelector,
                    resolution: Resolution, *, name: str) -> tuple[str, bool]:
        """The fetch itself, under the URL's lock: (the commit, whether objects were fetched)."""
        with _MirrorRepo(str(path)) as repo:
            fetched = False
            if selector.commit is not None:
                fetched = self._prove_pin(remote, repo, listing, selector, name=name)
            elif ObjectID(resolution.want.encode("ascii")) not in repo.object_store:
                self._make_room(keep=name)
                self._fetch_tip(remote, repo, resolution, listing=listing)
                fetched = True
            commit = self._peel(repo, resolution, url=remote.url.display)
        if resolution.ref is not None and resolution.ref.startswith("refs/") and (
            valid_ref_name(resolution.ref)
        ):
            # Kept so later fetches negotiate from it (see _MirrorRepo); only a hint, so a ref
            # that cannot be written (another ref's directory in the way) is left out.
            with contextlib.suppress(OSError):
                cachefiles.set_ref(path, resolution.ref, commit)
        return commit, fetched

    def is_served(self, url: str, *, commit: str, consumer: str) -> bool:
        """Whether ``commit`` of ``url`` was served to ``consumer`` by :meth:`fetch` (and the
        mirror still holds it)."""
        try:
            remote_url = parse_url(url, self._policy)
        except UrlPolicyError:
            return False  # never fetched, so never served
        mirror = self._path_for(remote_url)
        path = mirror / SERVED_DIR / _consumer_file(consumer)
        with self._locks_guard:  # never between the two renames of a compaction's swap
            try:
                if commit in path.read_text().split():
                    return True
            except OSError:
                pass
            return commit in kept_commits(mirror / KEPT_DIR / _consumer_file(consumer))

    def keep(self, url: str, *, consumer: str, holder: str, commits: Iterable[str]) -> list[str]:
        """Keep ``commits`` served to ``consumer`` for ``holder`` (replacing what it kept before);
        returns those kept (a commit never served to ``consumer`` is not).  Each call refreshes the
        record (:data:`sources.compact.SERVED_TTL`); an empty ``commits`` drops it.  Local disk only,
        no request; skipped (``[]``) while a fetch or compaction of the mirror runs (never waits:
        callers keep again on their next pass)."""
        try:
            remote_url = parse_url(url, self._policy)
        except UrlPolicyError:
            return []
        name = self._name_for(remote_url)
        wanted = list(dict.fromkeys(c for c in commits if c))[:_KEPT_PER_HOLDER]
        lock = self._lock_for(name)
        if not lock.acquire(blocking=False):
            return []
        try:
            mirror = self._root / name
            if not (mirror / "HEAD").exists():
                return []
            directory = mirror / KEPT_DIR / _consumer_file(consumer)
            path = directory / _consumer_file(holder)
            kept = [c for c in wanted if self.is_served(url, commit=c, consumer=consumer)]
            if not kept:
                with contextlib.suppress(OSError):
                    path.unlink()
                return []
            try:
                unchanged = path.read_text().split() == kept
            except OSError:
                unchanged = False
            if unchanged:
                with contextlib.suppress(OSError):
                    os.utime(path)
                return kept
            directory.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(prefix=".kept-", dir=directory)
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(kept) + "\n")
            os.replace(staging, path)
            return kept
        finally:
            lock.release()

    def read_tree(self, url: str, *, commit: str, path: str = "./",
                  ignore: str | None = None, limits: Limits | None = None,
                  consumer: str | None = None, unreadable: dict[str, str] | None = None
                  ) -> dict[str, bytes]:
        """Files under ``path`` at ``commit`` (already fetched): relative path -> bytes.

        Files excluded by the source's ignore rules (Flux's defaults, ``.sourceignore``
        files, ``ignore``; see :mod:`sources.ignore`) are left out.  With ``consumer``,
        ``commit`` must have been served to it (else :class:`NotFetchedError`).  With
        ``unreadable``, submodules and unsafe symlinks are recorded there and left out
        instead of failing the read (:meth:`sources.tree.CommitTree.read`).
        """
        remote_url = parse_url(url, self._policy)
        self._check_served(remote_url, url=url, commit=commit, consumer=consumer)
        with self._reading(remote_url, commit=commit) as store:
            return read_tree(store, commit=commit, path=path, ignore=ignore,
                             limits=limits or self._limits, cache=self._ignores, unreadable=unreadable,
                             trees=self._trees, scope=self._name_for(remote_url))

    def tree_hash(self, url: str, *, commit: str, path: str = "./",
                  consumer: str | None = None) -> str:
        """The Git tree id of ``path`` at ``commit``: equal ids mean equal content."""
        remote_url = parse_url(url, self._policy)
        self._check_served(remote_url, url=url, commit=commit, consumer=consumer)
        with self._reading(remote_url, commit=commit) as store:
            return subtree_id(store, commit=commit, path=path, trees=self._trees,
                              scope=self._name_for(remote_url))

    def mirror_path(self, url: str) -> Path:
        """Where the mirror of ``url`` lives (whether or not it exists yet)."""
        return self._path_for(parse_url(url, self._policy))

    def disk_usage(self) -> int:
        """Bytes the mirrors use on disk, as last measured (after each fetch)."""
        with self._locks_guard:
            return sum(self._sizes.values())

    def evict(self, *, keep: str | None = None, room: int = 0) -> list[str]:
        """Remove least recently used mirrors until the total plus ``room`` fits ``max_bytes``.

        Skips mirrors being fetched into or read, and ``keep`` (a mirror directory name).
        Returns the directory names removed.  Called before every download (``room``: the most
        it may bring) and after every fetch that grew a mirror; public for callers that want to
        shrink the store at other times.  Without ``room`` it gives way to an eviction already
        running; with it, it waits for that one, so the download starts within the budget.
        """
        if self._max_bytes is None or not self._evicting.acquire(blocking=room > 0):
            return []
        removed: list[str] = []
        try:
            with self._locks_guard:
                order = sorted(self._sizes, key=lambda n: self._last_used.get(n, 0.0))
                total = sum(self._sizes.values())
            for name in order:
                if total + room <= self._max_bytes:
                    break
                if name == keep:
                    continue
                detached = self._detach(name)
                if detached is None:
                    continue
                doomed, size = detached
                total -= size
                shutil.rmtree(doomed, ignore_errors=True)
                self._trees.forget(name)
                removed.append(name)
                self.evictions += 1
        finally:
            self._evicting.release()
        return removed

    def _make_room(self, *, keep: str) -> None:
        """Before a download into mirror ``keep`` (its lock held): evict until the mirrors as they
        are on disk, ``keep`` included, and the download at its largest fit the budget."""
        if self._max_bytes is None:
            return
        size = _disk_usage(self._root / keep)
        with self._locks_guard:
            self._sizes[keep] = size
        self.evict(keep=keep, room=self._limits.max_fetch_bytes)

    # -- proofs and records ------------------------------------------------------------

    def _fetch_tip(self, remote: Remote, repo: Repo, resolution: Resolution, *,
                   listing: Listing) -> None:
        """Fetch an object the caller's listing advertised (proven by the listing itself)."""
        _write_fetch(remote, repo, wants=[resolution.want], depth=1, blob_limit=self._blob_limit(),
                     listing=listing)
        if ObjectID(resolution.want.encode("ascii")) not in repo.object_store:
            raise GitOperationError(
                f"fetching from {remote.url.display} failed: the remote did not send "
                f"{resolution.want} ({resolution.ref_name})"
            )

    def _prove_pin(self, remote: Remote, repo: Repo, listing: Listing,
                   selector: RefSelector, *, name: str) -> bool:
        """Make sure pinned ``selector.commit`` is readable *by this caller* and in the
        mirror; returns whether objects were fetched.  See the module docstring."""
        pinned = selector.commit
        assert pinned is not None
        tips = self._advertised_tips(listing, selector)
        present = ObjectID(pinned.encode("ascii")) in repo.object_store
        if present and (pinned in tips or reachable(repo, tips=tips, target=pinned,
                                                    limit=PROOF_WALK)):
            return False
        not_found = RefNotFoundError(
            f"commit {pinned} not found in {remote.url.display} (or not readable with these "
            "credentials)")
        self._make_room(keep=name)
        try:
            _write_fetch(remote, repo, wants=[pinned], depth=1, blob_limit=self._blob_limit(),
                         haves=[pinned] if present else [], listing=listing)
        except WantRefusedError as refused:
            if refused.protocol_version == 2 or not tips:
                raise not_found from None
            return self._deepen_for(remote, repo, tips=tips, pinned=pinned,
                                    not_found=not_found, listing=listing)
        if ObjectID(pinned.encode("ascii")) not in repo.object_store:
            raise not_found
        return not present

    def _deepen_for(self, remote: Remote, repo: Repo, *, tips: list[str], pinned: str,
                    not_found: RefNotFoundError, listing: Listing) -> bool:
        """Servers that send only advertised tips: deepen them, boundedly, to find ``pinned``."""
        for depth in _PIN_STEPS:
            _write_fetch(remote, repo, wants=tips, depth=depth, blob_limit=self._blob_limit(),
                         listing=listing)
            if reachable(repo, tips=tips, target=pinned, limit=depth + 1):
                return True
        raise RefNotFoundError(
            f"commit {pinned} is not readable with these credentials, or not among the last "
            f"{PIN_HISTORY} commits of the ref it was "
            f"looked for on in {remote.url.display}, and this server sends only advertised "
            "commits (set ref.branch to the branch that contains it, or use a server that "
            "serves commits by id)"
        ) from not_found

    @staticmethod
    def _advertised_tips(listing: Listing, selector: RefSelector) -> list[str]:
        """The commits the caller's listing offered for the selector's ref (or HEAD)."""
        if selector.branch is not None:
            names = [f"refs/heads/{selector.branch}"]
        elif selector.name is not None:
            names = [selector.name]
        elif selector.tag is not None:
            names = [f"refs/tags/{selector.tag}{PEELED_SUFFIX}", f"refs/tags/{selector.tag}"]
        else:
            names = ["HEAD"]
        return [listing.refs[n] for n in names if n in listing.refs][:1]

    def _blob_limit(self) -> int:
        # Blobs over the per-file limit could never be read; the server may leave them out.
        return self._limits.max_file_bytes + 1

    def _record_served(self, name: str, consumer: str, commit: str) -> None:
        """Remember (atomically, on disk) that ``commit`` was served to ``consumer``."""
        directory = self._root / name / SERVED_DIR
        path = directory / _consumer_file(consumer)
        try:
            served = path.read_text().split()
        except OSError:
            served = []
        if served and served[-1] == commit:
            # Still in use: keeps the record from expiring (sources.compact.SERVED_TTL).
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        served = [*[c for c in served if c != commit][-(_SERVED_KEEP - 1):], commit]
        directory.mkdir(exist_ok=True)
        fd, staging = tempfile.mkstemp(prefix=".served-", dir=directory)
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(served) + "\n")
        os.replace(staging, path)

    def _check_served(self, remote_url: RemoteUrl, *, url: str, commit: str,
                      consumer: str | None) -> None:
        if consumer is not None and not self.is_served(url, commit=commit, consumer=consumer):
            raise NotFetchedError(
                f"commit {commit} of {remote_url.display} has not been fetched for this source "
                "(yet)"
            )

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

    def _compact(self, name: str, path: Path) -> bool:
        """Replace mirror ``name`` by its compacted copy (:mod:`sources.compact`); the caller
        holds its fetch lock.  Skipped (False) while someone reads it: the next fetch tries
        again."""
        with self._locks_guard:
            if self._readers.get(name, 0):
                return False
        staging = compacted_copy(path, served_dir_name=SERVED_DIR, keep_files=[_USED_MARKER],
                                 kept_dir_name=KEPT_DIR)
        aside = self._root / f".evict-{name}-{os.getpid()}-{threading.get_ident()}"
        with self._locks_guard:
            if self._readers.get(name, 0):
                shutil.rmtree(staging, ignore_errors=True)
                return False
            os.rename(path, aside)
            os.rename(staging, path)
        shutil.rmtree(aside, ignore_errors=True)
        self.compactions += 1
        return True

    def _found_damaged(self, name: str, path: Path, *, deep: bool) -> bool:
        """After a fetch into mirror ``name`` failed (its lock held): whether the mirror is
        damaged, and then discarded (True: the caller may start over in a new one)."""
        with self._locks_guard:
            flagged = name in self._damaged
        if not flagged and cachefiles.damage(path, deep=deep) is None:
            return False
        if not self._discard(name):
            with self._locks_guard:
                self._damaged.add(name)  # refused to new readers; discarded once they are done
            return False
        return True

    def _discard(self, name: str) -> bool:
        """Remove damaged mirror ``name`` (its fetch lock held by the caller) unless someone
        reads it; whether it is gone."""
        with self._locks_guard:
            if self._readers.get(name, 0):
                return False
            aside = self._root / f".evict-{name}-{os.getpid()}-{threading.get_ident()}"
            try:
                os.rename(self._root / name, aside)
                moved = True
            except FileNotFoundError:
                moved = False
            self._damaged.discard(name)
            self._sizes.pop(name, None)
        if moved:
            shutil.rmtree(aside, ignore_errors=True)
            self.discarded += 1
        self._trees.forget(name)
        return True

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
        now = time.time()
        for entry in self._root.iterdir():
            if entry.name.startswith((".evict-", ".init-")):
                # Debris of a process that stopped mid-way; a recent one may be another live
                # process's work on a shared root (the CLI's cache), which takes milliseconds.
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > _DEBRIS_AGE:
                        shutil.rmtree(entry, ignore_errors=True)
            elif entry.is_dir() and (entry / "HEAD").exists():
                _clear_debris(entry, now=now)
                whole = cachefiles.known_whole_in_this_boot(entry)
                if cachefiles.damage(entry, deep=not whole) is not None:
                    aside = self._root / f".evict-{entry.name}-{os.getpid()}-adopt"
                    with contextlib.suppress(OSError):
                        os.rename(entry, aside)
                        shutil.rmtree(aside, ignore_errors=True)
                        self.discarded += 1
                    continue
                if not whole:
                    cachefiles.mark_boot(entry)
                marker = entry / _USED_MARKER
                used = marker.stat().st_mtime if marker.exists() else entry.stat().st_mtime
                self._last_used[entry.name] = used
                self._sizes[entry.name] = _disk_usage(entry)

    @contextlib.contextmanager
    def _reading(self, remote_url: RemoteUrl, *, commit: str) -> Iterator[DiskObjectStore]:
        """The mirror's object store opened for reading; it cannot be evicted until the block ends.
        Only the object store: a whole repository (its config parsed, its refs and worktrees set
        up) costs ten times as much to open, on every read.

        A read that fails other than on purpose (not a :class:`SourceError`) has the mirror
        checked in full: found damaged, it is refused to every reader from then on (this one
        gets :class:`NotFetchedError`) and discarded by the next fetch, which fetches again."""
        name = self._name_for(remote_url)
        missing = NotFetchedError(
            f"commit {commit} of {remote_url.display} is not in the mirror; fetch it first")
        with self._locks_guard:
            if name in self._damaged:
                raise missing
            self._readers[name] = self._readers.get(name, 0) + 1
        try:
            objects = self._root / name / "objects"
            if not objects.is_dir():
                raise missing
            store = DiskObjectStore(str(objects))
            self._touch(name)
            try:
                yield store
            except SourceError:
                raise
            except Exception as error:
                # Its frames may hold views of the pack's memory map, which could not be closed.
                traceback.clear_frames(error.__traceback__)
                problem = cachefiles.damage(self._root / name, deep=True)
                if problem is None:
                    raise
                with self._locks_guard:
                    self._damaged.add(name)
                raise NotFetchedError(
                    f"the mirror of {remote_url.display} was found damaged ({problem}); "
                    "it is fetched again") from None
            finally:
                with contextlib.suppress(BufferError):  # a view still held: the map goes with it
                    store.close()
        finally:
            with self._locks_guard:
                self._readers[name] -= 1

    def _ensure_mirror(self, remote_url: RemoteUrl, *, name: str) -> Path:
        """Create the bare mirror if needed (atomically: init aside, then rename); the caller
        holds its lock.  One found damaged meanwhile (an unfinished write of this process, or a
        read that failed) is discarded first, or refused while someone still reads it."""
        path = self._path_for(remote_url)
        with self._locks_guard:
            flagged = name in self._damaged
        if (flagged or cachefiles.unfinished_write(path)) and not self._discard(name):
            raise GitOperationError(
                f"the mirror of {remote_url.display} was found damaged and is still being read; "
                "it is fetched again once nobody reads it")
        if (path / "HEAD").exists():
            return path
        staging = Path(tempfile.mkdtemp(prefix=".init-", dir=self._root))
        try:
            # The URL is for people inspecting the disk; it never contains credentials.
            cachefiles.init_bare(staging, url=remote_url.display)
            try:
                os.rename(staging, path)
            except OSError:
                if not (path / "HEAD").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return path

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
