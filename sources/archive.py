"""Unpacking an artifact (a gzip-compressed tarball) onto disk, streaming, bounded, refusing unsafe entries.

Identity: none.  Input is a file already verified against its digest (:mod:`sources.artifacts`
never calls this before); output is the files' contents written one after another into a file
the caller gives, and an :class:`Index` — per path its offset, size and SHA-256 in that file —
plus the paths a build may not load.

**Memory is bounded by design, not by content.**  A file's bytes go from the decompressor to the
output file in :data:`CHUNK` steps (hashed on the way); nothing holds a whole file, let alone a
whole tree.  What stays in memory is the index: one entry per path, its path bounded by
``max_path_bytes`` and all paths together by ``max_paths_bytes``.  Links cost no bytes on disk:
an in-root link is an index entry naming its target's bytes.

Why our own walk over :mod:`tarfile` rather than ``extractall``: nothing is written where an entry
says; every entry is checked by :func:`entry_path` and :func:`link_target` (pure, table-tested),
and the standard library's ``data`` filter (PEP 706) gives a second opinion on each one.  Refused,
failing the whole artifact with :class:`~sources.errors.UnsafePathError` naming the entry:

* absolute paths, any ``..`` segment, NUL bytes, paths too long or too deep;
* symbolic and hard links that leave the root (absolute targets, or ``..`` past the root);
* devices, FIFOs and every other special or unknown entry type;
* duplicate entries, and an entry below a path that is a file or a link.

A symbolic link that stays inside the root is read as its target's content (as a symlink in a
Git tree is); one to a directory, or to nothing, is listed in ``unreadable`` and fails only a
build that loads it.  A hard link reads as an earlier file.  Every link counts its target's size
against the limits again, so links cannot multiply a small archive into a large tree for a
reader (a build reading the same bytes under many names is bounded as if they were copies).

Bounds (:class:`~sources.limits.ArtifactLimits`): a file's size is checked from its header before
a byte of it is inflated; the decompressed stream as a whole — tar headers, long-name and pax
records included, which :mod:`tarfile` would otherwise read in one piece whatever size they claim —
is cut off past ``max_unpacked_bytes`` plus a small allowance per entry.
"""

from __future__ import annotations

import gzip
import hashlib
import posixpath
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import IO

from sources.errors import LimitExceededError, SourceError, UnsafePathError
from sources.limits import ArtifactLimits

_HEADER_ALLOWANCE = 4096
"""Decompressed bytes allowed per entry beyond file contents (header, padding, a long name)."""
_LINK_HOPS = 40
"""Symbolic links followed in a row before one counts as a loop (the kernel's limit)."""
_FILE_TYPES = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE}
_MAX_COMPONENT = 255
CHUNK = 64 * 1024
"""Bytes copied from the decompressor to disk at a time: the most of one file ever in memory."""


class ArchiveError(SourceError):
    """The artifact is not a readable gzip-compressed tarball."""


def entry_path(name: str, *, limits: ArtifactLimits) -> str:
    """The normalised path of an archive entry (``""`` for the root itself); raise
    :class:`UnsafePathError` for one that could leave the root or is unreasonable."""
    if "\x00" in name:
        raise UnsafePathError(f"archive entry {name!r} contains a NUL byte")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafePathError(f"archive entry {name!r} is an absolute path")
    if len(name.encode("utf-8", "surrogateescape")) > limits.max_path_bytes:
        raise UnsafePathError(f"archive entry {name[:80]!r}... is longer than {limits.max_path_bytes} bytes")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(f"archive entry {name!r} contains '..'")
    if len(parts) > limits.max_depth:
        raise UnsafePathError(f"archive entry {name[:80]!r} is nested deeper than {limits.max_depth} "
                              "directories")
    if any(len(p.encode("utf-8", "surrogateescape")) > _MAX_COMPONENT for p in parts):
        raise UnsafePathError(f"archive entry {name[:80]!r} has a name longer than {_MAX_COMPONENT} bytes")
    return "/".join(parts)


def link_target(path: str, target: str, *, symbolic: bool) -> str:
    """Where a link at ``path`` points, as a path from the root; raise :class:`UnsafePathError` when
    it leaves the root.  A symbolic link is relative to its directory, a hard link to the root."""
    if not target or "\x00" in target:
        raise UnsafePathError(f"archive entry {path!r} is a link without a usable target")
    if target.startswith(("/", "\\")):
        raise UnsafePathError(f"archive entry {path!r} links to the absolute path {target!r}")
    base = posixpath.dirname(path) if symbolic else ""
    joined = posixpath.normpath(posixpath.join(base, target))
    if joined == ".." or joined.startswith("../") or joined.startswith("/"):
        raise UnsafePathError(f"archive entry {path!r} links to {target!r}, outside the artifact")
    return "" if joined == "." else joined


class _Bounded:
    """A read-only stream that fails once more than ``limit`` bytes came through it."""

    def __init__(self, inner: IO[bytes], limit: int):
        self._inner = inner
        self._left = limit
        self._limit = limit

    def read(self, size: int = -1) -> bytes:
        want = self._left + 1 if size is None or size < 0 else min(size, self._left + 1)
        data = self._inner.read(want)
        self._left -= len(data)
        if self._left < 0:
            raise LimitExceededError(f"the artifact inflates to more than {self._limit} bytes "
                                     "(--artifact-max-unpacked-size); it was refused")
        return data


def _second_opinion(member: tarfile.TarInfo) -> None:
    """The standard library's ``data`` filter, against a root that exists nowhere (lexical checks only).
    Python before 3.11.4 has none: our own checks stand alone there."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # pragma: no cover - Python < 3.11.4
        return
    try:
        data_filter(member, "/nonexistent-stageset-artifact-root")
    except tarfile.FilterError as error:
        raise UnsafePathError(f"archive entry {member.name!r} is unsafe: {error}") from None


def _refuse_special(member: tarfile.TarInfo, path: str) -> None:
    """Our own checks of an entry's type and link target, before the standard library's."""
    if member.ischr() or member.isblk():
        raise UnsafePathError(f"archive entry {member.name!r} is a device")
    if member.isfifo():
        raise UnsafePathError(f"archive entry {member.name!r} is a FIFO")
    if member.issym() or member.islnk():
        link_target(path, member.linkname, symbolic=member.issym())
    elif not member.isdir() and member.type not in _FILE_TYPES:
        raise UnsafePathError(f"archive entry {member.name!r} has an entry type this controller does "
                              f"not read ({member.type!r})")


@dataclass(frozen=True)
class FileRef:
    """Where a file's bytes are in the unpacked file, and their SHA-256 (hex)."""

    offset: int
    size: int
    sha256: str


@dataclass
class Index:
    """An artifact's files (paths relative to its root, ``/``-separated) and what may not be loaded."""

    files: dict[str, FileRef] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes a reader could read (links count their target again), paths included."""
        return sum(len(p) + ref.size for p, ref in self.files.items())


@dataclass
class _Walk:
    limits: ArtifactLimits
    out: IO[bytes]
    offset: int
    result: Index = field(default_factory=Index)
    kinds: dict[str, str] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    total: int = 0
    entries: int = 0
    paths: int = 0

    def claim(self, path: str, kind: str, member: tarfile.TarInfo) -> None:
        if path in self.kinds:
            raise UnsafePathError(f"archive entry {member.name!r} appears more than once")
        parent = posixpath.dirname(path)
        while parent:
            held = self.kinds.get(parent)
            if held is not None and held != "dir":
                raise UnsafePathError(f"archive entry {member.name!r} is inside {parent!r}, which is a "
                                      f"{held}")
            parent = posixpath.dirname(parent)
        self.paths += len(path.encode("utf-8", "surrogateescape"))
        if self.paths > self.limits.max_paths_bytes:
            raise LimitExceededError(f"the artifact's paths add up to more than "
                                     f"{self.limits.max_paths_bytes} bytes; it was refused")
        self.kinds[path] = kind

    def add_bytes(self, path: str, size: int) -> None:
        if size > self.limits.max_file_bytes:
            raise LimitExceededError(f"artifact file {path!r} has {size} bytes, more than "
                                     f"{self.limits.max_file_bytes} (--artifact-max-file-size)")
        self.total += size
        if self.total > self.limits.max_unpacked_bytes:
            raise LimitExceededError(f"the artifact's files hold more than {self.limits.max_unpacked_bytes} "
                                     "bytes (--artifact-max-unpacked-size)")

    def copy(self, member: tarfile.TarInfo, reader: IO[bytes] | None) -> FileRef:
        """The entry's bytes from the archive into ``out``, a chunk at a time, hashed on the way."""
        hasher, left = hashlib.sha256(), member.size
        while left > 0:
            chunk = reader.read(min(CHUNK, left)) if reader is not None else b""
            if not chunk:
                raise ArchiveError(f"archive entry {member.name!r} is truncated")
            hasher.update(chunk)
            self.out.write(chunk)
            left -= len(chunk)
        ref = FileRef(offset=self.offset, size=member.size, sha256=hasher.hexdigest())
        self.offset += member.size
        return ref

    def member(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.entries += 1
        if self.entries > self.limits.max_files:
            raise LimitExceededError(f"the artifact has more than {self.limits.max_files} entries "
                                     "(--artifact-max-files)")
        path = entry_path(member.name, limits=self.limits)
        _refuse_special(member, path)
        _second_opinion(member)
        if member.isdir():
            if path:
                self.claim(path, "dir", member)
            return
        if not path:
            raise UnsafePathError(f"archive entry {member.name!r} is not a directory but names the root")
        if member.type in _FILE_TYPES:
            self.claim(path, "file", member)
            self.add_bytes(path, member.size)
            self.result.files[path] = self.copy(member, archive.extractfile(member))
        elif member.issym():
            self.claim(path, "link", member)
            self.symlinks[path] = link_target(path, member.linkname, symbolic=True)
        elif member.islnk():
            target = link_target(path, member.linkname, symbolic=False)
            if self.kinds.get(target) != "file":
                raise UnsafePathError(f"archive entry {member.name!r} is a hard link to {member.linkname!r}, "
                                      "which is not a file earlier in the artifact")
            self.claim(path, "file", member)
            self.add_bytes(path, self.result.files[target].size)
            self.result.files[path] = self.result.files[target]

    def resolve_symlinks(self) -> None:
        """In-root symbolic links read as the file they reach; the rest are unreadable."""
        for path in sorted(self.symlinks):
            target, hops = self.symlinks[path], 0
            while target in self.symlinks and hops < _LINK_HOPS:
                target, hops = self.symlinks[target], hops + 1
            if target in self.result.files:
                self.add_bytes(path, self.result.files[target].size)
                self.result.files[path] = self.result.files[target]
            elif hops >= _LINK_HOPS:
                self.result.unreadable[path] = "a symbolic link loop"
            elif self.kinds.get(target) == "dir" or target == "":
                self.result.unreadable[path] = "a symbolic link to a directory (not followed)"
            else:
                self.result.unreadable[path] = f"a symbolic link to {target!r}, which the artifact lacks"


def unpack(stream: IO[bytes], *, into: IO[bytes], limits: ArtifactLimits) -> Index:
    """Every entry of the gzip-compressed tarball ``stream``, checked and bounded (see the module),
    its files' bytes written to ``into`` from its current position on (offsets in the index are
    ``into``'s positions)."""
    head = stream.read(2)
    if head != b"\x1f\x8b":
        raise ArchiveError("the artifact is not a gzip-compressed tarball")
    stream.seek(0)
    walk = _Walk(limits, out=into, offset=into.tell())
    inflated = _Bounded(gzip.GzipFile(fileobj=stream, mode="rb"),  # type: ignore[arg-type]
                        limits.max_unpacked_bytes + _HEADER_ALLOWANCE * (limits.max_files + 2))
    try:
        with tarfile.open(fileobj=inflated, mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:
                walk.member(archive, member)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise ArchiveError(f"the artifact is not a readable gzip-compressed tarball: {error}") from None
    walk.resolve_symlinks()
    return walk.result
