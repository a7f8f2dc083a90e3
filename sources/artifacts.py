"""The artifact store: each artifact downloaded, verified and unpacked once per digest, bounded in bytes.

Identity: none of its own.  Downloads carry no credentials (:mod:`sources.download`); which
caller may read which artifact is decided by the digest, which the caller must have read from its
own source object: :meth:`ArtifactStore.read` hands out content only for a digest named to it,
and the content under a digest is exactly what that digest names (verified before anything of it
is read).  So one copy is safely shared by every reader whose source names the same digest, and
a reader never gets content its own source did not name.

How an artifact gets in (:meth:`ArtifactStore.fetch`):

1. download into a spool file in the store's directory, hashing as it arrives
   (bounded: ``max_download_bytes``, the time limit, the address guard);
2. compare with the expected digest — a mismatch discards the file unread;
3. unpack from the verified file (:func:`sources.archive.unpack`: bounded, unsafe entries refused);
4. publish ``<root>/<algorithm>-<hex>.tree`` atomically (one file: an index and the contents).

Downloads of the same digest from the same URL are made once at a time (later callers wait
and find it stored); the same digest from *another* URL is downloaded independently, so a slow
or hostile server named by one tenant never holds up another tenant that names a good one.

Bounded in bytes: past ``max_bytes`` the least recently read trees are deleted (the one just
stored is kept even when it alone is larger).  A tree deleted while unread is downloaded again
when next needed.  Trees left from an earlier run are kept and counted: a digest proves content
whoever stored it.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sources.addresses import AddressGuard
from sources.archive import Unpacked, unpack
from sources.digests import Digest, verify
from sources.download import display, download
from sources.limits import ArtifactLimits

_MAGIC = b"SSTREE1\n"
_SUFFIX = ".tree"


class NotStoredError(KeyError):
    """The store does not hold that digest (never fetched, or evicted)."""


@dataclass(frozen=True)
class StoredArtifact:
    digest: Digest
    size: int
    """Bytes on disk (the unpacked tree)."""
    downloaded: bool
    """This call downloaded it (else it was stored already)."""


def _write_tree(out: IO[bytes], tree: Unpacked) -> int:
    """``tree`` as one file: a magic line, the JSON index's length and the index, then every file's bytes."""
    index = {"files": [[path, len(data)] for path, data in tree.files.items()],
             "unreadable": tree.unreadable}
    header = json.dumps(index, separators=(",", ":")).encode()
    out.write(_MAGIC + struct.pack(">Q", len(header)) + header)
    for data in tree.files.values():
        out.write(data)
    return len(_MAGIC) + 8 + len(header) + sum(len(data) for data in tree.files.values())


def _read_tree(source: IO[bytes]) -> Unpacked:
    if source.read(len(_MAGIC)) != _MAGIC:
        raise ValueError("not a stored tree")
    (length,) = struct.unpack(">Q", source.read(8))
    index = json.loads(source.read(length))
    files = {path: source.read(size) for path, size in index["files"]}
    return Unpacked(files=files, unreadable=dict(index["unreadable"]))


class ArtifactStore:
    def __init__(self, *, root: Path, guard: AddressGuard, limits: ArtifactLimits | None = None,
                 max_bytes: int | None = None, ca_certs: str | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._guard = guard
        self._limits = limits or ArtifactLimits()
        self._max_bytes = max_bytes
        self._ca_certs = ca_certs
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # key -> bytes, least recently used first
        self._inflight: dict[tuple[str, str], threading.Lock] = {}
        self.downloads = 0
        """Downloads made (for tests and metrics)."""
        self.downloaded_bytes = 0
        for path in sorted(self.root.glob(f"*{_SUFFIX}"), key=lambda p: p.stat().st_mtime):
            self._sizes[path.name[:-len(_SUFFIX)]] = path.stat().st_size
        for stale in self.root.glob(".spool-*"):
            stale.unlink(missing_ok=True)

    @property
    def limits(self) -> ArtifactLimits:
        return self._limits

    def _path(self, digest: Digest) -> Path:
        return self.root / f"{digest.key}{_SUFFIX}"

    def has(self, digest: Digest) -> bool:
        with self._lock:
            return digest.key in self._sizes

    def disk_usage(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def fetch(self, url: str, digest: Digest, *, timeout: float,
              cancel: threading.Event | None = None) -> StoredArtifact:
        """Store the artifact ``url`` serves, if its digest is ``digest`` (else
        :class:`~sources.digests.DigestMismatchError`); a no-op when the digest is stored already."""
        with self._lock:
            if digest.key in self._sizes:
                return StoredArtifact(digest=digest, size=self._sizes[digest.key], downloaded=False)
            gate = self._inflight.setdefault((digest.key, url), threading.Lock())
        with gate:
            try:
                with self._lock:
                    if digest.key in self._sizes:
                        return StoredArtifact(digest=digest, size=self._sizes[digest.key], downloaded=False)
                size = self._download(url, digest, timeout=timeout, cancel=cancel)
                return StoredArtifact(digest=digest, size=size, downloaded=True)
            finally:
                with self._lock:
                    if self._inflight.get((digest.key, url)) is gate:
                        del self._inflight[(digest.key, url)]

    def _download(self, url: str, digest: Digest, *, timeout: float, cancel: threading.Event | None) -> int:
        spool = tempfile.NamedTemporaryFile(prefix=".spool-", dir=self.root, delete=False)  # noqa: SIM115
        try:
            with spool:
                got = download(url, into=spool, hasher=digest.hasher(), guard=self._guard,
                               max_bytes=self._limits.max_download_bytes, timeout=timeout,
                               ca_certs=self._ca_certs, cancel=cancel)
            with self._lock:
                self.downloads += 1
                self.downloaded_bytes += got.size
            verify(digest, got.digest, what=f"the file at {display(url)}")
            with open(spool.name, "rb") as verified:
                tree = unpack(verified, limits=self._limits)
        finally:
            Path(spool.name).unlink(missing_ok=True)
        return self._publish(digest, tree)

    def _publish(self, digest: Digest, tree: Unpacked) -> int:
        staged = tempfile.NamedTemporaryFile(prefix=".spool-", dir=self.root, delete=False)  # noqa: SIM115
        try:
            with staged:
                size = _write_tree(staged, tree)
            os.replace(staged.name, self._path(digest))
        except BaseException:
            Path(staged.name).unlink(missing_ok=True)
            raise
        with self._lock:
            self._sizes[digest.key] = size
            self._sizes.move_to_end(digest.key)
            self._evict(keep=digest.key)
        return size

    def _evict(self, *, keep: str) -> None:
        if self._max_bytes is None:
            return
        total = sum(self._sizes.values())
        for key in list(self._sizes):
            if total <= self._max_bytes:
                return
            if key == keep:
                continue
            total -= self._sizes.pop(key)
            (self.root / f"{key}{_SUFFIX}").unlink(missing_ok=True)

    def read(self, digest: Digest) -> Unpacked:
        """The unpacked tree of ``digest``; :class:`NotStoredError` when it is not stored (fetch it)."""
        with self._lock:
            if digest.key not in self._sizes:
                raise NotStoredError(str(digest))
            self._sizes.move_to_end(digest.key)
        try:
            with self._path(digest).open("rb") as stored:
                tree = _read_tree(stored)
            os.utime(self._path(digest))  # least recently used survives a restart too
        except FileNotFoundError:
            with self._lock:
                self._sizes.pop(digest.key, None)
            raise NotStoredError(str(digest)) from None
        return tree

    def files(self, digest: Digest) -> Mapping[str, bytes]:
        return self.read(digest).files
