"""Hostile and broken repositories served by a real Git server: nothing they contain may
read outside the tree, exhaust memory, or make a good ref look gone.

The heavy repositories are built cheaply: a 100 MB blob of zeros is hashed from a sparse
file and packs to ~100 KB; 100 000 files come from one ``git fast-import`` stream.  The
whole module runs in a few seconds, so it stays in the default run.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

import pytest

from sources import (
    LimitExceededError,
    Limits,
    MirrorStore,
    RefNotFoundError,
    RefSelector,
    UnsafePathError,
    UrlPolicy,
)
from sources.mirror import _disk_usage
from tests.gitserver import GitServer, Zeros

MiB = 1024 * 1024
T = TypeVar("T")


def _peak_allocated(action: Callable[[], T]) -> tuple[T | BaseException, int]:
    """Run ``action`` under tracemalloc: (its result or exception, peak bytes allocated)."""
    tracemalloc.start()
    try:
        try:
            result: T | BaseException = action()
        except Exception as error:  # the caller asserts on it
            result = error
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def big_repo(git_server: GitServer) -> str:
    url = git_server.create_repo("big", {"deploy/app.yaml": "a: 1\n"})
    git_server.commit("big", {"deploy/huge.bin": Zeros(100 * MiB)}, message="100 MB")
    return url


def test_huge_blob_is_never_fetched_when_the_server_filters(
    git_server: GitServer, big_repo: str, store: MirrorStore
) -> None:
    """Partial clone (blob:limit=<per-file limit + 1>): the blob never reaches us."""
    def fetch_and_read() -> dict[str, bytes]:
        commit = store.fetch(big_repo, ref=RefSelector(branch="main")).commit
        return store.read_tree(big_repo, commit=commit, path="deploy")

    error, peak = _peak_allocated(fetch_and_read)

    assert isinstance(error, LimitExceededError)
    assert str(error) == ("file 'deploy/huge.bin' is larger than the limit of 10485760 bytes "
                          "per file (the server did not send it)")
    assert peak < 10 * MiB
    assert _disk_usage(store.mirror_path(big_repo)) < 5 * MiB
    # Everything else is still readable, e.g. with the big file ignored.
    commit = git_server.head("big")
    assert store.read_tree(big_repo, commit=commit, path="deploy", ignore="*.bin") == {
        "app.yaml": b"a: 1\n"}


def test_huge_blob_is_refused_while_fetching_when_the_server_sends_it(
    git_server: GitServer, big_repo: str, store: MirrorStore
) -> None:
    """A server without partial clone sends the blob; the pack check refuses it from the
    object's header, before inflating it, and nothing is stored."""
    git_server.configure("big", "uploadpack.allowFilter", "false")

    error, peak = _peak_allocated(lambda: store.fetch(big_repo, ref=RefSelector(branch="main")))

    assert isinstance(error, LimitExceededError)
    assert str(error).startswith("the remote sent a blob of 104857600 bytes, more than the "
                                 "limit of 10485760 bytes per file; the fetch was refused")
    assert peak < 5 * MiB
    assert _disk_usage(store.mirror_path(big_repo)) < 1 * MiB
    # With a higher per-file limit the fetch works; reading is then bounded by the total.
    roomy = MirrorStore(root=store.mirror_path(big_repo).parent.parent / "roomy",
                        policy=UrlPolicy(allow_http=True),
                        limits=Limits(max_file_bytes=200 * MiB, max_total_bytes=50 * MiB))
    commit = roomy.fetch(big_repo, ref=RefSelector(branch="main")).commit
    with pytest.raises(LimitExceededError, match="add up to more than"):
        roomy.read_tree(big_repo, commit=commit, path="deploy")


def test_hundred_thousand_files_hit_the_file_count_limit(git_server: GitServer,
                                                         store: MirrorStore) -> None:
    url = git_server.create_repo("many", {"README.md": "many\n"})
    git_server.import_files("many", (
        (f"deploy/d{i // 1000:03d}/f{i:06d}.yaml", b"n: %d\n" % (i % 97))
        for i in range(100_000)))
    commit = store.fetch(url, ref=RefSelector(branch="main")).commit

    with pytest.raises(LimitExceededError, match=r"more than 10000 files under the path "
                                                 r"\(limit reached at 'deploy/d010/f010000\.yaml'\)"):
        store.read_tree(url, commit=commit, path="deploy")
    # A path with few files in the same commit is fine.
    assert store.read_tree(url, commit=commit, path="deploy/d099", limits=Limits(max_files=1000))[
        "f099999.yaml"] == b"n: %d\n" % (99_999 % 97)


@pytest.mark.parametrize("name", ["..", ".", "a/b"])
def test_tree_entries_that_are_not_plain_names_are_refused(git_server: GitServer,
                                                           store: MirrorStore, name: str) -> None:
    """Git itself never writes these, but a hostile server can serve them."""
    url = git_server.create_repo("evil", {"deploy/app.yaml": "a: 1\n"})
    blob = git_server.git("evil", "hash-object", "-w", "--stdin", input=b"root:x:0:0\n")
    raw_tree = b"100644 " + name.encode() + b"\0" + bytes.fromhex(blob)
    tree = git_server.git("evil", "hash-object", "-t", "tree", "--literally", "-w", "--stdin",
                          input=raw_tree)
    root = git_server.git("evil", "mktree", input=f"040000 tree {tree}\tdeploy\n".encode())
    git_server.set_ref("evil", "refs/heads/main", git_server.git("evil", "commit-tree", root,
                                                                  "-m", "evil"))
    commit = store.fetch(url, ref=RefSelector(branch="main")).commit

    with pytest.raises(UnsafePathError, match=rf"invalid name {name!r} under 'deploy'"):
        store.read_tree(url, commit=commit, path="deploy")


def test_symlink_chain_out_of_the_tree_is_refused(git_server: GitServer,
                                                  store: MirrorStore) -> None:
    from tests.gitserver import Symlink

    url = git_server.create_repo("links", {
        "deploy/a.yaml": Symlink("b.yaml"), "deploy/b.yaml": Symlink("../c.yaml"),
        "c.yaml": Symlink("/etc/passwd")})
    commit = store.fetch(url, ref=RefSelector(branch="main")).commit
    with pytest.raises(UnsafePathError, match=r"symlink 'deploy/b\.yaml' -> '\.\./c\.yaml' "
                                              r"points outside 'deploy'"):
        store.read_tree(url, commit=commit, path="deploy")
    with pytest.raises(UnsafePathError, match=r"'/etc/passwd' is absolute"):
        store.read_tree(url, commit=commit, path="./")


def test_non_semver_tags_among_semver_ones(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("tags", {"v": "0"})
    tags = ["latest", "1.2.3.4", "release-9.0.0", "v01.2.3", "vv9.0.0", "v1.0.0", "v1.5.0",
            "v2.0.0-rc.1", "9.9.9.9", "v1.4.0+build.7", "stable"]
    commits = {}
    for tag in tags:
        commits[tag] = git_server.commit("tags", {"v": tag}, message=tag)
        git_server.tag("tags", tag)

    assert store.fetch(url, ref=RefSelector(semver="*")).revision == (
        f"v1.5.0@sha1:{commits['v1.5.0']}")
    assert store.fetch(url, ref=RefSelector(semver="~1.4")).ref_name == "v1.4.0+build.7"
    assert store.fetch(url, ref=RefSelector(semver=">=2.0.0-0")).ref_name == "v2.0.0-rc.1"
    with pytest.raises(RefNotFoundError, match="matches semver constraint '>=3'"):
        store.fetch(url, ref=RefSelector(semver=">=3"))


def test_tag_pointing_to_a_blob_is_not_a_commit(git_server: GitServer,
                                                store: MirrorStore) -> None:
    url = git_server.create_repo("odd", {"v": "0"})
    blob = git_server.git("odd", "hash-object", "-w", "--stdin", input=b"not a commit\n")
    git_server.set_ref("odd", "refs/tags/v1.0.0", blob)
    with pytest.raises(RefNotFoundError, match=r"v1\.0\.0 in .* points to a blob, not a commit"):
        store.fetch(url, ref=RefSelector(tag="v1.0.0"))


def test_force_push_then_delete_keeps_the_last_good_commit_readable(
    git_server: GitServer, store: MirrorStore
) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "v1\n"})
    git_server.branch("app", "release")
    git_server.commit("app", {"deploy/app.yaml": "v2\n"}, branch="release")
    first = store.fetch(url, ref=RefSelector(branch="release")).commit

    rewritten = git_server.force_push("app", {"deploy/app.yaml": "v2-fixed\n"}, branch="release")
    second = store.fetch(url, ref=RefSelector(branch="release"))
    assert second.commit == rewritten != first
    assert second.fetched

    git_server.delete_branch("app", "release")
    with pytest.raises(RefNotFoundError, match="branch 'release' not found"):
        store.fetch(url, ref=RefSelector(branch="release"))
    # The last good artifact (and the one before the force-push) stay readable.
    assert store.read_tree(url, commit=rewritten, path="deploy") == {"app.yaml": b"v2-fixed\n"}
    assert store.read_tree(url, commit=first, path="deploy") == {"app.yaml": b"v2\n"}


def test_mirror_is_bare(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("app", {"deploy/app.yaml": "a\n"})
    store.fetch(url)
    mirror = store.mirror_path(url)
    assert (mirror / "HEAD").exists()
    assert not (mirror / "deploy").exists()
    assert not (mirror / "index").exists()


def test_sizes_from_headers_match_git_in_a_mirror_built_by_thin_fetches(
    git_server: GitServer, store: MirrorStore
) -> None:
    """Incremental fetches arrive as thin packs (deltas against objects we already have,
    completed with REF_DELTA bases): every size read from a header must match git's."""
    import os
    import subprocess

    from dulwich.objects import ObjectID
    from dulwich.repo import Repo

    from sources.tree import object_size

    base = os.urandom(32 * 1024).hex()
    url = git_server.create_repo("thin", {"deploy/big.txt": base})
    store.fetch(url)
    for i in range(4):
        git_server.commit("thin", {"deploy/big.txt": base + f"line {i}\n" * (i + 1)})
        assert store.fetch(url).fetched
    mirror = store.mirror_path(url)
    listing = subprocess.run(["git", "-C", str(mirror), "cat-file", "--batch-all-objects",
                              "--batch-check"], capture_output=True, check=True).stdout.decode()
    expected = {sha: int(size) for sha, _, size in (line.split() for line in listing.splitlines())}
    assert len(expected) >= 10
    with Repo(str(mirror)) as repo:
        for sha, size in expected.items():
            assert object_size(repo.object_store, ObjectID(sha.encode())) == size, sha
