"""The API models and the CRDs generated from them, without a cluster.

The same invalid-spec table the admission tests send to a real apiserver runs here
against the models, so the reconciler's re-check refuses what admission refuses.
"""

from __future__ import annotations

import datetime
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from stageset.api import (
    API_VERSION,
    GROUP,
    VERSION,
    GitRepository,
    KubeConfigRef,
    SecretKeyRef,
    Stage,
    StageSet,
    StageSetStatus,
    duration_seconds,
)
from stageset.api import crd as crdgen
from stageset.api.common import DURATION_PATTERN
from tests.api.specs import INVALID, VALID, Invalid, design_stagesets, stage, stageset

MODELS: dict[str, type[StageSet] | type[GitRepository]] = {
    "StageSet": StageSet, "GitRepository": GitRepository}


# --- the DESIGN.md StageSets --------------------------------------------------------------

def test_design_stagesets_parse_verbatim() -> None:
    payments, platform, remote = (StageSet.model_validate(raw) for raw in design_stagesets())

    assert payments.api_version == API_VERSION == f"{GROUP}/{VERSION}"
    assert payments.metadata == {"name": "payments", "namespace": "payments"}
    assert payments.spec.service_account_name == "payments-deployer"
    assert payments.spec.kube_config is None
    (app,) = payments.spec.stages
    # No kind: the controller's --default-source-kind decides (our GitRepository by default).
    assert (app.name, app.source_ref.name, app.source_ref.kind) == ("app", "payments-app", None)
    assert platform.spec.service_account_name is None
    assert remote.spec.kube_config == KubeConfigRef(
        secret_ref=SecretKeyRef(name="prod-eu-kubeconfig", key="value"))
    assert payments.status is None


def test_defaults() -> None:
    spec = StageSet.model_validate(design_stagesets()[0]).spec
    # interval: the controller's --default-interval; timeout: the reference's 15m.
    assert (spec.interval, spec.retry_interval, spec.timeout, spec.suspend) == (None, None, "15m",
                                                                                False)
    assert spec.interval_seconds(600.0) == 600.0
    assert spec.retry_seconds(120.0) == 120.0
    assert spec.depends_on == []
    (app,) = spec.stages
    assert app.path == "./"
    assert app.prune is True
    assert app.force is False
    assert app.timeout is None
    assert app.service_account_name is None
    assert app.post_build is None
    assert app.ready_checks is None
    assert app.source_ref.api_version is None
    assert app.source_ref.namespace is None

    repo = GitRepository.model_validate(VALID["git-https-branch"]).spec
    assert (repo.interval, repo.timeout, repo.suspend) == ("1m", "60s", False)
    parsed = Stage.model_validate(stage("x", readyChecks={}, postBuild={}))
    assert parsed.ready_checks is not None
    assert parsed.ready_checks.wait is True
    assert parsed.post_build is not None
    assert parsed.post_build.substitute == {}


def test_depends_on_absent_and_empty_are_different() -> None:
    spec = StageSet.model_validate(stageset({"stages": [
        stage("first"), stage("implicit"), stage("none", dependsOn=[]),
        stage("explicit", dependsOn=["first"])]})).spec
    assert [s.depends_on for s in spec.stages] == [None, None, [], ["first"]]

    dumped = [s.model_dump(by_alias=True, exclude_none=True) for s in spec.stages]
    assert "dependsOn" not in dumped[1]
    assert dumped[2]["dependsOn"] == []


def test_round_trip_by_alias() -> None:
    for body in [*design_stagesets(), *VALID.values()]:
        model = MODELS[body["kind"]]
        parsed = model.model_validate(body)
        dumped = parsed.model_dump(by_alias=True, exclude_none=True)
        assert dumped["apiVersion"] == "stages.metio.wtf/v1"
        assert "api_version" not in dumped
        assert model.model_validate(dumped) == parsed


def test_python_names_are_accepted_too() -> None:
    by_name = Stage(name="app", source_ref={"name": "repo"}, depends_on=[])  # type: ignore[arg-type]
    assert by_name == Stage.model_validate({"name": "app", "sourceRef": {"name": "repo"},
                                            "dependsOn": []})


def test_unknown_spec_fields_are_errors_but_unknown_status_fields_are_not() -> None:
    with pytest.raises(ValidationError, match="dependOn"):
        StageSet.model_validate(stageset({"stages": [stage("app", dependOn=[])]}))
    status = StageSetStatus.model_validate({"observedGeneration": 2, "fromTheFuture": True})
    assert status.observed_generation == 2


def test_wrong_api_version_or_kind_is_refused() -> None:
    for patch in ({"apiVersion": "stages.metio.wtf/v2"}, {"kind": "GitRepository"}):
        with pytest.raises(ValidationError):
            StageSet.model_validate(stageset({"stages": [stage("app")]}) | patch)


def _path(loc: tuple[str | int, ...]) -> str:
    """A pydantic error location in the apiserver's spelling: spec.stages[0].name."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


@pytest.mark.parametrize("case", INVALID, ids=[case.id for case in INVALID])
def test_models_refuse_what_admission_refuses(case: Invalid) -> None:
    with pytest.raises(ValidationError) as caught:
        MODELS[case.kind].model_validate(case.fresh())
    # The models point at the apiserver's field or at an object containing it.
    locations = [_path(error["loc"]) for error in caught.value.errors()]
    assert any(case.field == loc or case.field.startswith((f"{loc}.", f"{loc}["))
               for loc in locations), (case.field, locations)


@pytest.mark.parametrize("name", list(VALID))
def test_models_accept_valid_specs(name: str) -> None:
    MODELS[VALID[name]["kind"]].model_validate(VALID[name])


def test_model_messages_match_the_crd_wording() -> None:
    cases = {case.id: case for case in INVALID}
    for case_id in ("duplicate-stage-names", "depends-on-itself", "git-branch-and-tag",
                    "git-commit-with-tag", "git-url-ftp"):
        case = cases[case_id]
        with pytest.raises(ValidationError, match=re.escape(case.message)):
            MODELS[case.kind].model_validate(case.fresh())


# --- durations (durationpy, behind the schema's pattern) ---------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("1m30s", datetime.timedelta(minutes=1, seconds=30)),
    ("500ms", datetime.timedelta(milliseconds=500)),
    ("1h", datetime.timedelta(hours=1)),
    ("10m", datetime.timedelta(minutes=10)),
    ("60s", datetime.timedelta(seconds=60)),
    ("1.5h", datetime.timedelta(minutes=90)),
    ("2h45m30.5s", datetime.timedelta(hours=2, minutes=45, seconds=30, milliseconds=500)),
    ("1h1h", datetime.timedelta(hours=2)),
    ("300us", datetime.timedelta(microseconds=300)),
    ("7µs", datetime.timedelta(microseconds=7)),
    ("7μs", datetime.timedelta(microseconds=7)),
    ("0", datetime.timedelta(0)),
    ("0s", datetime.timedelta(0)),
])
def test_duration_seconds(text: str, expected: datetime.timedelta) -> None:
    assert duration_seconds(text) == pytest.approx(expected.total_seconds())


@pytest.mark.parametrize("text", ["", "1", "1d", "m", ".s", "1h 30m", " 1s", "--1s", "1S", "-1m",
                                  "-", "1e3s", "1w"])
def test_durations_the_schema_refuses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        duration_seconds(text)


@pytest.mark.parametrize("text", ["10m", "1h30m", "2.5m", "500ms", "1µs", "1ns"])
def test_schema_durations_all_parse(text: str) -> None:
    assert re.fullmatch(DURATION_PATTERN, text)
    assert duration_seconds(text) > 0 or text == "1ns"


# --- CRD generation -----------------------------------------------------------------------

def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path, through properties, items and map values."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _schema(kind: str) -> dict[str, Any]:
    (match,) = [k for k in crdgen.KINDS if k.kind == kind]
    crd = crdgen.custom_resource_definition(match)
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _contains_key(value: Any, key: str) -> bool:
    if isinstance(value, dict):
        return key in value or any(_contains_key(v, key) for v in value.values())
    if isinstance(value, list):
        return any(_contains_key(v, key) for v in value)
    return False


@pytest.mark.parametrize("kind", ["StageSet", "GitRepository"])
def test_crd_schema_is_structural(kind: str) -> None:
    schema = _schema(kind)
    for key in ("$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "const", "nullable"):
        assert not _contains_key(schema, key), key
    for path, node in _nodes(schema):
        # Only "any JSON" (a JSON 6902 value) may leave the type open, as structural schemas allow.
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields") is True, \
            f"{kind}{path} has no type"
        assert node.get("default", "unset") is not None, f"{kind}{path} defaults to null"
        assert node.get("additionalProperties") is not False, path
        for rule in node.get("x-kubernetes-validations", []):
            assert rule.get("message"), f"{kind}{path}: CEL rule without message: {rule}"
    props = schema["properties"]
    assert props["metadata"] == {"type": "object"}
    assert props["apiVersion"]["type"] == props["kind"]["type"] == "string"
    assert schema["required"] == ["spec"]
    assert {"conditions", "observedGeneration"} <= set(props["status"]["properties"])


def test_stage_depends_on_has_no_default_but_other_fields_do() -> None:
    spec = _schema("StageSet")["properties"]["spec"]["properties"]
    stage_props = spec["stages"]["items"]["properties"]
    assert "default" not in stage_props["dependsOn"]
    assert stage_props["path"]["default"] == "./"
    assert stage_props["prune"]["default"] is True
    # Never defaulted by the apiserver: what an omitted kind means is the controller's switch.
    assert "default" not in stage_props["sourceRef"]["properties"]["kind"]
    secret = spec["kubeConfig"]["properties"]["secretRef"]
    assert secret["required"] == ["name"]
    assert secret["properties"]["key"]["default"] == "value"
    assert "default" not in spec["interval"]  # the controller's --default-interval
    assert spec["timeout"]["default"] == "15m"


def test_rules_sit_next_to_the_fields_they_guard() -> None:
    spec = _schema("StageSet")["properties"]["spec"]["properties"]
    stage_rules = [r["rule"] for r in spec["stages"]["x-kubernetes-validations"]]
    assert any("exists_one" in rule for rule in stage_rules)  # unique names
    assert any("dependsOn" in rule for rule in stage_rules)  # known dependencies
    assert spec["stages"]["items"]["x-kubernetes-validations"][0]["fieldPath"] == ".dependsOn"
    assert spec["stages"]["items"]["properties"]["dependsOn"]["x-kubernetes-list-type"] == "set"
    git = _schema("GitRepository")["properties"]["spec"]["properties"]
    assert len(git["ref"]["x-kubernetes-validations"]) == 2
    assert "matches" in git["url"]["x-kubernetes-validations"][0]["rule"]
    conditions = _schema("GitRepository")["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


@pytest.mark.parametrize("kind", crdgen.KINDS, ids=[k.kind for k in crdgen.KINDS])
def test_crd_envelope(kind: crdgen.Kind) -> None:
    crd = crdgen.custom_resource_definition(kind)
    assert crd["metadata"]["name"] == f"{kind.plural}.stages.metio.wtf"
    spec = crd["spec"]
    scope = "Cluster" if kind.kind == "FleetRollout" else "Namespaced"
    assert (spec["group"], spec["scope"]) == ("stages.metio.wtf", scope)
    assert spec["names"]["shortNames"] == list(kind.short_names)
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = ["Ready", "Status", "Revision", "Suspended", "Age"]
    if kind.kind == "GitRepository":
        columns = ["URL", *columns]
    if kind.kind == "StageTarget":
        # The platform's kind: not in the tenants' category (their `kubectl get stages` is refused it).
        columns = ["Ready", "Status", "Server", "Version", "Age"]
    # The platform's notification kinds have no status (nothing reconciles them on their own).
    if kind.kind == "NotificationProvider":
        columns = ["Type", "Suspended", "Age"]
    if kind.kind == "NotificationAlert":
        columns = ["Provider", "Severity", "Suspended", "Age"]
    if kind.kind == "FleetRollout":
        columns = ["Ready", "Status", "Age"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns
    platform = {"StageTarget", "NotificationProvider", "NotificationAlert", "FleetRollout"}
    assert spec["names"]["categories"] == ([] if kind.kind in platform else ["stages"])


def test_recursive_models_are_refused() -> None:
    class Node(BaseModel):
        children: list[Node] = []

    with pytest.raises(ValueError, match="recursive model"):
        crdgen.structural_schema(Node)


def test_checked_in_crds_match_the_models() -> None:
    diff = crdgen.stale(output_dir=crdgen.DEFAULT_OUTPUT_DIR)
    assert diff == "", f"run `python -m stageset.api.crd`; checked-in CRDs differ:\n{diff}"


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--output-dir", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(k.filename for k in crdgen.KINDS)

    edited = tmp_path / "stages.metio.wtf_gitrepositories.yaml"
    edited.write_text(edited.read_text(encoding="utf-8").replace("60s", "30s"), encoding="utf-8")
    capsys.readouterr()
    assert crdgen.main(["--check", "--output-dir", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert re.search(r"^-\s+default: 30s\n\+\s+default: 60s$", out.out, re.MULTILINE)
    assert "out of date" in out.err

    shutil.rmtree(tmp_path)
    assert crdgen.main(["--check", "--output-dir", str(tmp_path)]) == 1


@pytest.mark.parametrize("kube_config", [
    {"secretRef": {"name": "kc"}, "configMapRef": {"name": "wi"}},
    {},
])
def test_a_kubeconfig_names_exactly_one_secret_or_configmap(kube_config: dict[str, Any]) -> None:
    """``secretRef`` or ``configMapRef`` (workload identity), never both or neither: on StageSets and
    StageTargets alike, as the CRDs' rule says."""
    from stageset.api.target import StageTarget

    with pytest.raises(ValidationError, match="exactly one of secretRef"):
        StageSet.model_validate(stageset({"kubeConfig": kube_config, "stages": [stage("app")]}))
    with pytest.raises(ValidationError, match="exactly one of secretRef"):
        StageTarget.model_validate({"spec": {"kubeConfig": kube_config}})
    accepted = StageSet.model_validate(stageset({"kubeConfig": {"configMapRef": {"name": "wi"}},
                                                 "stages": [stage("app")]}))
    assert accepted.spec.kube_config is not None
    assert accepted.spec.kube_config.secret_ref is None
    assert accepted.spec.kube_config.config_map_ref is not None
    target = StageTarget.model_validate({"spec": {"kubeConfig": {"configMapRef": {"name": "wi"}}}})
    assert target.spec.kube_config.config_map_ref is not None
    for kind in crdgen.KINDS:
        if kind.kind in ("StageSet", "StageTarget"):
            crd = crdgen.custom_resource_definition(kind)
            spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            rules = spec["properties"]["kubeConfig"]["x-kubernetes-validations"]
            assert {"rule": "has(self.secretRef) != has(self.configMapRef)"}.items() <= rules[-1].items()
