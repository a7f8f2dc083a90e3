"""Dependencies on objects of other kinds: which entries they are, whether the object is ready, and
what the message says (pure: ``stageset.controller.stageset.awaited``), table by table."""

from __future__ import annotations

from typing import Any

import pytest

from stageset.api import StageSet
from stageset.controller.stageset.awaited import (
    Awaited,
    ExprAnswer,
    Verdict,
    absent,
    awaited_of,
    by_expression,
    by_kstatus,
    early,
    expression_problems,
    names_stageset,
    unserved,
)

HOME = "shop"
DB = Awaited(index=0, api_version="db.example/v1", kind="Database", name="db", namespace=HOME, home=HOME)
OTHER_NS = Awaited(index=1, api_version="db.example/v1", kind="Database", name="db", namespace="infra",
                   home=HOME)
SECRET = Awaited(index=2, api_version="v1", kind="Secret", name="token", namespace=HOME, home=HOME,
                 ready_expr="self.data.ready == 'dHJ1ZQ=='")
CRD = Awaited(index=3, api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition",
              name="databases.db.example", namespace=HOME, home=HOME)


def database(*, ready: str | None = None, message: str = "", generation: int = 1,
             observed: int | None = None, deleting: bool = False, stalled: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "db", "namespace": HOME, "generation": generation}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    status: dict[str, Any] = {}
    conditions = []
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "message": message})
    if stalled:
        conditions.append({"type": "Stalled", "status": "True", "message": "quota exceeded"})
    if conditions:
        status["conditions"] = conditions
    if observed is not None:
        status["observedGeneration"] = observed
    return {"apiVersion": "db.example/v1", "kind": "Database", "metadata": meta, "status": status}


def stageset(depends_on: list[dict[str, Any]]) -> StageSet:
    return StageSet.model_validate({
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "app", "namespace": HOME},
        "spec": {"stages": [{"name": "app", "sourceRef": {"name": "repo"}}], "dependsOn": depends_on}})


def test_only_entries_of_other_kinds_are_awaited_here_with_their_index_and_namespace() -> None:
    found = awaited_of(stageset([
        {"name": "infra"},
        {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "name": "policies"},
        {"apiVersion": "db.example/v1", "kind": "Database", "name": "db", "readyExpr": "true"},
        {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "name": "op", "namespace": "ops"},
    ]))
    assert [(a.index, a.kind, a.name, a.namespace, a.ready_expr) for a in found] == [
        (2, "Database", "db", HOME, "true"), (3, "HelmRelease", "op", "ops", None)]
    assert found[1].cross_namespace
    assert not found[0].cross_namespace


@pytest.mark.parametrize(("entry", "stageset_entry"), [
    ({"name": "x"}, True),
    ({"name": "x", "namespace": "y", "minVersion": "1.0"}, True),
    ({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "name": "x"}, True),
    ({"apiVersion": "stages.metio.wtf/v2", "kind": "StageSet", "name": "x"}, False),
    ({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository", "name": "x"}, False),
    ({"apiVersion": "db.example/v1", "kind": "Database", "name": "x"}, False),
])
def test_the_raw_and_the_model_agree_on_what_is_a_stageset(entry: dict[str, Any],
                                                           stageset_entry: bool) -> None:
    assert names_stageset(entry) is stageset_entry
    assert stageset([entry]).spec.depends_on[0].names_stageset is stageset_entry


@pytest.mark.parametrize(("awaited", "namespaced", "named"), [
    (DB, True, "Database db"),
    (OTHER_NS, True, "Database infra/db"),
    (CRD, False, "CustomResourceDefinition databases.db.example"),
])
def test_the_object_is_named_as_the_user_wrote_it(awaited: Awaited, namespaced: bool, named: str) -> None:
    assert awaited.what(namespaced=namespaced) == named
    assert absent(awaited, namespaced=namespaced) == Verdict(False, f"{named} not found ({awaited.field})")


# kstatus (no readyExpr): rules 2 and 4
@pytest.mark.parametrize(("case", "awaited", "obj", "ready", "message"), [
    ("no conditions: Current", DB, database(), True, ""),
    ("Ready=True", DB, database(ready="True"), True, ""),
    ("Ready=False says why", DB, database(ready="False", message="provisioning storage"), False,
     "Database db is not Ready: provisioning storage"),
    ("another namespace: the fixed text only", OTHER_NS, database(ready="False", message="secret plan"),
     False,
     "Database infra/db is not Ready"),
    ("Stalled: failed, still waited for", DB, database(stalled=True), False,
     "Database db has failed: quota exceeded"),
])
def test_kstatus(case: str, awaited: Awaited, obj: dict[str, Any], ready: bool, message: str) -> None:
    assert early(awaited, obj) is None, case
    verdict = by_kstatus(awaited, obj)
    assert (verdict.ready, verdict.message) == (ready, message), case


@pytest.mark.parametrize(("case", "awaited", "obj", "message"), [
    ("generation not observed", DB, database(ready="True", generation=3, observed=2),
     "Database db is not Ready: generation 3 not yet observed (at 2)"),
    ("being deleted", DB, database(ready="True", deleting=True), "Database db is not Ready: being deleted"),
    ("another namespace: no detail", OTHER_NS, database(generation=3, observed=2),
     "Database infra/db is not Ready"),
])
def test_deleting_or_unobserved_is_never_ready(case: str, awaited: Awaited, obj: dict[str, Any],
                                               message: str) -> None:
    assert early(awaited, obj) == Verdict(False, message), case


# readyExpr: rule 3
@pytest.mark.parametrize(("case", "awaited", "answer", "ready", "message"), [
    ("true", DB, ExprAnswer(value=True), True, ""),
    ("false", DB, ExprAnswer(value=False), False,
     "Database db is not ready: spec.dependsOn[0].readyExpr is not true yet"),
    ("an error is shown", DB, ExprAnswer(error='no such key: "phase"'), False,
     'Database db is not ready: spec.dependsOn[0].readyExpr is not true yet (no such key: "phase")'),
    ("another namespace: the error is not", OTHER_NS, ExprAnswer(error="no such key: secret-plan"), False,
     "Database infra/db is not ready: spec.dependsOn[1].readyExpr is not true yet "
     "(it could not be evaluated)"),
    ("a Secret: the error is not (it could quote data)", SECRET, ExprAnswer(error="bad value 'hunter2'"),
     False,
     "Secret token is not ready: spec.dependsOn[2].readyExpr is not true yet (it could not be evaluated)"),
])
def test_ready_expr(case: str, awaited: Awaited, answer: ExprAnswer, ready: bool, message: str) -> None:
    verdict = by_expression(awaited, answer)
    assert isinstance(verdict, Verdict), case
    assert (verdict.ready, verdict.message) == (ready, message), case


def test_a_ready_expr_returning_no_bool_is_invalid_spec_naming_the_field() -> None:
    assert by_expression(DB, ExprAnswer(type="string")) == \
        "spec.dependsOn[0].readyExpr returned string, not bool, for Database db"


def test_what_the_type_checker_refuses_names_each_field() -> None:
    entries = [DB, SECRET, Awaited(index=4, api_version="v1", kind="ConfigMap", name="c", namespace=HOME,
                                   home=HOME, ready_expr="1 + 1")]
    answers = [ExprAnswer(error="Syntax error: mismatched input"), ExprAnswer(type="int")]
    assert expression_problems(entries, answers) == [
        "spec.dependsOn[2].readyExpr does not compile: Syntax error: mismatched input",
        "spec.dependsOn[4].readyExpr returns int, not bool"]
    assert expression_problems([SECRET], [ExprAnswer(type="dyn")]) == []


def test_an_unserved_kind_says_what_to_install() -> None:
    assert unserved(DB) == ("Database db (spec.dependsOn[0]): this cluster serves no kind Database in "
                            "db.example/v1; is its CustomResourceDefinition installed? (looked at again at "
                            "retryInterval)")


def test_long_object_messages_are_cut() -> None:
    verdict = by_kstatus(DB, database(ready="False", message="x" * 1000))
    assert len(verdict.message) < 400
    assert verdict.message.endswith("...")
