"""A mirror is a cache, not a database: written without fsync or lock files, and a damaged one is
found, discarded and fetched again — never read (:mod:`sources.cachefiles`), against a real Git
server on loopback.

Damage is made the ways it happens: a writer killed in the middle of a write (a real process,
killed by a real SIGKILL at the moment it writes), and the shapes a power loss leaves in files
written without fsync (a short pack, a zeroed index, an empty ref, a garbled shallow list,
flipped bytes inside a pack) in a mirror recorded as whole in another boot; and bytes flipped
under a live store, found when a read fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dulwich.objects import Commit, Tree

from sources import MirrorStore, NotFetchedError, RefSelector, UrlPolicy, cachefiles
from tests.gitserver import GitServer

POLICY = UrlPolicy(allow_http=True)
CONSUMER = "ns/app/uid"


def _store(root: Path) -> MirrorStore:
    return MirrorStore(root=root, policy=POLICY)


def _read(store: MirrorStore, url: str, commit: str) -> bytes:
    return store.read_tree(url, commit=commit, path="deploy", consumer=CONSUMER)["app.yaml"]


def _pack(mirror: Path) -> Path:
    packs = sorted((mirror / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1, packs
    return packs[0]


def _blob_offset(mirror: Path, commit: str, name: str) -> int:
    """Where the blob ``deploy/<name>`` of ``commit`` starts in the mirror's pack."""
    with cachefiles.CacheRepo(str(mirror)) as repo:
        tip = repo.object_store[commit.encode()]
        assert isinstance(tip, Commit)
        root = repo.object_store[tip.tree]
        assert isinstance(root, Tree)
        deploy = repo.object_store[root[b"deploy"][1]]
        assert isinstance(deploy, Tree)
        blob = deploy[name.encode()][1]
        packs = repo.object_store.packs
        assert len(packs) == 1
        return int(packs[0].index.object_offset(blob))


def test_a_fetch_writes_no_fsync_and_no_lock_file(git_server: GitServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: 1\n"})
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    store = _store(tmp_path / "mirrors")

    first = store.fetch(url, consumer=CONSUMER)
    git_server.commit("app", {"deploy/app.yaml": "n: 2\n"})
    second = store.fetch(url, ref=RefSelector(branch="main"), consumer=CONSUMER)

    assert first.fetched
    assert second.fetched
    assert calls == []
    mirror = store.mirror_path(url)
    assert [p for p in mirror.rglob("*") if p.name.endswith(".lock") or p.name.startswith(".tmp-")] == []
    assert (mirror / "refs" / "heads" / "main").read_text() == f"{second.commit}\n"
    assert _read(store, url, second.commit) == b"n: 2\n"
    assert cachefiles.damage(mirror, deep=True) is None


_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from sources import MirrorStore, UrlPolicy, cachefiles

    def killed(self, path, contents):
        # The new pack and its index are in; the shallow list that says its history is missing
        # is not: die here, as a process killed (OOM, node drain) at that moment does.
        os.kill(os.getpid(), signal.SIGKILL)

    cachefiles.CacheRepo._put_named_file = killed
    MirrorStore(root=Path(sys.argv[1]), policy=UrlPolicy(allow_http=True)).fetch(
        sys.argv[2], consumer="ns/app/uid")
""")


def test_a_writer_killed_mid_write_leaves_a_mirror_that_is_discarded_and_fetched_again(
        git_server: GitServer, tmp_path: Path) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: 1\n"})
    root = tmp_path / "mirrors"
    old = _store(root).fetch(url, consumer=CONSUMER)
    new_commit = git_server.commit("app", {"deploy/app.yaml": "n: 2\n"})

    child = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(root), url],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr  # killed in the middle of its write

    mirror = _store(tmp_path / "probe").mirror_path(url).name
    damaged = root / mirror
    assert (damaged / cachefiles.WRITING).exists()
    assert cachefiles.damage(damaged, deep=False) == "a write into it did not finish"
    with cachefiles.CacheRepo(str(damaged)) as repo:  # the new commit's objects did get in
        assert new_commit.encode() in repo.object_store
        assert new_commit.encode() not in repo.get_shallow()

    fetches = git_server.fetch_count("app")
    store = _store(root)  # a restarted controller adopts the mirrors on disk
    assert store.discarded == 1
    assert not damaged.exists()
    with pytest.raises(NotFetchedError):  # nothing of it is read
        store.read_tree(url, commit=old.commit, path="deploy", consumer=CONSUMER)

    again = store.fetch(url, consumer=CONSUMER)
    assert again.commit == new_commit
    assert again.fetched
    assert git_server.fetch_count("app") == fetches + 1
    assert _read(store, url, new_commit) == b"n: 2\n"
    assert cachefiles.damage(damaged, deep=True) is None


def _truncate_pack(mirror: Path, commit: str) -> None:
    pack = _pack(mirror)
    pack.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])


def _zero_index(mirror: Path, commit: str) -> None:
    index = _pack(mirror).with_suffix(".idx")
    index.write_bytes(bytes(index.stat().st_size))


def _empty_ref(mirror: Path, commit: str) -> None:
    (mirror / "refs" / "heads" / "main").write_bytes(b"")


def _garbled_shallow(mirror: Path, commit: str) -> None:
    (mirror / "shallow").write_bytes(b"\0" * 41)


def _flipped_blob(mirror: Path, commit: str) -> None:
    # Inside the blob's compressed bytes, so its pack's header, trailer and index still agree.
    pack = _pack(mirror)
    data = bytearray(pack.read_bytes())
    at = _blob_offset(mirror, commit, "app.yaml") + 4
    data[at:at + 6] = bytes(b ^ 0x55 for b in data[at:at + 6])
    pack.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate_pack, _zero_index, _empty_ref, _garbled_shallow,
                                    _flipped_blob])
def test_a_mirror_from_another_boot_is_checked_in_full_and_a_damaged_one_fetched_again(
        git_server: GitServer, tmp_path: Path, damage: object) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: 1\n", "deploy/b.yaml": "b: 1\n"})
    root = tmp_path / "mirrors"
    snap = _store(root).fetch(url, consumer=CONSUMER)
    mirror = _store(tmp_path / "probe").mirror_path(url).name
    assert callable(damage)
    damage(root / mirror, snap.commit)
    # As a power loss leaves it: the files written before the machine stopped, in a mirror last
    # known whole in the boot before.
    (root / mirror / cachefiles.BOOT_FILE).write_text("an-earlier-boot\n")

    fetches = git_server.fetch_count("app")
    store = _store(root)
    assert store.discarded == 1
    again = store.fetch(url, consumer=CONSUMER)
    assert again.fetched
    assert git_server.fetch_count("app") == fetches + 1
    assert _read(store, url, snap.commit) == b"n: 1\n"
    assert cachefiles.known_whole_in_this_boot(root / mirror)


def test_a_whole_mirror_from_another_boot_is_kept_and_marked(git_server: GitServer,
                                                             tmp_path: Path) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: 1\n"})
    root = tmp_path / "mirrors"
    snap = _store(root).fetch(url, consumer=CONSUMER)
    mirror = root / _store(tmp_path / "probe").mirror_path(url).name
    (mirror / cachefiles.BOOT_FILE).write_text("an-earlier-boot\n")

    fetches = git_server.fetch_count("app")
    store = _store(root)
    assert store.discarded == 0
    assert cachefiles.known_whole_in_this_boot(mirror)
    assert not store.fetch(url, consumer=CONSUMER).fetched
    assert git_server.fetch_count("app") == fetches
    assert _read(store, url, snap.commit) == b"n: 1\n"


def test_damage_found_by_a_read_refuses_the_mirror_until_it_is_fetched_again(
        git_server: GitServer, tmp_path: Path) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: 1\n", "deploy/b.yaml": "b: 1\n"})
    store = _store(tmp_path / "mirrors")
    snap = store.fetch(url, consumer=CONSUMER)
    mirror = store.mirror_path(url)
    _flipped_blob(mirror, snap.commit)  # under a live store, in this boot: found only when read
    assert cachefiles.damage(mirror, deep=False) is None

    with pytest.raises(NotFetchedError, match="found damaged"):
        _read(store, url, snap.commit)
    with pytest.raises(NotFetchedError):  # refused, not read again
        store.tree_hash(url, commit=snap.commit, path="deploy", consumer=CONSUMER)

    fetches = git_server.fetch_count("app")
    again = store.fetch(url, consumer=CONSUMER)
    assert again.fetched
    assert git_server.fetch_count("app") == fetches + 1
    assert store.discarded == 1
    assert _read(store, url, snap.commit) == b"n: 1\n"


def test_a_write_that_fails_midway_starts_over_in_a_new_mirror(git_server: GitServer, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: 1\n"})
    store = _store(tmp_path / "mirrors")
    store.fetch(url, consumer=CONSUMER)
    new_commit = git_server.commit("app", {"deploy/app.yaml": "n: 2\n"})
    real = cachefiles.CacheRepo._put_named_file
    failures = [OSError(28, "No space left on device")]

    def full_once(self: cachefiles.CacheRepo, path: str, contents: bytes) -> None:
        if failures:
            raise failures.pop()
        real(self, path, contents)

    monkeypatch.setattr(cachefiles.CacheRepo, "_put_named_file", full_once)
    fetches = git_server.fetch_count("app")
    again = store.fetch(url, consumer=CONSUMER)

    assert again.commit == new_commit
    assert again.fetched
    assert store.discarded == 1  # the half-written mirror, thrown away
    assert git_server.fetch_count("app") == fetches + 2  # the failed fetch, then a fresh one
    assert _read(store, url, new_commit) == b"n: 2\n"
    assert cachefiles.damage(store.mirror_path(url), deep=True) is None
