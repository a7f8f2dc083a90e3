"""A StageSet written for the reference controller means the same here or is refused; nothing is
pruned silently.

The group ``stages.metio.wtf/v1`` is shared with the Go StageSet controller.  The apiserver drops
fields a CRD does not declare (an error only under ``fieldValidation=Strict``; with the default, at
most a warning nobody reads), so a ported StageSet could lose its ``decryption`` or its
``readyChecks.checks`` without anyone noticing.  Here every field of the reference's API
(:mod:`tests.api.reference_api`, written from its API page) and every StageSet its docs and smoke
scripts show (``reference-stagesets.yaml``) is sent to the real apiserver with both field
validations, as a server-side dry run: each is either stored exactly as sent or refused with a
message naming every field this controller does not support.  The models (the reconciler's
re-check) must agree.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from pydantic import ValidationError

from stageset.api import StageSet, unsupported
from stageset.api.unsupported import PATHS, REFUSED
from tests.api.reference_api import FIELDS, Field, get, kept, put
from tests.api.test_admission import create

pytestmark = pytest.mark.apiserver

DOCUMENTED = [entry for entry in yaml.safe_load_all(
    Path(__file__).with_name("reference-stagesets.yaml").read_text(encoding="utf-8")) if entry]
DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference-controller.md"


def _base() -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "metadata": {"name": "ported"},
            "spec": {"stages": [{"name": "app", "sourceRef": {"name": "app"}}]}}


def _with(field: Field) -> dict[str, Any]:
    body = _base()
    put(body, field.path, copy.deepcopy(field.value))
    return body


def _send(api: k8s.ApiClient, body: dict[str, Any], *, namespace: str, strict: bool) -> dict[str, Any]:
    """The stored object, or ``{"refused": Status}``."""
    try:
        return create(api, copy.deepcopy(body), namespace=namespace, dry_run=True, strict=strict)
    except k8s.ApiException as error:
        return {"refused": json.loads(error.body), "code": error.status}


def _causes(refusal: dict[str, Any]) -> list[str]:
    return [str(cause.get("field")) for cause in refusal.get("details", {}).get("causes", [])]


def _assert_refused(answer: dict[str, Any], refused: list[str]) -> None:
    assert "refused" in answer, f"accepted, but {refused} must be refused"
    assert answer["code"] == 422, answer
    status = answer["refused"]
    # Exactly the unsupported fields, each named with the path the user wrote.
    assert sorted(_causes(status)) == sorted(refused), status["message"]
    for path in refused:
        assert f"{path}: Forbidden: {path.rsplit('.', 1)[-1]}" in status["message"], status["message"]
    assert status["message"].count("is not supported by this controller") == len(refused)


def _instances(body: dict[str, Any], pattern: str) -> list[tuple[str, Any]]:
    """The objects at ``pattern`` (``spec.stages[]``) in ``body``, with their concrete paths."""
    found: list[tuple[str, Any]] = [("", body)]
    for step in pattern.split("."):
        key, many = step.removesuffix("[]"), step.endswith("[]")
        deeper: list[tuple[str, Any]] = []
        for path, obj in found:
            value = obj.get(key) if isinstance(obj, dict) else None
            where = f"{path}.{key}".lstrip(".")
            if many and isinstance(value, list):
                deeper.extend((f"{where}[{index}]", item) for index, item in enumerate(value))
            elif not many and value is not None:
                deeper.append((where, value))
        found = deeper
    return found


def refusals_in(body: dict[str, Any]) -> list[str]:
    """The paths of the fields of ``body`` the table refuses (what the apiserver must name)."""
    return [f"{path}.{refusal.field}"
            for model, pattern in PATHS.items()
            for path, obj in _instances(body, pattern)
            for refusal in unsupported.of(model)
            if isinstance(obj, dict) and refusal.refuses(obj.get(refusal.field))]


def _model_refusal(body: dict[str, Any]) -> str | None:
    try:
        StageSet.model_validate(body)
    except ValidationError as error:
        return str(error)
    return None


@pytest.mark.parametrize("field", FIELDS, ids=[f.id for f in FIELDS])
def test_every_reference_field_is_stored_as_sent_or_refused_by_name(
        crds: list[dict[str, Any]], admin_api: k8s.ApiClient, scratch_namespace: str, field: Field) -> None:
    body = _with(field)
    for strict in (False, True):
        answer = _send(admin_api, body, namespace=scratch_namespace, strict=strict)
        if field.refused is None:
            assert "refused" not in answer, (strict, answer.get("refused"))
            assert kept(field.value, get(answer, field.path)), (strict, get(answer, field.path))
        else:
            _assert_refused(answer, [field.refused])
    # The reconciler's re-check agrees (an object stored before a rule existed fails the same way).
    refusal = _model_refusal(body)
    if field.refused is None:
        assert refusal is None, refusal
    else:
        assert refusal is not None
        name = field.refused.rsplit(".", 1)[-1]
        assert re.search(rf"\b{name}(: \w+)? \(.*\) is not supported by this controller", refusal), refusal


@pytest.mark.parametrize("entry", DOCUMENTED, ids=[e["stageset"]["metadata"]["name"] for e in DOCUMENTED])
def test_documented_reference_stagesets_are_accepted_whole_or_refused_by_name(
        crds: list[dict[str, Any]], admin_api: k8s.ApiClient, scratch_namespace: str,
        entry: dict[str, Any]) -> None:
    body = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", **entry["stageset"]}
    refused = refusals_in(body)
    for strict in (False, True):
        answer = _send(admin_api, body, namespace=scratch_namespace, strict=strict)
        if refused:
            _assert_refused(answer, refused)
        else:
            assert "refused" not in answer, (strict, answer.get("refused"))
            assert kept(body["spec"], answer["spec"]), (body["spec"], answer["spec"])
    refusal = _model_refusal(body)
    assert (refusal is None) == (not refused), refusal
    if refusal is not None:
        assert "is not supported by this controller" in refusal


def _generic(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


def test_the_refusal_table_and_the_reference_field_list_agree() -> None:
    """Every line of the table is exercised by the walk, and every refusal the walk expects is a
    line of the table.  Accepting a field when its issue lands: delete its line in
    stageset/api/unsupported.py, set ``refused=None`` on its entries in reference_api.py (the walk
    then checks the new schema stores it as sent) and update its row in the porting page."""
    walked = {_generic(f.refused) for f in FIELDS if f.refused is not None}
    table = {refusal.path for refusal in REFUSED}
    assert walked == table
    assert set(PATHS) == {refusal.model for refusal in REFUSED}
    # The walk's own expectations are what the table says, field by field.
    for field in FIELDS:
        assert refusals_in(_with(field)) == ([field.refused] if field.refused else []), field.id
    # The documented StageSets hold both kinds, and every model the table names.
    refusing = [refusals_in({"spec": e["stageset"]["spec"]}) for e in DOCUMENTED]
    assert any(refusing)
    assert not all(refusing)
    assert {_generic(path).rsplit(".", 1)[0] for paths in refusing for path in paths} >= {
        "spec", "spec.stages[]", "spec.stages[].promotion"}


def test_the_porting_page_lists_every_refused_field() -> None:
    page = DOCS_PAGE.read_text(encoding="utf-8")
    for refusal in REFUSED:
        assert f"`{refusal.path}`" in page, refusal.path
        if refusal.planned:
            line = next(line for line in page.splitlines() if f"`{refusal.path}`" in line)
            assert refusal.planned in line, (refusal.path, line)
