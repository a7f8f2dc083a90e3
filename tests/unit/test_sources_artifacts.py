"""Artifacts, the pure parts: digests, the address guard's rule, archive entry checks, bounded unpacking."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import os
import tarfile

import pytest

from sources.addresses import AddressGuard, AddressLookupError, AddressRefusedError, refusal
from sources.archive import CHUNK, ArchiveError, Index, entry_path, link_target, unpack
from sources.digests import Digest, DigestError, DigestMismatchError, verify
from sources.errors import LimitExceededError, UnsafePathError
from sources.limits import ArtifactLimits
from tests.artifactserver import Entry, digest_of, gzip_bomb, hostile_tarball, tarball

LIMITS = ArtifactLimits()

# -- digests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "sha256:" + "a" * 64, "sha384:" + "b" * 96, "sha512:" + "c" * 128, "sha256:" + "A" * 64,
])
def test_digests_we_can_verify(text: str) -> None:
    digest = Digest.parse(text)
    assert str(digest) == text.lower()
    assert digest.key == text.lower().replace(":", "-")


@pytest.mark.parametrize(("text", "says"), [
    ("blake3:" + "a" * 64, "cannot verify"),
    ("md5:" + "a" * 32, "cannot verify"),
    ("sha256:" + "a" * 63, "64 hex digits"),
    ("sha256:" + "g" * 64, "64 hex digits"),
    ("sha256", "<algorithm>:<hex>"),
    ("", "<algorithm>:<hex>"),
    ("sha256:../../etc", "<algorithm>:<hex>"),
])
def test_digests_refused(text: str, says: str) -> None:
    with pytest.raises(DigestError, match=says):
        Digest.parse(text)


def test_verify_names_both_digests() -> None:
    expected = Digest.parse(digest_of(b"good"))
    verify(expected, expected.hex, what="x")
    with pytest.raises(DigestMismatchError) as raised:
        verify(expected, "0" * 64, what="the file at http://h/a.tar.gz")
    assert expected.hex in str(raised.value)
    assert "0" * 64 in str(raised.value)
    assert "digest mismatch" in str(raised.value)


# -- the address guard -----------------------------------------------------------------------

@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),  # noqa: S104
    ("169.254.169.254", "metadata"), ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("fd00:ec2::254", "AWS metadata"), ("100.100.100.200", "Alibaba"), ("192.0.0.192", "Oracle"),
    ("169.254.170.2", "ECS"),
    ("224.0.0.1", "multicast"), ("239.1.2.3", "multicast"), ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "metadata"),
    ("::127.0.0.1", "loopback"), ("2002:7f00:1::", "loopback"), ("64:ff9b::7f00:1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "metadata"),
])
def test_refused_addresses(address: str, why: str) -> None:
    found = refusal(ipaddress.ip_address(address))
    assert found is not None
    assert why in found


@pytest.mark.parametrize("address", [
    "10.0.0.1", "10.96.0.10", "172.16.5.4", "192.168.1.1", "100.64.0.1", "fd12:3456::1",
    "8.8.8.8", "2001:db8::1", "::ffff:10.1.2.3", "64:ff9b::808:808",
])
def test_allowed_addresses(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_guard_refuses_a_name_with_any_refused_address_and_resolves_once() -> None:
    calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["10.0.0.5", "127.0.0.1"]

    guard = AddressGuard(resolver=resolver)
    with pytest.raises(AddressRefusedError, match=r"artifacts\.example \(127\.0\.0\.1\): loopback"):
        guard.addresses("artifacts.example", 80)
    assert calls == ["artifacts.example"]
    assert AddressGuard(allow_insecure=True, resolver=resolver).addresses("artifacts.example", 80)


def test_guard_literal_hosts_are_checked_without_a_lookup() -> None:
    def resolver(host: str, port: int) -> list[str]:
        raise AssertionError("no look-up for a literal address")

    guard = AddressGuard(resolver=resolver)
    with pytest.raises(AddressRefusedError):
        guard.addresses("[::1]", 80)
    assert guard.addresses("10.1.2.3", 80) == [ipaddress.ip_address("10.1.2.3")]


def test_guard_names_that_do_not_resolve_are_retried_failures() -> None:
    def resolver(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(AddressLookupError, match=r"cannot resolve nowhere\.invalid"):
        AddressGuard(resolver=resolver).addresses("nowhere.invalid", 80)


# -- archive entries -------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "path"), [
    ("a.yaml", "a.yaml"), ("./a.yaml", "a.yaml"), ("dir/", "dir"), ("./", ""), (".", ""),
    ("a//b/./c.yaml", "a/b/c.yaml"),
])
def test_entry_paths(name: str, path: str) -> None:
    assert entry_path(name, limits=LIMITS) == path


@pytest.mark.parametrize(("name", "says"), [
    ("/etc/passwd", "absolute"), ("\\x", "absolute"), ("C:/x", "absolute"),
    ("../x", "'..'"), ("a/../../x", "'..'"), ("a/../b", "'..'"),
    ("a\x00b", "NUL"), ("x" * 300, "longer than 255"), ("/".join(["d"] * 200), "deeper"),
])
def test_entry_paths_refused(name: str, says: str) -> None:
    with pytest.raises(UnsafePathError, match=says):
        entry_path(name, limits=LIMITS)


@pytest.mark.parametrize(("path", "target", "symbolic", "resolved"), [
    ("a/link", "b.yaml", True, "a/b.yaml"),
    ("a/link", "../b.yaml", True, "b.yaml"),
    ("a/link", ".", True, "a"),
    ("link", "a/b.yaml", False, "a/b.yaml"),
])
def test_link_targets(path: str, target: str, symbolic: bool, resolved: str) -> None:
    assert link_target(path, target, symbolic=symbolic) == resolved


@pytest.mark.parametrize(("path", "target", "symbolic"), [
    ("link", "/etc/passwd", True), ("link", "../outside", True), ("a/link", "../../outside", True),
    ("a/link", "../a/../../x", True), ("link", "../x", False), ("link", "", True),
])
def test_link_targets_refused(path: str, target: str, symbolic: bool) -> None:
    with pytest.raises(UnsafePathError):
        link_target(path, target, symbolic=symbolic)


# -- unpacking -------------------------------------------------------------------------------

def _read(data: bytes, limits: ArtifactLimits = LIMITS) -> tuple[Index, bytes]:
    out = io.BytesIO()
    index = unpack(io.BytesIO(data), into=out, limits=limits)
    return index, out.getvalue()


def _unpack(data: bytes, limits: ArtifactLimits = LIMITS) -> dict[str, bytes]:
    index, written = _read(data, limits)
    return {path: written[ref.offset:ref.offset + ref.size] for path, ref in index.files.items()}


def test_files_are_written_once_with_their_digest_and_links_name_the_same_bytes() -> None:
    data = hostile_tarball([Entry("a.yaml", data=b"x" * 1000), Entry("b.yaml", data=b"y" * 10),
                            Entry("hard", type=tarfile.LNKTYPE, linkname="a.yaml"),
                            Entry("soft", type=tarfile.SYMTYPE, linkname="a.yaml")])
    index, written = _read(data)
    assert len(written) == 1010  # the links are index entries, not copies on disk
    assert index.files["hard"] == index.files["soft"] == index.files["a.yaml"]
    assert index.files["b.yaml"].sha256 == hashlib.sha256(b"y" * 10).hexdigest()
    assert index.size == sum(len(p) for p in index.files) + 3 * 1000 + 10


def test_a_file_larger_than_a_chunk_is_copied_in_chunks() -> None:
    big = os.urandom(3 * CHUNK + 17)
    assert _unpack(tarball({"big.bin": big})) == {"big.bin": big}


def test_the_paths_together_are_bounded() -> None:
    """The index is what every render holds in memory: its paths are bounded together."""
    files = {f"{'d' * 200}/{i:04}.yaml": b"" for i in range(30)}
    with pytest.raises(LimitExceededError, match="paths add up"):
        _unpack(tarball(files, directories=False), ArtifactLimits(max_paths_bytes=4000))


def test_unpack_a_flux_like_tarball() -> None:
    files = {"deploy/app.yaml": b"kind: ConfigMap\n", "kustomization.yaml": b"resources: []\n"}
    assert _unpack(tarball(files)) == files


def test_in_root_links_read_as_their_target_and_the_rest_is_unreadable() -> None:
    data = hostile_tarball([
        Entry("base/cm.yaml", data=b"kind: ConfigMap\n"),
        Entry("overlay/", type=tarfile.DIRTYPE),
        Entry("overlay/cm.yaml", type=tarfile.SYMTYPE, linkname="../base/cm.yaml"),
        Entry("hard.yaml", type=tarfile.LNKTYPE, linkname="base/cm.yaml"),
        Entry("to-dir", type=tarfile.SYMTYPE, linkname="overlay"),
        Entry("dangling", type=tarfile.SYMTYPE, linkname="nothing.yaml"),
        Entry("loop-a", type=tarfile.SYMTYPE, linkname="loop-b"),
        Entry("loop-b", type=tarfile.SYMTYPE, linkname="loop-a"),
    ])
    index, _ = _read(data)
    files = _unpack(data)
    assert files["overlay/cm.yaml"] == files["hard.yaml"] == b"kind: ConfigMap\n"
    assert set(index.unreadable) == {"to-dir", "dangling", "loop-a", "loop-b"}


@pytest.mark.parametrize(("entries", "says"), [
    ([Entry("/etc/cron.d/x", data=b"x")], "absolute"),
    ([Entry("../../x.yaml", data=b"x")], r"'\.\.'"),
    ([Entry("ok/../../x.yaml", data=b"x")], r"'\.\.'"),
    ([Entry("link", type=tarfile.SYMTYPE, linkname="/etc/passwd")], "absolute path"),
    ([Entry("link", type=tarfile.SYMTYPE, linkname="../../etc/passwd")], "outside the artifact"),
    ([Entry("a/link", type=tarfile.SYMTYPE, linkname="../../x")], "outside the artifact"),
    ([Entry("hard", type=tarfile.LNKTYPE, linkname="../x")], "outside the artifact"),
    ([Entry("hard", type=tarfile.LNKTYPE, linkname="later.yaml"), Entry("later.yaml", data=b"x")],
     "not a file earlier"),
    ([Entry("dev", type=tarfile.CHRTYPE)], "device"),
    ([Entry("dev", type=tarfile.BLKTYPE)], "device"),
    ([Entry("fifo", type=tarfile.FIFOTYPE)], "FIFO"),
    ([Entry("a.yaml", data=b"1"), Entry("a.yaml", data=b"2")], "more than once"),
    ([Entry("./a.yaml", data=b"1"), Entry("a.yaml", data=b"2")], "more than once"),
    ([Entry("a", data=b"1"), Entry("a/b.yaml", data=b"2")], "which is a file"),
    ([Entry("a", type=tarfile.SYMTYPE, linkname="d"), Entry("a/b.yaml", data=b"2")], "which is a link"),
])
def test_unsafe_archives_are_refused_whole(entries: list[Entry], says: str) -> None:
    with pytest.raises(UnsafePathError, match=says):
        _unpack(hostile_tarball(entries))


def test_bounds() -> None:
    small = ArtifactLimits(max_file_bytes=10, max_unpacked_bytes=25, max_files=3)
    with pytest.raises(LimitExceededError, match="--artifact-max-file-size"):
        _unpack(tarball({"a": b"x" * 11}), small)
    with pytest.raises(LimitExceededError, match="--artifact-max-unpacked-size"):
        _unpack(tarball({"a": b"x" * 10, "b": b"y" * 10, "c": b"z" * 10}, directories=False), small)
    with pytest.raises(LimitExceededError, match="--artifact-max-files"):
        _unpack(tarball({f"f{i}": b"" for i in range(4)}, directories=False), small)
    # Links are copies, and count again: they cannot multiply a small archive.
    linked = hostile_tarball([Entry("a", data=b"x" * 10), Entry("b", type=tarfile.LNKTYPE, linkname="a"),
                              Entry("c", type=tarfile.SYMTYPE, linkname="a")])
    with pytest.raises(LimitExceededError, match="--artifact-max-unpacked-size"):
        _unpack(linked, small)


def test_a_tar_bomb_is_cut_off_while_inflating() -> None:
    bomb = gzip_bomb(inflated=8 * 1024 * 1024)
    assert len(bomb) < 64 * 1024
    with pytest.raises(LimitExceededError):
        _unpack(bomb, ArtifactLimits(max_file_bytes=128 * 1024 * 1024, max_unpacked_bytes=1024 * 1024))


def test_a_huge_pax_header_is_cut_off_too() -> None:
    """tarfile reads a pax record in one piece whatever size it claims: the inflated stream is bounded."""
    big = tarfile.TarInfo("x.yaml")
    big.pax_headers = {"comment": "A" * (4 * 1024 * 1024)}
    buffer = io.BytesIO()
    import gzip
    with gzip.GzipFile(fileobj=buffer, mode="wb") as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(big, io.BytesIO(b""))
    with pytest.raises(LimitExceededError):
        _unpack(buffer.getvalue(), ArtifactLimits(max_unpacked_bytes=64 * 1024, max_files=4))


@pytest.mark.parametrize("data", [b"", b"not gzip at all", b"\x1f\x8b\x08\x00garbage"])
def test_not_a_tarball(data: bytes) -> None:
    with pytest.raises(ArchiveError):
        _unpack(data)
