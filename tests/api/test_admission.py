"""Admission of our kinds by a real kube-apiserver with the generated CRDs installed.

What only the apiserver can tell us: that the CRDs are structural and their CEL
rules fit the cost budget (installing them), that defaults are applied on the
server, and that bad specs are refused with a message that points at the field —
even while the controller is down.  Invalid specs are sent as server-side dry runs,
so the whole admission chain runs and nothing is stored.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from stageset.api import (
    Artifact,
    Condition,
    GitRepository,
    GitRepositoryStatus,
    StageSet,
    StageSetStatus,
    StageStatus,
)
from tests.api.specs import (
    INVALID,
    PLURALS,
    VALID,
    Invalid,
    design_stagesets,
    gitrepository,
    stage,
    stageset,
)

pytestmark = pytest.mark.apiserver

GROUP, VERSION = "stages.metio.wtf", "v1"
MODELS: dict[str, type[StageSet] | type[GitRepository]] = {
    "StageSet": StageSet, "GitRepository": GitRepository}


def create(api: k8s.ApiClient, body: dict[str, Any], *, namespace: str,
           dry_run: bool = False, strict: bool = False) -> dict[str, Any]:
    """POST ``body``; returns the object as the apiserver stored (or would store) it."""
    kwargs: dict[str, Any] = {}
    if dry_run:
        kwargs["dry_run"] = "All"
    if strict:
        kwargs["field_validation"] = "Strict"
    created: dict[str, Any] = k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURALS[body["kind"]], body, **kwargs)
    return created


def delete(api: k8s.ApiClient, obj: dict[str, Any]) -> None:
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, obj["metadata"]["namespace"], PLURALS[obj["kind"]], obj["metadata"]["name"])


def refusal(api: k8s.ApiClient, body: dict[str, Any], *, namespace: str,
            strict: bool = False, code: int = 422) -> dict[str, Any]:
    """Send ``body`` as a dry run, expect it refused with ``code``, return the Status body."""
    with pytest.raises(k8s.ApiException) as caught:
        create(api, body, namespace=namespace, dry_run=True, strict=strict)
    status: dict[str, Any] = json.loads(caught.value.body)
    assert caught.value.status == code, status
    return status


def test_crds_are_established_with_our_names(crds: list[dict[str, Any]],
                                             admin_api: k8s.ApiClient) -> None:
    ext = k8s.ApiextensionsV1Api(admin_api)
    served = {}
    for crd in crds:
        live = json.loads(ext.read_custom_resource_definition(
            crd["metadata"]["name"], _preload_content=False).data)
        served[live["spec"]["names"]["kind"]] = live["status"]["acceptedNames"]
    assert served["StageSet"]["plural"] == "stagesets"
    assert served["StageSet"]["shortNames"] == ["ss"]
    assert served["GitRepository"]["plural"] == "gitrepositories"
    # Not Flux's ``gitrepo``: ours must not shadow source.toolkit.fluxcd.io's GitRepository.
    assert served["GitRepository"]["shortNames"] == ["ssgitrepo", "ssgr"]
    assert served["StageSet"]["categories"] == served["GitRepository"]["categories"] == ["stages"]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["payments", "platform", "payments-remote"])
def test_design_stagesets_are_accepted_verbatim(crds: list[dict[str, Any]],
                                                admin_api: k8s.ApiClient,
                                                ensure_namespace: Callable[[str], str],
                                                index: int) -> None:
    original = design_stagesets()[index]
    namespace = ensure_namespace(original["metadata"]["namespace"])
    # Dry-run: full admission and defaulting, nothing stored (the e2e tests own these names).
    stored = create(admin_api, original, namespace=namespace, dry_run=True)
    spec = stored["spec"]
    (app,) = spec["stages"]
    assert app["name"] == "app"
    assert app["path"] == "./"
    assert app["prune"] is True
    assert "kind" not in app["sourceRef"]  # the controller's --default-source-kind decides
    assert "dependsOn" not in app
    # No interval default: the controller's --default-interval; the reference's 15m timeout.
    assert "interval" not in spec
    assert (spec["timeout"], spec["suspend"]) == ("15m", False)
    if "kubeConfig" in original["spec"]:
        assert spec["kubeConfig"]["secretRef"] == {"name": "prod-eu-kubeconfig", "key": "value"}
    # Server defaults and model defaults agree: the stored object parses to the same spec.
    assert StageSet.model_validate(stored).spec == StageSet.model_validate(original).spec


def test_apiserver_applies_defaults_but_never_to_stage_depends_on(
        crds: list[dict[str, Any]], admin_api: k8s.ApiClient, scratch_namespace: str) -> None:
    body = stageset({
        "kubeConfig": {"secretRef": {"name": "remote"}},
        "stages": [
            stage("implicit"),
            stage("explicit-none", dependsOn=[]),
            stage("tuned", postBuild={"substituteFrom": [{"kind": "Secret", "name": "vars"}]},
                  readyChecks={}),
        ],
    }, name="defaults")
    stored = create(admin_api, body, namespace=scratch_namespace)
    try:
        implicit, explicit_none, tuned = stored["spec"]["stages"]
        for each in (implicit, explicit_none, tuned):
            assert each["path"] == "./"
            assert each["prune"] is True
            assert each["force"] is False
            assert each["sourceRef"] == {"name": "repo"}
            assert "timeout" not in each  # inherits spec.timeout in the controller
        assert "dependsOn" not in implicit
        assert explicit_none["dependsOn"] == []
        assert tuned["postBuild"]["substituteFrom"] == [
            {"kind": "Secret", "name": "vars", "optional": False}]
        assert tuned["readyChecks"] == {"wait": True, "disableWait": False}
        assert stored["spec"]["onTimeout"] == "Hold"
        for each in (implicit, explicit_none, tuned):
            # Per-stage overrides stay absent: they inherit the StageSet's.
            assert "onTimeout" not in each
            assert "conflictPolicy" not in each
        assert stored["spec"]["kubeConfig"]["secretRef"]["key"] == "value"

        parsed = StageSet.model_validate(stored).spec.stages
        assert parsed[0].depends_on is None
        assert parsed[1].depends_on == []
    finally:
        delete(admin_api, stored)


@pytest.mark.parametrize("case", INVALID, ids=[case.id for case in INVALID])
def test_invalid_spec_is_refused_naming_the_field(crds: list[dict[str, Any]],
                                                  admin_api: k8s.ApiClient,
                                                  scratch_namespace: str, case: Invalid) -> None:
    status = refusal(admin_api, case.fresh(), namespace=scratch_namespace)
    assert status["reason"] == "Invalid"
    fields = [cause.get("field") for cause in status["details"]["causes"]]
    assert case.field in fields, status["message"]
    assert case.message in status["message"]
    assert f"{case.field}: " in status["message"]


@pytest.mark.parametrize("name", list(VALID))
def test_valid_spec_is_accepted_and_parses_alike(crds: list[dict[str, Any]],
                                                 admin_api: k8s.ApiClient,
                                                 scratch_namespace: str, name: str) -> None:
    body = copy.deepcopy(VALID[name])
    stored = create(admin_api, body, namespace=scratch_namespace, dry_run=True)
    model = MODELS[body["kind"]]
    assert model.model_validate(stored).spec == model.model_validate(body).spec


def test_gitrepository_defaults(crds: list[dict[str, Any]], admin_api: k8s.ApiClient,
                                scratch_namespace: str) -> None:
    body = copy.deepcopy(VALID["git-scp-like"])
    stored = create(admin_api, body, namespace=scratch_namespace, dry_run=True)
    assert stored["spec"] == {"url": "git@github.com:org/repo.git", "ref": {"tag": "v1.2.3"},
                              "interval": "1m", "timeout": "60s", "suspend": False}


def test_unknown_field_is_refused_under_strict_field_validation(
        crds: list[dict[str, Any]], admin_api: k8s.ApiClient, scratch_namespace: str) -> None:
    # A typo (dependOn) must not silently turn into "depends on the previous stage".
    body = stageset({"stages": [stage("db"), stage("app", dependOn=[])]})
    # Strict decoding errors are 400 BadRequest, not 422.
    status = refusal(admin_api, body, namespace=scratch_namespace, strict=True, code=400)
    assert 'unknown field "spec.stages[1].dependOn"' in status["message"]


def test_status_written_from_the_models_is_accepted(
        crds: list[dict[str, Any]], admin_api: k8s.ApiClient, scratch_namespace: str) -> None:
    custom = k8s.CustomObjectsApi(admin_api)
    now = "2026-01-02T03:04:05Z"
    revision = "main@sha1:" + "a" * 40
    ready = Condition(type="Ready", status="True", reason="Succeeded", message="",
                      last_transition_time=now, observed_generation=1)
    statuses: list[tuple[dict[str, Any], StageSetStatus | GitRepositoryStatus]] = [
        (stageset({"stages": [stage("app")]}, name="with-status"), StageSetStatus(
            observed_generation=1, conditions=[ready], last_applied_revision=revision,
            stages=[StageStatus(name="app", phase="Ready", revision=revision,
                                last_applied_time=now, objects=3)],
            last_handled_reconcile_at=now)),
        (gitrepository({"url": "https://git.example.com/x.git"}, name="with-status"),
         GitRepositoryStatus(
            observed_generation=1, conditions=[ready],
            artifact=Artifact(revision="main@sha1:" + "b" * 40, digest="sha256:" + "c" * 64,
                              last_update_time=now))),
    ]
    for body, status in statuses:
        stored = create(admin_api, body, namespace=scratch_namespace)
        try:
            stored["status"] = status.model_dump(by_alias=True, exclude_none=True)
            updated = custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, scratch_namespace, PLURALS[body["kind"]], "with-status", stored)
            assert MODELS[body["kind"]].model_validate(updated).status == status
        finally:
            delete(admin_api, stored)


def test_a_warn_stagesets_drift_status_written_from_the_models_is_accepted(
        crds: list[dict[str, Any]], admin_api: k8s.ApiClient, scratch_namespace: str) -> None:
    """``status.drifted`` and the ``Drifted`` condition (issue 45) as the controller writes them."""
    from stageset.api import DriftedObject

    custom = k8s.CustomObjectsApi(admin_api)
    now = "2026-01-02T03:04:05Z"
    conditions = [Condition(type=t, status="True", reason=r, message=m, last_transition_time=now,
                            observed_generation=1)
                  for t, r, m in (("Drifted", "DriftDetected", "1 object differs: ConfigMap x/a (data.k)"),
                                  ("Ready", "Succeeded", ""))]
    status = StageSetStatus(observed_generation=1, conditions=conditions, drifted=[
        DriftedObject(stage="app", id="x_a__ConfigMap", fields=["data.k", "metadata.labels.team"]),
        DriftedObject(stage="app", id="x_web_apps_Deployment", deleted=True)])
    body = stageset({"driftDetection": {"mode": "Warn"}, "stages": [stage("app")]}, name="drifted")
    stored = create(admin_api, body, namespace=scratch_namespace)
    try:
        stored["status"] = status.model_dump(by_alias=True, exclude_none=True)
        updated = custom.replace_namespaced_custom_object_status(
            GROUP, VERSION, scratch_namespace, PLURALS["StageSet"], "drifted", stored)
        assert MODELS["StageSet"].model_validate(updated).status == status
    finally:
        delete(admin_api, stored)
