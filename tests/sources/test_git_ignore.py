"""Ignore rules on real repositories (Flux's defaults, ``.sourceignore``, ``spec.ignore``), and
trees built to exhaust a reader: every read stays bounded."""

from __future__ import annotations

import time

import pytest

from sources import LimitExceededError, Limits, MirrorStore, RefSelector
from tests.gitserver import GitServer, Zeros

MiB = 1024 * 1024
CLUTTER = {
    "deploy/app.yaml": "kind: ConfigMap\n",
    "deploy/logo.png": "PNG",
    "deploy/.sops.yaml": "creation_rules: []\n",
    ".github/workflows/ci.yml": "on: push\n",
    ".gitlab-ci.yml": "stages: []\n",
    ".gitignore": "*.tmp\n",
    "dist/app.tar.gz": "tgz",
    "README.md": "# app\n",
}


def _read(server: GitServer, store: MirrorStore, files: dict[str, object], *,
          ignore: str | None = None, path: str = "./") -> dict[str, bytes]:
    url = server.create_repo("app", files)  # type: ignore[arg-type]
    commit = store.fetch(url, ref=RefSelector(branch="main")).commit
    return store.read_tree(url, commit=commit, path=path, ignore=ignore)


def test_flux_default_exclusions(git_server: GitServer, store: MirrorStore) -> None:
    assert sorted(_read(git_server, store, CLUTTER)) == ["README.md", "deploy/app.yaml"]


def test_sourceignore_replaces_the_defaults(git_server: GitServer, store: MirrorStore) -> None:
    files = {**CLUTTER, ".sourceignore": "# docs are not manifests\n*.md\n"}
    assert sorted(_read(git_server, store, files)) == [
        ".github/workflows/ci.yml", ".gitlab-ci.yml", ".sourceignore", "deploy/.sops.yaml",
        "deploy/app.yaml", "deploy/logo.png", "dist/app.tar.gz"]


def test_nested_sourceignore_applies_below_its_directory(git_server: GitServer,
                                                         store: MirrorStore) -> None:
    files = {"deploy/app.yaml": "a\n", "deploy/test/t.yaml": "t\n", "other/test/t.yaml": "o\n",
             "deploy/.sourceignore": "test/\n"}
    assert sorted(_read(git_server, store, files, path="deploy")) == [".sourceignore",
                                                                      "app.yaml"]
    # Reading another path of the same commit: the file does not apply there.
    url = git_server.url("app")
    commit = git_server.head("app")
    assert sorted(store.read_tree(url, commit=commit, path="other")) == ["test/t.yaml"]


def test_spec_ignore_comes_last_and_is_anchored_at_the_root(git_server: GitServer,
                                                             store: MirrorStore) -> None:
    files = {**CLUTTER, ".sourceignore": "*.yaml\n", "deploy/secret.yaml": "s\n"}
    read = _read(git_server, store, files, ignore="!*.yaml\n/deploy/secret.yaml\n")
    assert "deploy/app.yaml" in read
    assert "deploy/secret.yaml" not in read


def test_ignored_files_are_no_error_and_do_not_count(git_server: GitServer,
                                                     store: MirrorStore) -> None:
    files = {"deploy/app.yaml": "a\n", "deploy/huge.png": Zeros(40 * MiB),
             "deploy/vendor": "x"}
    read = _read(git_server, store, files, ignore="*.png\n")
    assert sorted(read) == ["deploy/app.yaml", "deploy/vendor"]


@pytest.mark.timeout(60)
def test_catastrophic_pattern_and_long_name_do_not_freeze(git_server: GitServer,
                                                           store: MirrorStore) -> None:
    long_name = "a" * 3000
    files = {f"deploy/{long_name}": "x\n", "deploy/app.yaml": "a\n"}
    started = time.monotonic()
    read = _read(git_server, store, files, ignore="*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a b\n")
    assert sorted(read) == sorted(["deploy/app.yaml", f"deploy/{long_name}"])
    assert time.monotonic() - started < 30


def _tree_bomb(server: GitServer, *, width: int, levels: int) -> str:
    """A repository whose root names ``width ** levels`` files using ``levels`` small trees."""
    blob = server.git("bomb", "hash-object", "-w", "--stdin", input=b"kind: ConfigMap\n")
    tree = server.git("bomb", "mktree", input=b"".join(
        f"100644 blob {blob}\tf{i}.png\n".encode() for i in range(width)))
    for _ in range(levels - 1):
        tree = server.git("bomb", "mktree", input=b"".join(
            f"040000 tree {tree}\td{i}\n".encode() for i in range(width)))
    commit = server.git("bomb", "commit-tree", tree, "-m", "bomb")
    server.set_ref("bomb", "refs/heads/main", commit)
    return commit


@pytest.mark.timeout(60)
def test_tree_bomb_is_refused_quickly(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("bomb")
    _tree_bomb(git_server, width=20, levels=6)  # 64 million paths, all default-ignored
    commit = store.fetch(url, ref=RefSelector(branch="main")).commit
    started = time.monotonic()
    with pytest.raises(LimitExceededError, match="more than 200000 tree entries"):
        store.read_tree(url, commit=commit, path="./")
    assert time.monotonic() - started < 30


def test_deep_nesting_is_a_limit_not_a_crash(git_server: GitServer, store: MirrorStore) -> None:
    url = git_server.create_repo("deep", {"/".join(["d"] * 300) + "/app.yaml": "a\n"})
    commit = store.fetch(url, ref=RefSelector(branch="main")).commit
    with pytest.raises(LimitExceededError, match="nested deeper than 128 levels"):
        store.read_tree(url, commit=commit, path="./")
    # Nesting counts from the path read; a higher limit reads it all.
    assert store.read_tree(url, commit=commit, path="/".join(["d"] * 250)) == {
        "/".join(["d"] * 50) + "/app.yaml": b"a\n"}
    assert len(store.read_tree(url, commit=commit, path="./", limits=Limits(max_depth=400))) == 1
