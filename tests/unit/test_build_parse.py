"""Limits enforced while parsing: depth, nodes, aliases, documents, bytes, objects (table-driven).

Hostile inputs at full size, each in its own process with memory figures, are in
tests/build/test_hostile_inputs.py; here the limits are shrunk so every case is cheap.
"""

from __future__ import annotations

import dataclasses

import pytest

from stageset.build import BuildError, BuildLimits, build_stage
from stageset.build.parse import StageBudget, load_json, load_yaml

SMALL = BuildLimits(max_depth=5, max_document_nodes=50, max_aliases=3, max_documents_per_file=4,
                    max_file_bytes=2000, max_stage_nodes=200, max_stage_objects=5, max_stage_bytes=5000)
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c%d}\n"


def load(text: str, limits: BuildLimits = SMALL) -> list[object]:
    return [value for _, value in load_yaml(text, where="f.yaml", limits=limits, budget=StageBudget(limits))]


@pytest.mark.parametrize(("text", "message"), [
    ("[[[[[[1]]]]]]", r"f\.yaml: document 1 is nested more than 5 levels deep"),
    ("a: {b: {c: {d: {e: {f: 1}}}}}", r"nested more than 5 levels deep"),
    ("a:\n b:\n  c:\n   d:\n    e:\n     f: 1\n", r"nested more than 5 levels deep"),
    ("[" + ",".join("1" * 60) + "]", r"f\.yaml: document 1 has more than 50 YAML nodes"),
    ("a: &a 1\nb: *a\nc: *a\nd: *a\ne: *a\n", r"more than 3 YAML aliases"),
    ("---\na: 1\n" * 5, r"more than 4 YAML documents"),
    ("a: [unclosed", r"f\.yaml: not valid YAML"),
])
def test_yaml_limits_and_errors(text: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        load(text)


def test_within_the_limits_documents_load_as_values() -> None:
    assert load("[[[[[1]]]]]") == [[[[[[1]]]]]]
    assert load("a: &a {x: 1}\nb: *a\n") == [{"a": {"x": 1}, "b": {"x": 1}}]
    assert load("---\n---\na: 2024-01-01\n") == [None, {"a": "2024-01-01"}]


def test_alias_expansion_is_counted_after_composing() -> None:
    limits = dataclasses.replace(SMALL, max_aliases=100)
    text = "a: &a [1, 2, 3, 4, 5, 6, 7, 8]\nb: &b [*a, *a, *a, *a, *a]\nc: [*b, *b]\n"
    with pytest.raises(BuildError, match=r"expands to more than 50 YAML nodes through aliases"):
        load(text, limits)


def test_the_stage_budget_adds_up_across_files() -> None:
    budget = StageBudget(SMALL)
    for _ in range(4):
        load_yaml("[" + ",".join("1" * 40) + "]", where="f.yaml", limits=SMALL, budget=budget)
    with pytest.raises(BuildError, match=r"g\.yaml: the stage's manifests hold more than 200 YAML/JSON"):
        load_yaml("[" + ",".join("1" * 40) + "]", where="g.yaml", limits=SMALL, budget=budget)


@pytest.mark.parametrize(("text", "message"), [
    ("[[[[[[1]]]]]]", r"j\.json: nested more than 5 levels deep"),
    ('{"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}', r"nested more than 5 levels deep"),
    ("[" + ",".join("1" * 60) + "]", r"more than 50 JSON values"),
    ('{"a": ', r"j\.json: not valid JSON"),
    ('"' + '\\"' * 100, r"not valid JSON"),  # an unterminated string is scanned once, not once per quote
])
def test_json_limits_and_errors(text: str, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        load_json(text, where="j.json", limits=SMALL, budget=StageBudget(SMALL))


def test_json_brackets_and_commas_inside_strings_are_not_structure() -> None:
    text = '{"a": "[[[[[[[[,,,,,,,:::::]]]]", "b": ["x\\"[[[[[["]}'
    assert load_json(text, where="j.json", limits=SMALL, budget=StageBudget(SMALL)) == \
        {"a": "[[[[[[[[,,,,,,,:::::]]]]", "b": ['x"[[[[[[']}


def test_stage_limits_on_bytes_files_and_objects() -> None:
    many = {f"f{i}.yaml": (CM % i).encode() for i in range(6)}
    with pytest.raises(BuildError, match=r"the stage renders more than 5 objects"):
        build_stage(many, limits=SMALL)
    with pytest.raises(BuildError, match=r"big\.yaml: 2001 bytes is more than the limit of 2000 bytes per"):
        build_stage({"big.yaml": (CM % 0).encode() + b"#" * (2001 - len(CM % 0))}, limits=SMALL)
    spread = {f"f{i}.yaml": (CM % i).encode() + b"#" * 1500 for i in range(4)}
    with pytest.raises(BuildError, match=r"the stage's manifest files add up to more than 5000 bytes"):
        build_stage(spread, limits=SMALL)


def test_kustomizations_are_parsed_under_the_same_limits() -> None:
    deep = "resources: " + "[" * 6 + "]" * 6 + "\n"
    with pytest.raises(BuildError, match=r"kustomization\.yaml: document 1 is nested more than 5 levels"):
        build_stage({"kustomization.yaml": deep.encode()}, limits=SMALL)


def test_limits_are_overridden_by_name_with_units() -> None:
    limits = BuildLimits.with_overrides(["max_stage_objects=50000", "max-stage-bytes=64Mi",
                                         "kustomize_timeout=2m", "kustomize_memory_bytes=1Gi"])
    assert limits.max_stage_objects == 50_000
    assert limits.max_stage_bytes == 64 * 1024 * 1024
    assert limits.kustomize_timeout == 120.0
    assert limits.kustomize_memory_bytes == 1024 ** 3
    assert limits.max_depth == BuildLimits().max_depth
    for bad in ("nope=1", "max_depth", "max_depth=deep", "max_file_bytes=1Xi", "max_file_bytes=500m",
                "max_depth=0"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            BuildLimits.with_overrides([bad])
