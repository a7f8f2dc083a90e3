"""Kustomize builds by the real builder: loads from the source root, and what stays refused.

The static checks (tests/unit/test_build_sourceroot.py) give the messages; the tests here that
call :func:`kustomize_build` directly skip them, to show that the builder itself can neither
reach the network nor read a file of this machine.
"""

from __future__ import annotations

import re
import shutil
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stageset.build import BuildError, BuildLimits, build_stage
from stageset.build.kustomize import kustomize_build

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
def build(builder_binary: Path) -> Build:
    def run(files: dict[str, bytes], path: str = "./deploy", **kwargs: Any) -> list[dict[str, Any]]:
        return build_stage(files, path=path, kustomize=builder_binary, **kwargs)

    return run


def under(prefix: str, files: dict[str, bytes]) -> dict[str, bytes]:
    return {f"{prefix}/{name}": content for name, content in files.items()}


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects}


def test_overlay_with_base_patches_images_and_generators(build: Build) -> None:
    files = under("deploy", {
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
    })
    kinds = by_kind(build(files))
    assert set(kinds) == {"Deployment", "Service", "ConfigMap"}
    deployment = kinds["Deployment"]
    assert deployment["metadata"]["name"] == "prod-web"
    assert deployment["metadata"]["namespace"] == "shop"
    assert deployment["metadata"]["labels"] == {"app": "web", "env": "prod"}
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.29"
    assert kinds["ConfigMap"]["metadata"]["name"].startswith("prod-settings-")  # hashed generator name
    assert kinds["ConfigMap"]["data"] == {"mode": "fast"}


def test_an_overlay_loads_a_base_patches_and_files_above_the_stage_path(build: Build) -> None:
    """The layout of issue 8: ``overlays/<env>`` -> ``../../bases/<tier>``, with shared files."""
    files = {
        "deploy/bases/backend/kustomization.yaml": b"resources: [cm.yaml]\n",
        "deploy/bases/backend/cm.yaml": CONFIGMAP,
        "deploy/overlays/dev/kustomization.yaml": b"""resources: [../../bases/backend, ../../shared/ns.yaml]
nameSuffix: -dev
patches: [{path: ../../shared/patch.yaml}]
configMapGenerator: [{name: env, envs: [../../shared/dev.env]}]
""",
        "deploy/shared/ns.yaml": b"apiVersion: v1\nkind: Namespace\nmetadata: {name: dev}\n",
        "deploy/shared/patch.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\n"
                                    b"data: {b: '2'}\n",
        "deploy/shared/dev.env": b"LEVEL=debug\n",
    }
    objects = build(files, "deploy/overlays/dev")
    names = sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    assert names[0] == ("ConfigMap", "cfg-dev")
    assert names[1][1].startswith("env-dev-")  # the generator, with kustomize's content hash
    assert names[2] == ("Namespace", "dev")  # kustomize does not rename namespaces
    cfg = next(o for o in objects if o["metadata"]["name"] == "cfg-dev")
    assert cfg["data"] == {"a": "1", "b": "2"}


@pytest.mark.parametrize("name", ["kustomization.yml", "Kustomization"])
def test_every_kustomization_file_name_is_recognised(build: Build, name: str) -> None:
    objects = build(under("deploy", {name: b"resources: [cm.yaml]\nnamePrefix: k-\n", "cm.yaml": CONFIGMAP}))
    assert objects[0]["metadata"]["name"] == "k-cfg"


def test_a_path_without_kustomization_builds_subdirectory_kustomizations_as_units(build: Build) -> None:
    files = {
        "deploy/plain.yaml": CONFIGMAP,
        "deploy/values.yaml": b"replicaCount: 2\n",
        "deploy/app/kustomization.yaml": b"resources: [../../base]\nnamePrefix: app-\n",
        "deploy/app/ignored.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: not-listed}\n",
        "base/kustomization.yaml": b"resources: [svc.yaml]\n",
        "base/svc.yaml": SERVICE,
    }
    assert [(o["kind"], o["metadata"]["name"]) for o in build(files)] == \
        [("ConfigMap", "cfg"), ("Service", "app-web")]


def test_static_refusals_come_before_kustomize(build: Build) -> None:
    files = {"deploy/kustomization.yaml": b"resources: [cm.yaml, '../../../etc']\n",
             "deploy/cm.yaml": CONFIGMAP}
    with pytest.raises(BuildError, match=r"^deploy/kustomization\.yaml: resources: '\.\./\.\./\.\./etc' "
                                         r"escapes the artifact root$"):
        build(files)
    files["deploy/kustomization.yaml"] = b"resources: ['https://raw.githubusercontent.com/o/r/main/x.yaml']\n"
    with pytest.raises(BuildError, match=r"resources: remote reference .* is not supported"):
        build(files)


# --------------------------------------------------------------------------- the builder itself


@pytest.fixture
def listener() -> Iterator[list[bytes]]:
    """A loopback HTTP listener that records anything that reaches it (nothing should)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    seen: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            seen.append(connection.recv(1024))
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    seen.append(str(server.getsockname()[1]).encode())
    yield seen
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("entry", [
    "https://example.com/deploy.yaml",
    "http://127.0.0.1:{port}/deploy.yaml",
    "github.com/kubernetes-sigs/kustomize//examples/helloWorld?ref=v5.0.0",
    "git@github.com:org/repo.git",
])
def test_the_builder_runs_offline_even_without_the_checks(builder_binary: Path, listener: list[bytes],
                                                           entry: str) -> None:
    port = listener[0].decode()
    files = {"kustomization.yaml": f"resources: ['{entry.format(port=port)}']\n".encode()}
    with pytest.raises(BuildError, match=r"kustomize build failed: .*(network access is disabled"
                                         r"|no 'git' program|not a valid directory)"):
        kustomize_build(files, [""], limits=BuildLimits(), binary=builder_binary)
    assert listener[1:] == []  # nothing connected, not even to loopback


@pytest.mark.parametrize("kustomization", [
    "resources: [../../../../../../etc/hostname]",
    "resources: [/etc/hostname]",
    "configMapGenerator: [{name: x, files: [/etc/hostname]}]",
    "patches: [{path: /etc/hostname}]",
    "openapi: {path: /proc/self/environ}",
])
def test_the_builder_sees_no_file_of_this_machine(builder_binary: Path, kustomization: str) -> None:
    assert Path("/etc/hostname").exists() or Path("/proc/self/environ").exists()
    files = {"kustomization.yaml": f"{kustomization}\n".encode(), "cm.yaml": CONFIGMAP}
    with pytest.raises(BuildError, match=r"(?s)kustomize build failed: .*(doesn't exist|no such file)"):
        kustomize_build(files, [""], limits=BuildLimits(), binary=builder_binary)


EXEC_FUNCTION = b"""apiVersion: example.com/v1
kind: Generate
metadata:
  name: gen
  annotations:
    config.kubernetes.io/function: |
      exec:
        path: /bin/sh
"""


@pytest.mark.parametrize("plugin", [
    EXEC_FUNCTION,
    EXEC_FUNCTION.replace(b"exec:\n        path: /bin/sh", b"container:\n        image: busybox"),
    b"apiVersion: someteam.example.com/v1\nkind: LegacyExecPlugin\nmetadata: {name: x}\n",
])
def test_the_builder_runs_no_plugin_even_without_the_checks(builder_binary: Path, plugin: bytes) -> None:
    files = {"kustomization.yaml": b"resources: [cm.yaml]\ngenerators: [plugin.yaml]\n", "cm.yaml": CONFIGMAP,
             "plugin.yaml": plugin}
    with pytest.raises(BuildError, match="external plugins disabled"):
        kustomize_build(files, [""], limits=BuildLimits(), binary=builder_binary)


def test_kustomize_errors_are_reported_with_paths_relative_to_the_root(build: Build) -> None:
    files = under("deploy", {"kustomization.yaml": b"resources: [cm.yaml]\npatches: [{path: p.yaml}]\n",
                             "cm.yaml": CONFIGMAP, "p.yaml": b"not: a patch: at all\n"})
    with pytest.raises(BuildError, match=r"kustomize build failed: deploy: ") as caught:
        build(files)
    message = str(caught.value)
    assert "/artifact" not in message
    assert not message.startswith("kustomize build failed: Error:")


def test_a_kustomization_that_builds_nothing_is_an_error(build: Build) -> None:
    with pytest.raises(BuildError, match=r"path '\./deploy': the kustomization built no objects"):
        build({"deploy/kustomization.yaml": b"namePrefix: x-\n"})


def test_substitution_runs_after_the_build(build: Build) -> None:
    files = under("deploy", {
        "kustomization.yaml": b"resources: [deployment.yaml, cm.yaml]\nnamePrefix: ${prefix}-\n",
        "deployment.yaml": DEPLOYMENT.replace(b"replicas: 1", b"replicas: ${replicas}"),
        "cm.yaml": b"""apiVersion: v1
kind: ConfigMap
metadata:
  name: script
  annotations: {kustomize.toolkit.fluxcd.io/substitute: disabled}
data: {run.sh: 'echo ${HOME}'}
""",
    })
    objects = by_kind(build(files, variables={"prefix": "eu", "replicas": "2"}))
    assert objects["Deployment"]["metadata"]["name"] == "eu-web"
    assert objects["Deployment"]["spec"]["replicas"] == 2
    assert objects["ConfigMap"]["data"] == {"run.sh": "echo ${HOME}"}  # opted out
    with pytest.raises(BuildError, match=r"^Deployment \$\{prefix\}-web \(kustomize build: document \d\): "
                       r"variable \$\{prefix\} is not set and has no default$"):
        build(files, variables={})


# --------------------------------------------------------------------------- how it is run


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-builder"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


STAGE = {"kustomization.yaml": b"resources: []\n"}


def test_the_builder_runs_with_no_path_no_home_a_dead_proxy_and_a_memory_limit(tmp_path: Path) -> None:
    # PATH is empty, so only shell builtins work here.  Like the real builder, the script reads
    # its input first: the limit is set on the process before the input is fed.
    fake = _script(tmp_path, 'while read -r _; do :; done; echo "$@" >&2; echo "ulimit=$(ulimit -d)" >&2; '
                             'export -p >&2; exit 1\n')
    limits = BuildLimits(kustomize_memory_bytes=256 * 1024 * 1024)
    with pytest.raises(BuildError) as caught:
        build_stage(STAGE, kustomize=fake, limits=limits)
    message = str(caught.value)
    assert message.startswith("kustomize build failed: .\n")  # the root is built; no flags at all
    exported = dict(re.findall(r"^export (\w+)='?([^'\n]*)'?$", message, re.MULTILINE))
    assert exported["HTTPS_PROXY"] == exported["HTTP_PROXY"] == "http://127.0.0.1:0"
    assert exported["HOME"] == "/nonexistent"
    assert exported["PATH"] == ""
    assert exported["GOMEMLIMIT"] == str(256 * 1024 * 1024)
    assert "KUBECONFIG" not in exported
    assert not any(key.startswith(("GIT_", "GOOGLE_", "AWS_", "KUBERNETES_")) for key in exported)
    assert f"ulimit={(256 + 128) * 1024}" in message  # KiB: the heap limit plus the Go runtime's own


def test_the_builder_is_killed_at_the_timeout(tmp_path: Path) -> None:
    fake = _script(tmp_path, f"exec {shutil.which('sleep')} 30\n")
    with pytest.raises(BuildError, match=r"kustomize build timed out after 0\.5s"):
        build_stage(STAGE, kustomize=fake, limits=BuildLimits(kustomize_timeout=0.5))


def test_the_builder_output_is_read_only_up_to_the_stage_limit(tmp_path: Path) -> None:
    fake = _script(tmp_path, f"exec {shutil.which('yes')} 'apiVersion: v1'\n")
    with pytest.raises(BuildError, match=r"kustomize build printed more than 100000 bytes"):
        build_stage(STAGE, kustomize=fake, limits=BuildLimits(max_stage_bytes=100_000))


def test_a_builder_killed_by_a_signal_is_reported(tmp_path: Path) -> None:
    fake = _script(tmp_path, "kill -SEGV $$\n")
    with pytest.raises(BuildError, match=r"kustomize build was killed by signal 11"):
        build_stage(STAGE, kustomize=fake)
