"""The corpus of real layouts (tests/fixtures/layouts), built by the real builder.

Each kustomize directory builds exactly as the upstream ``kustomize build`` of the same
version builds it (with loads allowed anywhere in the repository, as Flux builds), the
features each layout relies on are checked object by object, and the render cache rebuilds a
stage exactly when a file its build reads changes.  The same layouts run end to end in
tests/e2e/test_layouts.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.api import StageSet
from stageset.build import BuildLimits, build_stage
from stageset.controller.render.cache import RenderCache, SourceRoot, render_stage

LAYOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"

KUSTOMIZE_DIRS = [
    ("multitier", "deploy/overlays/dev"), ("multitier", "deploy/overlays/staging"),
    ("multitier", "deploy/overlays/production"), ("multitier", "deploy/bases/backend"),
    ("monorepo", "infrastructure/controllers"), ("monorepo", "infrastructure/configs"),
    ("monorepo", "apps/staging"), ("monorepo", "apps/production"),
    ("plain", "addons/redis"),
    ("components", "overlays/community"), ("components", "overlays/enterprise"),
    ("components", "overlays/dev"),
]


def files_of(layout: str) -> dict[str, bytes]:
    root = LAYOUTS / layout
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


Build = Callable[..., list[dict[str, Any]]]


@pytest.fixture
def build(builder_binary: Path) -> Build:
    def run(layout: str, path: str, files: Mapping[str, bytes] | None = None) -> list[dict[str, Any]]:
        return build_stage(files or files_of(layout), path=path, kustomize=builder_binary)

    return run


def named(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize(("layout", "path"), KUSTOMIZE_DIRS, ids=[f"{lay}:{p}" for lay, p in KUSTOMIZE_DIRS])
def test_builds_equal_upstream_kustomize(build: Build, kustomize_binary: Path, layout: str,
                                         path: str) -> None:
    upstream = subprocess.run(
        [str(kustomize_binary), "build", "--load-restrictor", "LoadRestrictionsNone", path],
        cwd=LAYOUTS / layout, check=True, capture_output=True, timeout=120).stdout
    expected = [doc for doc in yaml.safe_load_all(upstream) if doc]
    assert expected, "upstream kustomize built something"
    assert build(layout, path) == expected


def test_multitier_overlays_set_namespaces_labels_images_and_generated_config(build: Build) -> None:
    for env, replicas in (("dev", 1), ("staging", 2), ("production", 3)):
        objects = build("multitier", f"./deploy/overlays/{env}")
        assert {o["metadata"]["namespace"] for o in objects} == {f"shop-{env}"}
        for obj in objects:  # the LabelTransformer of the overlay, on every object
            assert obj["metadata"]["labels"]["shop.example.com/environment"] == env
            assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "shop"
        by = named(objects)
        database = by[("StatefulSet", "database")]
        assert database["metadata"]["labels"]["app.kubernetes.io/component"] == "database"
        backend = by[("Deployment", "backend")]
        assert backend["spec"]["replicas"] == replicas
        container = backend["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == f"registry.invalid/shop/backend:1.4.0-{env}"
        config_name = container["envFrom"][0]["configMapRef"]["name"]  # rewritten to the hashed name
        assert config_name.startswith("backend-config-")
        config = by[("ConfigMap", config_name)]["data"]
        assert config["LOG_FORMAT"] == "json"  # from ../../shared/common.env
        assert "LOG_LEVEL=" in config["backend.properties"]
        frontend_volume = by[("Deployment", "frontend")]["spec"]["template"]["spec"]["volumes"][0]
        assert frontend_volume["configMap"]["name"].startswith("frontend-config-")
        secrets = [name for kind, name in by if kind == "Secret"]
        assert (len(secrets) == 1) == (env == "production")


def test_monorepo_infrastructure_and_app_overlays(build: Build) -> None:
    controllers = named(build("monorepo", "./infrastructure/controllers"))
    assert set(controllers) == {("Namespace", "widget-system"),
                                ("CustomResourceDefinition", "widgets.example.com"),
                                ("ServiceAccount", "widget-operator"), ("Deployment", "widget-operator")}
    assert controllers[("Deployment", "widget-operator")]["metadata"]["namespace"] == "widget-system"
    configs = named(build("monorepo", "./infrastructure/configs"))
    assert set(configs) == {("Namespace", "podinfo"), ("Widget", "defaults"), ("RoleBinding", "apps-team")}
    for env, replicas, message in (("staging", 1, "staging build"),
                                   ("production", 2, "hello from production")):
        apps = named(build("monorepo", f"./apps/{env}"))
        deployment = apps[("Deployment", "podinfo")]
        assert deployment["metadata"]["namespace"] == "podinfo"
        assert deployment["spec"]["replicas"] == replicas
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["env"] == [{"name": "PODINFO_UI_MESSAGE", "value": message}]
        assert container["envFrom"][0]["configMapRef"]["name"].startswith("podinfo-settings-")


def test_monorepo_cluster_stagesets_are_valid_and_name_real_paths(build: Build) -> None:
    files = files_of("monorepo")
    for cluster in ("staging", "production"):
        documents = list(yaml.safe_load_all(files[f"clusters/{cluster}/stageset.yaml"]))
        (raw,) = [d for d in documents if d["kind"] == "StageSet"]
        stageset = StageSet.model_validate(raw)
        assert [s.name for s in stageset.spec.stages] == ["infra-controllers", "infra-configs", "apps"]
        for stage in stageset.spec.stages:
            assert build("monorepo", stage.path)


def test_plain_directory_skips_readme_scripts_and_ci_files(build: Build) -> None:
    objects = build("plain", "./")
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "guestbook-settings"), ("Deployment", "guestbook"),
        ("ServiceAccount", "guestbook"), ("Secret", "guestbook-api-key"),
        ("NetworkPolicy", "guestbook-ingress"), ("Service", "guestbook"),
        ("Service", "redis"), ("Deployment", "redis"),  # addons/redis, built by kustomize as one unit
    ]
    assert all("namespace" not in o["metadata"] for o in objects)  # the StageSet's namespace applies
    redis = named(objects)[("Deployment", "redis")]
    assert redis["metadata"]["labels"] == {"app.kubernetes.io/part-of": "guestbook"}


def test_components_are_picked_per_overlay(build: Build) -> None:
    community = named(build("components", "overlays/community"))
    enterprise = named(build("components", "overlays/enterprise"))
    dev = named(build("components", "overlays/dev"))
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}
    assert community[("Deployment", "web")]["spec"]["template"]["metadata"]["annotations"] == scrape
    assert enterprise[("Deployment", "web")]["spec"]["template"]["metadata"]["annotations"] == scrape
    assert "annotations" not in dev[("Deployment", "web")]["spec"]["template"]["metadata"]
    assert ("Ingress", "web") in enterprise
    assert ("Ingress", "web") not in community
    tls = next(o for (kind, name), o in enterprise.items()
               if kind == "Secret" and name.startswith("web-tls-"))
    assert tls["type"] == "kubernetes.io/tls"
    assert enterprise[("Ingress", "web")]["spec"]["tls"][0]["secretName"] == tls["metadata"]["name"]
    settings = next(o for (kind, name), o in dev.items() if kind == "ConfigMap")
    assert settings["data"] == {"THEME": "dark", "LOG_LEVEL": "debug"}  # the debug component merged in


# --------------------------------------------------------------------------- what re-renders


STAGES = {
    "monorepo": ["infrastructure/controllers", "infrastructure/configs", "apps/staging", "apps/production"],
    "multitier": ["deploy/overlays/dev", "deploy/overlays/staging", "deploy/overlays/production"],
}


def rebuilt(cache: RenderCache, builder: Path, layout: str, commit: str,
            files: Mapping[str, bytes]) -> list[str]:
    """The stages of ``layout`` that were built (not served from the cache) at ``commit``."""
    built = []
    for path in STAGES[layout]:
        before = cache.builds
        render_stage(cache, url=f"https://git.example/{layout}.git", commit=commit, ignore=None, path=path,
                     variables=None, read_tree=lambda: SourceRoot(files=files), limits=BuildLimits(),
                     kustomize=builder)
        if cache.builds > before:
            built.append(path)
    return built


@pytest.mark.parametrize(("layout", "changed", "expected"), [
    ("monorepo", "apps/base/podinfo/deployment.yaml", ["apps/staging", "apps/production"]),
    ("monorepo", "apps/production/podinfo-patch.yaml", ["apps/production"]),
    ("monorepo", "infrastructure/configs/default-widget.yaml", ["infrastructure/configs"]),
    ("monorepo", "infrastructure/controllers/widget-operator/crd.yaml", ["infrastructure/controllers"]),
    ("monorepo", "README.md", []),
    ("monorepo", "clusters/staging/stageset.yaml", []),
    ("multitier", "deploy/bases/cache/deployment.yaml", STAGES["multitier"]),
    ("multitier", "deploy/shared/common.env", STAGES["multitier"]),
    ("multitier", "deploy/overlays/dev/config/backend.properties", ["deploy/overlays/dev"]),
    ("multitier", "deploy/overlays/production/secrets/database.env", ["deploy/overlays/production"]),
    ("multitier", "Makefile", []),
])
def test_a_change_rebuilds_exactly_the_stages_whose_build_reads_it(
        builder_binary: Path, layout: str, changed: str, expected: list[str]) -> None:
    cache = RenderCache()
    files = files_of(layout)
    assert rebuilt(cache, builder_binary, layout, "c1", files) == STAGES[layout]
    assert rebuilt(cache, builder_binary, layout, "c1", files) == []
    edited = {**files, changed: files[changed] + b"\n# edited\n"}
    assert rebuilt(cache, builder_binary, layout, "c2", edited) == expected
