"""The artifact store against real HTTP servers on loopback: download, verify, share, evict, and refuse.

The address guard is ON in the refusal tests.  Test servers can only listen on loopback, which
the guard refuses, so a test that needs one hop to pass uses :class:`PretendPublic`: the real
guard, except that one loopback address (``127.0.0.2``) is taken for a public one.  Every
refusal is then the real rule, at the real place (connect time, every hop).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sources.addresses import AddressGuard, AddressRefusedError, IPAddress, refusal
from sources.archive import ArchiveError
from sources.artifacts import MAX_TREE_OVERHEAD_BYTES, ArtifactStore, NotStoredError
from sources.digests import Digest, DigestMismatchError
from sources.errors import LimitExceededError, TransferError, UnsafePathError, UrlPolicyError
from sources.limits import ArtifactLimits
from tests.artifactserver import ArtifactServer, Entry, digest_of, gzip_bomb, hostile_tarball, tarball

FILES = {"app/cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\n"}
INSECURE = AddressGuard(allow_insecure=True)
PUBLIC = ipaddress.ip_address("127.0.0.2")


class PretendPublic(AddressGuard):
    """The real guard, but 127.0.0.2 counts as a public address."""

    def check(self, address: IPAddress, *, host: str) -> None:
        if address != PUBLIC:
            super().check(address, host=host)


@pytest.fixture
def server() -> Iterator[ArtifactServer]:
    with ArtifactServer() as running:
        yield running


@pytest.fixture
def public_server() -> Iterator[ArtifactServer]:
    with ArtifactServer(host=str(PUBLIC)) as running:
        yield running


def store(tmp_path: Path, guard: AddressGuard = INSECURE, **kwargs: object) -> ArtifactStore:
    return ArtifactStore(root=tmp_path / "artifacts", guard=guard, **kwargs)  # type: ignore[arg-type]


def test_download_verify_unpack_and_share(server: ArtifactServer, tmp_path: Path) -> None:
    body = tarball(FILES)
    url = server.publish("gitrepository/ns/app/abc.tar.gz", body)
    artifacts = store(tmp_path)
    digest = Digest.parse(digest_of(body))
    first = artifacts.fetch(url, digest, timeout=10)
    assert first.downloaded
    assert dict(artifacts.read(digest, url=url)) == FILES
    # The same digest from the same URL again (any reader whose own source names both): no second
    # download.
    again = artifacts.fetch(url, digest, timeout=10)
    assert not again.downloaded
    assert server.requests["/gitrepository/ns/app/abc.tar.gz"] == 1
    # A restarted controller keeps what it verified, and which URL proved it.
    assert dict(store(tmp_path).read(digest, url=url)) == FILES


def test_sha512_digests(server: ArtifactServer, tmp_path: Path) -> None:
    body = tarball(FILES)
    url = server.publish("a.tar.gz", body)
    digest = Digest.parse(digest_of(body, "sha512"))
    assert store(tmp_path).fetch(url, digest, timeout=10).downloaded


def test_digest_mismatch_stores_nothing(server: ArtifactServer, tmp_path: Path) -> None:
    url = server.publish("a.tar.gz", tarball({"evil.yaml": b"kind: ClusterRoleBinding\n"}))
    named = Digest.parse(digest_of(tarball(FILES)))
    artifacts = store(tmp_path)
    with pytest.raises(DigestMismatchError, match="digest mismatch"):
        artifacts.fetch(url, named, timeout=10)
    assert not artifacts.has(named)
    with pytest.raises(NotStoredError):
        artifacts.read(named, url=url)
    assert not list((tmp_path / "artifacts").iterdir())  # the spool file is gone too


def test_oversize_is_refused_from_content_length_and_while_reading(server: ArtifactServer,
                                                                   tmp_path: Path) -> None:
    body = tarball({"big.yaml": os.urandom(50_000)})
    small = store(tmp_path, limits=ArtifactLimits(max_download_bytes=1000))
    url = server.publish("big.tar.gz", body)
    with pytest.raises(LimitExceededError, match="--artifact-max-size"):
        small.fetch(url, Digest.parse(digest_of(body)), timeout=10)
    # A server that does not say the size is counted as it sends.
    unsized = server.publish("unsized.tar.gz", body, content_length=-1)
    with pytest.raises(LimitExceededError, match="larger than 1000 bytes"):
        small.fetch(unsized, Digest.parse(digest_of(body)), timeout=10)


def test_hostile_archives_are_refused_after_verification(server: ArtifactServer, tmp_path: Path) -> None:
    artifacts = store(tmp_path, limits=ArtifactLimits(max_unpacked_bytes=1024 * 1024))
    for name, body, error in [
        ("traversal", hostile_tarball([Entry("../../etc/cron.d/x", data=b"x")]), UnsafePathError),
        ("symlink", hostile_tarball([Entry("l", type=b"2", linkname="/etc/passwd")]), UnsafePathError),
        ("bomb", gzip_bomb(inflated=8 * 1024 * 1024), LimitExceededError),
        ("garbage", b"<html>not an artifact</html>", ArchiveError),
    ]:
        url = server.publish(f"{name}.tar.gz", body)
        digest = Digest.parse(digest_of(body))
        with pytest.raises(error):
            artifacts.fetch(url, digest, timeout=10)
        assert not artifacts.has(digest), name


def test_lru_bounded_in_bytes(server: ArtifactServer, tmp_path: Path) -> None:
    bodies = [tarball({"f.yaml": bytes([65 + i]) * 4000}) for i in range(3)]
    digests = [Digest.parse(digest_of(b)) for b in bodies]
    artifacts = store(tmp_path, max_bytes=9000)
    urls = [server.publish(f"{i}.tar.gz", body) for i, body in enumerate(bodies)]
    for i in range(2):
        artifacts.fetch(urls[i], digests[i], timeout=10)
    artifacts.read(digests[0], url=urls[0])  # 0 is now more recent than 1
    artifacts.fetch(urls[2], digests[2], timeout=10)
    assert [artifacts.has(d) for d in digests] == [True, False, True]
    assert artifacts.disk_usage() <= 9000


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "0.0.0.0", "169.254.169.254",  # noqa: S104
                                  "224.0.0.1", "2130706433", "127.1", "0x7f000001"])
def test_refused_addresses_never_connect(server: ArtifactServer, tmp_path: Path, host: str) -> None:
    body = tarball(FILES)
    server.publish("a.tar.gz", body)
    url = f"http://{host}:{server.port}/a.tar.gz"
    with pytest.raises(AddressRefusedError, match="not allowed for artifacts"):
        store(tmp_path, AddressGuard()).fetch(url, Digest.parse(digest_of(body)), timeout=5)
    assert server.requests["/a.tar.gz"] == 0


def test_a_name_resolving_to_a_refused_address(server: ArtifactServer, tmp_path: Path) -> None:
    body = tarball(FILES)
    server.publish("a.tar.gz", body)
    guard = AddressGuard(resolver=lambda _host, _port: ["127.0.0.1"])
    with pytest.raises(AddressRefusedError, match=r"source-controller\.flux-system \(127\.0\.0\.1\)"):
        store(tmp_path, guard).fetch(f"http://source-controller.flux-system:{server.port}/a.tar.gz",
                                     Digest.parse(digest_of(body)), timeout=5)
    assert server.requests["/a.tar.gz"] == 0


def test_redirect_to_loopback_is_refused_at_the_second_hop(public_server: ArtifactServer,
                                                           server: ArtifactServer, tmp_path: Path) -> None:
    body = tarball(FILES)
    target = server.publish("secret.tar.gz", body)
    public_server.publish("a.tar.gz", b"", redirect=target)
    public_server.publish("ok.tar.gz", body)
    guard = PretendPublic()
    # The first hop passes the (real) guard; the redirect's target is checked again at connect time.
    assert store(tmp_path, guard).fetch(public_server.url("ok.tar.gz"), Digest.parse(digest_of(body)),
                                        timeout=5).downloaded
    with pytest.raises(AddressRefusedError, match="loopback"):
        store(tmp_path / "2", guard).fetch(public_server.url("a.tar.gz"), Digest.parse(digest_of(body)),
                                           timeout=5)
    assert public_server.requests["/a.tar.gz"] == 1
    assert server.requests["/secret.tar.gz"] == 0


def test_no_dns_rebinding_one_lookup_per_connection(public_server: ArtifactServer, tmp_path: Path) -> None:
    """The address that was checked is the address connected to: a resolver that answers
    something else on a second look-up is never asked again."""
    body = tarball(FILES)
    public_server.publish("a.tar.gz", body)
    answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"]])
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    guard = PretendPublic(resolver=rebinding)
    url = f"http://artifacts.example:{public_server.port}/a.tar.gz"
    assert store(tmp_path, guard).fetch(url, Digest.parse(digest_of(body)), timeout=5).downloaded
    assert asked == ["artifacts.example"]
    assert public_server.requests["/a.tar.gz"] == 1
    # The next connection asks again, and the guard sees the new (refused) answer.
    with pytest.raises(AddressRefusedError):
        store(tmp_path / "2", guard).fetch(url, Digest.parse(digest_of(body)), timeout=5)
    assert public_server.requests["/a.tar.gz"] == 1


def test_refusal_rule_is_the_guards() -> None:
    assert refusal(PUBLIC) == "loopback"  # PretendPublic is a test's exception, not the rule


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://x/a.tar.gz", "gopher://x/", "http:///a",
                                 "http://user:pw@host/a.tar.gz"])
def test_only_plain_http_urls(tmp_path: Path, url: str) -> None:
    with pytest.raises(UrlPolicyError):
        store(tmp_path).fetch(url, Digest.parse(digest_of(b"x")), timeout=5)


def test_tarpit_is_cut_at_the_deadline(server: ArtifactServer, tmp_path: Path) -> None:
    body = tarball(FILES)
    url = server.publish("slow.tar.gz", body, trickle=0.2)
    started = time.monotonic()
    with pytest.raises(TransferError, match="--artifact-timeout"):
        store(tmp_path).fetch(url, Digest.parse(digest_of(body)), timeout=1.5)
    assert time.monotonic() - started < 10


def test_a_slow_url_does_not_hold_up_the_same_digest_from_a_good_one(server: ArtifactServer,
                                                                     tmp_path: Path) -> None:
    """Downloads are single-flight per (digest, URL): a tarpit naming a digest cannot make another
    reader of that digest wait for it."""
    body = tarball(FILES)
    digest = Digest.parse(digest_of(body))
    slow = server.publish("slow.tar.gz", body, trickle=0.5)
    good = server.publish("good.tar.gz", body)
    artifacts = store(tmp_path)
    failures: list[BaseException] = []

    def tarpit() -> None:
        try:
            artifacts.fetch(slow, digest, timeout=20)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=tarpit, daemon=True)
    thread.start()
    while server.requests["/slow.tar.gz"] == 0:
        time.sleep(0.01)
    assert artifacts.fetch(good, digest, timeout=5).downloaded
    assert thread.is_alive()  # the tarpit is still trickling; the good reader did not wait for it
    assert dict(artifacts.read(digest, url=good)) == FILES
    with pytest.raises(NotStoredError):  # the tarpit proved nothing
        artifacts.read(digest, url=slow)


def test_a_download_is_abandoned_when_the_controller_stops(server: ArtifactServer, tmp_path: Path) -> None:
    body = tarball(FILES)
    url = server.publish("slow.tar.gz", body, trickle=0.2)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(TransferError, match="abandoned: the controller is stopping"):
        store(tmp_path).fetch(url, Digest.parse(digest_of(body)), timeout=60, cancel=stop)


# -- a digest is no capability: content only for a URL that served it -----------------------------


def test_a_digest_is_served_only_for_a_url_that_served_it(server: ArtifactServer, tmp_path: Path) -> None:
    """Tenant B names tenant A's digest with a URL that serves nothing: no content, no proof; with a
    URL that serves the same file, B's own download proves it (and the tree is not unpacked again)."""
    body = tarball(FILES)
    digest = Digest.parse(digest_of(body))
    theirs = server.publish("a/app.tar.gz", body)
    artifacts = store(tmp_path)
    artifacts.fetch(theirs, digest, timeout=10, tenant="a")
    stored = artifacts.disk_usage()
    nothing = server.url("b/nothing.tar.gz")
    assert not artifacts.proven(digest, url=nothing)
    with pytest.raises(NotStoredError):
        artifacts.read(digest, url=nothing)
    with pytest.raises(TransferError, match="HTTP 404"):
        artifacts.fetch(nothing, digest, timeout=10, tenant="b")
    assert server.requests["/b/nothing.tar.gz"] == 1  # asked its own URL, not the store
    assert not artifacts.proven(digest, url=nothing)
    with pytest.raises(NotStoredError):
        artifacts.read(digest, url=nothing)
    # A URL serving something else is a mismatch, and proves nothing either.
    other = server.publish("b/other.tar.gz", tarball({"evil.yaml": b"kind: Secret\n"}))
    with pytest.raises(DigestMismatchError):
        artifacts.fetch(other, digest, timeout=10, tenant="b")
    assert not artifacts.proven(digest, url=other)
    # Its own URL serving the very file: downloaded and verified, then served from the store.
    mine = server.publish("b/app.tar.gz", body)
    assert artifacts.fetch(mine, digest, timeout=10, tenant="b").downloaded
    assert dict(artifacts.read(digest, url=mine)) == FILES
    assert artifacts.disk_usage() == stored  # one tree, two proofs
    assert artifacts.tenant_usage("a") == stored
    assert artifacts.tenant_usage("b") == 0
    # Proofs survive a restart; the URL itself is not written anywhere.
    again = store(tmp_path)
    assert again.proven(digest, url=mine)
    assert not again.proven(digest, url=nothing)
    for path in (tmp_path / "artifacts").iterdir():
        assert b"127.0.0.1" not in path.read_bytes(), path.name


def test_disk_is_bounded_per_tenant(server: ArtifactServer, tmp_path: Path) -> None:
    """Past its budget a tenant's own least recently read trees go; another tenant's stay."""
    bodies = [tarball({"f.yaml": os.urandom(4000)}) for _ in range(4)]
    digests = [Digest.parse(digest_of(b)) for b in bodies]
    urls = [server.publish(f"{i}.tar.gz", body) for i, body in enumerate(bodies)]
    artifacts = store(tmp_path, max_tenant_bytes=9000)
    artifacts.fetch(urls[3], digests[3], timeout=10, tenant="quiet")
    for i in range(3):
        artifacts.fetch(urls[i], digests[i], timeout=10, tenant="noisy")
    assert [artifacts.has(d) for d in digests] == [False, True, True, True]
    assert artifacts.tenant_usage("noisy") <= 9000
    assert sorted(p.name.rsplit(".", 1)[1] for p in (tmp_path / "artifacts").iterdir()) == \
        ["meta"] * 3 + ["tree"] * 3  # the evicted tree's files are gone


def test_a_tree_is_read_a_file_at_a_time_and_survives_eviction_while_open(server: ArtifactServer,
                                                                         tmp_path: Path) -> None:
    files = {"a.yaml": b"a: 1\n", "big.bin": os.urandom(200_000)}
    body = tarball(files)
    digest = Digest.parse(digest_of(body))
    url = server.publish("t.tar.gz", body)
    artifacts = store(tmp_path, max_bytes=1)
    artifacts.fetch(url, digest, timeout=10)
    tree = artifacts.read(digest, url=url)
    assert tree.size("big.bin") == 200_000
    assert tree.sha256("a.yaml") == hashlib.sha256(b"a: 1\n").hexdigest()
    other = tarball({"x.yaml": b"x: 1\n"})
    artifacts.fetch(server.publish("o.tar.gz", other), Digest.parse(digest_of(other)), timeout=10)
    assert not artifacts.has(digest)  # evicted (max_bytes=1) ...
    assert tree["big.bin"] == files["big.bin"]  # ... yet still readable by whoever holds it open
    tree.close()


def test_trees_of_an_older_format_or_without_proofs_are_deleted_at_start(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / f"sha256-{'a' * 64}.tree").write_bytes(b"SSTREE1\n" + b"\0" * 16)
    (root / f"sha256-{'b' * 64}.tree").write_bytes(b"SSTREE2\n" + b"\0" * 16)  # no .meta: no proof
    (root / ".spool-x").write_bytes(b"half a download")
    artifacts = store(tmp_path)
    assert artifacts.disk_usage() == 0
    assert not list(root.iterdir())


def test_an_index_past_its_bound_is_refused(server: ArtifactServer, tmp_path: Path) -> None:
    """Short paths (within max_paths_bytes) whose dangling links name long targets: the index that
    lists them as unreadable would outgrow what the chart's artifact volume allows a staged tree
    beyond its files (MAX_TREE_OVERHEAD_BYTES), so the artifact is refused and nothing is left."""
    target = "missing/" + "t" * 2500
    links = [Entry(f"l{n:05}", type=tarfile.SYMTYPE, linkname=target) for n in range(3500)]
    body = hostile_tarball(links)
    url = server.publish("links.tar.gz", body)
    digest = Digest.parse(digest_of(body))
    artifacts = store(tmp_path)
    with pytest.raises(LimitExceededError, match=f"index takes more than {MAX_TREE_OVERHEAD_BYTES} bytes"):
        artifacts.fetch(url, digest, timeout=10)
    assert not artifacts.has(digest)
    assert not list((tmp_path / "artifacts").iterdir())
    # A tenth of them fits: the bound refuses only what is past it.
    few = hostile_tarball(links[:350])
    url = server.publish("few.tar.gz", few)
    assert artifacts.fetch(url, Digest.parse(digest_of(few)), timeout=10).downloaded
