"""Reading trees fetched from a real server: hostile content is refused, limits hold."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from sources import (
    LimitExceededError,
    Limits,
    MirrorStore,
    PathNotFoundError,
    RefSelector,
    UnsafePathError,
)
from tests.gitserver import FileValue, GitServer, Submodule, Symlink, make_files


def _fetch(server: GitServer, store: MirrorStore,
           files: Mapping[str, FileValue]) -> tuple[str, str]:
    url = server.create_repo("app", files)
    return url, store.fetch(url, ref=RefSelector(branch="main")).commit


def test_symlink_to_etc_passwd_is_refused(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {
        "deploy/app.yaml": "a: 1\n", "deploy/passwd": Symlink("/etc/passwd")})
    with pytest.raises(UnsafePathError, match=r"symlink 'deploy/passwd' -> '/etc/passwd' is "
                                              "absolute"):
        store.read_tree(url, commit=commit, path="./deploy")


def test_symlink_climbing_out_is_refused(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {
        "deploy/app.yaml": "a: 1\n", "deploy/x": Symlink("../../../../etc/passwd"),
        "other/secret.yaml": "s: 1\n", "deploy2/y": Symlink("../other/secret.yaml")})
    with pytest.raises(UnsafePathError, match=r"'deploy/x' .* leaves the repository"):
        store.read_tree(url, commit=commit, path="deploy")
    with pytest.raises(UnsafePathError, match=r"'deploy2/y' .* points outside 'deploy2'"):
        store.read_tree(url, commit=commit, path="deploy2")


def test_symlinks_inside_the_path_are_resolved(git_server: GitServer,
                                               store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {
        "deploy/base/app.yaml": "a: 1\n", "deploy/prod/app.yaml": Symlink("../base/app.yaml"),
        "deploy/staging": Symlink("base")})
    assert store.read_tree(url, commit=commit, path="deploy") == {
        "base/app.yaml": b"a: 1\n", "prod/app.yaml": b"a: 1\n", "staging/app.yaml": b"a: 1\n"}


def test_dot_dot_and_absolute_paths_are_refused(git_server: GitServer,
                                                store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {"deploy/app.yaml": "a: 1\n"})
    with pytest.raises(UnsafePathError, match=r"path '\.\./deploy' contains '\.\.'"):
        store.read_tree(url, commit=commit, path="../deploy")
    with pytest.raises(UnsafePathError, match=r"path '/etc' is absolute"):
        store.read_tree(url, commit=commit, path="/etc")
    with pytest.raises(UnsafePathError):
        store.tree_hash(url, commit=commit, path="deploy/../..")


def test_submodule_is_refused(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {"deploy/app.yaml": "a: 1\n",
                                             "deploy/vendor": Submodule()})
    with pytest.raises(UnsafePathError, match="'deploy/vendor' is a submodule"):
        store.read_tree(url, commit=commit, path="deploy")


def test_missing_path(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {"deploy/app.yaml": "a: 1\n"})
    with pytest.raises(PathNotFoundError, match="'deploy/nope' does not exist"):
        store.read_tree(url, commit=commit, path="./deploy/nope")
    with pytest.raises(PathNotFoundError, match="is a file, not a directory"):
        store.read_tree(url, commit=commit, path="deploy/app.yaml")


def test_file_size_limit(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {"deploy/small.yaml": "a: 1\n",
                                             "deploy/big.yaml": "x" * 2048})
    with pytest.raises(LimitExceededError,
                       match=r"file 'deploy/big\.yaml' is 2048 bytes, more than the limit "
                             r"of 1024 bytes per file"):
        store.read_tree(url, commit=commit, path="deploy", limits=Limits(max_file_bytes=1024))
    # Ignored files do not count.
    assert store.read_tree(url, commit=commit, path="deploy", ignore="big.yaml",
                           limits=Limits(max_file_bytes=1024)) == {"small.yaml": b"a: 1\n"}


def test_file_count_and_total_limits(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, make_files(30, size=100))
    with pytest.raises(LimitExceededError, match="more than 10 files"):
        store.read_tree(url, commit=commit, path="deploy", limits=Limits(max_files=10))
    with pytest.raises(LimitExceededError, match="add up to more than 1000 bytes"):
        store.read_tree(url, commit=commit, path="deploy", limits=Limits(max_total_bytes=1000))
    assert len(store.read_tree(url, commit=commit, path="deploy")) == 30


def test_ignore_patterns(git_server: GitServer, store: MirrorStore) -> None:
    url, commit = _fetch(git_server, store, {
        "deploy/app.yaml": "a\n", "deploy/README.md": "r\n", "deploy/keep.md": "k\n",
        "deploy/secret.yaml": "s\n", "deploy/tmp/x.yaml": "t\n", "deploy/sub/secret.yaml": "n\n"})
    ignore = "# comment\n*.md\n!keep.md\n/deploy/secret.yaml\ntmp/\n"

    assert store.read_tree(url, commit=commit, path="deploy", ignore=ignore) == {
        "app.yaml": b"a\n", "keep.md": b"k\n", "sub/secret.yaml": b"n\n"}
