"""Mirrors do not grow with history: past a number of packs they are compacted to what readers
can still be served, against a real Git server on loopback."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sources import MirrorStore, NotFetchedError, RefSelector, UrlPolicy, compact
from sources.mirror import SERVED_DIR
from sources.urls import parse_url
from tests.gitserver import GitServer

KiB = 1024
POLICY = UrlPolicy(allow_http=True)


def _history(git_server: GitServer, store: MirrorStore, url: str, commits: int, *,
             consumer: str = "ns/app/uid") -> list[str]:
    """``commits`` new commits, each with a fresh 64 KiB file (incompressible), each fetched."""
    served = []
    for i in range(commits):
        files: dict[str, bytes | str | None] = {f"deploy/blob-{i}.bin": os.urandom(64 * KiB),
                                                "deploy/app.yaml": f"n: {i}\n"}
        if i:
            files[f"deploy/blob-{i - 1}.bin"] = None
        git_server.commit("app", files)
        served.append(store.fetch(url, consumer=consumer).commit)
    return served


def app_yaml(store: MirrorStore, url: str, commit: str, consumer: str = "ns/app/uid") -> bytes:
    return store.read_tree(url, commit=commit, path="deploy", consumer=consumer)["app.yaml"]


def test_a_mirror_is_compacted_to_what_is_still_served(git_server: GitServer, tmp_path: Path) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: start\n"})
    store = MirrorStore(root=tmp_path / "mirrors", policy=POLICY)
    commits = _history(git_server, store, url, 50)
    path = store.mirror_path(url)

    assert store.compactions >= 1
    assert compact.pack_count(path) <= compact.COMPACT_AFTER_PACKS
    # Every file of the repository's history would be ~50 x 64 KiB on disk; what stays is at
    # most the served window (16 commits) plus the packs fetched since the last compaction.
    most = (16 + compact.COMPACT_AFTER_PACKS + 2) * 64 * KiB
    assert store.disk_usage() < most, (store.disk_usage(), most)

    # What the consumer was served most recently still reads; its oldest commits are gone.
    assert app_yaml(store, url, commits[-1]) == b"n: 49\n"
    assert app_yaml(store, url, commits[-16]) == b"n: 34\n"
    with pytest.raises(NotFetchedError):
        store.read_tree(url, commit=commits[0], path="deploy", consumer="ns/app/uid")

    # A pin on an old commit is asked of the server again (and served) — a cache, not a loss.
    pinned = store.fetch(url, ref=RefSelector(commit=commits[1]), consumer="other/pin/uid")
    assert pinned.fetched
    assert app_yaml(store, url, commits[1], consumer="other/pin/uid") == b"n: 1\n"

    # And fetching keeps working from the compacted mirror (negotiating from its refs).
    git_server.commit("app", {"deploy/app.yaml": "n: after\n"})
    after = store.fetch(url, consumer="ns/app/uid")
    assert after.fetched
    assert app_yaml(store, url, after.commit) == b"n: after\n"


def test_compaction_waits_while_someone_reads(git_server: GitServer, tmp_path: Path) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: start\n"})
    store = MirrorStore(root=tmp_path / "mirrors", policy=POLICY)
    first = store.fetch(url, consumer="ns/app/uid")
    with store._reading(parse_url(url, POLICY), commit=first.commit):  # a StageSet reading meanwhile
        _history(git_server, store, url, compact.COMPACT_AFTER_PACKS + 2)
        assert store.compactions == 0, "never under a reader"
        assert compact.pack_count(store.mirror_path(url)) > compact.COMPACT_AFTER_PACKS
    _history(git_server, store, url, 1)
    assert store.compactions == 1


def test_records_of_consumers_gone_for_long_are_dropped(tmp_path: Path) -> None:
    served = tmp_path / SERVED_DIR
    served.mkdir()
    (served / "fresh").write_text("a\n")
    (served / "stale").write_text("b\n")
    old = time.time() - compact.SERVED_TTL - 60
    os.utime(served / "stale", (old, old))
    assert compact.drop_stale_records(served) == 1
    assert compact.served_commits(served) == {"a"}


def test_a_kept_commit_stays_served_through_history_and_compaction(git_server: GitServer,
                                                                   tmp_path: Path) -> None:
    """A stage's last good commit (kept by its StageSet) still reads after the branch moved on past
    the newest few and the mirror was compacted; a commit never served to the consumer is not kept,
    and dropping the keep lets it go like any other."""
    url = git_server.create_repo("app", {"deploy/app.yaml": "n: start\n"})
    store = MirrorStore(root=tmp_path / "mirrors", policy=POLICY)
    good = _history(git_server, store, url, 1)[0]
    assert store.keep(url, consumer="ns/app/uid", holder="ns/shop/prod", commits=[good]) == [good]
    # Never served to this consumer: not kept (and still not served).
    assert store.keep(url, consumer="ns/other/uid", holder="ns/x/y", commits=[good]) == []
    assert not store.is_served(url, commit=good, consumer="ns/other/uid")
    _history(git_server, store, url, compact.COMPACT_AFTER_PACKS + 4)
    assert store.compactions >= 1
    assert store.is_served(url, commit=good, consumer="ns/app/uid")
    assert app_yaml(store, url, good) == b"n: 0\n"
    store.keep(url, consumer="ns/app/uid", holder="ns/shop/prod", commits=[])
    assert not store.is_served(url, commit=good, consumer="ns/app/uid")


def test_kept_records_not_refreshed_for_long_are_dropped(tmp_path: Path) -> None:
    kept = tmp_path / "stageset-kept" / "consumer"
    kept.mkdir(parents=True)
    (kept / "fresh").write_text("a\n")
    (kept / "stale").write_text("b\n")
    old = time.time() - compact.SERVED_TTL - 60
    os.utime(kept / "stale", (old, old))
    assert compact.drop_stale_kept(tmp_path / "stageset-kept") == 1
    assert compact.all_kept_commits(tmp_path / "stageset-kept") == {"a"}
