"""Reading trees from an object store: paths, symlinks, submodules, ignore, limits.

These build commits in an in-memory object store, so every hostile shape of tree can be
tested quickly; ``tests/sources`` repeats the important ones through a real server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from dulwich.index import commit_tree
from dulwich.object_store import MemoryObjectStore
from dulwich.objects import Blob, Commit, ObjectID, Tag, Tree

from sources import (
    GitOperationError,
    LimitExceededError,
    Limits,
    PathNotFoundError,
    RefNotFoundError,
    UnsafePathError,
)
from sources.tree import IgnoreCache, TreeCache, read_tree, split_path, subtree_id
from tests.gitserver import FileValue, Submodule, Symlink

Files = dict[str, FileValue]


def _commit(files: Mapping[str, FileValue]) -> tuple[MemoryObjectStore, str]:
    store = MemoryObjectStore()
    entries = []
    for path, value in files.items():
        if isinstance(value, Submodule):
            entries.append((path.encode(), ObjectID(value.commit.encode()), 0o160000))
            continue
        if isinstance(value, Symlink):
            blob, mode = Blob.from_string(value.target.encode()), 0o120000
        else:
            assert value is not None
            blob = Blob.from_string(value.encode() if isinstance(value, str) else value)
            mode = 0o100644
        store.add_object(blob)
        entries.append((path.encode(), blob.id, mode))
    commit = Commit()
    commit.tree = commit_tree(store, entries)
    commit.author = commit.committer = b"T <t@example.test>"
    commit.author_time = commit.commit_time = 0
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = b"m"
    store.add_object(commit)
    return store, commit.id.decode()


def _read(files: Mapping[str, FileValue], path: str = "./", *, ignore: str | None = None,
          limits: Limits | None = None) -> dict[str, bytes]:
    store, commit = _commit(files)
    return read_tree(store, commit=commit, path=path, ignore=ignore, limits=limits or Limits())


@pytest.mark.parametrize(
    ("path", "parts"),
    [("", ()), (".", ()), ("./", ()), ("deploy", ("deploy",)), ("./deploy/", ("deploy",)),
     ("deploy//a/./b", ("deploy", "a", "b"))],
)
def test_split_path(path: str, parts: tuple[str, ...]) -> None:
    assert split_path(path) == parts


@pytest.mark.parametrize("path", ["/", "/deploy", "../x", "deploy/../../x", "a/.."])
def test_split_path_refuses_escapes(path: str) -> None:
    with pytest.raises(UnsafePathError, match=repr(path).replace(".", r"\.")):
        split_path(path)


def test_reads_files_relative_to_path() -> None:
    files: Files = {
        "deploy/a.yaml": "a", "deploy/sub/b.yaml": b"\x00\xff", "other/c": "c"}
    assert _read(files, "deploy") == {"a.yaml": b"a", "sub/b.yaml": b"\x00\xff"}
    assert _read(files) == {"deploy/a.yaml": b"a", "deploy/sub/b.yaml": b"\x00\xff",
                            "other/c": b"c"}


def test_symlink_chain_inside_path() -> None:
    files: Files = {
        "d/real.yaml": "r", "d/one": Symlink("two"), "d/two": Symlink("./x/../real.yaml")}
    assert _read(files, "d") == {"real.yaml": b"r", "one": b"r", "two": b"r"}


def test_symlinked_directory_is_expanded() -> None:
    files: Files = {
        "d/base/a.yaml": "a", "d/base/inner/b.yaml": "b", "d/prod": Symlink("base"),
        "d/base/link": Symlink("inner/b.yaml")}
    assert _read(files, "d") == {
        "base/a.yaml": b"a", "base/inner/b.yaml": b"b", "base/link": b"b",
        "prod/a.yaml": b"a", "prod/inner/b.yaml": b"b", "prod/link": b"b"}


def test_path_through_a_symlink() -> None:
    files: Files = {
        "envs/prod/app.yaml": "p", "current": Symlink("envs/prod")}
    store, commit = _commit(files)
    assert read_tree(store, commit=commit, path="current", ignore=None, limits=Limits()) == {
        "app.yaml": b"p"}
    assert subtree_id(store, commit=commit, path="current") == subtree_id(
        store, commit=commit, path="envs/prod")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"d/x": Symlink("/etc/passwd")}, r"symlink 'd/x' -> '/etc/passwd' is absolute"),
        ({"d/x": Symlink("../../etc/passwd")}, r"symlink 'd/x' .* leaves the repository"),
        ({"d/x": Symlink("../other/f"), "other/f": "f"}, r"symlink 'd/x' .* points outside 'd'"),
        ({"d/x": Symlink("y"), "d/y": Symlink("x")}, r"too many levels of symbolic links"),
        ({"d/loop": Symlink(".")}, r"symlink 'd/loop' points to its own parent"),
        ({"d/sub/up": Symlink(".."), "d/f": "f"}, r"symlink 'd/sub/up' points to its own parent"),
        ({"d/a/l": Symlink("../b"), "d/b/m": Symlink("../a")}, r"points to its own parent"),
        ({"d/vendor": Submodule()}, r"'d/vendor' is a submodule"),
        ({"d/x": Symlink("../vendor/f"), "vendor": Submodule()}, r"points outside 'd'"),
    ],
)
def test_unsafe_trees_are_refused_naming_the_path(files: Mapping[str, FileValue],
                                                  message: str) -> None:
    with pytest.raises(UnsafePathError, match=message):
        _read(files, "d")


@pytest.mark.parametrize(
    ("files", "unreadable", "message"),
    [
        ({"d/x": Symlink("/etc/passwd")}, {"x"}, r"symlink 'd/x' -> '/etc/passwd' is absolute"),
        ({"d/x": Symlink("../../etc/passwd")}, {"x"}, r"leaves the repository"),
        ({"d/x": Symlink("y"), "d/y": Symlink("x")}, {"x", "y"}, r"too many levels of symbolic links"),
        ({"d/sub/up": Symlink("..")}, {"sub/up"}, r"points to its own parent"),
        ({"d/vendor": Submodule()}, {"vendor"}, r"'d/vendor' is a submodule"),
        ({"d/x": Symlink("missing")}, {"x"}, r"does not exist"),
    ],
)
def test_a_lenient_read_leaves_unsafe_entries_out_and_says_why(
        files: Mapping[str, FileValue], unreadable: set[str], message: str) -> None:
    store, commit = _commit({**files, "d/ok.yaml": "ok", "d/deep/also.yaml": "also"})
    found: dict[str, str] = {}
    read = read_tree(store, commit=commit, path="d", ignore=None, limits=Limits(), unreadable=found)
    assert read == {"ok.yaml": b"ok", "deep/also.yaml": b"also"}
    assert set(found) == unreadable
    assert all(re.search(message, why) for why in found.values())


def test_a_lenient_read_still_fails_on_limits() -> None:
    store, commit = _commit({"d/vendor": Submodule(), "d/a": "x" * 100})
    with pytest.raises(LimitExceededError):
        read_tree(store, commit=commit, path="d", ignore=None, limits=Limits(max_file_bytes=10),
                  unreadable={})


def test_symlink_into_submodule_is_refused() -> None:
    with pytest.raises(UnsafePathError, match="'d/vendor' is a submodule"):
        _read({"d/x": Symlink("vendor/f"), "d/vendor": Submodule()}, "d", ignore="/d/vendor")


def test_dangling_symlink() -> None:
    with pytest.raises(PathNotFoundError, match=r"symlink 'd/x': 'd/missing' does not exist"):
        _read({"d/x": Symlink("missing")}, "d")


def test_ignored_entries_are_not_inspected() -> None:
    files: Files = {
        "d/app.yaml": "a", "d/evil": Symlink("/etc/passwd"), "d/vendor": Submodule()}
    assert _read(files, "d", ignore="evil\nvendor\n") == {"app.yaml": b"a"}


def test_ignore_directories_and_negation() -> None:
    files: Files = {
        "d/build/x": "x", "d/build/keep": "k", "d/tmp/y": "y", "d/a.md": "m",
        "d/docs/b.md": "b", "d/ok.yaml": "o"}
    assert _read(files, "d", ignore="/d/build/**\n!/d/build/keep\ntmp/\n*.md\n!/d/docs/b.md\n") == {
        "build/keep": b"k", "docs/b.md": b"b", "ok.yaml": b"o"}


def test_ignore_is_anchored_at_the_repository_root() -> None:
    files: Files = {
        "d/secret.yaml": "s", "d/sub/secret.yaml": "t"}
    assert _read(files, "d", ignore="/d/secret.yaml") == {"sub/secret.yaml": b"t"}
    assert _read(files, "d", ignore="/secret.yaml") == {"secret.yaml": b"s",
                                                         "sub/secret.yaml": b"t"}


def test_limits() -> None:
    files: Files = {
        f"d/f{i}": "x" * 10 for i in range(5)}
    assert len(_read(files, "d", limits=Limits(max_files=5, max_file_bytes=10,
                                               max_total_bytes=50))) == 5
    with pytest.raises(LimitExceededError, match="more than 4 files"):
        _read(files, "d", limits=Limits(max_files=4))
    with pytest.raises(LimitExceededError, match=r"file 'd/f0' is 10 bytes, more than the limit"):
        _read(files, "d", limits=Limits(max_file_bytes=9))
    with pytest.raises(LimitExceededError, match="add up to more than 49 bytes"):
        _read(files, "d", limits=Limits(max_total_bytes=49))


def test_symlinked_copies_count_towards_limits() -> None:
    files: Files = {
        "d/base/a": "a", "d/b1": Symlink("base"), "d/b2": Symlink("base")}
    with pytest.raises(LimitExceededError, match="more than 2 files"):
        _read(files, "d", limits=Limits(max_files=2))


def test_path_errors() -> None:
    with pytest.raises(PathNotFoundError, match="'d/nope' does not exist"):
        _read({"d/a": "a"}, "d/nope")
    with pytest.raises(PathNotFoundError, match="'d/a' is a file, not a directory"):
        _read({"d/a": "a"}, "d/a")
    with pytest.raises(PathNotFoundError, match="'d/a' is not a directory"):
        _read({"d/a": "a"}, "d/a/b")


def test_commit_must_exist_and_be_a_commit() -> None:
    store, _ = _commit({"a": "a"})
    with pytest.raises(RefNotFoundError, match="is not in the mirror"):
        read_tree(store, commit="0" * 40, path="", ignore=None, limits=Limits())
    blob = Blob.from_string(b"x")
    store.add_object(blob)
    with pytest.raises(GitOperationError, match="is a blob, not a commit"):
        subtree_id(store, commit=blob.id.decode(), path="")


def test_annotated_tag_id_reads_its_commit() -> None:
    store, commit = _commit({"a": "a"})
    tag = Tag()
    tag.object = (Commit, ObjectID(commit.encode()))
    tag.name = b"v1"
    tag.tagger = b"T <t@example.test>"
    tag.tag_time, tag.tag_timezone = 0, 0
    tag.message = b"v1"
    store.add_object(tag)
    assert read_tree(store, commit=tag.id.decode(), path="", ignore=None, limits=Limits()) == {
        "a": b"a"}


def test_hostile_entry_names_are_refused() -> None:
    store, _ = _commit({})
    blob = Blob.from_string(b"x")
    store.add_object(blob)
    for name in (b"..", b"a/b", b"\xff"):
        tree = Tree()
        tree.add(name, 0o100644, blob.id)
        store.add_object(tree)
        commit = Commit()
        commit.tree = tree.id
        commit.author = commit.committer = b"T <t@example.test>"
        commit.author_time = commit.commit_time = 0
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = b"m"
        store.add_object(commit)
        with pytest.raises(UnsafePathError):
            read_tree(store, commit=commit.id.decode(), path="", ignore=None, limits=Limits())


# -- the parsed-tree cache ---------------------------------------------------------------------------


def test_tree_cache_reads_the_same_files_and_parses_each_tree_once() -> None:
    files: Files = {f"sets/{k}/cm-{j}.yaml": f"{k}-{j}" for k in range(20) for j in range(3)}
    store, commit = _commit(files)
    trees, ignores = TreeCache(), IgnoreCache()
    for k in range(20):
        read = read_tree(store, commit=commit, path=f"sets/{k}", ignore=None, limits=Limits(),
                         cache=ignores, trees=trees, scope="m")
        assert read == {f"cm-{j}.yaml": f"{k}-{j}".encode() for j in range(3)}
    # The root, sets/ and each set's directory are parsed once; every later walk is a hit
    # (each read looks up the root and sets/, and lists its own directory).
    assert trees.misses == 22
    assert trees.hits == 3 * 20
    assert subtree_id(store, commit=commit, path="sets/3", trees=trees, scope="m") == subtree_id(
        store, commit=commit, path="sets/3")


def test_tree_cache_keeps_mirrors_apart() -> None:
    store, commit = _commit({"d/a": "a"})
    trees = TreeCache()
    for scope in ("mirror-a", "mirror-b"):
        read_tree(store, commit=commit, path="d", ignore=None, limits=Limits(), cache=IgnoreCache(),
                  trees=trees, scope=scope)
    assert trees.misses == 4, "a tree parsed from one mirror served a read of another"
    trees.forget("mirror-a")
    assert len(trees) == 2  # mirror-b's root and d


def test_tree_cache_is_bounded_by_entries() -> None:
    files: Files = {f"d{k}/f{j}": f"{k}" for k in range(10) for j in range(4)}
    store, commit = _commit(files)
    trees, ignores = TreeCache(max_entries=20), IgnoreCache()  # the root (10 entries) is never kept
    for k in range(10):
        read_tree(store, commit=commit, path=f"d{k}", ignore=None, limits=Limits(), cache=ignores,
                  trees=trees, scope="m")
        assert trees.held_entries <= 20
    assert len(trees) == 5  # the five newest 4-entry directories
    hits = trees.hits
    read_tree(store, commit=commit, path="d9", ignore=None, limits=Limits(), cache=ignores, trees=trees,
              scope="m")
    assert trees.hits == hits + 1  # d9 held; the root parsed again


def test_reads_fill_the_ignore_cache_they_are_given() -> None:
    """An empty IgnoreCache is falsy (it has a length): a read once took it for "no cache" and
    scanned every tree of the commit for .sourceignore files on every read."""
    store, commit = _commit({f"d{k}/a": f"{k}" for k in range(5)})
    ignores, trees = IgnoreCache(), TreeCache()
    read_tree(store, commit=commit, path="d0", ignore=None, limits=Limits(), cache=ignores, trees=trees,
              scope="m")
    assert len(ignores) == 1
    parsed, hits = trees.misses, trees.hits
    read_tree(store, commit=commit, path="d1", ignore=None, limits=Limits(), cache=ignores, trees=trees,
              scope="m")
    assert trees.misses == parsed
    assert trees.hits == hits + 2  # the root looked up, d1 listed: no second scan of the commit
