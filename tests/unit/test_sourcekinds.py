"""What a sourceRef names under each --default-source-kind, and what a source object's status says."""

from __future__ import annotations

from typing import Any

import pytest

from stageset.controller.sourcekinds import (
    FLUX_GROUP,
    OUR_GROUP,
    Artifact,
    DefaultSourceKind,
    NotUsable,
    RefKind,
    SourceObject,
    artifact_state,
    classify,
    failure_text,
    points_at,
    referenced,
    trigger,
)

OURS = DefaultSourceKind.GIT_REPOSITORY
REFERENCE = DefaultSourceKind.EXTERNAL_ARTIFACT
FLUX_V1 = f"{FLUX_GROUP}/v1"


@pytest.mark.parametrize(("api_version", "kind", "default", "expected"), [
    # Our default: an omitted kind is our GitRepository.
    (None, None, OURS, (RefKind.OURS, OUR_GROUP, "v1", "GitRepository")),
    (None, "GitRepository", OURS, (RefKind.OURS, OUR_GROUP, "v1", "GitRepository")),
    ("stages.metio.wtf/v1", None, OURS, (RefKind.OURS, OUR_GROUP, "v1", "GitRepository")),
    (None, "ExternalArtifact", OURS, (RefKind.FLUX, FLUX_GROUP, "v1", "ExternalArtifact")),
    (None, "OCIRepository", OURS, (RefKind.FLUX, FLUX_GROUP, "v1", "OCIRepository")),
    (None, "Bucket", OURS, (RefKind.FLUX, FLUX_GROUP, "v1", "Bucket")),
    (FLUX_V1, "GitRepository", OURS, (RefKind.FLUX, FLUX_GROUP, "v1", "GitRepository")),
    (FLUX_V1, None, OURS, (RefKind.FLUX, FLUX_GROUP, "v1", "ExternalArtifact")),
    (f"{FLUX_GROUP}/v1beta2", "OCIRepository", OURS, (RefKind.FLUX, FLUX_GROUP, "v1beta2", "OCIRepository")),
    ("jaas.metio.wtf/v1", "JsonnetSnippet", OURS,
     (RefKind.PRODUCER, "jaas.metio.wtf", "v1", "JsonnetSnippet")),
    (FLUX_V1, "HelmChart", OURS, (RefKind.PRODUCER, FLUX_GROUP, "v1", "HelmChart")),
    # The reference's meaning: an omitted kind is Flux's ExternalArtifact, an omitted apiVersion Flux's v1.
    (None, None, REFERENCE, (RefKind.FLUX, FLUX_GROUP, "v1", "ExternalArtifact")),
    (None, "GitRepository", REFERENCE, (RefKind.FLUX, FLUX_GROUP, "v1", "GitRepository")),
    ("stages.metio.wtf/v1", "GitRepository", REFERENCE, (RefKind.OURS, OUR_GROUP, "v1", "GitRepository")),
    ("stages.metio.wtf/v1", None, REFERENCE, (RefKind.OURS, OUR_GROUP, "v1", "GitRepository")),
    (None, "JsonnetSnippet", REFERENCE, (RefKind.PRODUCER, FLUX_GROUP, "v1", "JsonnetSnippet")),
])
def test_classify(api_version: str | None, kind: str | None, default: DefaultSourceKind,
                  expected: tuple[RefKind, str, str, str]) -> None:
    target = classify(api_version=api_version, kind=kind, default=default)
    assert target.problem is None
    assert (target.kind, target.group, target.version, target.name) == expected


@pytest.mark.parametrize(("api_version", "kind", "says"), [
    (None, "JsonnetSnippet", "without an apiVersion"),
    ("stages.metio.wtf/v1", "StageSet", "only source kind"),
    ("stages.metio.wtf/v2", "GitRepository", "only source kind"),
    (f"{FLUX_GROUP}/v1beta1", "GitRepository", "v1 or v1beta2"),
])
def test_classify_refused(api_version: str | None, kind: str, says: str) -> None:
    target = classify(api_version=api_version, kind=kind, default=OURS)
    assert target.problem is not None
    assert says in target.problem


def _source(ready: dict[str, Any] | None, artifact: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", **ready}]
    if artifact is not None:
        status["artifact"] = artifact
    return {"status": status}


GOOD = {"url": "http://sc/a.tar.gz", "digest": "sha256:" + "a" * 64, "revision": "main@sha1:" + "b" * 40}


@pytest.mark.parametrize(("obj", "expected"), [
    (_source({"status": "True"}, GOOD), Artifact(GOOD["url"], GOOD["digest"], GOOD["revision"])),
    (_source({"status": "True"}, {**GOOD, "revision": None}), Artifact(GOOD["url"], GOOD["digest"],
                                                                      GOOD["digest"])),
    (_source(None, GOOD), NotUsable(False, "", "it has no Ready condition yet")),
    (_source({"status": "False", "reason": "GitOperationFailed", "message": "auth failed"}, GOOD),
     NotUsable(False, "GitOperationFailed", "auth failed")),
    (_source({"status": "Unknown", "reason": "Progressing", "message": "building"}),
     NotUsable(False, "Progressing", "building")),
    (_source({"status": "True"}), NotUsable(True, "", "it is Ready but has no status.artifact")),
    (_source({"status": "True"}, {**GOOD, "url": ""}), NotUsable(True, "", "its status.artifact has no url")),
    (_source({"status": "True"}, {**GOOD, "digest": None}),
     NotUsable(True, "", "its status.artifact has no digest")),
])
def test_artifact_state(obj: dict[str, Any], expected: Artifact | NotUsable) -> None:
    assert artifact_state(obj) == expected


def test_failure_text_drops_the_runbook_link_and_is_bounded() -> None:
    text = failure_text("LimitExceeded", "the remote sent a blob; runbook: https://stages.metio.wtf/runbooks/x/")
    assert text == "LimitExceeded: the remote sent a blob"
    assert len(failure_text("R", "m" * 5000)) < 1100


def test_points_at_matches_group_kind_name_and_namespace_not_version() -> None:
    ea = {"metadata": {"namespace": "shop"},
          "spec": {"sourceRef": {"apiVersion": "jaas.metio.wtf/v2", "kind": "JsonnetSnippet", "name": "app"}}}
    assert points_at(ea, group="jaas.metio.wtf", kind="JsonnetSnippet", name="app", namespace="shop")
    assert not points_at(ea, group="other.io", kind="JsonnetSnippet", name="app", namespace="shop")
    assert not points_at(ea, group="jaas.metio.wtf", kind="JsonnetSnippet", name="web", namespace="shop")
    assert not points_at(ea, group="jaas.metio.wtf", kind="JsonnetSnippet", name="app", namespace="other")
    elsewhere = {**ea, "spec": {"sourceRef": {**ea["spec"]["sourceRef"], "namespace": "other"}}}
    assert not points_at(elsewhere, group="jaas.metio.wtf", kind="JsonnetSnippet", name="app",
                         namespace="shop")


def test_referenced_sources_of_a_stageset() -> None:
    stageset = {"metadata": {"namespace": "shop"}, "spec": {"stages": [
        {"name": "a", "sourceRef": {"name": "app"}},
        {"name": "b", "sourceRef": {"kind": "OCIRepository", "name": "oci", "namespace": "infra"}},
        {"name": "c", "sourceRef": {"apiVersion": "jaas.metio.wtf/v1", "kind": "JsonnetSnippet",
                                    "name": "j"}},
        {"name": "d", "sourceRef": {"kind": "NoApiVersion", "name": "x"}},
    ]}}
    assert referenced(stageset, OURS) == {
        SourceObject(OUR_GROUP, "GitRepository", "shop", "app"),
        SourceObject(FLUX_GROUP, "OCIRepository", "infra", "oci"),
        SourceObject("jaas.metio.wtf", "JsonnetSnippet", "shop", "j"),
    }
    assert SourceObject(FLUX_GROUP, "ExternalArtifact", "shop", "app") in referenced(stageset, REFERENCE)


def test_trigger_ignores_status_writes_that_change_neither_artifact_nor_readiness() -> None:
    before = _source({"status": "True", "reason": "Succeeded", "message": "ok"}, GOOD)
    same = {**before, "status": {**before["status"], "observedGeneration": 7, "lastHandledReconcileAt": "x"}}
    assert trigger(before) == trigger(same)
    assert trigger(before) != trigger(_source({"status": "True", "reason": "Succeeded", "message": "ok"},
                                              {**GOOD, "digest": "sha256:" + "c" * 64}))
    assert trigger(before) != trigger(_source({"status": "False", "reason": "Failed", "message": "x"}, GOOD))
