"""postBuild variables: Flux's merge order, optional referents, Secret decoding, ``${var}`` expansion."""

from __future__ import annotations

import base64

import pytest

from stageset.build import (
    BuildError,
    SubstituteFromNotFoundError,
    VariableSource,
    merge_variables,
    substitute,
)
from stageset.build.variables import substituted_forms


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_substitute_from_in_order_then_inline_substitute_wins() -> None:
    merged = merge_variables(
        {"region": "eu-inline"},
        [
            VariableSource("ConfigMap", "defaults", {"region": "us", "tier": "gold", "size": "s"}),
            VariableSource("Secret", "overrides", {"tier": b64("platinum"), "token": b64("s3cr3t")}),
            VariableSource("ConfigMap", "last", {"size": "xl"}),
        ],
    )
    assert merged == {"region": "eu-inline", "tier": "platinum", "size": "xl", "token": "s3cr3t"}


def test_plain_tuples_are_accepted() -> None:
    assert merge_variables(None, [("ConfigMap", "vars", {"a": "1"}, False)]) == {"a": "1"}


def test_missing_non_optional_referent_is_an_error_naming_it() -> None:
    with pytest.raises(SubstituteFromNotFoundError, match=r"Secret 'cluster-vars' not found"):
        merge_variables({}, [VariableSource("Secret", "cluster-vars", None)])


def test_optional_referent_that_does_not_exist_is_skipped() -> None:
    merged = merge_variables({"a": "inline"}, [
        VariableSource("ConfigMap", "maybe", None, optional=True),
        VariableSource("ConfigMap", "there", {"b": "2"}, optional=True),
    ])
    assert merged == {"a": "inline", "b": "2"}


def test_existing_but_empty_referent_contributes_nothing() -> None:
    assert merge_variables({}, [VariableSource("ConfigMap", "empty", {})]) == {}


def test_secret_values_are_base64_decoded_and_checked_without_showing_them() -> None:
    decoded = merge_variables({}, [VariableSource("Secret", "s", {"multi": b64("a\nb: c")})])
    assert decoded == {"multi": "a\nb: c"}
    with pytest.raises(BuildError, match=r"Secret 's' key 'k' is not valid base64") as caught:
        merge_variables({}, [VariableSource("Secret", "s", {"k": "not base64!"})])
    assert "not base64!" not in str(caught.value)
    binary = base64.b64encode(b"\xff\xfe").decode()
    with pytest.raises(BuildError, match=r"Secret 's' key 'k' is not UTF-8 text"):
        merge_variables({}, [VariableSource("Secret", "s", {"k": binary})])


@pytest.mark.parametrize("name", ["app.conf", "my-var", "1st", ""])
def test_invalid_variable_names_are_errors(name: str) -> None:
    with pytest.raises(BuildError, match="is not a valid variable name"):
        merge_variables({}, [VariableSource("ConfigMap", "vars", {name: "x"})])
    with pytest.raises(BuildError, match=r"postBuild\.substitute: .* is not a valid variable name"):
        merge_variables({name: "x"}, [])


def test_unsupported_kind_is_an_error() -> None:
    with pytest.raises(BuildError, match="kind 'Pod' is not one of ConfigMap, Secret"):
        merge_variables({}, [VariableSource("Pod", "p", {})])


def test_expansion_with_defaults() -> None:
    variables = {"a": "one", "empty": ""}
    assert substitute("${a}-${b:=two}-${empty:=three}-${a:=unused}", variables, origin="f") == \
        "one-two-three-one"
    assert substitute("${b:=}x", {}, origin="f") == "x"


def test_unset_variable_without_default_is_an_error_naming_it_and_the_origin() -> None:
    with pytest.raises(BuildError, match=r"^ConfigMap app \(a\.yaml\): variable \$\{missing\} is not set"):
        substitute("x ${missing} y", {}, origin="ConfigMap app (a.yaml)")


def test_set_but_empty_variable_without_default_is_empty() -> None:
    assert substitute("[${empty}]", {"empty": ""}, origin="f") == "[]"


def test_escapes_are_kept_literally() -> None:
    assert substitute("$${a} $${b:=x} ${a}", {"a": "1"}, origin="f") == "${a} ${b:=x} 1"
    assert substitute("$${undefined}", {}, origin="f") == "${undefined}"


@pytest.mark.parametrize("text", ["$HOME", "$(date)", "${1}", "${a:-x}", "${}", "$ {a}", "${a-b}"])
def test_other_dollar_forms_are_left_alone(text: str) -> None:
    assert substitute(text, {"a": "1", "HOME": "h"}, origin="f") == text


def test_values_are_inserted_verbatim() -> None:
    assert substitute("${v}", {"v": "${w} $${x} \\1"}, origin="f") == "${w} $${x} \\1"


def test_the_substituted_forms_of_decrypted_values_are_what_substitution_makes_of_them() -> None:
    values = frozenset({"plain-secret", "pw-${REGION}", "${UNSET}", "${SIZE:=large}-pw", "$${REGION}"})
    assert substituted_forms(values, {"REGION": "eu"}) == {"pw-eu", "large-pw", "${REGION}"}
    assert substituted_forms(values, None) == frozenset()  # no postBuild: nothing is substituted
    assert substituted_forms(values, {}) == {"large-pw", "${REGION}"}
