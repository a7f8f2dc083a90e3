"""How many HTTP requests a fetch costs: one discovery per fetch, not two (issue 38).

Every request to ``git http-backend`` spawns processes on the server, and each is a round
trip: a cold fetch must cost ``GET info/refs`` + ``POST ls-refs`` + ``POST fetch`` (the
fetch reuses the listing's discovery, sources/transport.py), an unchanged remote only the
listing.  These tests also guard the one private dulwich hook this relies on
(``_discover_references``): if an upgrade bypasses it, the counts here go up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from dulwich.repo import Repo

from sources import Credentials, MirrorStore, RefSelector
from sources.transport import Remote
from sources.urls import UrlPolicy, parse_url
from tests.gitserver import GitServer

APP = {"deploy/app.yaml": "kind: ConfigMap\n"}

LISTING = Counter({("GET", ""): 1, ("POST", "ls-refs"): 1})
COLD = LISTING + Counter({("POST", "fetch"): 1})


def _requests(server: GitServer) -> Counter[tuple[str, str]]:
    """The requests since the last reset, by method and protocol command."""
    counted = Counter((r.method, r.command) for r in server.requests)
    server.reset_log()
    return counted


def test_cold_warm_and_new_commit(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    git_server.reset_log()

    first = store.fetch(url, ref=RefSelector(branch="main"))
    assert first.fetched
    assert _requests(git_server) == COLD

    again = store.fetch(url, ref=RefSelector(branch="main"))
    assert not again.fetched
    assert _requests(git_server) == LISTING

    new = git_server.commit("app", {"deploy/app.yaml": "kind: Secret\n"})
    changed = store.fetch(url, ref=RefSelector(branch="main"))
    assert changed.commit == new
    assert changed.fetched
    assert _requests(git_server) == COLD
    assert store.read_tree(url, commit=new, path="deploy")["app.yaml"] == b"kind: Secret\n"


def test_default_branch_tag_and_semver_resolve_in_one_discovery(
    git_server: GitServer, store: MirrorStore
) -> None:
    url = git_server.create_repo("app", APP, branch="trunk")
    light = git_server.tag("app", "v1.0.0", ref="trunk")
    newer = git_server.commit("app", {"deploy/app.yaml": "v2\n"}, branch="trunk")
    git_server.tag("app", "v2.0.0", annotated=True, message="release 2", ref="trunk")
    git_server.reset_log()

    head = store.fetch(url)  # the remote HEAD's symref names the branch
    assert head.revision == f"trunk@sha1:{newer}"
    assert _requests(git_server) == COLD

    tag = store.fetch(url, ref=RefSelector(tag="v1.0.0"))
    assert tag.revision == f"v1.0.0@sha1:{light}"
    assert tag.fetched
    assert _requests(git_server) == COLD

    # The annotated tag object is new to the mirror (its commit is not): one fetch, peeled.
    semver = store.fetch(url, ref=RefSelector(semver="^2"))
    assert semver.revision == f"v2.0.0@sha1:{newer}"
    assert _requests(git_server) == COLD
    assert not store.fetch(url, ref=RefSelector(semver="^2")).fetched
    assert _requests(git_server) == LISTING


def test_pinned_commit_asked_of_the_server_costs_one_discovery(
    git_server: GitServer, store: MirrorStore
) -> None:
    url = git_server.create_repo("app", APP)
    old = git_server.head("app")
    git_server.commit("app", {"deploy/app.yaml": "newer\n"})
    git_server.reset_log()

    snap = store.fetch(url, ref=RefSelector(commit=old))

    assert snap.commit == old
    assert snap.fetched
    assert _requests(git_server) == COLD


def test_protocol_v0_server_lists_once_too(git_server: GitServer, store: MirrorStore) -> None:
    """An old smart server advertises refs in the ``info/refs`` answer itself: a cold fetch is
    that and the fetch POST, an unchanged remote that alone."""
    url = git_server.create_repo("app", APP)
    git_server.user_protocol_v0("")
    git_server.reset_log()

    assert store.fetch(url, ref=RefSelector(branch="main")).commit == git_server.head("app")
    assert _requests(git_server) == Counter({("GET", ""): 1, ("POST", "fetch"): 1})
    assert not store.fetch(url, ref=RefSelector(branch="main")).fetched
    assert _requests(git_server) == Counter({("GET", ""): 1})


@pytest.mark.parametrize("same_remote", [True, False])
def test_a_listing_is_reused_only_by_the_remote_that_made_it(
    make_git_server: Callable[..., GitServer], tmp_path: Path, same_remote: bool
) -> None:
    """Another caller's listing (even one with equal credentials) never stands in for this
    caller's discovery: its fetch discovers again, with its own credentials."""
    server = make_git_server(username="alice", password="a-secret")
    url = server.create_repo("app", APP)
    remote_url = parse_url(url, UrlPolicy(allow_http=True))
    alice = Remote(url=remote_url, credentials=Credentials(username="alice", password="a-secret"),
                   timeout=30)
    other = Remote(url=remote_url, credentials=Credentials(username="alice", password="a-secret"),
                   timeout=30)
    listing = alice.list_refs(["refs/heads/main"])
    server.reset_log()
    with Repo.init_bare(str(tmp_path / "m"), mkdir=True) as repo:
        fetcher = alice if same_remote else other
        fetcher.fetch(repo, wants=[listing.refs["refs/heads/main"]], depth=1, listing=listing)
        assert server.head("app").encode() in repo.object_store

    counted = Counter((r.method, r.command) for r in server.requests if r.status == 200)
    assert counted == (Counter({("POST", "fetch"): 1}) if same_remote else COLD)
