"""Mirrors are bounded on disk: least recently used ones are evicted, never one in use, and
before a fetch would take the store past its budget."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sources import Limits, MirrorStore, NotFetchedError, RefSelector, UrlPolicy
from sources.mirror import _disk_usage
from sources.urls import parse_url
from tests.gitserver import GitServer

KiB = 1024
POLICY = UrlPolicy(allow_http=True)


def _repos(server: GitServer, count: int, size: int = 256 * KiB) -> list[str]:
    """``count`` repositories of ``size`` incompressible bytes each."""
    return [server.create_repo(f"r{i}", {"deploy/blob.bin": os.urandom(size),
                                         "deploy/app.yaml": f"n: {i}\n"})
            for i in range(count)]


FETCH = 320 * KiB
"""The most one fetch of these tests may bring (``max_fetch_bytes``): the room made before it."""


def _store(tmp_path: Path, max_bytes: int | None, fetch: int = FETCH) -> MirrorStore:
    return MirrorStore(root=tmp_path / "mirrors", policy=POLICY, max_bytes=max_bytes,
                       limits=Limits(max_fetch_bytes=fetch))


def _mirrors(store: MirrorStore, urls: list[str]) -> list[bool]:
    return [(store.mirror_path(url) / "HEAD").exists() for url in urls]


def test_least_recently_used_mirror_is_evicted(git_server: GitServer, tmp_path: Path) -> None:
    urls = _repos(git_server, 4)
    probe = _store(tmp_path / "probe", None)
    probe.fetch(urls[0])
    one = probe.disk_usage()
    store = _store(tmp_path, max_bytes=int(one * 2.5))  # room for two mirrors

    a, b = (store.fetch(u) for u in urls[:2])
    assert _mirrors(store, urls) == [True, True, False, False]
    # Reading A makes B the least recently used one.
    store.read_tree(urls[0], commit=a.commit, path="deploy")

    c = store.fetch(urls[2])
    assert _mirrors(store, urls) == [True, False, True, False]
    assert store.evictions == 1
    assert store.disk_usage() <= int(one * 2.5)

    # An evicted mirror's commit is gone until fetched again.
    with pytest.raises(NotFetchedError, match="is not in the mirror; fetch it first"):
        store.read_tree(urls[1], commit=b.commit, path="deploy")
    again = store.fetch(urls[1])
    assert again.fetched
    assert store.read_tree(urls[1], commit=again.commit, path="deploy")["app.yaml"] == b"n: 1\n"
    assert _mirrors(store, urls) == [False, True, True, False]  # A was least recent now
    assert store.tree_hash(urls[2], commit=c.commit, path="deploy")


def test_unchanged_polls_do_not_evict_and_unbounded_never_does(git_server: GitServer,
                                                                tmp_path: Path) -> None:
    urls = _repos(git_server, 3, size=64 * KiB)
    unbounded = _store(tmp_path / "u", None)
    for url in urls:
        unbounded.fetch(url)
    assert _mirrors(unbounded, urls) == [True, True, True]
    assert unbounded.evict() == []

    # Room for every mirror and one fetch: nothing is ever evicted.
    bounded = _store(tmp_path / "b", max_bytes=unbounded.disk_usage() + FETCH)
    for url in urls * 3:
        bounded.fetch(url)
    assert bounded.evictions == 0


def test_mirrors_in_use_are_not_evicted(git_server: GitServer, tmp_path: Path) -> None:
    urls = _repos(git_server, 3)
    store = _store(tmp_path, max_bytes=1)  # only ever room for the mirror just fetched
    first = store.fetch(urls[0])
    name0 = store.mirror_path(urls[0]).name

    # A reader holds mirror 0; a fetch of another URL may not remove it.
    with store._reading(parse_url(urls[0], POLICY), commit=first.commit):
        store.fetch(urls[1])
        assert _mirrors(store, urls)[0]
    # A fetch in progress (its lock held) protects the mirror too.
    lock = store._lock_for(name0)
    with lock:
        store.fetch(urls[2])
        assert _mirrors(store, urls) == [True, False, True]
    assert store.evict(keep=store.mirror_path(urls[2]).name) == [name0]
    assert _mirrors(store, urls) == [False, False, True]


def test_a_new_store_adopts_the_mirrors_on_disk(git_server: GitServer, tmp_path: Path) -> None:
    urls = _repos(git_server, 3)
    old = _store(tmp_path, None)
    for url in urls:
        old.fetch(url)
    total = old.disk_usage()
    # Leftovers of an eviction or init interrupted by a crash (an hour old), and an init another
    # process sharing the root (the CLI's cache) has under way right now: kept.
    (tmp_path / "mirrors" / ".evict-deadbeef-1-2").mkdir()
    (tmp_path / "mirrors" / ".init-x").mkdir()
    (tmp_path / "mirrors" / ".init-live").mkdir()
    for debris in (".evict-deadbeef-1-2", ".init-x"):
        os.utime(tmp_path / "mirrors" / debris, (time.time() - 3600, time.time() - 3600))
    # Mirror 0 was used last.
    os.utime(old.mirror_path(urls[1]) / "stageset-last-used", (1, 1))
    os.utime(old.mirror_path(urls[2]) / "stageset-last-used", (2, 2))

    new = _store(tmp_path, max_bytes=total - 1)
    assert new.disk_usage() == total
    assert not (tmp_path / "mirrors" / ".evict-deadbeef-1-2").exists()
    assert not (tmp_path / "mirrors" / ".init-x").exists()
    assert (tmp_path / "mirrors" / ".init-live").exists()
    assert new.evict() == [new.mirror_path(urls[1]).name]


def test_concurrent_fetches_and_reads_under_eviction(git_server: GitServer,
                                                     tmp_path: Path) -> None:
    """Many threads, six URLs, room for about two mirrors: every read either succeeds with
    the right content or says the commit must be fetched again; nothing else breaks."""
    urls = _repos(git_server, 6, size=128 * KiB)
    probe = _store(tmp_path / "probe", None)
    probe.fetch(urls[0])
    store = _store(tmp_path, max_bytes=probe.disk_usage() * 2)
    start = threading.Barrier(8)

    def work(worker: int) -> int:
        start.wait()
        refetches = 0
        for step in range(12):
            i = (worker + step) % len(urls)
            for _ in range(5):
                snap = store.fetch(urls[i], ref=RefSelector(branch="main"))
                try:
                    files = store.read_tree(urls[i], commit=snap.commit, path="deploy")
                except NotFetchedError:
                    refetches += 1
                    continue
                assert files["app.yaml"] == f"n: {i}\n".encode()
                break
            else:
                raise AssertionError(f"could not read {urls[i]} after 5 fetches")
        return refetches

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))

    assert store.evictions > 0
    leftovers = [p.name for p in (tmp_path / "mirrors").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_room_is_made_before_a_fetch_would_pass_the_budget(git_server: GitServer, tmp_path: Path) -> None:
    """Before each download the mirrors on disk plus the most it may bring fit the budget (the
    chart sizes the mirror volume on this), so one fetch never takes the store past it."""
    urls = _repos(git_server, 5)
    probe = _store(tmp_path / "probe", None)
    probe.fetch(urls[0])
    one = probe.disk_usage()
    budget = 2 * one + FETCH  # two mirrors and one fetch in flight
    store = _store(tmp_path, max_bytes=budget)
    seen: list[tuple[int, list[bool]]] = []
    download = store._fetch_tip

    def spy(*args: object, **kwargs: object) -> None:
        # What is on disk (measured, not as accounted) when the download starts.
        seen.append((_disk_usage(tmp_path / "mirrors"), _mirrors(store, urls)))
        download(*args, **kwargs)  # type: ignore[arg-type]

    store._fetch_tip = spy  # type: ignore[method-assign]
    for url in urls:
        store.fetch(url)
        assert _disk_usage(tmp_path / "mirrors") <= budget
    assert len(seen) == 5
    for on_disk, _ in seen:
        assert on_disk + FETCH <= budget, (on_disk, budget)
    # The third download (into its new, empty mirror) found two mirrors and evicted the older
    # first, before it began.
    assert seen[2][1] == [False, True, True, False, False]
    assert store.evictions == 3
