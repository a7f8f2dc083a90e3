"""Plain manifests and substitution on rendered objects (no kustomize binary needed here)."""

from __future__ import annotations

import json

import pytest

from stageset.build import BuildError, build_stage

DEPLOYMENT = b"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: ${ns:=shop}
spec:
  replicas: ${replicas}
  template:
    metadata:
      annotations:
        port: "${port}"
        quoted-single: '${replicas}'
        escaped: $${not_a_variable}
    spec:
      containers:
      - name: web
        image: nginx:${tag}   # a comment with ${not_substituted}
        args: ["--enabled=${enabled}"]
        command:
        - |
          echo ${tag}
"""


def test_unquoted_scalars_are_typed_again_and_quoted_ones_stay_strings() -> None:
    [deployment] = build_stage({"app.yaml": DEPLOYMENT}, variables={
        "replicas": "3", "port": "8080", "tag": "1.27", "enabled": "true"})
    assert deployment["metadata"]["namespace"] == "shop"
    assert deployment["spec"]["replicas"] == 3
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"port": "8080", "quoted-single": "3", "escaped": "${not_a_variable}"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "nginx:1.27"
    assert container["args"] == ["--enabled=true"]
    assert container["command"] == ["echo 1.27\n"]


def test_without_post_build_nothing_is_substituted() -> None:
    [deployment] = build_stage({"app.yaml": DEPLOYMENT}, variables=None)
    assert deployment["spec"]["replicas"] == "${replicas}"
    assert deployment["spec"]["template"]["metadata"]["annotations"]["escaped"] == "$${not_a_variable}"


def test_unset_variable_names_the_variable_and_the_object() -> None:
    with pytest.raises(BuildError, match=r"^Deployment \$\{ns:=shop\}/web \(app\.yaml: document 1\): "
                                         r"variable \$\{replicas\} is not set and has no default$"):
        build_stage({"app.yaml": DEPLOYMENT}, variables={"tag": "1", "port": "1", "enabled": "1"})


def test_a_value_cannot_inject_yaml_structure() -> None:
    files = {"cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  v: ${v}\n"}
    value = "x\nextra: injected\nmetadata: {name: other}"
    [cm] = build_stage(files, variables={"v": value})
    assert cm["data"] == {"v": value}
    assert cm["metadata"] == {"name": "c"}


def test_values_do_not_appear_in_errors() -> None:
    files = {"cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: '${name}'}\n"}
    with pytest.raises(BuildError, match=r"has no metadata\.name") as caught:
        build_stage(files, variables={"name": ""})
    assert "ConfigMap" in str(caught.value)
    secret_value = "hunter2-very-secret"
    bad = {"x.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  a: ${a}\n  b: ${b}\n"}
    with pytest.raises(BuildError) as caught:
        build_stage(bad, variables={"a": secret_value})
    assert secret_value not in str(caught.value)
    assert "${b}" in str(caught.value)


def test_json_strings_stay_strings() -> None:
    document = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "${name}"},
                "spec": {"replicas": "${replicas}", "paused": False}}
    [deployment] = build_stage({"d.json": json.dumps(document).encode()},
                               variables={"name": "api", "replicas": "2"})
    assert deployment["metadata"]["name"] == "api"
    assert deployment["spec"] == {"replicas": "2", "paused": False}


@pytest.mark.parametrize("mark", [
    "annotations: {stages.metio.wtf/substitute: disabled}",
    "labels: {kustomize.toolkit.fluxcd.io/substitute: disabled}",
])
def test_objects_can_opt_out_of_substitution(mark: str) -> None:
    files = {"s.yaml": f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s\n  {mark}\n"
                       "data: {run.sh: 'echo ${HOME}'}\n".encode(),
             "t.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: t}\ndata: {v: '${v}'}\n"}
    objects = build_stage(files, variables={"v": "1"})
    assert [o["data"] for o in objects] == [{"run.sh": "echo ${HOME}"}, {"v": "1"}]


def test_list_items_are_objects_and_are_substituted_one_by_one() -> None:
    files = {"list.yaml": b"""apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: a}
  data: {n: "${n}"}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: b}
  data:
    n: ${n}
"""}
    objects = build_stage(files, variables={"n": "7"})
    assert [(o["metadata"]["name"], o["data"]["n"]) for o in objects] == [("a", "7"), ("b", 7)]
    with pytest.raises(BuildError, match=r"list\.yaml: document 1, item 1 has no apiVersion"):
        build_stage({"list.yaml": b"apiVersion: v1\nkind: List\nitems:\n- {metadata: {name: x}}\n"})


def test_anchors_and_aliases_are_expanded_once() -> None:
    files = {"a.yaml": b"""apiVersion: v1
kind: ConfigMap
metadata: {name: a}
data:
  first: &v "$${literal}-${x}"
  second: *v
"""}
    [cm] = build_stage(files, variables={"x": "1"})
    assert cm["data"] == {"first": "${literal}-1", "second": "${literal}-1"}


def test_timestamps_stay_strings() -> None:
    files = {"a.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"
                       b"data:\n  d: 2024-01-02\n  e: ${e}\n"}
    [cm] = build_stage(files, variables={"e": "2025-02-03T04:05:06Z"})
    assert cm["data"] == {"d": "2024-01-02", "e": "2025-02-03T04:05:06Z"}
    json.dumps(cm)


def test_empty_path_is_an_error_with_or_without_variables() -> None:
    for variables in (None, {}, {"a": "b"}):
        with pytest.raises(BuildError, match=r"path '\./deploy' holds no manifests"):
            build_stage({"deploy/README.md": b"x", "deploy/empty.yaml": b"---\n# nothing\n",
                         "elsewhere.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n"},
                        path="./deploy", variables=variables)


def test_non_utf8_file_is_an_error_naming_it() -> None:
    with pytest.raises(BuildError, match=r"bin\.yaml: not UTF-8 text"):
        build_stage({"bin.yaml": b"\xff\xfe"})

