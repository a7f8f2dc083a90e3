"""Object sizes read from pack and loose object headers, without loading the objects.

A real repository written by the ``git`` CLI (loose objects, then a pack with deltas, as
``git repack`` makes them), compared against ``git cat-file --batch-check``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from dulwich.object_store import MemoryObjectStore
from dulwich.objects import Blob, ObjectID
from dulwich.repo import Repo

from sources.tree import object_size


def _git(repo: Path, *args: str, data: bytes | None = None) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "T",
           "GIT_AUTHOR_EMAIL": "t@example.test", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@example.test"}
    return subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True,
                          check=True, env=env).stdout.decode()


def _sizes(repo: Path) -> dict[str, int]:
    listing = _git(repo, "cat-file", "--batch-all-objects", "--batch-check")
    return {sha: int(size) for sha, _, size in (line.split() for line in listing.splitlines())}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo.git"
    subprocess.run(["git", "init", "--bare", "-q", str(path)], check=True)
    base = os.urandom(64 * 1024).hex().encode()  # large and similar: packs as deltas
    for i in range(5):
        blob = _git(path, "hash-object", "-w", "--stdin", data=base + b"change %d\n" % i).strip()
        small = _git(path, "hash-object", "-w", "--stdin", data=b"s%d\n" % i).strip()
        tree = _git(path, "mktree", data=f"100644 blob {blob}\tbig\n100644 blob {small}\tsmall\n"
                    .encode()).strip()
        _git(path, "update-ref", f"refs/heads/b{i}", _git(path, "commit-tree", tree, "-m", "c")
             .strip())
    return path


def test_loose_objects(repo: Path) -> None:
    expected = _sizes(repo)
    with Repo(str(repo)) as dulwich_repo:
        store = dulwich_repo.object_store
        for sha, size in expected.items():
            assert object_size(store, ObjectID(sha.encode())) == size, sha


def test_packed_objects_and_deltas(repo: Path) -> None:
    _git(repo, "repack", "-a", "-d", "-f", "--depth=10", "--window=10", "-q")
    verify = _git(repo, "verify-pack", "-v", *[str(p) for p in (repo / "objects" / "pack")
                                               .glob("*.idx")])
    assert "chain length = 1" in verify  # some objects really are deltas
    expected = _sizes(repo)
    with Repo(str(repo)) as dulwich_repo:
        store = dulwich_repo.object_store
        for sha, size in expected.items():
            assert object_size(store, ObjectID(sha.encode())) == size, sha


def test_unknown_store_or_object_gives_none(repo: Path) -> None:
    memory = MemoryObjectStore()
    blob = Blob.from_string(b"x" * 10)
    memory.add_object(blob)
    assert object_size(memory, blob.id) is None  # callers then load it as usual
    with Repo(str(repo)) as dulwich_repo:
        assert object_size(dulwich_repo.object_store, ObjectID(b"0" * 40)) is None
