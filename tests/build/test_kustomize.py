"""Kustomize overlays built by the real binary: what works, and what is refused (network, escapes, exec)."""

from __future__ import annotations

import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stageset.build import BuildError, build_stage
from stageset.build import kustomize as kz

Build = Callable[..., list[dict[str, Any]]]

DEPLOYMENT = b"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx:1.27
"""
SERVICE = b"""apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80}]
"""
CONFIGMAP = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: '1'}\n"


@pytest.fixture
def build(kustomize_binary: Path) -> Build:
    def run(files: dict[str, bytes], **kwargs: Any) -> list[dict[str, Any]]:
        return build_stage(files, path="./deploy", kustomize=kustomize_binary, **kwargs)

    return run


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


def test_overlay_with_base_inside_the_path_patches_and_name_prefix(build: Build) -> None:
    files = {
        "base/kustomization.yaml": b"resources: [deployment.yaml, service.yaml]\n",
        "base/deployment.yaml": DEPLOYMENT,
        "base/service.yaml": SERVICE,
        "kustomization.yaml": b"""apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: shop
namePrefix: prod-
commonLabels: {env: prod}
resources: [base]
patches:
- path: replicas.yaml
- target: {kind: Deployment, name: web}
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/image
      value: nginx:1.28
images:
- name: nginx
  newTag: "1.29"
configMapGenerator:
- name: settings
  literals: [mode=fast]
""",
        "replicas.yaml": b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
                         b"spec: {replicas: 3}\n",
        "README.md": b"# not read",
    }
    objects = build(files)
    kinds = by_kind(objects)
    assert set(kinds) == {"Deployment", "Service", "ConfigMap"}
    deployment = kinds["Deployment"]
    assert deployment["metadata"]["name"] == "prod-web"
    assert deployment["metadata"]["namespace"] == "shop"
    assert deployment["metadata"]["labels"] == {"app": "web", "env": "prod"}
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.29"
    assert kinds["Service"]["metadata"]["name"] == "prod-web"
    assert kinds["ConfigMap"]["metadata"]["name"].startswith("prod-settings-")  # hashed generator name
    assert kinds["ConfigMap"]["data"] == {"mode": "fast"}


def test_overlay_in_a_subdirectory_may_use_a_sibling_base(build: Build) -> None:
    """``../../base`` from ``overlays/prod`` stays inside the stage path, so it loads."""
    files = {
        "kustomization.yaml": b"resources: [overlays/prod]\n",
        "overlays/prod/kustomization.yaml": b"resources: [../../base]\nnameSuffix: -prod\n",
        "base/kustomization.yaml": b"resources: [cm.yaml]\n",
        "base/cm.yaml": CONFIGMAP,
    }
    assert [obj["metadata"]["name"] for obj in build(files)] == ["cfg-prod"]


@pytest.mark.parametrize("name", ["kustomization.yml", "Kustomization"])
def test_every_kustomization_file_name_is_recognised(build: Build, name: str) -> None:
    objects = build({name: b"resources: [cm.yaml]\nnamePrefix: k-\n", "cm.yaml": CONFIGMAP})
    assert objects[0]["metadata"]["name"] == "k-cfg"


@pytest.mark.parametrize("entry", [
    "https://raw.githubusercontent.com/org/repo/main/deploy.yaml",
    "github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v5.0.0",
    "git@github.com:org/repo.git//deploy",
    "ssh://git@example.com/org/repo.git",
    "HTTPS://127.0.0.1:6443/api",
    "git::https://example.com/org/repo.git",
    "file:///etc",
])
def test_remote_resources_are_refused_with_a_clear_error(build: Build, entry: str) -> None:
    files = {"kustomization.yaml": f"resources:\n- cm.yaml\n- '{entry}'\n".encode(), "cm.yaml": CONFIGMAP}
    with pytest.raises(BuildError, match=r"^kustomization\.yaml: resources: remote reference .* not support"):
        build(files)


def test_remote_references_in_nested_kustomizations_and_other_fields_are_refused(build: Build) -> None:
    files = {
        "kustomization.yaml": b"resources: [base]\n",
        "base/kustomization.yaml": b"configMapGenerator:\n- name: x\n  files: [conf=https://example.com/conf]\n",
    }
    with pytest.raises(BuildError, match=r"base/kustomization\.yaml: configMapGenerator\[\]\.files: remote"):
        build(files)


@pytest.mark.parametrize("entry", [
    "https://example.com/deploy.yaml",
    "github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v5.0.0",
    "git@github.com:org/repo.git",
])
def test_kustomize_itself_runs_offline(build: Build, monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Defence in depth: with our check switched off, kustomize still cannot fetch anything.

    HTTP goes to a proxy address where nothing listens, and there is no ``git`` to clone with.
    """
    monkeypatch.setattr(kz, "check_kustomizations", lambda _files: None)
    with pytest.raises(BuildError, match=r"kustomize build failed: .*(proxyconnect|no 'git' program)"):
        build({"kustomization.yaml": f"resources: ['{entry}']\n".encode()})


def test_a_base_outside_the_stage_path_is_refused(build: Build) -> None:
    files = {"kustomization.yaml": b"resources: [../base]\n"}
    with pytest.raises(BuildError, match=r"'\.\./base' points outside the stage path"):
        build(files)
    nested = {"kustomization.yaml": b"resources: [app]\n",
              "app/kustomization.yaml": b"resources: [../../shared]\n"}
    with pytest.raises(BuildError, match=r"app/kustomization\.yaml: resources: '\.\./\.\./shared' points"):
        build(nested)


@pytest.mark.parametrize(("field", "value"), [
    ("patches", "- path: ../secrets/patch.yaml"),
    ("resources", "- /etc/kubernetes/admin.conf"),
    ("configMapGenerator", "- name: x\n  envs: [../../.env]"),
])
def test_files_outside_the_stage_path_are_refused(build: Build, field: str, value: str) -> None:
    files = {"kustomization.yaml": f"{field}:\n{value}\n".encode()}
    with pytest.raises(BuildError, match=r"(points outside the stage path|absolute path .* is not allowed)"):
        build(files)


def test_escape_attempt_past_the_check_finds_only_our_empty_scratch_directory(
        build: Build, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kz, "check_kustomizations", lambda _files: None)
    with pytest.raises(BuildError, match="kustomize build failed") as caught:
        build({"kustomization.yaml": b"resources: [../../../../../../../../etc/kubernetes]\n"})
    assert "stageset-kustomize-" not in str(caught.value)  # our temporary paths are not shown


EXEC_FUNCTION = b"""apiVersion: example.com/v1
kind: Generate
metadata:
  name: gen
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: /bin/sh
"""
CONTAINER_FUNCTION = b"""apiVersion: example.com/v1
kind: Transform
metadata:
  name: t
  annotations:
    config.kubernetes.io/function: |
      container:
        image: busybox
"""


@pytest.mark.parametrize(("field", "plugin"), [
    ("generators", EXEC_FUNCTION),
    ("transformers", CONTAINER_FUNCTION),
    ("generators", b"apiVersion: someteam.example.com/v1\nkind: LegacyExecPlugin\nmetadata: {name: x}\n"),
])
def test_exec_and_container_plugins_are_refused(build: Build, field: str, plugin: bytes) -> None:
    files = {"kustomization.yaml": f"resources: [cm.yaml]\n{field}: [plugin.yaml]\n".encode(),
             "cm.yaml": CONFIGMAP, "plugin.yaml": plugin}
    with pytest.raises(BuildError, match="external plugins disabled"):
        build(files)


def test_inline_exec_function_is_refused(build: Build) -> None:
    inline = "\n".join("  " + line for line in EXEC_FUNCTION.decode().splitlines())
    files = {"kustomization.yaml": f"resources: [cm.yaml]\ntransformers:\n- |\n{inline}\n".encode(),
             "cm.yaml": CONFIGMAP}
    with pytest.raises(BuildError, match="external plugins disabled"):
        build(files)


def test_helm_charts_are_refused(build: Build) -> None:
    files = {"kustomization.yaml": b"helmCharts:\n- name: nginx\n  repo: https://charts.example.com\n"}
    with pytest.raises(BuildError, match="helmCharts: Helm charts are not supported"):
        build(files)


def test_kustomize_errors_are_reported_with_paths_relative_to_the_stage(build: Build) -> None:
    files = {"kustomization.yaml": b"resources: [cm.yaml, missing.yaml]\n", "cm.yaml": CONFIGMAP}
    with pytest.raises(BuildError, match=r"kustomize build failed: .*missing\.yaml") as caught:
        build(files)
    message = str(caught.value)
    assert "/tmp" not in message
    assert "stageset-kustomize-" not in message
    assert not message.startswith("kustomize build failed: Error:")


def test_a_kustomization_that_builds_nothing_is_an_error(build: Build) -> None:
    with pytest.raises(BuildError, match=r"path '\./deploy': the kustomization built no objects"):
        build({"kustomization.yaml": b"namePrefix: x-\n"})


def test_substitution_runs_after_the_build(build: Build) -> None:
    files = {
        "kustomization.yaml": b"resources: [deployment.yaml, cm.yaml]\nnamePrefix: ${prefix}-\n",
        "deployment.yaml": DEPLOYMENT.replace(b"replicas: 1", b"replicas: ${replicas}"),
        "cm.yaml": b"""apiVersion: v1
kind: ConfigMap
metadata:
  name: script
  annotations: {kustomize.toolkit.fluxcd.io/substitute: disabled}
data: {run.sh: 'echo ${HOME}'}
""",
    }
    objects = by_kind(build(files, variables={"prefix": "eu", "replicas": "2"}))
    assert objects["Deployment"]["metadata"]["name"] == "eu-web"
    assert objects["Deployment"]["spec"]["replicas"] == 2
    assert objects["ConfigMap"]["data"] == {"run.sh": "echo ${HOME}"}  # opted out
    with pytest.raises(BuildError, match=r"^Deployment \$\{prefix\}-web \(kustomize build: document \d\): "
                       r"variable \$\{prefix\} is not set and has no default$"):
        build(files, variables={})


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-kustomize"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_kustomize_runs_with_a_scratch_home_no_path_and_a_dead_proxy(tmp_path: Path) -> None:
    # PATH is empty, so only shell builtins work here.
    fake = _script(tmp_path, 'echo "$@" >&2; export -p >&2; exit 1\n')
    with pytest.raises(BuildError) as caught:
        build_stage({"kustomization.yaml": b"resources: []\n"}, kustomize=fake)
    message = str(caught.value)
    assert "build . --load-restrictor LoadRestrictionsRootOnly" in message
    for flag in ("--enable-alpha-plugins", "--enable-exec", "--enable-helm", "--network"):
        assert flag not in message
    exported = re.findall(r"^export (\w+)='?([^'\n]*)'?$", message, re.MULTILINE)
    env = dict(exported)
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://127.0.0.1:0"
    assert env["HOME"].startswith("../")  # inside the scratch directory, shown relative to the tree
    assert env["PATH"] == "../bin"  # an empty directory: no git, no helm, no shell
    assert "KUBECONFIG" not in env
    assert not any(key.startswith(("GIT_", "GOOGLE_", "AWS_")) for key in env)


def test_kustomize_is_killed_at_the_timeout(tmp_path: Path) -> None:
    fake = _script(tmp_path, f"exec {shutil.which('sleep')} 30\n")
    with pytest.raises(BuildError, match=r"kustomize build timed out after 0\.5s"):
        build_stage({"kustomization.yaml": b"resources: []\n"}, kustomize=fake, timeout=0.5)
