from __future__ import annotations

import pytest

from stageset.build import BuildError, render_manifests, substitute

CM = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n"


def test_multi_document_files_in_sorted_order() -> None:
    files = {"b.yaml": CM % b"second", "a/x.yml": CM % b"first" + b"---\n" + CM % b"also-first",
             "README.md": b"# not a manifest", "c.json": b'{"apiVersion": "v1", "kind": "Secret",'
             b' "metadata": {"name": "third"}}'}
    names = [o["metadata"]["name"] for o in render_manifests(files)]
    assert names == ["first", "also-first", "second", "third"]


def test_empty_path_is_an_error_not_an_empty_set() -> None:
    with pytest.raises(BuildError, match="holds no manifests"):
        render_manifests({"README.md": b"hello"}, origin="./deploy")


def test_document_without_kind_names_the_file() -> None:
    with pytest.raises(BuildError, match=r"broken\.yaml: document 1 has no kind"):
        render_manifests({"broken.yaml": b"apiVersion: v1\nmetadata: {name: x}\n"})


def test_invalid_yaml_names_the_file() -> None:
    with pytest.raises(BuildError, match=r"bad\.yaml: not valid YAML"):
        render_manifests({"bad.yaml": b"a: [unclosed"})


def test_substitution_with_defaults_and_errors() -> None:
    assert substitute("${a}-${b:=two}", {"a": "one"}, origin="f") == "one-two"
    with pytest.raises(BuildError, match=r"\$\{missing\} is not set"):
        substitute("${missing}", {}, origin="f")


def test_a_billion_laughs_document_is_refused_before_it_expands() -> None:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    bomb = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb}\n" + "\n".join(lines) + "\n"
    with pytest.raises(BuildError, match="expands to more than"):
        render_manifests({"bomb.yaml": bomb.encode()})


def test_ordinary_anchors_still_work() -> None:
    doc = (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, labels: &l {app: x}}\n"
           b"data: {copy: *l}\n")
    objects = render_manifests({"a.yaml": doc})
    assert objects[0]["data"]["copy"] == {"app": "x"}
