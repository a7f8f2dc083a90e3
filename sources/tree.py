"""Reading the files under a path of a commit straight from a Git object store.

Identity: none of its own — it reads a mirror on the controller's disk; who may read which
commit is decided by :mod:`sources.mirror` before a read gets here.

Why no work tree: a checkout writes every file of every revision to disk and races with
concurrent readers; reading blobs from the object store is cheaper, needs no cleanup and
never touches the controller's filesystem, so a hostile repository cannot make us follow a
symlink out of a checkout.

What a tree may contain is checked here, with errors that name the offending path:

* ``path`` itself must be relative and free of ``..`` (``./deploy``, ``deploy``, ``./`` and
  ``""`` are fine; ``/etc`` and ``../x`` are :class:`UnsafePathError`).
* Submodules (gitlinks) are refused: their content is in another repository we did not
  fetch, and silently skipping them would deploy half an application.
* Symlinks are **resolved** when their target stays inside ``path`` — files read as the
  target's content, directories expand as copies — so repositories that share a base by
  symlink keep working.  Targets that are absolute, leave ``path`` or loop are
  :class:`UnsafePathError`; a dangling target is :class:`PathNotFoundError`.  Both name the
  link.  Keeping targets inside ``path`` also means the Git tree id of
  ``path`` (:func:`subtree_id`) changes whenever anything we would read changes, which is
  what lets callers skip re-rendering an unchanged subtree.
* A *lenient* read (``unreadable=`` a dict) records submodules and unsafe symlinks with the
  reason instead of raising, and leaves them out: a build reads a whole source root, and one
  submodule or stray link somewhere in a monorepo must fail only the builds that need it.
* :class:`~sources.limits.Limits` bound the number of files and the bytes of each file and
  of the whole read (:class:`LimitExceededError`), after ignore rules are applied, and the
  tree entries visited and the nesting depth whether ignored or not (Git stores a subtree
  once however often it is named, so a few kilobytes can name millions of paths).  A blob's
  size is read from its pack (or loose object) header before the blob is loaded
  (:func:`object_size`), so a 100 MB file is refused without 100 MB of memory.

Ignore rules are Flux's (:mod:`sources.ignore`): its default exclusions unless the source
has ``.sourceignore`` files or ``ignore`` patterns, matched against paths relative to the
repository root whatever ``path`` is read (``/deploy/secret.yaml`` is anchored at the root;
``*.md`` matches anywhere).  The ``.sourceignore`` files of a commit are found by one walk
of its trees, cached by root tree id (:class:`IgnoreCache`).  Parsed tree objects are cached per
mirror by id (:class:`TreeCache`): rendering a thousand stages of one commit walks the same root
and parent trees a thousand times, and parsing a directory of a thousand entries each time made the
cold pass of a mono-repository grow with the square of its stages.  Ignored entries are skipped
before they are inspected, so an ignored symlink or submodule is no error.  Note that the
tree id still covers ignored files.
"""

from __future__ import annotations

import os
import stat
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from dulwich.object_store import BaseObjectStore
from dulwich.objects import S_ISGITLINK, Blob, Commit, ObjectID, Tag, Tree

from sources.errors import (
    GitOperationError,
    LimitExceededError,
    NotFetchedError,
    PathNotFoundError,
    UnsafePathError,
)
from sources.ignore import IGNORE_FILE, Matcher, default_matcher, source_matcher
from sources.limits import Limits, MiB

__all__ = ["CommitTree", "IgnoreCache", "Limits", "MiB", "TreeCache", "object_size", "read_tree",
           "split_path", "subtree_id"]

MAX_SYMLINK_HOPS = 40
"""Like Linux's MAXSYMLINKS: a chain longer than this is treated as a loop."""
MAX_SYMLINK_TARGET = 4096
"""Like Linux's PATH_MAX: a longer symlink target is refused before it is loaded."""
_OFS_DELTA, _REF_DELTA = 6, 7

Parts = tuple[str, ...]


def split_path(path: str) -> Parts:
    """``"./deploy/app"`` -> ``("deploy", "app")``; refuse absolute and ``..`` paths."""
    if path.startswith("/"):
        raise UnsafePathError(f"path {path!r} is absolute; use a path relative to the "
                              "repository root such as './deploy'")
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafePathError(f"path {path!r} contains '..'")
    return parts


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Git's little-endian base-128 integer at ``pos``: (value, next position)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _inflate_head(handle: BinaryIO, want: int) -> bytes:
    """The first ``want`` bytes of the zlib stream at the handle's position (or fewer)."""
    inflater = zlib.decompressobj()
    out = b""
    while len(out) < want:
        chunk = handle.read(256)
        if not chunk:
            break
        out += inflater.decompress(chunk, want - len(out))
        if inflater.eof:
            break
    return out


def _packed_size(path: str, offset: int, hash_size: int) -> int | None:
    """The inflated size of the object at ``offset`` of pack ``path``, from its header.

    For a delta it is the result size recorded at the start of the delta data, so only a
    few bytes are ever inflated.
    """
    with open(path, "rb") as handle:
        handle.seek(offset)
        head = handle.read(32)
        if not head:
            return None
        kind = (head[0] >> 4) & 7
        size, shift, pos = head[0] & 0x0F, 4, 1
        byte = head[0]
        while byte & 0x80:
            byte = head[pos]
            size |= (byte & 0x7F) << shift
            shift += 7
            pos += 1
        if kind == _OFS_DELTA:
            byte = head[pos]
            pos += 1
            while byte & 0x80:
                byte = head[pos]
                pos += 1
        elif kind == _REF_DELTA:
            pos += hash_size
        else:
            return size
        handle.seek(offset + pos)
        delta = _inflate_head(handle, 20)
        try:
            _, at = _varint(delta, 0)  # the base's size
            result, _ = _varint(delta, at)
        except IndexError:
            return None
        return result


def object_size(store: BaseObjectStore, sha: ObjectID) -> int | None:
    """The size of object ``sha`` without loading it, if the store can tell; else None.

    Reads the pack entry's header (or a loose object's ``"<type> <size>\\0"`` prefix).  Any
    surprise returns None and the caller loads the object as usual.
    """
    try:
        for pack in getattr(store, "packs", ()):
            try:
                offset = pack.index.object_offset(sha)
            except KeyError:
                continue
            return _packed_size(pack._data_path, offset, len(bytes.fromhex(sha.decode())))
        loose_path = getattr(store, "_get_shafile_path", None)
        if loose_path is None:
            return None
        path = loose_path(sha)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as handle:
            header = _inflate_head(handle, 64)
        _, _, rest = header.partition(b" ")
        digits, nul, _ = rest.partition(b"\0")
        return int(digits) if nul and digits.isdigit() else None
    except (OSError, ValueError, AttributeError, IndexError, zlib.error):
        return None


def _show(parts: Parts) -> str:
    return "/".join(parts) or "."


@dataclass
class _Budget:
    limits: Limits
    files: int = 0
    total: int = 0
    entries: int = 0

    def visit(self, path: str, *, depth: int) -> None:
        """Every tree entry looked at, ignored or not, counts; so does nesting."""
        self.entries += 1
        if self.entries > self.limits.max_tree_entries:
            raise LimitExceededError(
                f"more than {self.limits.max_tree_entries} tree entries to look at (limit "
                f"reached at {path!r}); does the repository repeat a subtree many times?"
            )
        if depth > self.limits.max_depth:
            raise LimitExceededError(
                f"directories nested deeper than {self.limits.max_depth} levels at {path!r}"
            )

    def charge(self, path: str, size: int) -> None:
        if size > self.limits.max_file_bytes:
            raise LimitExceededError(
                f"file {path!r} is {size} bytes, more than the limit of "
                f"{self.limits.max_file_bytes} bytes per file"
            )
        self.files += 1
        if self.files > self.limits.max_files:
            raise LimitExceededError(
                f"more than {self.limits.max_files} files under the path (limit reached at "
                f"{path!r})"
            )
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise LimitExceededError(
                f"files under the path add up to more than {self.limits.max_total_bytes} "
                f"bytes (limit reached at {path!r})"
            )


@dataclass
class CommitTree:
    """The tree of one commit in ``store``, for path lookups and reads."""

    store: BaseObjectStore
    commit: str
    trees: TreeCache | None = None
    """Parsed trees shared between reads of the same mirror (``scope``); None parses every time."""
    scope: str = ""
    root: ObjectID = field(init=False)

    def __post_init__(self) -> None:
        oid = ObjectID(self.commit.encode("ascii"))
        if oid not in self.store:
            raise NotFetchedError(f"commit {self.commit} is not in the mirror; fetch it first")
        obj = self.store[oid]
        while isinstance(obj, Tag):
            obj = self.store[obj.object[1]]
        if not isinstance(obj, Commit):
            raise GitOperationError(f"object {self.commit} is a {obj.type_name.decode()}, "
                                    "not a commit")
        self.root = obj.tree

    # -- lookups -----------------------------------------------------------------------

    def _tree(self, sha: ObjectID) -> Tree:
        if self.trees is not None:
            return self.trees.tree(self.scope, sha, self._load_tree)
        return self._load_tree(sha)

    def _load_tree(self, sha: ObjectID) -> Tree:
        obj = self.store[sha]
        if not isinstance(obj, Tree):  # pragma: no cover - a corrupt repository
            raise GitOperationError(f"object {sha.decode()} is not a tree")
        return obj

    def _link_target(self, sha: ObjectID) -> str:
        size = object_size(self.store, sha)
        if sha not in self.store or (size is not None and size > MAX_SYMLINK_TARGET):
            # (A missing blob was left out by the server for being over the size limit.)
            raise UnsafePathError(f"a symlink target (object {sha.decode()}) is longer than "
                                  f"{MAX_SYMLINK_TARGET} bytes")
        blob = self.store[sha]
        if not isinstance(blob, Blob):  # pragma: no cover - a corrupt repository
            raise GitOperationError(f"object {sha.decode()} is not a blob")
        return blob.data.decode("utf-8", "replace")

    def lookup(self, parts: Parts, *, within: Parts, origin: str) -> tuple[int, ObjectID, Parts]:
        """Find ``parts`` from the root, following symlinks that stay inside ``within``.

        Returns ``(mode, object id, real path)``; raises :class:`PathNotFoundError` if a
        component is missing and :class:`UnsafePathError` for a symlink that leaves
        ``within`` or loops.  ``origin`` names what is being looked up, for messages.
        """
        pending = list(parts)
        mode, sha = stat.S_IFDIR, self.root
        real: Parts = ()
        hops = 0
        while pending:
            name = pending.pop(0)
            if not stat.S_ISDIR(mode):
                raise PathNotFoundError(f"{origin}: {_show(real)!r} is not a directory")
            tree = self._tree(sha)
            key = name.encode()
            if key not in tree:
                raise PathNotFoundError(f"{origin}: {_show((*real, name))!r} does not exist")
            mode, sha = tree[key]
            if stat.S_ISLNK(mode):
                hops += 1
                link = (*real, name)
                if hops > MAX_SYMLINK_HOPS:
                    raise UnsafePathError(f"symlink {_show(link)!r}: too many levels of "
                                          "symbolic links (a loop?)")
                target_parts = self._join_target(link, self._link_target(sha), within=within)
                pending = [*target_parts, *pending]
                mode, sha, real = stat.S_IFDIR, self.root, ()
                continue
            if S_ISGITLINK(mode):
                raise UnsafePathError(f"{_show((*real, name))!r} is a submodule, which is not "
                                      "supported")
            real = (*real, name)
        return mode, sha, real

    def _join_target(self, link: Parts, target: str, *, within: Parts) -> Parts:
        """The repository path a symlink at ``link`` points to; refuse escapes."""
        shown = f"symlink {_show(link)!r} -> {target!r}"
        if target.startswith("/"):
            raise UnsafePathError(f"{shown} is absolute")
        resolved: list[str] = list(link[:-1])
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not resolved:
                    raise UnsafePathError(f"{shown} leaves the repository")
                resolved.pop()
            else:
                resolved.append(part)
        result = tuple(resolved)
        if result[: len(within)] != within:
            raise UnsafePathError(f"{shown} points outside {_show(within)!r}")
        return result

    def subtree(self, path: str) -> tuple[ObjectID, Parts]:
        """The tree id and real path of directory ``path``."""
        parts = split_path(path)
        mode, sha, real = self.lookup(parts, within=(), origin=f"path {path!r}")
        if not stat.S_ISDIR(mode):
            raise PathNotFoundError(f"path {path!r} is a file, not a directory")
        return sha, real

    # -- reading -----------------------------------------------------------------------

    def read(self, path: str, *, ignore: str | None, limits: Limits,
             cache: IgnoreCache | None = None, unreadable: dict[str, str] | None = None
             ) -> dict[str, bytes]:
        """Every file under ``path`` that the ignore rules keep: relative POSIX path -> content.

        With ``unreadable``, entries that cannot be read safely (submodules, symlinks that
        leave ``path``, dangle or loop) are recorded there (relative path -> why) and left out
        instead of failing the whole read: a caller reading a whole source root decides whether
        anything it needs is among them.  Limits still fail the read.
        """
        tree_id, real = self.subtree(path)
        budget = _Budget(limits)
        # "is None", not "or": an empty cache is falsy (it has a length), and was never filled.
        matcher = (IgnoreCache() if cache is None else cache).matcher(self, ignore=ignore, budget=budget)
        walk = _Walk(tree=self, within=real, matcher=matcher, budget=budget, unreadable=unreadable)
        walk.directory(tree_id, real=real, out=(), stack=(real,))
        return walk.files

    def sourceignore_files(self, budget: _Budget) -> list[tuple[Parts, str]]:
        """Every ``.sourceignore`` of the commit as (directory, text), parents first.

        As Flux: regular files only (no symlinks), every directory visited (ignored or not).
        """
        found: list[tuple[Parts, str]] = []
        pending: list[tuple[ObjectID, Parts]] = [(self.root, ())]
        key = IGNORE_FILE.encode()
        while pending:
            tree_id, parts = pending.pop()
            tree = self._tree(tree_id)
            subdirs: list[tuple[ObjectID, Parts]] = []
            for entry in tree.iteritems(name_order=True):
                name = entry.path.decode("utf-8", "replace")
                budget.visit(_show((*parts, name)), depth=0)  # iterative: depth is no risk
                if entry.path == key and stat.S_ISREG(entry.mode):
                    size = object_size(self.store, entry.sha)
                    if size is not None and size > _MAX_IGNORE_FILE:
                        raise LimitExceededError(
                            f"{_show((*parts, IGNORE_FILE))!r} is larger than "
                            f"{_MAX_IGNORE_FILE} bytes")
                    if entry.sha not in self.store:
                        continue
                    blob = self.store[entry.sha]
                    if isinstance(blob, Blob):
                        found.append((parts, blob.data.decode("utf-8", "replace")))
                elif stat.S_ISDIR(entry.mode) and entry.path != b".git":
                    subdirs.append((entry.sha, (*parts, name)))
            pending.extend(reversed(subdirs))
        return found


_MAX_IGNORE_FILE = 256 * 1024


class IgnoreCache:
    """Compiled ignore rules per (root tree, ``spec.ignore``): a commit's ``.sourceignore``
    files are found by walking all its trees, which is worth doing once, not per read.

    Keys are content ids, so one cache may serve every mirror; it keeps the newest ``size``
    entries and at most ``max_patterns`` compiled patterns in all.  The pattern bound is the
    one that holds memory: a compiled set lives outside Python's heap (9000 patterns: 30 MiB),
    so 256 entries of a tenant's largest pattern file, one per commit pushed, would otherwise
    hold gigabytes.  Sources without patterns share one matcher and cost nothing here.
    """

    def __init__(self, size: int = 256, *, max_patterns: int = 20_000) -> None:
        self._size = size
        self._max_patterns = max_patterns
        self._patterns = 0
        self._entries: OrderedDict[tuple[bytes, str | None], Matcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, tree: CommitTree, *, ignore: str | None, budget: _Budget) -> Matcher:
        key = (bytes(tree.root), ignore)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        # The scan has its own entry budget; the read that follows gets a fresh one.
        scan = _Budget(budget.limits)
        matcher = source_matcher(spec_ignore=ignore,
                                 sourceignore_files=tree.sourceignore_files(scan))
        with self._lock:
            if key not in self._entries:
                self._entries[key] = matcher
                self._patterns += self._cost(matcher)
            while len(self._entries) > self._size or (
                    self._patterns > self._max_patterns and len(self._entries) > 1):
                _, dropped = self._entries.popitem(last=False)
                self._patterns -= self._cost(dropped)
        return matcher

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_patterns(self) -> int:
        """Compiled patterns held (the shared default matcher counts none)."""
        return self._patterns

    @staticmethod
    def _cost(matcher: Matcher) -> int:
        return 0 if matcher is default_matcher() else matcher.size


class TreeCache:
    """Parsed Git trees by (mirror, tree id), least recently used out, bounded by tree entries.

    A tree id fixes a tree's content, so an entry never goes stale; the mirror's name is part of
    the key anyway, so a read only ever gets trees parsed from its own mirror's object store (no
    tenant's read is served from another's fetch, even for equal content).  Entries are shared
    read-only between threads (nothing mutates a parsed :class:`~dulwich.objects.Tree`).  The bound
    is the sum of entries of the trees held (``max_entries``, about 150 bytes each in CPython): a
    tree larger than a quarter of it is parsed every time, never kept.
    """

    def __init__(self, *, max_entries: int = 100_000) -> None:
        self._max_entries = max_entries
        self._held = 0
        self._trees: OrderedDict[tuple[str, bytes], Tree] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def tree(self, scope: str, sha: ObjectID, load: Callable[[ObjectID], Tree]) -> Tree:
        key = (scope, bytes(sha))
        with self._lock:
            found = self._trees.get(key)
            if found is not None:
                self._trees.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        tree = load(sha)
        size = len(tree)
        if size * 4 > self._max_entries:
            return tree
        with self._lock:
            if key not in self._trees:
                self._trees[key] = tree
                self._held += size
            while self._held > self._max_entries:
                _, dropped = self._trees.popitem(last=False)
                self._held -= len(dropped)
        return tree

    def forget(self, scope: str) -> None:
        """Drop one mirror's trees (it was removed from disk)."""
        with self._lock:
            for key in [k for k in self._trees if k[0] == scope]:
                self._held -= len(self._trees.pop(key))

    @property
    def held_entries(self) -> int:
        return self._held

    def __len__(self) -> int:
        return len(self._trees)


@dataclass
class _Walk:
    """One recursive read of a subtree; collects files and enforces limits."""

    tree: CommitTree
    within: Parts
    matcher: Matcher
    budget: _Budget
    unreadable: dict[str, str] | None = None
    files: dict[str, bytes] = field(default_factory=dict)

    def _repo_path(self, out: Parts) -> str:
        return "/".join((*self.within, *out))

    def _refuse(self, out: Parts, error: UnsafePathError | PathNotFoundError) -> None:
        """Fail the read, or (a lenient read) record why ``out`` was left out."""
        if self.unreadable is None:
            raise error
        self.unreadable["/".join(out)] = str(error)

    def directory(self, tree_id: ObjectID, *, real: Parts, out: Parts,
                  stack: tuple[Parts, ...]) -> None:
        for entry in self.tree._tree(tree_id).iteritems(name_order=True):
            try:
                name = entry.path.decode("utf-8")
            except UnicodeDecodeError:
                raise UnsafePathError(
                    f"a name under {_show((*self.within, *out))!r} is not valid UTF-8"
                ) from None
            if name in ("", ".", "..") or "/" in name or "\0" in name:
                raise UnsafePathError(f"invalid name {name!r} under {_show(real)!r}")
            self.budget.visit(self._repo_path((*out, name)), depth=len(out) + 1)
            self.entry(entry.mode, entry.sha, real=(*real, name), out=(*out, name),
                       stack=stack)

    def entry(self, mode: int, sha: ObjectID, *, real: Parts, out: Parts,
              stack: tuple[Parts, ...]) -> None:
        repo_path = self._repo_path(out)
        if S_ISGITLINK(mode):
            if self.matcher.excluded(repo_path, is_dir=False):
                return
            self._refuse(out, UnsafePathError(f"{repo_path!r} is a submodule, which is not supported"))
            return
        if stat.S_ISLNK(mode):
            if self.matcher.excluded(repo_path, is_dir=False):
                return
            try:
                mode, sha, real = self.tree.lookup(real, within=self.within,
                                                   origin=f"symlink {repo_path!r}")
                if stat.S_ISDIR(mode) and any(real == s[: len(real)] for s in stack):
                    raise UnsafePathError(f"symlink {repo_path!r} points to its own parent "
                                          f"directory {_show(real)!r} (a loop)")
            except (UnsafePathError, PathNotFoundError) as error:
                self._refuse(out, error)
                return
        if stat.S_ISDIR(mode):
            if self.matcher.prunes(repo_path):
                return
            self.directory(sha, real=real, out=out, stack=(*stack, real))
            return
        if self.matcher.excluded(repo_path, is_dir=False):
            return
        size = object_size(self.tree.store, sha)
        if size is not None:
            # Refused before the blob is loaded: a huge file costs no memory.
            self.budget.charge(repo_path, size)
        elif sha not in self.tree.store:
            # Mirrors are fetched with a partial-clone filter (blob:limit): the server left
            # this blob out because it is over the per-file limit.
            raise LimitExceededError(
                f"file {repo_path!r} is larger than the limit of "
                f"{self.budget.limits.max_file_bytes} bytes per file (the server did not send it)"
            )
        blob = self.tree.store[sha]
        if not isinstance(blob, Blob):  # pragma: no cover - a corrupt repository
            raise GitOperationError(f"{repo_path!r} is not a blob")
        data = blob.data
        if size is None:
            self.budget.charge(repo_path, len(data))
        elif size != len(data):  # pragma: no cover - a corrupt repository
            raise GitOperationError(f"{repo_path!r}: object {sha.decode()} is {len(data)} bytes, "
                                    f"its header said {size}")
        self.files["/".join(out)] = data


def read_tree(store: BaseObjectStore, *, commit: str, path: str, ignore: str | None,
              limits: Limits, cache: IgnoreCache | None = None,
              unreadable: dict[str, str] | None = None, trees: TreeCache | None = None,
              scope: str = "") -> dict[str, bytes]:
    """Files under ``path`` at ``commit`` that the ignore rules keep: relative path -> bytes
    (see :meth:`CommitTree.read` for ``unreadable``; ``trees``/``scope``: :class:`TreeCache`)."""
    return CommitTree(store, commit, trees, scope).read(path, ignore=ignore, limits=limits, cache=cache,
                                                        unreadable=unreadable)


def subtree_id(store: BaseObjectStore, *, commit: str, path: str, trees: TreeCache | None = None,
               scope: str = "") -> str:
    """The Git tree id (hex) of directory ``path`` at ``commit``."""
    tree_id, _ = CommitTree(store, commit, trees, scope).subtree(path)
    return tree_id.decode("ascii")
