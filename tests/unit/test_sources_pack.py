"""The pack check (sources.pack): hostile packs are refused while they stream in, with memory
that stays at a few 64 KiB buffers.  Real packs come from ``git pack-objects``; hostile ones
are built byte by byte, as a hostile server would send them."""

from __future__ import annotations

import hashlib
import subprocess
import tracemalloc
import zlib
from pathlib import Path

import pytest

from sources import GitOperationError, LimitExceededError, Limits
from sources.pack import PackInspector

MiB = 1024 * 1024
BLOB, OFS_DELTA, REF_DELTA = 3, 6, 7


def _varint_header(kind: int, size: int) -> bytes:
    out = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def _size(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _pack(entries: list[bytes], *, count: int | None = None) -> bytes:
    body = b"PACK" + (2).to_bytes(4, "big") + (count if count is not None else len(entries)
                                                  ).to_bytes(4, "big") + b"".join(entries)
    return body + hashlib.sha1(body).digest()  # noqa: S324 - Git's pack checksum


def _blob(data: bytes, *, declared: int | None = None) -> bytes:
    return _varint_header(BLOB, len(data) if declared is None else declared) + zlib.compress(data)


def _feed(pack: bytes, limits: Limits | None = None, chunk: int = 65536) -> PackInspector:
    inspector = PackInspector(limits or Limits())
    for i in range(0, len(pack), chunk):
        inspector.feed(pack[i:i + chunk])
    inspector.finish()
    return inspector


def _peak(action: object) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            action()  # type: ignore[operator]
        except Exception as error:
            return error, tracemalloc.get_traced_memory()[1]
        return None, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_real_packs_with_deltas_pass(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    base = "\n".join(f"line {i}" for i in range(2000))
    for i in range(20):
        (repo / "f.txt").write_text(base + f"\nchange {i}\n")
        (repo / f"n{i}.txt").write_text(f"{i}\n")
        subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b",
                        "commit", "-qm", str(i)], check=True)
    objects = subprocess.run(["git", "-C", str(repo), "rev-list", "--objects", "--all"],
                             capture_output=True, check=True).stdout
    pack = subprocess.run(["git", "-C", str(repo), "pack-objects", "--stdout",
                           "--delta-base-offset"], input=objects, capture_output=True,
                          check=True).stdout
    for chunk in (1, 7, 4096, 1 << 20):
        inspector = _feed(pack, chunk=chunk)
        assert inspector.objects == 20 + 20 + 40  # commits, trees, blobs (f.txt and n<i>.txt)
        assert inspector.raw == len(pack)
    assert PackInspector(Limits()).started is False


def test_empty_pack_and_no_pack() -> None:
    assert _feed(_pack([])).objects == 0
    PackInspector(Limits()).finish()  # nothing sent at all is fine (nothing wanted)


def test_oversized_blob_is_refused_from_its_header_without_inflating() -> None:
    # 450 MB of zeros compress to ~450 KB: the header alone is enough to refuse it.
    compressor = zlib.compressobj()
    chunk = bytes(MiB)
    stream = b"".join(compressor.compress(chunk) for _ in range(450)) + compressor.flush()
    pack = _pack([_varint_header(BLOB, 450 * MiB) + stream])
    inspector = PackInspector(Limits())

    error, peak = _peak(lambda: inspector.feed(pack[:65536]))

    assert isinstance(error, LimitExceededError)
    assert "a blob of 471859200 bytes, more than the limit of 10485760 bytes per file" in str(error)
    assert inspector.inflated == 0
    assert peak < 2 * MiB


def test_a_header_that_lies_is_caught_while_inflating() -> None:
    compressor = zlib.compressobj()
    stream = b"".join(compressor.compress(bytes(MiB)) for _ in range(200)) + compressor.flush()
    pack = _pack([_varint_header(BLOB, 100) + stream])
    inspector = PackInspector(Limits())

    error, peak = _peak(lambda: [inspector.feed(pack[i:i + 65536])
                                 for i in range(0, len(pack), 65536)])

    assert isinstance(error, GitOperationError)
    assert "inflates to more than the 100 bytes its header says" in str(error)
    assert inspector.inflated <= 100 + 64 * 1024
    assert peak < 2 * MiB


def test_delta_bomb_is_refused() -> None:
    """A delta whose copy instructions (one byte each: copy 64 KiB) would build gigabytes
    from a small base, while declaring a small result."""
    base = _blob(bytes(70_000))
    instructions = _size(70_000) + _size(1000) + bytes([0x80]) * 100_000
    delta = _varint_header(OFS_DELTA, len(instructions)) + _size(len(base)) + zlib.compress(
        instructions)
    with pytest.raises(GitOperationError, match="declares 1000 bytes but its instructions "
                                                "produce more"):
        _feed(_pack([base, delta]))


def test_delta_declaring_a_huge_result_is_refused_from_its_header() -> None:
    instructions = _size(10) + _size(2 * 1024 * MiB) + bytes([0x80])
    delta = _varint_header(REF_DELTA, len(instructions)) + bytes(20) + zlib.compress(instructions)
    with pytest.raises(LimitExceededError, match="a delta result of 2147483648 bytes"):
        _feed(_pack([delta]))


def test_delta_copying_outside_its_base_is_refused() -> None:
    instructions = _size(10) + _size(20) + bytes([0x91, 0x05, 0x14])  # copy 20 at offset 5
    delta = _varint_header(REF_DELTA, len(instructions)) + bytes(20) + zlib.compress(instructions)
    with pytest.raises(GitOperationError, match="copies from outside its base"):
        _feed(_pack([delta]))


def test_many_objects_and_many_bytes_are_refused() -> None:
    with pytest.raises(LimitExceededError, match="a pack of 600000 objects"):
        PackInspector(Limits()).feed(_pack([], count=600_000)[:12])
    blobs = [_blob(bytes([i]) * 900_000) for i in range(12)]
    with pytest.raises(LimitExceededError, match="add up to more than 10000000 bytes unpacked"):
        _feed(_pack(blobs), Limits(max_fetch_bytes=10_000_000))


def test_endless_compressed_padding_is_refused() -> None:
    """Empty stored deflate blocks decode to nothing: without a bound on compressed bytes per
    object, a server could stream them forever."""
    padding = b"\x00\x00\x00\xff\xff" * 100_000
    stream = b"\x78\x01" + padding + b"\x03\x00" + (1).to_bytes(4, "big")
    inspector = PackInspector(Limits())
    with pytest.raises(GitOperationError, match="much larger than its content"):
        inspector.feed(_pack([_varint_header(BLOB, 0) + stream]))


@pytest.mark.parametrize(("pack", "message"), [
    (b"HTTP/1.1 200 OK\r\n\r\n", "not a pack"),
    (_pack([_blob(b"abc")])[:-5], "ended early"),
    (_pack([_blob(b"abc")]) + b"more", "after the pack's checksum"),
    (_pack([_varint_header(5, 3) + zlib.compress(b"abc")]), "unknown object type 5"),
    (_pack([_varint_header(BLOB, 3) + b"not zlib at all"]), "compressed data is invalid"),
    (_pack([_blob(b"abc", declared=10)]), "inflated to 3 bytes, its header said 10"),
])
def test_malformed_packs(pack: bytes, message: str) -> None:
    with pytest.raises(GitOperationError, match=message):
        _feed(pack)
