"""Paths without a kustomization, built as Flux generates a kustomization for them (no binary here).

The rule (docs/layouts.md): every ``.yaml``/``.yml``/``.json`` file below the path is read;
a file none of whose documents has ``kind`` or ``metadata`` is not a manifest and is
skipped; a manifest file must hold complete objects only; a subdirectory with its own
kustomization is one kustomize unit (tested with the real builder in tests/build).
"""

from __future__ import annotations

import pytest

from stageset.build import BuildError, build_stage

CM = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n"


def names(files: dict[str, bytes], path: str = ".") -> list[str]:
    return [o["metadata"]["name"] for o in build_stage(files, path=path)]


def test_multi_document_files_recursively_in_sorted_order() -> None:
    files = {"b.yaml": CM % b"second", "a/x.yml": CM % b"first" + b"---\n" + CM % b"also-first",
             "README.md": b"# not a manifest", "c.json": b'{"apiVersion": "v1", "kind": "Secret",'
             b' "metadata": {"name": "third"}}', "d.json": b'[{"apiVersion": "v1", "kind": "Secret",'
             b' "metadata": {"name": "fourth"}}]'}
    assert names(files) == ["first", "also-first", "second", "third", "fourth"]


def test_only_the_stage_path_is_walked() -> None:
    files = {"deploy/a.yaml": CM % b"mine", "other/b.yaml": CM % b"not-mine", "deploy-x/c.yaml": CM % b"nope"}
    assert names(files, "./deploy") == ["mine"]
    assert names(files, "deploy/") == ["mine"]


@pytest.mark.parametrize(("name", "content"), [
    (".github/workflows/ci.yml", b"name: CI\non: [push]\njobs:\n  test: {runs-on: ubuntu, steps: []}\n"),
    ("chart/values.yaml", b"replicaCount: 2\nimage: {repository: nginx, tag: ''}\n"),
    ("chart/Chart.yaml", b"apiVersion: v2\nname: web\nversion: 1.0.0\n"),
    ("docker-compose.yml", b"services:\n  web: {image: nginx}\n"),
    (".pre-commit-config.yaml", b"repos:\n- repo: local\n  hooks: []\n"),
    ("list-of-strings.yaml", b"- a\n- b\n"),
    ("scalar.yaml", b"just text\n"),
    ("config.json", b'{"extends": "base", "rules": {"x": 1}}'),
    ("empty.yaml", b"# only a comment\n"),
])
def test_files_that_are_not_kubernetes_objects_are_skipped(name: str, content: bytes) -> None:
    assert names({"app.yaml": CM % b"app", name: content}) == ["app"]


def test_a_mistyped_kind_is_an_error_not_a_silently_dropped_object() -> None:
    with pytest.raises(BuildError, match=r"broken\.yaml: document 1 has no kind"):
        build_stage({"broken.yaml": b"apiVersion: v1\nknd: ConfigMap\nmetadata: {name: x}\n"})


def test_an_object_without_a_name_or_api_version_is_an_error() -> None:
    with pytest.raises(BuildError, match=r"a\.yaml: document 1 \(ConfigMap\) has no metadata\.name"):
        build_stage({"a.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n"})
    with pytest.raises(BuildError, match=r"a\.yaml: document 1 has no apiVersion"):
        build_stage({"a.yaml": b"kind: ConfigMap\nmetadata: {name: x}\n"})


def test_a_manifest_file_mixing_objects_and_other_documents_is_an_error() -> None:
    mixed = CM % b"a" + b"---\nreplicaCount: 2\n"
    with pytest.raises(BuildError, match=r"mixed\.yaml: document 2 is not a Kubernetes object"):
        build_stage({"mixed.yaml": mixed})


def test_local_config_objects_are_left_out_as_kustomize_does() -> None:
    local = (b"apiVersion: example.com/v1\nkind: Settings\nmetadata:\n  name: s\n  annotations:\n"
             b"    config.kubernetes.io/local-config: 'true'\n")
    assert names({"a.yaml": CM % b"a", "s.yaml": local}) == ["a"]


def test_empty_path_is_an_error_not_an_empty_set() -> None:
    with pytest.raises(BuildError, match="holds no manifests"):
        build_stage({"deploy/README.md": b"hello", "deploy/values.yaml": b"a: 1\n"}, path="./deploy")


@pytest.mark.parametrize(("path", "message"), [
    ("./missing", r"path '\./missing' not found in artifact"),
    ("./a.yaml", r"path '\./a\.yaml' is a file, not a directory"),
    ("../up", r"path '\.\./up' escapes the artifact root"),
    ("/etc", r"path '/etc' is absolute"),
])
def test_a_bad_stage_path_is_named(path: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        build_stage({"a.yaml": CM % b"a"}, path=path)


def test_one_object_defined_twice_is_an_error_naming_both_places() -> None:
    files = {"a.yaml": CM % b"same", "b/c.yaml": CM % b"same"}
    with pytest.raises(BuildError, match=r"ConfigMap same is defined twice in this stage: "
                                         r"a\.yaml: document 1 and b/c\.yaml: document 1"):
        build_stage(files)


def test_invalid_yaml_names_the_file() -> None:
    with pytest.raises(BuildError, match=r"bad\.yaml: not valid YAML"):
        build_stage({"bad.yaml": b"a: [unclosed"})
    with pytest.raises(BuildError, match=r"bad\.json: not valid JSON"):
        build_stage({"bad.json": b'{"a": '})


def test_a_billion_laughs_document_is_refused_before_it_expands() -> None:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    bomb = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb}\n" + "\n".join(lines) + "\n"
    with pytest.raises(BuildError, match="expands to more than"):
        build_stage({"bomb.yaml": bomb.encode()})


def test_ordinary_anchors_still_work() -> None:
    doc = (b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, labels: &l {app: x}}\n"
           b"data: {copy: *l}\n")
    objects = build_stage({"a.yaml": doc})
    assert objects[0]["data"]["copy"] == {"app": "x"}
