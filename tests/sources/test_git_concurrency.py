"""Many callers, one fetch: the per-URL lock and the already-have-it check."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from sources import MirrorStore, RefSelector, Snapshot
from tests.gitserver import GitServer


def test_twenty_threads_fetching_one_url_fetch_once(git_server: GitServer,
                                                    store: MirrorStore) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "x: 1\n"})
    start = threading.Barrier(20)

    def fetch(_: int) -> tuple[Snapshot, dict[str, bytes]]:
        start.wait()
        snap = store.fetch(url, ref=RefSelector(branch="main"))
        return snap, store.read_tree(url, commit=snap.commit, path="deploy")

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(fetch, range(20)))

    assert {snap.commit for snap, _ in results} == {git_server.head("app")}
    assert all(files == {"app.yaml": b"x: 1\n"} for _, files in results)
    assert sum(snap.fetched for snap, _ in results) == 1
    assert git_server.fetch_count("app") == 1


def test_different_urls_fetch_in_parallel(git_server: GitServer, store: MirrorStore) -> None:
    urls = [git_server.create_repo(f"app{i}", {"f": str(i)}) for i in range(6)]

    with ThreadPoolExecutor(max_workers=6) as pool:
        snaps = list(pool.map(lambda u: store.fetch(u), urls))

    for i, (url, snap) in enumerate(zip(urls, snaps, strict=True)):
        assert store.read_tree(url, commit=snap.commit, path="") == {"f": str(i).encode()}
    assert git_server.fetch_count() == 6
