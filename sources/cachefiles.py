"""A mirror's files, written as a cache is written, and the check that tells a damaged mirror.

Identity: none.  Local disk only; nothing here talks to a remote.

A mirror (:mod:`sources.mirror`) holds nothing that is not on its remote: losing one costs a
fetch, never data.  So it is written as a cache, not as a database:

- **No fsync, no lock files.**  dulwich writes each ref, the shallow list and the repository's
  files through lock files and ``fsync``s each one (7 per cold fetch into a new mirror); here
  every such file is written aside in the mirror's own directory and renamed into place
  (:func:`write_file`), so a reader sees the old content or the new, never a part, and a
  process that dies leaves no lock behind that would refuse the next write.  The pack and its
  index are dulwich's own (written aside, renamed in; the index last, and dulwich uses no pack
  without its index), also without ``fsync``.  Writers of one mirror are serialized by the
  store's per-URL lock; a ref is only ever set to a commit the mirror holds.
- **A damaged mirror is found, discarded and fetched again; it is never trusted.**  What can
  damage one, and what finds it:

  * a process that stops in the middle of a write (killed, out of memory, out of disk): a
    write into a mirror is bracketed by a marker file naming the writer (:func:`writing`); a
    marker whose writer is gone means an unfinished write (the new pack may be in without the
    shallow list that says its history is missing, say);
  * a machine that stops before the kernel wrote its page cache out (power loss, kernel crash):
    any file written in the seconds before may come back empty, short, zeroed or old, whether
    or not it was renamed.  Within one boot the page cache is the truth, so a mirror records
    the boot it was last known whole in (:data:`BOOT_FILE`); one from another boot is checked
    in full (:func:`damage` with ``deep``: every pack's and index's SHA-1 checksum) before use;
  * anything else: a read or write of the object store that fails other than on purpose makes
    the store check the mirror again (:class:`sources.mirror.MirrorStore`).

  :func:`damage` says what is wrong: an unfinished write; a ref or shallow entry that is not an
  object id; a pack whose index does not match it (count, checksum) or, deep, whose bytes do
  not match their checksum; a ref's commit whose tree is missing, or whose parents are missing
  while the shallow list does not say so.  The store then moves the mirror aside and removes
  it, as eviction does: its commits are fetched again by the next fetch, and a reader meanwhile
  gets :class:`~sources.errors.NotFetchedError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dulwich.objects import Commit, ObjectID
from dulwich.repo import Repo

WRITING = "stageset-writing"
"""Per mirror, while a write into it runs: ``<boot id> <pid>`` of the writer."""

BOOT_FILE = "stageset-boot"
"""Per mirror: the boot (``/proc/sys/kernel/random/boot_id``) in which it was last known whole."""

STAGING_PREFIX = ".tmp-"
"""Files being written aside, in the mirror's own directory (debris if a writer died)."""

_HEX = re.compile(rb"[0-9a-f]{40}")
_REF_FILE = re.compile(rb"([0-9a-f]{40}|ref: refs/[^\0\n]+)\n?")

_CONFIG = (
    "[core]\n"
    "\trepositoryformatversion = 0\n"
    "\tfilemode = true\n"
    "\tbare = true\n"
    "\tlogallrefupdates = false\n"
    "[stageset]\n"
    "\turl = {url}\n"
)


def write_file(path: Path, data: bytes) -> None:
    """``data`` into ``path``: written aside next to it, then renamed over it; no fsync."""
    fd, staging = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise


class CacheRepo(Repo):
    """A mirror opened with dulwich, whose named files (the shallow list) are written as
    :func:`write_file` writes, without a lock file or an fsync."""

    def _put_named_file(self, path: str, contents: bytes) -> None:
        write_file(Path(self.controldir()) / path.lstrip(os.path.sep), contents)


def init_bare(path: Path, *, url: str) -> None:
    """Lay out an empty bare repository in the existing, empty directory ``path`` (the caller
    renames it into place).  ``url``: shown in its config for people inspecting the disk; never
    a credential (no newline, as any display URL)."""
    for directory in ("objects/pack", "objects/info", "refs/heads", "refs/tags"):
        (path / directory).mkdir(parents=True, exist_ok=True)
    (path / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    shown = url.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    (path / "config").write_text(_CONFIG.format(url=f'"{shown}"'))
    mark_boot(path)


def set_ref(path: Path, ref: str, commit: str) -> None:
    """Point ``ref`` (a full, valid ref name, ``refs/...``) of the mirror at ``path`` to ``commit``."""
    target = path / ref
    if target.exists() and target.read_bytes().strip() == commit.encode("ascii"):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(commit.encode("ascii") + b"\n")
        os.replace(staging, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise


def boot_id() -> str | None:
    """This boot's id (Linux), or None where the kernel does not tell."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def known_whole_in_this_boot(path: Path) -> bool:
    """Whether the mirror at ``path`` was last known whole in this very boot (so its files are
    what this boot's page cache holds, unsynced or not)."""
    current = boot_id()
    try:
        return current is not None and (path / BOOT_FILE).read_text().strip() == current
    except OSError:
        return False


def mark_boot(path: Path) -> None:
    """Record that the mirror at ``path`` is whole in this boot."""
    with contextlib.suppress(OSError):
        write_file(path / BOOT_FILE, f"{boot_id() or ''}\n".encode())


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Bracket a write into the mirror at ``path``: the marker names this process while it runs.

    The marker goes when the block ends normally, and when it raises a
    :class:`~sources.errors.SourceError` (a refusal or failure of the remote, raised before
    anything is written: :meth:`sources.transport.Remote.fetch`).  Anything else leaves it, so
    the mirror counts as damaged until the store discards it."""
    from sources.errors import SourceError

    marker = path / WRITING
    write_file(marker, f"{boot_id() or ''} {os.getpid()}\n".encode())
    try:
        yield
    except SourceError:
        with contextlib.suppress(OSError):
            marker.unlink()
        raise
    else:
        with contextlib.suppress(OSError):
            marker.unlink()


def unfinished_write(path: Path) -> bool:
    """Whether a write into the mirror at ``path`` was left unfinished: its marker names a
    writer that is gone (another boot, a process that no longer runs) or this very process
    (whose store found it outside a write, so the write failed)."""
    try:
        words = (path / WRITING).read_text().split()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if len(words) != 2 or not words[1].isdigit():
        return True
    boot, pid = words[0], int(words[1])
    if boot != (boot_id() or "") or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False


def damage(path: Path, *, deep: bool) -> str | None:
    """What is wrong with the mirror at ``path`` (module docstring), or None if nothing is.

    ``deep`` also checks every pack's and index's bytes against their SHA-1 checksums (reads
    every byte: for a mirror from another boot).  Never raises: a mirror that cannot be read
    is damaged."""
    if unfinished_write(path):
        return "a write into it did not finish"
    try:
        with CacheRepo(str(path)) as repo:
            return _damage(repo, deep=deep)
    except Exception as error:  # whatever stops reading it, it cannot be trusted
        return f"it cannot be read ({type(error).__name__}: {error})"


def _damage(repo: Repo, *, deep: bool) -> str | None:
    # dulwich reads an empty ref file as no ref; a file written without fsync may come back so
    # after a power loss, so every loose ref file is read here as written.
    control = Path(repo.controldir())
    for ref_file in (control / "refs").rglob("*"):
        if ref_file.is_file() and not ref_file.name.startswith(STAGING_PREFIX) and not (
                _REF_FILE.fullmatch(ref_file.read_bytes())):
            return f"ref {ref_file.relative_to(control)} is not an object id"
    refs = {name: sha for name, sha in repo.refs.as_dict().items() if name != b"HEAD"}
    for name, sha in refs.items():
        if not _HEX.fullmatch(sha):
            return f"ref {name.decode(errors='replace')} is not an object id"
    shallow = repo.get_shallow()  # raises on a line that is not an object id
    store: Any = repo.object_store
    for pack in store.packs:
        pack.check_length_and_checksum()
        if deep:
            pack.index.check()
            pack.data.check()
    for sha in set(refs.values()):
        oid = ObjectID(sha)
        if oid not in store:
            continue  # fetched again when wanted
        obj = store[oid]
        if not isinstance(obj, Commit):
            continue
        if obj.tree not in store:
            return f"commit {sha.decode()} has no tree"
        if oid not in shallow and any(parent not in store for parent in obj.parents):
            return f"commit {sha.decode()} lacks its history and is not marked shallow"
    return None
