"""Hostile trees: the Git tree reader and the YAML/kustomize build either return something sane or
refuse with their own error — never another exception, never a path outside the tree.

Trees are built straight into an in-memory object store (names Git itself would refuse, symlinks
anywhere, submodules, deep nesting), so every shape a hostile server could send is reachable.
The build gets file sets with broken YAML, bombs in miniature, kustomizations that reach out of
the root, for remote bases, for plugins — and runs the real ``stageset-kustomize`` builder.
"""

from __future__ import annotations

import posixpath
from typing import Any

import yaml
from dulwich.object_store import MemoryObjectStore
from dulwich.objects import Blob, Commit, ObjectID, Tree
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sources import Limits, SourceError
from sources.tree import read_tree
from stageset.build import BuildLimits
from stageset.build.errors import BuildError
from stageset.build.render import build_stage

NAMES = st.sampled_from(["a", "b.yaml", "c.json", "..", ".", "a/b", "-x", " ", "k.yaml\n", "é.yaml",
                         ".sourceignore", "kustomization.yaml", "x" * 300, ".git"])
TARGETS = st.sampled_from(["a", "../a", "/etc/passwd", "..", ".", "b/../../x", "b.yaml", "loop", "",
                           "a/b/c", "../" * 20 + "etc"])
FILE = st.binary(max_size=64) | st.sampled_from([b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
                                                  b"*.yaml\n", b"!b.yaml\n"])


@st.composite
def git_tree(draw: st.DrawFn, store: MemoryObjectStore, depth: int = 0) -> ObjectID:
    tree = Tree()
    for _ in range(draw(st.integers(0, 4))):
        name = draw(NAMES).encode()
        kind = draw(st.sampled_from(["file", "link", "module", "dir"] if depth < 4 else ["file", "link"]))
        if kind == "file":
            blob = Blob.from_string(draw(FILE))
            store.add_object(blob)
            tree.add(name, 0o100644, blob.id)
        elif kind == "link":
            blob = Blob.from_string(draw(TARGETS).encode())
            store.add_object(blob)
            tree.add(name, 0o120000, blob.id)
        elif kind == "module":
            tree.add(name, 0o160000, b"1" * 40)
        else:
            tree.add(name, 0o040000, draw(git_tree(store, depth + 1)))
    store.add_object(tree)
    return tree.id


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(),
       path=st.sampled_from(["./", "", "a", "./a/b", "../a", "/etc", "b.yaml", "a/../..", "é.yaml"]),
       ignore=st.none() | st.sampled_from(["*.json", "/a", "!b.yaml\n*", "[", "**/**/**", "\\"]),
       files=st.integers(1, 50))
def test_the_tree_reader_returns_files_inside_the_tree_or_refuses(data: st.DataObject, path: str,
                                                                   ignore: str | None, files: int) -> None:
    store = MemoryObjectStore()
    commit = Commit()
    commit.tree = data.draw(git_tree(store))
    commit.author = commit.committer = b"T <t@example.test>"
    commit.author_time = commit.commit_time = 0
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = b"m"
    store.add_object(commit)
    limits = Limits(max_files=files, max_file_bytes=48, max_total_bytes=512)
    try:
        found = read_tree(store, commit=commit.id.decode(), path=path, ignore=ignore, limits=limits)
    except SourceError as error:
        event(f"refused: {type(error).__name__}")
        message = str(error)
        assert message
        return
    event("read")
    assert len(found) <= files
    for name, content in found.items():
        assert isinstance(content, bytes)
        assert len(content) <= 48
        assert not name.startswith("/"), name
        assert ".." not in name.split("/"), name
        assert posixpath.normpath(name) == name, name


SCALARS = st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=8)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)
RESOURCES = st.sampled_from(["a.yaml", "base", "../base", "../../../etc", "/etc/passwd", "https://example.test/x",
                             "github.com/org/repo", "missing.yaml", "app", "."])


@st.composite
def yaml_text(draw: st.DrawFn) -> bytes:
    shape = draw(st.sampled_from(["object"] * 5 + ["objects", "value", "noise", "anchors", "deep"]))
    if shape == "object":
        name = draw(st.from_regex(r"[a-z]{1,6}", fullmatch=True))
        return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                               "data": {"k": draw(st.text(max_size=6))}}).encode()
    if shape == "objects":
        return yaml.safe_dump_all(draw(st.lists(VALUES, max_size=3))).encode()
    if shape == "value":
        return yaml.safe_dump(draw(VALUES)).encode()
    if shape == "anchors":
        return b"a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c, *c, *c]\n"
    if shape == "deep":
        depth = draw(st.integers(50, 150))
        return ("[" * depth + "]" * depth).encode()
    return draw(st.binary(max_size=40))


@st.composite
def kustomization(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = draw(st.fixed_dictionaries({}, optional={
        "resources": st.lists(RESOURCES, max_size=3),
        "components": st.lists(RESOURCES, max_size=1),
        "namePrefix": st.text(max_size=4),
        "configMapGenerator": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["g", "h"]),
                                                              "files": st.lists(RESOURCES, max_size=2)}),
                                       max_size=1),
        "generators": st.lists(st.sampled_from(["fn.yaml", "plugin.yaml"]), max_size=1),
        "helmCharts": st.lists(st.fixed_dictionaries({"name": st.just("x")}), max_size=1),
        "patches": st.lists(st.fixed_dictionaries({"path": RESOURCES}), max_size=1),
    }))
    if draw(st.booleans()):
        body["apiVersion"] = "kustomize.config.k8s.io/v1beta1"
        body["kind"] = draw(st.sampled_from(["Kustomization", "Component"]))
    return yaml.safe_dump(body).encode()


@st.composite
def file_set(draw: st.DrawFn) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for directory in ("app", "base", "."):
        for name in draw(st.lists(st.sampled_from(["a.yaml", "b.yml", "c.json", "d.txt", "fn.yaml"]),
                                  max_size=3, unique=True)):
            files[posixpath.normpath(f"{directory}/{name}")] = draw(yaml_text())
        if draw(st.integers(0, 3)) == 0:
            files[posixpath.normpath(f"{directory}/kustomization.yaml")] = draw(kustomization())
    return files


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(files=file_set(), path=st.sampled_from([".", "app", "base", "missing", "../app", "/app"]))
def test_the_build_returns_objects_or_a_build_error(files: dict[str, bytes], path: str) -> None:
    limits = BuildLimits()
    try:
        objects = build_stage(files, path=path, limits=limits)
    except BuildError as error:
        event("refused")
        message = str(error).strip()
        assert message
        return
    event("built")
    assert objects
    for obj in objects:
        assert isinstance(obj, dict)
        assert obj.get("kind")
        assert obj.get("apiVersion")
        assert isinstance(obj.get("metadata"), dict)
