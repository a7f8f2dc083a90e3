"""Checking a pack while it arrives, before dulwich inflates any object of it.

Identity: none — it parses bytes a remote sent to a fetch made with the caller's own
credentials (see :mod:`sources.transport`).

Why: dulwich indexes a received pack by inflating every object whole, in memory.  A
GitRepository's URL is tenant input, so the server may be hostile: a blob of zeros that
packs to 450 KB and inflates to 450 MB, a delta whose copy instructions expand a small base
a thousandfold, headers that lie about sizes, compressed data that never ends, or simply
an endless stream.  :class:`PackInspector` is the fetch's pack-data callback, so it sees
every byte first, and parses the pack format incrementally:

* the object count in the pack header must not exceed ``Limits.max_fetch_objects``;
* each object's size, read from its header (for a delta: the result size from the delta's
  own header, a few bytes into it), must not exceed ``Limits.max_file_bytes``, and the sizes
  of all objects must not add up to more than ``Limits.max_fetch_bytes`` — so an oversized
  object is refused from its header, before any of it is inflated;
* each object is then inflated in 64 KiB steps, counted and thrown away: an object that
  inflates to more than its header said, a delta whose instructions would produce more than
  its declared result (or copy from outside its base), and compressed data much larger than
  the content it encodes are refused on the spot;
* the raw pack must not exceed ``Limits.max_fetch_bytes`` either.

Memory stays at a few 64 KiB buffers whatever the input; a refused pack is never stored.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from sources.errors import GitOperationError, LimitExceededError
from sources.limits import Limits

STEP = 64 * 1024
"""Most bytes inflated at once."""

_COMMIT, _TREE, _BLOB, _TAG, _OFS_DELTA, _REF_DELTA = 1, 2, 3, 4, 6, 7
_KINDS = {_COMMIT: "commit", _TREE: "tree", _BLOB: "blob", _TAG: "tag",
          _OFS_DELTA: "delta", _REF_DELTA: "delta"}
_MAX_VARINT = 10


def _corrupt(detail: str) -> GitOperationError:
    return GitOperationError(f"the remote sent a malformed pack ({detail}); nothing was stored")


class _DeltaCheck:
    """Follows a delta's instructions without applying them: what they would produce."""

    def __init__(self, *, max_result: int, on_sizes: Callable[[int], None]) -> None:
        self._max_result = max_result
        self._on_sizes = on_sizes
        self._carry = b""
        self._skip = 0
        self.base_size: int | None = None
        self.result_size: int | None = None
        self.produced = 0

    def feed(self, data: bytes) -> None:
        buf = self._carry + data if self._carry else data
        self._carry = b""
        pos, end = 0, len(buf)
        if self.result_size is None:
            parsed = self._sizes(buf)
            if parsed is None:
                if end > 2 * _MAX_VARINT:
                    raise _corrupt("a delta header is too long")
                self._carry = bytes(buf)
                return
            pos = parsed
        result = self.result_size
        base = self.base_size
        assert result is not None
        assert base is not None
        while pos < end:
            if self._skip:
                take = min(self._skip, end - pos)
                pos += take
                self._skip -= take
                continue
            op = buf[pos]
            if op & 0x80:
                need = 1 + bin(op & 0x7F).count("1")
                if end - pos < need:
                    break
                at = pos + 1
                offset = size = 0
                for bit in range(4):
                    if op & (1 << bit):
                        offset |= buf[at] << (8 * bit)
                        at += 1
                for bit in range(3):
                    if op & (1 << (4 + bit)):
                        size |= buf[at] << (8 * bit)
                        at += 1
                size = size or 0x10000
                if offset + size > base:
                    raise _corrupt("a delta copies from outside its base object")
                pos = at
                self.produced += size
            elif op:
                self._skip = op
                pos += 1
                self.produced += op
            else:
                raise _corrupt("a delta has an invalid instruction")
            if self.produced > result:
                raise _corrupt(f"a delta declares {result} bytes but its instructions produce "
                               "more")
        self._carry = bytes(buf[pos:])

    def _sizes(self, buf: bytes) -> int | None:
        values: list[int] = []
        pos = 0
        for _ in range(2):
            value = shift = 0
            while True:
                if pos >= len(buf):
                    return None
                byte = buf[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
                if shift >= 7 * _MAX_VARINT:
                    raise _corrupt("a delta size is too long")
            values.append(value)
        self.base_size, self.result_size = values
        self._on_sizes(values[1])
        return pos

    def complete(self) -> bool:
        return (self.result_size is not None and self.produced == self.result_size
                and not self._carry and not self._skip)


class PackInspector:
    """Feed it a pack stream chunk by chunk; it raises as soon as the pack is over a limit.

    ``hash_size`` is 20 for SHA-1 repositories and 32 for SHA-256 ones.  Counters
    (``objects``, ``inflated``, ``raw``) are public for tests and benchmarks.
    """

    def __init__(self, limits: Limits, *, hash_size: int = 20) -> None:
        self._limits = limits
        self._hash_size = hash_size
        self._state = "header"
        self._buf = b""
        self._remaining = 0
        self._z: zlib._Decompress | None = None
        self._kind = 0
        self._size = 0
        self._obj_inflated = 0
        self._obj_raw = 0
        self._delta: _DeltaCheck | None = None
        self._trailer = 0
        self.objects = 0
        self.inflated = 0
        self.declared = 0
        self.raw = 0

    # -- limits ------------------------------------------------------------------------

    def _too_big(self, size: int, what: str) -> LimitExceededError:
        return LimitExceededError(
            f"the remote sent a {what} of {size} bytes, more than the limit of "
            f"{self._limits.max_file_bytes} bytes per file; the fetch was refused before "
            "inflating it (nothing was stored). Remove the file from the repository, or serve "
            "it from a server that supports partial clone (uploadpack.allowFilter), which "
            "leaves such files out"
        )

    def _declare(self, size: int, what: str) -> None:
        if size > self._limits.max_file_bytes:
            raise self._too_big(size, what)
        self.declared += size
        if self.declared > self._limits.max_fetch_bytes:
            raise LimitExceededError(
                f"the objects the remote sent add up to more than "
                f"{self._limits.max_fetch_bytes} bytes unpacked (the limit per fetch); the "
                "fetch was refused (nothing was stored)"
            )

    # -- parsing -----------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """The next bytes of the pack."""
        self.raw += len(data)
        if self.raw > self._limits.max_fetch_bytes:
            raise LimitExceededError(
                f"the remote sent more than {self._limits.max_fetch_bytes} bytes of pack data "
                "(the limit per fetch); the fetch was refused (nothing was stored)"
            )
        view = data
        while view:
            if self._state == "header":
                view = self._header(view)
            elif self._state == "object":
                view = self._object_header(view)
            elif self._state == "body":
                view = self._inflate(view)
            else:
                self._trailer += len(view)
                if self._trailer > self._hash_size:
                    raise _corrupt("data after the pack's checksum")
                view = b""

    @property
    def started(self) -> bool:
        """Whether a pack header arrived (a pack of no objects counts)."""
        return self._state != "header"

    def finish(self) -> None:
        """The stream ended: it must have been a whole pack (or nothing at all)."""
        if self._state == "header" and not self._buf and self.raw == 0:
            return
        if self._state != "trailer" or self._trailer != self._hash_size:
            raise _corrupt("the pack ended early")

    def _header(self, view: bytes) -> bytes:
        self._buf += view
        if len(self._buf) < 12:
            return b""
        head, rest = self._buf[:12], self._buf[12:]
        self._buf = b""
        if head[:4] != b"PACK" or int.from_bytes(head[4:8], "big") not in (2, 3):
            raise _corrupt("not a pack")
        count = int.from_bytes(head[8:12], "big")
        if count > self._limits.max_fetch_objects:
            raise LimitExceededError(
                f"the remote sent a pack of {count} objects, more than the limit of "
                f"{self._limits.max_fetch_objects} per fetch; the fetch was refused"
            )
        self._remaining = count
        self._state = "object" if count else "trailer"
        return rest

    def _object_header(self, view: bytes) -> bytes:
        buf = self._buf + view
        parsed = self._parse_object_header(buf)
        if parsed is None:
            if len(buf) > 2 * _MAX_VARINT + self._hash_size:
                raise _corrupt("an object header is too long")
            self._buf = buf
            return b""
        self._buf = b""
        kind, size, used = parsed
        self._kind, self._size = kind, size
        self._obj_inflated = self._obj_raw = 0
        if kind in (_OFS_DELTA, _REF_DELTA):
            # Delta data is at most a little longer than the result it builds.
            if size > self._limits.max_file_bytes + self._limits.max_file_bytes // 64 + 64:
                raise self._too_big(size, "delta")
            self._delta = _DeltaCheck(max_result=self._limits.max_file_bytes,
                                      on_sizes=self._delta_sizes)
        else:
            self._delta = None
            self._declare(size, _KINDS[kind])
        self._z = zlib.decompressobj()
        self._state = "body"
        return buf[used:]

    def _delta_sizes(self, result_size: int) -> None:
        self._declare(result_size, "delta result")

    def _parse_object_header(self, buf: bytes) -> tuple[int, int, int] | None:
        if not buf:
            return None
        byte = buf[0]
        kind = (byte >> 4) & 7
        if kind not in _KINDS:
            raise _corrupt(f"unknown object type {kind}")
        size, shift, pos = byte & 0x0F, 4, 1
        while byte & 0x80:
            if pos >= len(buf):
                return None
            byte = buf[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if shift > 7 * _MAX_VARINT:
                raise _corrupt("an object size is too long")
        if kind == _OFS_DELTA:
            while True:
                if pos >= len(buf):
                    return None
                byte = buf[pos]
                pos += 1
                if not byte & 0x80:
                    break
                if pos > 2 * _MAX_VARINT + 1:
                    raise _corrupt("a delta offset is too long")
        elif kind == _REF_DELTA:
            if len(buf) < pos + self._hash_size:
                return None
            pos += self._hash_size
        return kind, size, pos

    def _inflate(self, view: bytes) -> bytes:
        z = self._z
        assert z is not None
        try:
            self._take(z.decompress(view, STEP))
            while z.unconsumed_tail and not z.eof:
                self._take(z.decompress(z.unconsumed_tail, STEP))
        except zlib.error:
            raise _corrupt("an object's compressed data is invalid") from None
        leftover = z.unused_data if z.eof else b""
        self._obj_raw += len(view) - len(leftover)
        # zlib adds a few bytes per 16 KiB at worst; much more is padding meant to stall us.
        if self._obj_raw > self._size + self._size // 64 + 256:
            raise _corrupt("an object's compressed data is much larger than its content")
        if not z.eof:
            return b""
        if self._obj_inflated != self._size:
            raise _corrupt(f"an object inflated to {self._obj_inflated} bytes, its header "
                           f"said {self._size}")
        if self._delta is not None and not self._delta.complete():
            raise _corrupt("a delta's instructions do not build its declared result")
        self.objects += 1
        self._remaining -= 1
        self._z = None
        self._state = "object" if self._remaining else "trailer"
        return leftover

    def _take(self, out: bytes) -> None:
        if not out:
            return
        self._obj_inflated += len(out)
        self.inflated += len(out)
        if self._obj_inflated > self._size:
            raise _corrupt(f"an object inflates to more than the {self._size} bytes its header "
                           "says")
        if self._delta is not None:
            self._delta.feed(out)
