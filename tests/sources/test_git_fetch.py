"""Fetching branches, tags, semver, names and commits from a real smart-HTTP server."""

from __future__ import annotations

import pytest

from sources import MirrorStore, RefNotFoundError, RefSelector, parse_revision
from tests.gitserver import GitServer

APP = {"deploy/app.yaml": "kind: ConfigMap\n", "deploy/sub/b.yaml": "b: 1\n",
       "README.md": "# app\n"}


def test_fetch_branch_and_read_path(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    head = git_server.head("app")

    snap = store.fetch(url, ref=RefSelector(branch="main"))

    assert snap.commit == head
    assert snap.revision == f"main@sha1:{head}"
    assert parse_revision(snap.revision) == ("main", head)
    assert snap.fetched
    assert store.read_tree(url, commit=snap.commit, path="./deploy") == {
        "app.yaml": b"kind: ConfigMap\n", "sub/b.yaml": b"b: 1\n"}
    assert store.read_tree(url, commit=snap.commit, path="./") == {
        "deploy/app.yaml": b"kind: ConfigMap\n", "deploy/sub/b.yaml": b"b: 1\n",
        "README.md": b"# app\n"}
    assert git_server.fetch_count("app") == 1


def test_default_ref_follows_remote_head(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP, branch="trunk")

    snap = store.fetch(url)

    assert snap.revision == f"trunk@sha1:{git_server.head('app', 'trunk')}"


def test_unchanged_remote_is_not_fetched_again_and_new_commit_is(
    git_server: GitServer, store: MirrorStore
) -> None:
    url = git_server.create_repo("app", APP)
    first = store.fetch(url, ref=RefSelector(branch="main"))

    again = store.fetch(url, ref=RefSelector(branch="main"))
    assert again.commit == first.commit
    assert not again.fetched
    assert git_server.fetch_count("app") == 1

    new = git_server.commit("app", {"deploy/app.yaml": "kind: Secret\n"}, message="change")
    changed = store.fetch(url, ref=RefSelector(branch="main"))
    assert changed.commit == new != first.commit
    assert changed.fetched
    assert git_server.fetch_count("app") == 2
    assert store.read_tree(url, commit=new, path="deploy")["app.yaml"] == b"kind: Secret\n"
    # The old commit is still readable from the mirror.
    assert store.read_tree(url, commit=first.commit, path="deploy")["app.yaml"] == (
        b"kind: ConfigMap\n")


def test_tree_hash_changes_only_with_the_subtree(git_server: GitServer,
                                                 store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    first = store.fetch(url, ref=RefSelector(branch="main")).commit
    git_server.commit("app", {"README.md": "# changed\n"})
    second = store.fetch(url, ref=RefSelector(branch="main")).commit
    git_server.commit("app", {"deploy/app.yaml": "changed\n"})
    third = store.fetch(url, ref=RefSelector(branch="main")).commit

    hashes = [store.tree_hash(url, commit=c, path="./deploy") for c in (first, second, third)]
    assert hashes[0] == hashes[1] != hashes[2]
    assert hashes[0] == git_server.git("app", "rev-parse", f"{first}:deploy")


def test_lightweight_and_annotated_tags(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    light = git_server.tag("app", "v1.0.0")
    new = git_server.commit("app", {"deploy/app.yaml": "v2\n"})
    annotated = git_server.tag("app", "v2.0.0", annotated=True, message="release 2")
    assert annotated == new

    snap1 = store.fetch(url, ref=RefSelector(tag="v1.0.0"))
    snap2 = store.fetch(url, ref=RefSelector(tag="v2.0.0"))

    assert snap1.revision == f"v1.0.0@sha1:{light}"
    assert snap2.revision == f"v2.0.0@sha1:{new}"  # peeled to the commit, as Flux reports
    assert store.read_tree(url, commit=snap2.commit, path="deploy")["app.yaml"] == b"v2\n"
    # Asking again costs no fetch.
    assert not store.fetch(url, ref=RefSelector(tag="v2.0.0")).fetched


def test_semver_picks_highest_match_ignoring_prereleases_and_non_semver(
    git_server: GitServer, store: MirrorStore
) -> None:
    url = git_server.create_repo("app", APP)
    commits = {}
    for tag in ["v1.0.0", "v1.2.0", "v1.10.0", "v2.0.0-rc.1", "v2.0.0", "latest", "v1.11.0-beta"]:
        commits[tag] = git_server.commit("app", {"deploy/version": tag}, message=tag)
        git_server.tag("app", tag, annotated=tag.endswith("0"))

    assert store.fetch(url, ref=RefSelector(semver=">=1.0.0 <2.0.0")).revision == (
        f"v1.10.0@sha1:{commits['v1.10.0']}")
    assert store.fetch(url, ref=RefSelector(semver="~1.2")).ref_name == "v1.2.0"
    assert store.fetch(url, ref=RefSelector(semver="*")).ref_name == "v2.0.0"
    assert store.fetch(url, ref=RefSelector(semver=">=1.11.0-0 <2")).ref_name == "v1.11.0-beta"
    with pytest.raises(RefNotFoundError, match=r"no tag in .* matches semver constraint '\^3'"):
        store.fetch(url, ref=RefSelector(semver="^3"))


def test_name_ref(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    pr = git_server.commit("app", {"deploy/app.yaml": "pr\n"}, branch="refs/pull/7/head")

    snap = store.fetch(url, ref=RefSelector(name="refs/pull/7/head"))

    assert snap.revision == f"refs/pull/7/head@sha1:{pr}"
    assert store.read_tree(url, commit=pr, path="deploy")["app.yaml"] == b"pr\n"


def test_commit_pin_alone_and_with_branch(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    old = git_server.head("app")
    git_server.commit("app", {"deploy/app.yaml": "newer\n"})
    git_server.commit("app", {"deploy/app.yaml": "newest\n"})

    snap = store.fetch(url, ref=RefSelector(commit=old))
    assert snap.revision == f"sha1:{old}"
    assert store.read_tree(url, commit=old, path="deploy")["app.yaml"] == b"kind: ConfigMap\n"

    pinned = store.fetch(url, ref=RefSelector(branch="main", commit=old))
    assert pinned.revision == f"main@sha1:{old}"
    assert not pinned.fetched


def test_commit_pin_when_a_v2_server_refuses_to_send_it(
    git_server: GitServer, store: MirrorStore
) -> None:
    """A protocol v2 server that will not send a commit by id (per-ref permissions): the pin
    is not found, and no history is fetched to look for it."""
    url = git_server.create_repo("app", APP)
    old = git_server.head("app")
    git_server.commit("app", {"deploy/app.yaml": "newer\n"})
    store.fetch(url, ref=RefSelector(branch="main"))  # the mirror is now shallow
    git_server.refuse_unadvertised_wants("app")
    git_server.reset_log()

    with pytest.raises(RefNotFoundError, match=f"commit {old} not found in"):
        store.fetch(url, ref=RefSelector(commit=old))
    assert git_server.fetch_count("app") == 1


def test_commit_pin_already_in_the_mirror_is_asked_of_the_server_again(
    git_server: GitServer, store: MirrorStore
) -> None:
    """Being in the shared mirror proves nothing about the caller: the server is asked
    (naming the commit as a "have", so nothing is transferred)."""
    url = git_server.create_repo("app", APP)
    pinned = git_server.commit("app", {"deploy/app.yaml": "pinned\n"}, branch="refs/heads/dev")
    store.fetch(url, ref=RefSelector(branch="dev"))
    git_server.reset_log()

    snap = store.fetch(url, ref=RefSelector(commit=pinned))

    assert (snap.commit, snap.fetched) == (pinned, False)
    assert git_server.fetch_count("app") == 1
    # Once the server refuses (pinned is no tip any more), the copy in the mirror is not
    # served.
    git_server.commit("app", {"deploy/app.yaml": "later\n"}, branch="refs/heads/dev")
    git_server.refuse_unadvertised_wants("app")
    with pytest.raises(RefNotFoundError):
        store.fetch(url, ref=RefSelector(commit=pinned))


def test_commit_pin_reachable_from_an_advertised_tip_needs_no_fetch(
    git_server: GitServer, store: MirrorStore
) -> None:
    url = git_server.create_repo("app", APP)
    old = git_server.head("app")
    git_server.commit("app", {"deploy/app.yaml": "newer\n"})
    store.fetch(url, ref=RefSelector(commit=old))
    store.fetch(url, ref=RefSelector(branch="main"))
    git_server.refuse_unadvertised_wants("app")  # would refuse any want but the tip
    git_server.reset_log()

    # The mirror has old and main's tip; main's tip (advertised to us) has old as parent.
    assert store.fetch(url, ref=RefSelector(branch="main", commit=old)).commit == old
    assert git_server.fetch_count("app") == 0


def test_unknown_commit_is_not_found(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    with pytest.raises(RefNotFoundError, match=r"commit 0{40} not found in http://"):
        store.fetch(url, ref=RefSelector(commit="0" * 40))


def test_force_pushed_branch(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    git_server.commit("app", {"deploy/app.yaml": "to be rewritten\n"})
    before = store.fetch(url, ref=RefSelector(branch="main"))

    rewritten = git_server.force_push("app", {"deploy/app.yaml": "rewritten\n"})
    after = store.fetch(url, ref=RefSelector(branch="main"))

    assert after.commit == rewritten != before.commit
    assert store.read_tree(url, commit=rewritten, path="deploy")["app.yaml"] == b"rewritten\n"


def test_deleted_branch_is_ref_not_found(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    git_server.branch("app", "feature")
    store.fetch(url, ref=RefSelector(branch="feature"))

    git_server.delete_branch("app", "feature")

    with pytest.raises(RefNotFoundError, match=r"branch 'feature' not found in http://"):
        store.fetch(url, ref=RefSelector(branch="feature"))
    with pytest.raises(RefNotFoundError, match="tag 'v9' not found"):
        store.fetch(url, ref=RefSelector(tag="v9"))


def test_spellings_of_one_url_share_a_mirror(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", APP)
    store.fetch(url, ref=RefSelector(branch="main"))
    other_spelling = url.replace("http://", "HTTP://") + "/"

    snap = store.fetch(other_spelling, ref=RefSelector(branch="main"))

    assert not snap.fetched
    assert store.mirror_path(url) == store.mirror_path(other_spelling)
    assert git_server.fetch_count() == 1


def test_dot_git_is_not_folded_two_repositories(git_server: GitServer, store: MirrorStore) -> None:
    """``/vault`` and ``/vault.git`` are two repositories on git http-backend: two mirrors."""
    with_suffix = git_server.create_repo("vault", {"deploy/app.yaml": "private\n"})
    without = git_server.create_repo("vault-public", {"deploy/app.yaml": "public\n"},
                                     directory="vault")
    assert without.endswith("/vault")
    assert with_suffix.endswith("/vault.git")

    one = store.fetch(with_suffix).commit
    other = store.fetch(without).commit

    assert one != other
    assert store.mirror_path(with_suffix) != store.mirror_path(without)
    assert store.read_tree(without, commit=other, path="deploy") == {"app.yaml": b"public\n"}


def test_local_file_url(git_server: GitServer, store: MirrorStore) -> None:
    git_server.create_repo("app", APP)
    git_server.tag("app", "v1.0.0", annotated=True)
    path = git_server.repo_path("app")

    snap = store.fetch(f"file://{path}", ref=RefSelector(tag="v1.0.0"))

    assert snap.commit == git_server.head("app")
    assert store.read_tree(f"file://{path}", commit=snap.commit, path="deploy/sub") == {
        "b.yaml": b"b: 1\n"}


def test_older_commit_after_a_shallow_newer_one(git_server: GitServer,
                                                store: MirrorStore) -> None:
    """The mirror is shallow at the newer commit; an ancestor must still arrive whole."""
    url = git_server.create_repo("app", APP)
    old = git_server.tag("app", "v1.0.0", annotated=True)
    git_server.commit("app", {"deploy/app.yaml": "new\n", "deploy/extra.yaml": "e\n"})
    store.fetch(url, ref=RefSelector(branch="main"))

    snap = store.fetch(url, ref=RefSelector(tag="v1.0.0"))

    assert snap.commit == old
    assert store.read_tree(url, commit=old, path="deploy") == {
        "app.yaml": b"kind: ConfigMap\n", "sub/b.yaml": b"b: 1\n"}
