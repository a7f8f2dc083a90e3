"""Stage ``patches`` by the real builder: kustomize semantics on plain paths and overlays alike.

Patches run after the build and before substitution (Flux's order), are applied one by one by
kustomize itself (``stageset-kustomize --patch``), and a failure names the patch's index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stageset.build import BuildError, build_stage
from stageset.build.kustomize import kustomize_patch
from stageset.build.limits import BuildLimits

DEPLOYMENT = b"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: prod
  labels: {app: web, tier: front}
  annotations: {team: payments}
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
WORKER = DEPLOYMENT.replace(b"name: web\n  namespace", b"name: worker\n  namespace").replace(
    b"tier: front", b"tier: back").replace(b"team: payments", b"team: billing")
CONFIG = b"""apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: prod}
data:
  port: "${PORT}"
  replicas: ${REPLICAS}
"""
SMP_REPLICAS = ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: prod}\n"
                "spec: {replicas: 3}\n")


def by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects}


def test_a_strategic_merge_patch_applies_to_plain_files_by_its_own_name(builder_binary: Path) -> None:
    files = {"app/web.yaml": DEPLOYMENT, "app/worker.yaml": WORKER}
    built = by_name(build_stage(files, path="app", kustomize=builder_binary,
                                patches=[{"patch": SMP_REPLICAS}]))
    assert built["web"]["spec"]["replicas"] == 3
    assert built["worker"]["spec"]["replicas"] == 1


def test_json6902_with_a_target_selects_by_labels_annotations_kind_and_regex(builder_binary: Path) -> None:
    files = {"app/web.yaml": DEPLOYMENT, "app/worker.yaml": WORKER}
    add_label = json.dumps([{"op": "add", "path": "/metadata/labels/patched", "value": "yes"}])
    cases = [
        ({"labelSelector": "tier=back"}, {"worker"}),
        ({"annotationSelector": "team=payments"}, {"web"}),
        ({"group": "apps", "version": "v1", "kind": "Deployment", "name": "w.*"}, {"web", "worker"}),
        ({"kind": "Deployment", "name": "web", "namespace": "prod"}, {"web"}),
        ({"kind": "Deployment", "namespace": "staging"}, set()),
    ]
    for target, expected in cases:
        built = build_stage(files, path="app", kustomize=builder_binary,
                            patches=[{"patch": add_label, "target": target}])
        patched = {o["metadata"]["name"] for o in built if o["metadata"]["labels"].get("patched") == "yes"}
        assert patched == expected, target


def test_patches_apply_to_a_kustomize_overlay_after_its_build(builder_binary: Path) -> None:
    files = {
        "base/web.yaml": DEPLOYMENT,
        "base/kustomization.yaml": b"resources: [web.yaml]\n",
        "overlay/kustomization.yaml": b"resources: [../base]\nnamePrefix: eu-\n",
    }
    # The overlay's namePrefix ran first: the patch names the built object.
    smp = SMP_REPLICAS.replace("name: web", "name: eu-web")
    built = build_stage(files, path="overlay", kustomize=builder_binary, patches=[{"patch": smp}])
    assert [(o["metadata"]["name"], o["spec"]["replicas"]) for o in built] == [("eu-web", 3)]


def test_patches_run_in_order_and_before_substitution_keeping_quotes(builder_binary: Path) -> None:
    files = {"app/config.yaml": CONFIG}
    patches = [
        {"patch": json.dumps([{"op": "add", "path": "/data/region", "value": "${REGION}"}]),
         "target": {"kind": "ConfigMap"}},
        {"patch": json.dumps([{"op": "replace", "path": "/data/region", "value": "eu-${REGION}"}]),
         "target": {"kind": "ConfigMap"}},
    ]
    built = build_stage(files, path="app", kustomize=builder_binary, patches=patches,
                        variables={"PORT": "8080", "REPLICAS": "3", "REGION": "west"})
    data = built[0]["data"]
    # A quoted scalar stays a string after the round trip through kustomize; an unquoted one is
    # typed by its value, exactly as without patches.
    assert data == {"port": "8080", "replicas": 3, "region": "eu-west"}


def test_a_failing_patch_is_named_by_its_index(builder_binary: Path) -> None:
    files = {"app/web.yaml": DEPLOYMENT}
    ghost = SMP_REPLICAS.replace("name: web", "name: ghost")
    failing_test = json.dumps([{"op": "test", "path": "/spec/replicas", "value": 7}])
    with pytest.raises(BuildError, match=r"^patches\[1\]: .*ghost"):
        build_stage(files, path="app", kustomize=builder_binary,
                    patches=[{"patch": SMP_REPLICAS}, {"patch": ghost}])
    with pytest.raises(BuildError, match=r"^patches\[0\]: .*test"):
        build_stage(files, path="app", kustomize=builder_binary,
                    patches=[{"patch": failing_test, "target": {"kind": "Deployment"}}])
    with pytest.raises(BuildError, match=r"^patches\[0\]: "):
        build_stage(files, path="app", kustomize=builder_binary,
                    patches=[{"patch": "{not yaml: [", "target": {"kind": "Deployment"}}])


def test_a_patch_deleting_every_object_is_an_error_not_an_empty_stage(builder_binary: Path) -> None:
    delete = "$patch: delete\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: prod}\n"
    with pytest.raises(BuildError, match="patches left no object"):
        build_stage({"app/web.yaml": DEPLOYMENT}, path="app", kustomize=builder_binary,
                    patches=[{"patch": delete}])


def test_a_patch_renaming_onto_another_object_is_refused(builder_binary: Path) -> None:
    rename = json.dumps([{"op": "replace", "path": "/metadata/name", "value": "web"}])
    with pytest.raises(BuildError, match=r"^patches\[0\]: .*already registered id: Deployment.v1.apps/web"):
        build_stage({"app/web.yaml": DEPLOYMENT, "app/worker.yaml": WORKER}, path="app",
                    kustomize=builder_binary,
                    patches=[{"patch": rename, "target": {"kind": "Deployment", "name": "worker"}}])


def test_the_patch_step_keeps_object_order_and_bounds_its_output(builder_binary: Path) -> None:
    stream = "".join(f"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\n" for i in (3, 1, 2))
    add = [{"patch": json.dumps([{"op": "add", "path": "/data", "value": {"k": "v"}}]),
            "target": {"kind": "ConfigMap"}}]
    out = kustomize_patch(stream, add, limits=BuildLimits(), binary=builder_binary)
    assert [line for line in out.splitlines() if line.startswith("  name:")] == \
        ["  name: c3", "  name: c1", "  name: c2"]
    tiny = BuildLimits(max_stage_bytes=64)
    with pytest.raises(BuildError, match="more than 64 bytes"):
        kustomize_patch(stream, add, limits=tiny, binary=builder_binary)
