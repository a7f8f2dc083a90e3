"""The artifact store: each artifact downloaded, verified and unpacked to disk once per digest, served
only to a caller whose own URL proved it, bounded in bytes per tenant and in all.

Identity: none of its own.  Downloads carry no credentials (:mod:`sources.download`).

**Who may read what.**  A digest alone is no capability: digests are not secret (they are in
every source object's status, in events, in logs of other tools).  Content under a digest is
handed out (:meth:`ArtifactStore.read`) only for a ``(digest, url)`` pair that is *proven*: that
URL served a file with that digest to this store at least once.  A caller naming a digest
someone else's URL proved, with a URL of its own, has the file downloaded from its own URL and
verified (no unpacking: the tree is stored already) before it reads a byte; a URL that serves
nothing, or something else, proves nothing and the caller gets nothing.  This is what the Git
mirror does per caller with commits (:mod:`sources.mirror`); here the URL is the whole
capability (artifact servers take no credentials: whoever names the URL could fetch it).  Proofs
are kept beside the tree (``<key>.meta``, the URL's SHA-256, never the URL) so a restart keeps them;
an evicted tree takes its proofs with it.

How an artifact gets in (:meth:`ArtifactStore.fetch`):

1. download into a spool file in the store's directory, hashing as it arrives
   (bounded: ``max_download_bytes``, the time limit, the address guard);
2. compare with the expected digest — a mismatch discards the file unread;
3. unpack from the verified file straight into a staged tree file (:func:`sources.archive.unpack`:
   bounded, unsafe entries refused, a chunk at a time — no file is ever whole in memory);
4. publish ``<root>/<algorithm>-<hex>.tree`` atomically: the magic, every file's bytes, then
   the index (per path: offset, size, SHA-256) and its length.

**Memory is bounded by design.**  Reading (:class:`StoredTree`) loads the index only (bounded by
``max_files`` and ``max_paths_bytes``); a file's bytes are read from disk when a build asks for
that file, and its SHA-256 (what a render cache key needs) comes from the index without reading
it.  So a render holds what it reads, nothing of the rest of the tree.  A :class:`StoredTree`
keeps its file open: a tree evicted while a build reads it stays readable to that build.

**Disk is bounded per tenant and in all.**  A tree is charged to the tenant (the requester the
controller names: the StageSet's namespace) whose download stored it.  After each tree is stored,
that tenant's least recently read trees are deleted until it holds at most ``max_tenant_bytes``,
then anyone's until the store holds at most ``max_bytes`` (the tree just stored is kept even when
it alone is larger).  A tree deleted while unread is downloaded again when next needed.  While
downloads run, each holds at most ``max_download_bytes`` (its spool) plus ``max_unpacked_bytes``
and :data:`MAX_TREE_OVERHEAD_BYTES` (its staged tree: the files, then the index) beyond the budget —
the figures the chart's artifact volume is sized from (``helm/stageset``, docs/sizing.md).

Downloads of the same digest from the same URL are made once at a time (later callers wait
and find it stored); the same digest from *another* URL is downloaded independently, so a slow
or hostile server named by one tenant never holds up another tenant that names a good one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sources.addresses import AddressGuard
from sources.archive import FileRef, Index, unpack
from sources.digests import Digest, verify
from sources.download import display, download
from sources.errors import LimitExceededError
from sources.limits import ArtifactLimits, MiB

_MAGIC = b"SSTREE2\n"
_TRAILER = struct.Struct(">Q8s")
"""After the index: its length and the magic again (a truncated file is not a tree)."""
_TREE = ".tree"
_META = ".meta"
MAX_TREE_OVERHEAD_BYTES = 8 * MiB
"""Most bytes a stored tree holds beyond its files (the magic, the index, the trailer); an artifact
whose index would be larger is refused.  The limits bound the paths (``max_paths_bytes``) but not
their JSON escapes nor the targets of dangling links named in ``unreadable``, so this bounds them,
with room over the 5 MiB that 10,000 entries and 4 MiB of plain paths take.  The chart adds it per download in
flight to its artifact volume (``helm/stageset/templates/deployment.yaml``; tests/helm keep them equal)."""
_MAX_PROOFS = 64
"""URLs remembered per digest (the most recent): every one cost its caller a download."""


class NotStoredError(KeyError):
    """The store does not hold that digest for that URL (never fetched from it, or evicted)."""


@dataclass(frozen=True)
class StoredArtifact:
    digest: Digest
    size: int
    """Bytes on disk (the unpacked tree)."""
    downloaded: bool
    """This call downloaded it (else it was proven for this URL already)."""


@dataclass
class _Entry:
    size: int
    tenant: str
    proofs: list[str] = field(default_factory=list)
    """SHA-256 of each URL that served this digest to the store, oldest first."""


def _url_key(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()


def _write_index(out: IO[bytes], index: Index) -> None:
    body = json.dumps({"files": [[p, r.offset, r.size, r.sha256] for p, r in index.files.items()],
                       "unreadable": index.unreadable}, separators=(",", ":")).encode()
    if len(_MAGIC) + len(body) + _TRAILER.size > MAX_TREE_OVERHEAD_BYTES:
        raise LimitExceededError(f"the artifact's index takes more than {MAX_TREE_OVERHEAD_BYTES} bytes "
                                 "(its paths and link targets); it was refused")
    out.write(body + _TRAILER.pack(len(body), _MAGIC))


def _read_index(fd: int) -> Index:
    end = os.fstat(fd).st_size
    if end < len(_MAGIC) + _TRAILER.size or _pread(fd, 0, len(_MAGIC)) != _MAGIC:
        raise ValueError("not a stored tree")
    length, magic = _TRAILER.unpack(_pread(fd, end - _TRAILER.size, _TRAILER.size))
    if magic != _MAGIC or length > end:
        raise ValueError("not a stored tree")
    raw = json.loads(_pread(fd, end - _TRAILER.size - length, length))
    refs: dict[tuple[int, int, str], FileRef] = {}  # links share one FileRef in memory
    files = {str(p): refs.setdefault((int(o), int(n), str(h)),
                                     FileRef(offset=int(o), size=int(n), sha256=str(h)))
             for p, o, n, h in raw["files"]}
    return Index(files=files, unreadable={str(k): str(v) for k, v in raw["unreadable"].items()})


def _pread(fd: int, offset: int, size: int) -> bytes:
    parts: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise OSError(f"stored tree ends before offset {offset + size}")
        parts.append(chunk)
        offset, size = offset + len(chunk), size - len(chunk)
    return b"".join(parts) if len(parts) != 1 else parts[0]


class StoredTree(Mapping[str, bytes]):
    """An artifact's files as a mapping (path -> bytes) read from disk on each look-up.

    Holds the tree file open (closed when this object is collected, or by :meth:`close`) and the
    index in memory; ``tree[path]`` reads that one file.  :meth:`size` and :meth:`sha256` answer
    from the index without reading anything."""

    def __init__(self, *, path: Path):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._closer = weakref.finalize(self, os.close, fd)
        self._fd = fd
        try:
            self._index = _read_index(fd)
        except BaseException:
            self.close()
            raise

    @property
    def unreadable(self) -> dict[str, str]:
        return self._index.unreadable

    def __getitem__(self, name: str) -> bytes:
        ref = self._index.files[name]
        return _pread(self._fd, ref.offset, ref.size)

    def __contains__(self, name: object) -> bool:
        return name in self._index.files

    def __iter__(self) -> Iterator[str]:
        return iter(self._index.files)

    def __len__(self) -> int:
        return len(self._index.files)

    def size(self, name: str) -> int:
        return self._index.files[name].size

    def sha256(self, name: str) -> str:
        return self._index.files[name].sha256

    def close(self) -> None:
        self._closer()


class ArtifactStore:
    def __init__(self, *, root: Path, guard: AddressGuard, limits: ArtifactLimits | None = None,
                 max_bytes: int | None = None, max_tenant_bytes: int | None = None,
                 ca_certs: str | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._guard = guard
        self._limits = limits or ArtifactLimits()
        self._max_bytes = max_bytes
        self._max_tenant_bytes = max_tenant_bytes
        self._ca_certs = ca_certs
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._inflight: dict[tuple[str, str], threading.Lock] = {}
        self.downloads = 0
        """Downloads made (for tests and metrics)."""
        self.downloaded_bytes = 0
        self._load()

    def _load(self) -> None:
        """Trees left from an earlier run, with their proofs; anything else in the directory is
        debris of a run that stopped mid-download (or of an older format) and is deleted."""
        for stale in self.root.glob(".spool-*"):
            stale.unlink(missing_ok=True)
        trees = sorted(self.root.glob(f"*{_TREE}"), key=lambda p: p.stat().st_mtime)
        for path in trees:
            key = path.name[:-len(_TREE)]
            meta = self.root / f"{key}{_META}"
            try:
                with path.open("rb") as tree:
                    magic = tree.read(len(_MAGIC))
                recorded = json.loads(meta.read_text())
                entry = _Entry(size=path.stat().st_size, tenant=str(recorded["tenant"]),
                               proofs=[str(p) for p in recorded["urls"]][-_MAX_PROOFS:])
            except (OSError, ValueError, KeyError, TypeError):
                magic, entry = b"", None
            if magic != _MAGIC or entry is None:
                path.unlink(missing_ok=True)
                meta.unlink(missing_ok=True)
                continue
            self._entries[key] = entry
        for meta in self.root.glob(f"*{_META}"):
            if meta.name[:-len(_META)] not in self._entries:
                meta.unlink(missing_ok=True)

    @property
    def limits(self) -> ArtifactLimits:
        return self._limits

    def _path(self, key: str, suffix: str = _TREE) -> Path:
        return self.root / f"{key}{suffix}"

    def has(self, digest: Digest) -> bool:
        """Whether a tree of ``digest`` is stored at all (for whichever URL): not a reason to serve it."""
        with self._lock:
            return digest.key in self._entries

    def proven(self, digest: Digest, *, url: str) -> bool:
        """Whether ``url`` served ``digest`` to this store and its tree is stored: what :meth:`read`
        requires."""
        with self._lock:
            entry = self._entries.get(digest.key)
            return entry is not None and _url_key(url) in entry.proofs

    def disk_usage(self) -> int:
        with self._lock:
            return sum(entry.size for entry in self._entries.values())

    def tenant_usage(self, tenant: str) -> int:
        """Bytes of the trees charged to ``tenant``."""
        with self._lock:
            return sum(entry.size for entry in self._entries.values() if entry.tenant == tenant)

    def fetch(self, url: str, digest: Digest, *, timeout: float, tenant: str = "",
              cancel: threading.Event | None = None) -> StoredArtifact:
        """Prove ``digest`` for ``url``: download what ``url`` serves and verify it is ``digest``
        (else :class:`~sources.digests.DigestMismatchError`); store its tree unless stored already
        (charged to ``tenant``).  A no-op when ``url`` proved ``digest`` before."""
        proof = _url_key(url)
        with self._lock:
            entry = self._entries.get(digest.key)
            if entry is not None and proof in entry.proofs:
                return StoredArtifact(digest=digest, size=entry.size, downloaded=False)
            gate = self._inflight.setdefault((digest.key, url), threading.Lock())
        with gate:
            try:
                with self._lock:
                    entry = self._entries.get(digest.key)
                    if entry is not None and proof in entry.proofs:
                        return StoredArtifact(digest=digest, size=entry.size, downloaded=False)
                size = self._download(url, digest, tenant=tenant, timeout=timeout, cancel=cancel)
                return StoredArtifact(digest=digest, size=size, downloaded=True)
            finally:
                with self._lock:
                    if self._inflight.get((digest.key, url)) is gate:
                        del self._inflight[(digest.key, url)]

    def _download(self, url: str, digest: Digest, *, tenant: str, timeout: float,
                  cancel: threading.Event | None) -> int:
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
            # Proven: ``url`` served ``digest``.  Unpacked only if no tree of it is stored yet.
            with self._lock:
                entry = self._entries.get(digest.key)
                if entry is not None:
                    self._prove(digest.key, entry, url)
                    return entry.size
            with open(spool.name, "rb") as verified:
                return self._publish(digest, verified, url=url, tenant=tenant)
        finally:
            Path(spool.name).unlink(missing_ok=True)

    def _publish(self, digest: Digest, verified: IO[bytes], *, url: str, tenant: str) -> int:
        staged = tempfile.NamedTemporaryFile(prefix=".spool-", dir=self.root, delete=False)  # noqa: SIM115
        try:
            with staged:
                staged.write(_MAGIC)
                index = unpack(verified, into=staged, limits=self._limits)
                _write_index(staged, index)
                size = staged.tell()
            with self._lock:
                entry = self._entries.get(digest.key)
                if entry is None:
                    entry = _Entry(size=size, tenant=tenant)
                    self._write_meta(digest.key, entry, extra=url)  # the proof before the tree
                    os.replace(staged.name, self._path(digest.key))
                    entry.proofs = [_url_key(url)]
                    self._entries[digest.key] = entry
                else:  # stored meanwhile, from another URL
                    self._prove(digest.key, entry, url)
                self._entries.move_to_end(digest.key)
                self._evict(keep=digest.key, tenant=tenant)
                return entry.size
        finally:
            Path(staged.name).unlink(missing_ok=True)

    def _prove(self, key: str, entry: _Entry, url: str) -> None:
        """Record (under the lock, on disk first) that ``url`` served ``key``."""
        proof = _url_key(url)
        if proof in entry.proofs:
            return
        self._write_meta(key, entry, extra=url)
        entry.proofs = [*entry.proofs, proof][-_MAX_PROOFS:]

    def _write_meta(self, key: str, entry: _Entry, *, extra: str) -> None:
        proofs = [*[p for p in entry.proofs if p != _url_key(extra)], _url_key(extra)][-_MAX_PROOFS:]
        fd, staging = tempfile.mkstemp(prefix=".spool-meta-", dir=self.root)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"tenant": entry.tenant, "urls": proofs}, handle)
            os.replace(staging, self._path(key, _META))
        except BaseException:
            Path(staging).unlink(missing_ok=True)
            raise

    def _evict(self, *, keep: str, tenant: str) -> None:
        """Under the lock: the tenant's least recently read trees past its budget, then anyone's past
        the store's."""
        if self._max_tenant_bytes is not None:
            held = sum(entry.size for entry in self._entries.values() if entry.tenant == tenant)
            for key, entry in list(self._entries.items()):
                if held <= self._max_tenant_bytes:
                    break
                if key != keep and entry.tenant == tenant:
                    held -= entry.size
                    self._drop(key)
        if self._max_bytes is not None:
            total = sum(entry.size for entry in self._entries.values())
            for key, entry in list(self._entries.items()):
                if total <= self._max_bytes:
                    break
                if key != keep:
                    total -= entry.size
                    self._drop(key)

    def _drop(self, key: str) -> None:
        self._entries.pop(key, None)
        self._path(key).unlink(missing_ok=True)
        self._path(key, _META).unlink(missing_ok=True)

    def read(self, digest: Digest, *, url: str) -> StoredTree:
        """The tree of ``digest`` as ``url`` proved it (:class:`NotStoredError` when it is not stored,
        or ``url`` never served it: fetch it from ``url``)."""
        with self._lock:
            entry = self._entries.get(digest.key)
            if entry is None or _url_key(url) not in entry.proofs:
                raise NotStoredError(str(digest))
            self._entries.move_to_end(digest.key)
        try:
            tree = StoredTree(path=self._path(digest.key))
        except (FileNotFoundError, ValueError):
            with self._lock:
                if self._entries.get(digest.key) is entry:
                    self._drop(digest.key)
            raise NotStoredError(str(digest)) from None
        with contextlib.suppress(FileNotFoundError):  # evicted since it was opened: still readable
            os.utime(self._path(digest.key))  # least recently used survives a restart too
        return tree
