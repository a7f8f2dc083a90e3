"""Finding the kustomize binary, and the static checks on kustomization files (no binary run here)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stageset.build import BuildError, KustomizeNotFoundError, locate_kustomize
from stageset.build import kustomize as kz


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STAGESET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.delenv(kz.ENV_OVERRIDE, raising=False)
    return tmp_path


def test_override_wins_and_must_exist(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    executable(kz.cached_binary())
    override = executable(isolated / "mine" / "kustomize")
    monkeypatch.setenv(kz.ENV_OVERRIDE, str(override))
    assert locate_kustomize() == override
    assert kz.ensure_kustomize(log=False) == override
    monkeypatch.setenv(kz.ENV_OVERRIDE, str(isolated / "nope"))
    with pytest.raises(KustomizeNotFoundError, match=r"STAGESET_KUSTOMIZE=.*nope is not an executable"):
        locate_kustomize()


def test_cached_build_then_path(isolated: Path) -> None:
    on_path = executable(isolated / "path" / "kustomize")
    assert locate_kustomize() == on_path
    cached = executable(kz.cached_binary())
    assert cached == isolated / "cache" / "tools" / f"kustomize-{kz.KUSTOMIZE_VERSION}" / "kustomize"
    assert locate_kustomize() == cached


def test_missing_binary_says_how_to_get_one(isolated: Path) -> None:
    with pytest.raises(KustomizeNotFoundError, match=r"python -m stageset\.build"):
        locate_kustomize()
    assert issubclass(KustomizeNotFoundError, BuildError)


def test_wrapper_module_pins_the_version() -> None:
    go_mod = (kz.WRAPPER / "go.mod").read_text()
    assert f"require {kz.KUSTOMIZE_MODULE} {kz.KUSTOMIZE_VERSION}\n" in go_mod
    assert f"{kz.KUSTOMIZE_MODULE} {kz.KUSTOMIZE_VERSION}/go.mod" in (kz.WRAPPER / "go.sum").read_text()


@pytest.mark.parametrize("kustomization", [
    "resources: [https://example.com/a.yaml]",
    "resources: ['git::https://example.com/repo.git']",
    "bases: [github.com/org/repo]",
    "components: ['GitHub.com:org/repo']",
    "resources: ['deploy@host.example.com:org/repo']",
    "crds: [http://example.com/crd.yaml]",
    "openapi: {path: https://example.com/schema.json}",
    "patches: [{path: 'https://example.com/p.yaml'}]",
    "patchesJson6902: [{path: 'https://example.com/p.yaml', target: {kind: X, name: y}}]",
    "replacements: [{path: 'https://example.com/r.yaml'}]",
    "secretGenerator: [{name: s, envs: ['https://example.com/.env']}]",
    "generators: ['https://example.com/gen.yaml']",
    "someFutureField: {deep: [{where: 'https://example.com/x'}]}",
])
def test_remote_references_are_refused(kustomization: str) -> None:
    with pytest.raises(BuildError, match=r"remote reference .* is not supported"):
        kz.check_kustomizations({"kustomization.yaml": kustomization.encode()})


@pytest.mark.parametrize("kustomization", [
    "resources: [../x]",
    "resources: [a/../../x]",
    "components: [/abs]",
    "configMapGenerator: [{name: c, files: [key=../secret.txt]}]",
    "configMapGenerator: [{name: c, env: ../.env}]",
    "patchesStrategicMerge: [../p.yaml]",
    "transformers: [../t.yaml]",
])
def test_paths_leaving_the_tree_are_refused(kustomization: str) -> None:
    with pytest.raises(BuildError, match=r"(points outside the stage path|is not allowed)"):
        kz.check_kustomizations({"kustomization.yaml": kustomization.encode()})


def test_local_paths_urls_in_labels_and_inline_patches_are_fine() -> None:
    kz.check_kustomizations({
        "kustomization.yaml": b"""resources: [base, ./app.yaml, sub/../app.yaml]
commonAnnotations: {docs: https://example.com/docs}
labels: [{pairs: {source: https://example.com}}]
configMapGenerator: [{name: c, literals: ['url=https://example.com'], files: [k=conf.txt]}]
patches:
- patch: |-
    - op: add
      path: /metadata/annotations/link
      value: https://example.com
  target: {kind: Deployment}
patchesStrategicMerge:
- |-
  apiVersion: v1
  kind: ConfigMap
  metadata: {name: c, annotations: {url: "https://example.com"}}
""",
        "overlays/prod/kustomization.yaml": b"resources: [../../base]\n",
    })


def test_helm_is_refused() -> None:
    with pytest.raises(BuildError, match="helmChartInflationGenerator: Helm charts are not supported"):
        kz.check_kustomizations({"Kustomization": b"helmChartInflationGenerator: [{chartName: x}]\n"})


def test_invalid_kustomization_yaml_names_the_file() -> None:
    with pytest.raises(BuildError, match=r"^base/kustomization\.yml: not valid YAML"):
        kz.check_kustomizations({"kustomization.yaml": b"resources: [base]\n",
                                 "base/kustomization.yml": b"resources: [unclosed\n"})


@pytest.mark.parametrize("name", ["/abs.yaml", "../up.yaml", "a//b.yaml", "a/./b.yaml", "a\\b.yaml"])
def test_unsafe_file_names_are_never_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(BuildError, match="refusing unsafe file name"):
        kz._write_tree({name: b"x"}, tmp_path)


def test_a_file_and_a_directory_of_the_same_name_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="cannot write"):
        kz._write_tree({"a": b"x", "a/b.yaml": b"y"}, tmp_path)
