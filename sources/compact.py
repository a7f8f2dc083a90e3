"""Compacting a mirror: keep only the commits its readers can still be served.

Identity: none; local disk only (the controller's own mirror directory).  Nothing here
talks to a remote.

Every fetch adds a pack to a mirror, and a mirror is shared by every GitRepository of its
URL, so without this a busy repository's mirror grows with its history for as long as the
controller runs (measured: the one-hour soak's mirrors grew linearly).  A mirror is a cache,
not a clone: a reader may only read commits recorded as served to its consumer
(``stageset-served/``, at most the newest few per consumer), and later fetches negotiate
from the mirror's refs.  So a compacted mirror keeps exactly:

- the commits of the served records, of the kept records (commits a reader asked to keep beyond
  the newest few: a stage's last good revision) and of the refs (annotated tags with them), each with
  its whole tree (trees and blobs; blobs a fetch left out for their size stay out);
- nothing of their history: the kept commits are marked shallow, as a depth-1 fetch leaves
  them.  A pinned commit that is no longer kept is asked of the server again with the
  caller's credentials (the mirror's proof rules do not change).

Records of consumers not heard of for :data:`SERVED_TTL` (a GitRepository deleted long ago), and
kept records their holder has not refreshed for as long (a StageSet deleted long ago), are dropped
first, so their commits stop being kept.

The compacted copy is built aside (``.init-*``, written as :mod:`sources.cachefiles` writes a
mirror: no lock files, no fsync) and swapped in by the caller
(:class:`sources.mirror.MirrorStore`, holding the URL's fetch lock, with no reader inside);
the old directory is then deleted.  A crash midway leaves the old mirror intact and an
``.init-*`` directory that the next start removes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from dulwich.object_store import BaseObjectStore
from dulwich.objects import Commit, ObjectID, ShaFile, Tag, Tree
from dulwich.repo import Repo

from sources import cachefiles

COMPACT_AFTER_PACKS = 16
"""A mirror with more packs than this is compacted after its next fetch."""

SERVED_TTL = 14 * 24 * 3600.0
"""Seconds after which a consumer's served record, not refreshed by a fetch, is dropped."""

# Git's file mode of a submodule entry: a commit of another repository, never in this one.
_GITLINK = 0o160000


def pack_count(path: Path) -> int:
    """How many packs the mirror at ``path`` holds."""
    try:
        return sum(1 for entry in os.scandir(path / "objects" / "pack") if entry.name.endswith(".pack"))
    except OSError:
        return 0


def needs_compaction(path: Path) -> bool:
    return pack_count(path) > COMPACT_AFTER_PACKS


def drop_stale_records(served_dir: Path, *, now: float | None = None) -> int:
    """Remove served records untouched for :data:`SERVED_TTL`; returns how many."""
    now = time.time() if now is None else now
    dropped = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(served_dir):
            with contextlib.suppress(OSError):
                if entry.is_file() and now - entry.stat().st_mtime > SERVED_TTL:
                    os.unlink(entry.path)
                    dropped += 1
    return dropped


def drop_stale_kept(kept_dir: Path, *, now: float | None = None) -> int:
    """Remove kept records (``<consumer>/<holder>`` files) untouched for :data:`SERVED_TTL`."""
    dropped = 0
    with contextlib.suppress(OSError):
        for consumer in os.scandir(kept_dir):
            if consumer.is_dir():
                dropped += drop_stale_records(Path(consumer.path), now=now)
    return dropped


def kept_commits(consumer_dir: Path) -> set[str]:
    """Every commit the kept records of one consumer name."""
    return served_commits(consumer_dir)


def all_kept_commits(kept_dir: Path) -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for consumer in os.scandir(kept_dir):
            if consumer.is_dir():
                found.update(kept_commits(Path(consumer.path)))
    return found


def served_commits(served_dir: Path) -> set[str]:
    """Every commit any consumer's record names."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(served_dir):
            with contextlib.suppress(OSError):
                if entry.is_file() and not entry.name.startswith("."):
                    found.update(Path(entry.path).read_text().split())
    return found


def _closure(store: BaseObjectStore, roots: Iterable[ObjectID]) -> Iterator[ShaFile]:
    """``roots`` (tags, commits) and everything their trees hold that the store has; no parents."""
    seen: set[ObjectID] = set()
    pending = list(roots)
    while pending:
        sha = pending.pop()
        if sha in seen or sha not in store:
            continue
        seen.add(sha)
        obj = store[sha]
        yield obj
        if isinstance(obj, Tag):
            pending.append(obj.object[1])
        elif isinstance(obj, Commit):
            pending.append(obj.tree)
        elif isinstance(obj, Tree):
            pending.extend(entry.sha for entry in obj.iteritems() if entry.mode != _GITLINK)


def compacted_copy(path: Path, *, served_dir_name: str, keep_files: Iterable[str],
                   kept_dir_name: str | None = None) -> Path:
    """Build the compacted copy of the mirror at ``path`` next to it; returns its directory.

    ``served_dir_name`` is the records' directory and ``kept_dir_name`` the kept records' (both
    copied, stale records dropped first); ``keep_files`` are other top-level files copied as they
    are (markers)."""
    drop_stale_records(path / served_dir_name)
    if kept_dir_name is not None:
        drop_stale_kept(path / kept_dir_name)
    staging = Path(tempfile.mkdtemp(prefix=".init-", dir=path.parent))
    try:
        with Repo(str(path)) as old:
            refs = {name: sha for name, sha in old.refs.as_dict().items()
                    if name != b"HEAD" and sha in old.object_store}
            wanted = served_commits(path / served_dir_name)
            if kept_dir_name is not None:
                wanted |= all_kept_commits(path / kept_dir_name)
            roots = {ObjectID(c.encode("ascii")) for c in wanted}
            roots.update(refs.values())
            objects = list(_closure(old.object_store, roots))
            kept = {o.id for o in objects}
            commits = [o for o in objects if isinstance(o, Commit)]
            cachefiles.init_bare(staging, url="")
            with cachefiles.CacheRepo(str(staging)) as new:
                if objects:
                    new.object_store.add_objects([(o, None) for o in objects])
                shallow = {c.id for c in commits if any(p not in kept for p in c.parents)}
                if shallow:
                    new.update_shallow(shallow, None)
            for ref, sha in refs.items():
                with contextlib.suppress(OSError):  # refs are hints for negotiation
                    cachefiles.set_ref(staging, ref.decode(), sha.decode("ascii"))
        shutil.copyfile(path / "config", staging / "config")
        for records in (served_dir_name, kept_dir_name):
            if records is not None and (path / records).is_dir():
                shutil.copytree(path / records, staging / records, dirs_exist_ok=True)
        for kept_file in keep_files:
            with contextlib.suppress(OSError):
                shutil.copy2(path / kept_file, staging / kept_file)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging
