"""What a build may load: the source root, checked references, and exactly the files kustomize is given."""

from __future__ import annotations

import re

import pytest

from stageset.build import BuildError, BuildLimits
from stageset.build.parse import StageBudget
from stageset.build.sourceroot import Plan, normalize_stage_path, plan_build

CM = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"


def plan(files: dict[str, bytes], path: str) -> Plan:
    limits = BuildLimits()
    return plan_build(files, path, limits=limits, budget=StageBudget(limits))[1]


def refused(kustomization: str, *, extra: dict[str, bytes] | None = None) -> str:
    files = {"apps/prod/kustomization.yaml": kustomization.encode(), **(extra or {})}
    with pytest.raises(BuildError) as caught:
        plan(files, "apps/prod")
    return str(caught.value)


LAYOUT = {
    "apps/base/kustomization.yaml": b"resources: [deploy.yaml]\n",
    "apps/base/deploy.yaml": CM,
    "apps/base/unused.txt": b"beside the kustomization: given to kustomize",
    "apps/base/sub/unreferenced.yaml": CM,
    "apps/prod/kustomization.yaml": b"""resources: [../base, ../../shared/extra.yaml]
components: [../../components/tls]
patches: [{path: ../../patches/replicas.yaml}]
configMapGenerator: [{name: app, files: [conf=../../config/app.properties], envs: [../../config/.env]}]
""",
    "components/tls/kustomization.yaml": b"kind: Component\npatches: [{path: tls.yaml}]\n",
    "components/tls/tls.yaml": CM,
    "shared/extra.yaml": CM,
    "shared/other-teams-file.yaml": CM,
    "patches/replicas.yaml": CM,
    "config/app.properties": b"a=b\n",
    "config/.env": b"A=B\n",
    "apps/staging/kustomization.yaml": b"resources: [../base]\n",
    "README.md": b"# repo",
}


def test_an_overlay_loads_bases_components_patches_and_generator_files_from_the_root() -> None:
    result = plan(LAYOUT, "./apps/prod")
    assert result.units == ("apps/prod",)
    assert result.plain == ()
    assert result.inputs == (
        "apps/base/deploy.yaml", "apps/base/kustomization.yaml", "apps/base/unused.txt",
        "apps/prod/kustomization.yaml", "components/tls/kustomization.yaml", "components/tls/tls.yaml",
        "config/.env", "config/app.properties", "patches/replicas.yaml", "shared/extra.yaml",
    )


def test_a_stage_reads_nothing_of_directories_it_does_not_name() -> None:
    inputs = set(plan(LAYOUT, "apps/staging").inputs)
    assert inputs == {"apps/base/deploy.yaml", "apps/base/kustomization.yaml", "apps/base/unused.txt",
                      "apps/staging/kustomization.yaml"}


@pytest.mark.parametrize(("kustomization", "message"), [
    ("resources: [../../../outside]", r"^apps/prod/kustomization\.yaml: resources: '\.\./\.\./\.\./outside' "
                                      r"escapes the artifact root$"),
    ("resources: [a/../../../../x]", r"escapes the artifact root"),
    ("components: [/abs]", r"components: absolute path '/abs' escapes the artifact root"),
    ("configMapGenerator: [{name: c, files: [key=../../../secret.txt]}]",
     r"configMapGenerator\[\]\.files: '\.\./\.\./\.\./secret\.txt' escapes"),
    ("configMapGenerator: [{name: c, env: ../../../.env}]", r"configMapGenerator\[\]\.env: .* escapes"),
    ("patchesStrategicMerge: [/etc/kubernetes/admin.conf]", r"absolute path .* escapes the artifact root"),
    ("transformers: [../../../t.yaml]", r"transformers: .* escapes the artifact root"),
    ("openapi: {path: /var/run/secrets/kubernetes.io/serviceaccount/token}", r"openapi\.path: absolute path"),
])
def test_escapes_are_refused_naming_the_file_and_entry(kustomization: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        plan({"apps/prod/kustomization.yaml": kustomization.encode()}, "apps/prod")


@pytest.mark.parametrize(("kustomization", "message"), [
    ("resources: [../base]", r"resources: '\.\./base' not found in artifact \(looked for 'apps/base'\)"),
    ("patches: [{path: missing.yaml}]", r"patches\[\]\.path: 'missing\.yaml' not found in artifact"),
    ("resources: [empty-dir-less]", r"not found in artifact"),
])
def test_missing_references_are_not_found_in_artifact(kustomization: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        plan({"apps/prod/kustomization.yaml": kustomization.encode()}, "apps/prod")


def test_a_referenced_directory_needs_a_kustomization() -> None:
    files = {"apps/prod/kustomization.yaml": b"resources: [../plain]\n", "apps/plain/cm.yaml": CM}
    with pytest.raises(BuildError, match=r"directory 'apps/plain' has no kustomization\.yaml"):
        plan(files, "apps/prod")


@pytest.mark.parametrize("kustomization", [
    "resources: [https://example.com/a.yaml]",
    "resources: ['git::https://example.com/repo.git']",
    "bases: [github.com/org/repo]",
    "components: ['GitHub.com:org/repo']",
    "resources: ['deploy@host.example.com:org/repo']",
    "resources: ['file:///etc']",
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
    assert "remote reference" in refused(kustomization)
    assert "is not supported" in refused(kustomization)


def test_urls_in_labels_literals_and_inline_patches_are_fine() -> None:
    files = {"kustomization.yaml": b"""resources: [cm.yaml]
commonAnnotations: {docs: https://example.com/docs}
labels: [{pairs: {source: https://example.com}}]
configMapGenerator: [{name: c, literals: ['url=https://example.com'], files: [k=conf.txt],
                      options: {annotations: {link: 'https://example.com'}}}]
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
""", "cm.yaml": CM, "conf.txt": b"x"}
    assert plan(files, ".").inputs == ("cm.yaml", "conf.txt", "kustomization.yaml")


@pytest.mark.parametrize(("kustomization", "message"), [
    ("helmCharts: [{name: x, repo: 'oci://r'}]", r"helmCharts: Helm charts are not supported"),
    ("helmChartInflationGenerator: [{chartName: x}]", r"helmChartInflationGenerator: Helm"),
    ("helmGlobals: {chartHome: charts}", r"helmGlobals: Helm"),
])
def test_helm_is_refused(kustomization: str, message: str) -> None:
    assert re.search(message, refused(kustomization))


EXEC = b"""apiVersion: example.com/v1
kind: Generate
metadata:
  name: gen
  annotations:
    config.kubernetes.io/function: |
      exec: {path: /bin/sh}
"""


def test_krm_functions_are_refused_in_files_directories_and_inline() -> None:
    message = refused("generators: [gen.yaml]", extra={"apps/prod/gen.yaml": EXEC})
    assert message == "apps/prod/gen.yaml: Generate: exec and container KRM functions are not supported"
    inline = "\n".join("  " + line for line in EXEC.decode().splitlines())
    assert "exec and container KRM functions" in refused(f"transformers:\n- |\n{inline}\n")
    # Through a generator directory: the configurations it builds are checked too.
    message = refused("generators: [../gen]", extra={"apps/gen/kustomization.yaml": b"resources: [f.yaml]\n",
                                                     "apps/gen/f.yaml": EXEC})
    assert "exec and container KRM functions" in message
    helm = b"apiVersion: builtin\nkind: HelmChartInflationGenerator\nmetadata: {name: h}\n"
    message = refused("generators: [h.yaml]", extra={"apps/prod/h.yaml": helm})
    assert "Helm charts are not supported" in message


def test_builtin_generator_configurations_bring_their_files() -> None:
    generator = b"""apiVersion: builtin
kind: ConfigMapGenerator
metadata: {name: settings}
files: [../../config/app.properties]
"""
    patch = b"apiVersion: builtin\nkind: PatchTransformer\nmetadata: {name: p}\npath: ../../patches/r.yaml\n"
    files = {"apps/prod/kustomization.yaml": b"generators: [gen.yaml]\ntransformers: [patch.yaml]\n",
             "apps/prod/gen.yaml": generator, "apps/prod/patch.yaml": patch,
             "config/app.properties": b"a=1\n", "patches/r.yaml": CM}
    assert set(plan(files, "apps/prod").inputs) >= {"config/app.properties", "patches/r.yaml"}
    files["apps/prod/gen.yaml"] = generator.replace(b"../../config", b"../../../../etc")
    with pytest.raises(BuildError, match=r"apps/prod/gen\.yaml: ConfigMapGenerator\.files: .* escapes"):
        plan(files, "apps/prod")


def test_a_generator_directory_of_files_is_read_whole() -> None:
    files = {"kustomization.yaml": b"configMapGenerator: [{name: c, files: [conf]}]\n",
             "conf/a.properties": b"a", "conf/b.properties": b"b", "conf/deeper/c": b"c"}
    assert plan(files, ".").inputs == ("conf/a.properties", "conf/b.properties", "kustomization.yaml")


def test_a_path_without_a_kustomization_makes_units_of_subdirectories_with_one() -> None:
    files = {
        "deploy/a.yaml": CM, "deploy/README.md": b"x", "deploy/scripts/run.sh": b"#!/bin/sh",
        "deploy/nested/b.yml": CM, "deploy/nested/c.json": b"{}",
        "deploy/app/kustomization.yaml": b"resources: [cm.yaml]\n", "deploy/app/cm.yaml": CM,
        "deploy/app/inner/kustomization.yaml": b"resources: []\n",  # inside a unit: not a unit of its own
        "deploy/z/kustomization.yml": b"resources: [../../shared]\n",
        "shared/kustomization.yaml": b"resources: [cm.yaml]\n", "shared/cm.yaml": CM,
    }
    result = plan(files, "./deploy")
    assert result.units == ("deploy/app", "deploy/z")
    assert result.plain == ("deploy/a.yaml", "deploy/nested/b.yml", "deploy/nested/c.json")
    assert result.inputs == ("deploy/app/cm.yaml", "deploy/app/kustomization.yaml",
                             "deploy/z/kustomization.yml", "shared/cm.yaml", "shared/kustomization.yaml")


def test_stage_paths_are_normalized() -> None:
    assert normalize_stage_path("./") == ""
    assert normalize_stage_path("") == ""
    assert normalize_stage_path("./apps//prod/") == "apps/prod"
    with pytest.raises(BuildError, match="escapes the artifact root"):
        normalize_stage_path("apps/../../x")
