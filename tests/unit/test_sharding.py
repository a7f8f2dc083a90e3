"""Label-selector shards: the selector syntax (as the apiserver reads it), matching, the shard a
selector serves, the main shard's "unserved" selector, and the flags that carry them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from stageset.cli.main import controller, controller_settings
from stageset.cli.params import LABEL_SELECTOR, SHARD_KEYS
from stageset.controller.sharding import (
    SHARD_LABEL,
    LabelSelector,
    SelectorError,
    foreign_source_message,
    parse_shard_keys,
    unserved_message,
)

# (flag value, canonical text sent to the apiserver: sorted by key, one spelling per operator)
PARSED = [
    ("sharding.fluxcd.io/key=shard1", "sharding.fluxcd.io/key=shard1"),
    ("sharding.fluxcd.io/key==shard1", "sharding.fluxcd.io/key=shard1"),
    ("!sharding.fluxcd.io/key", "!sharding.fluxcd.io/key"),
    ("  ! sharding.fluxcd.io/key ", "!sharding.fluxcd.io/key"),
    ("sharding.fluxcd.io/key in (shard2, shard1,shard2)", "sharding.fluxcd.io/key in (shard1,shard2)"),
    ("team notin (a),tier", "team notin (a),tier"),
    ("tier,team!=payments", "team!=payments,tier"),
    ("team=", "team="),
    ("replicas>2,replicas<10", "replicas>2,replicas<10"),
    ("example.com/team=a,app.kubernetes.io/name=shop", "app.kubernetes.io/name=shop,example.com/team=a"),
    ("k in ()", "k in ()"),
]

# (flag value, words the error must contain)
REFUSED = [
    ("", "empty"),
    ("   ", "empty"),
    ("a=b,", "after the last ','"),
    (",a", "label key expected"),
    ("a b", "an operator"),
    ("a=b c", "',' expected"),
    ("a in b", "'(' expected"),
    ("a in (b", "',' or ')'"),
    ("a in (b c)", "',' or ')'"),
    ("a>b", "whole number"),
    ("-a=b", "not a label key"),
    ("a/b/c=d", "not a label key"),
    ("Example.com/a=b", "not a label key"),
    ("a=" + "x" * 64, "not a label value"),
    ("a=-b", "not a label value"),
    ("!a=b", "',' expected"),
    ("a=(b)", "a value for"),
    ("x" * 5000, "longer than"),
]


@pytest.mark.parametrize(("text", "canonical"), PARSED)
def test_selectors_parse_to_their_canonical_text(text: str, canonical: str) -> None:
    selector = LabelSelector.parse(text)
    assert str(selector) == canonical
    assert LabelSelector.parse(str(selector)) == selector


@pytest.mark.parametrize(("text", "words"), REFUSED)
def test_bad_selectors_are_refused_saying_why(text: str, words: str) -> None:
    with pytest.raises(SelectorError, match=words.replace("(", r"\(").replace(")", r"\)")):
        LabelSelector.parse(text)


def test_an_empty_value_is_a_value() -> None:
    assert str(LabelSelector.parse("a==")) == "a="
    assert LabelSelector.parse("a=").matches({"a": ""})
    assert not LabelSelector.parse("a=").matches({})


# (selector, labels, matches) — the apiserver's rules (labels.Requirement.Matches)
MATCHES = [
    ("!sharding.fluxcd.io/key", {}, True),
    ("!sharding.fluxcd.io/key", {SHARD_LABEL: "shard1"}, False),
    ("!sharding.fluxcd.io/key", {SHARD_LABEL: ""}, False),
    ("sharding.fluxcd.io/key=shard1", {SHARD_LABEL: "shard1"}, True),
    ("sharding.fluxcd.io/key=shard1", {SHARD_LABEL: "shard2"}, False),
    ("sharding.fluxcd.io/key=shard1", {}, False),
    ("team!=a", {}, True),
    ("team!=a", {"team": "a"}, False),
    ("team!=a", {"team": "b"}, True),
    ("team notin (a,b)", {}, True),
    ("team notin (a,b)", {"team": "b"}, False),
    ("team in (a,b)", {"team": "b"}, True),
    ("team in (a,b)", {}, False),
    ("team", {"team": ""}, True),
    ("team", {}, False),
    ("n>2", {"n": "3"}, True),
    ("n>2", {"n": "2"}, False),
    ("n>2", {"n": "x"}, False),
    ("n<2", {"n": "-5"}, True),
    ("n<2", {}, False),
    ("team=a,tier=web", {"team": "a", "tier": "web"}, True),
    ("team=a,tier=web", {"team": "a"}, False),
]


@pytest.mark.parametrize(("text", "labels", "expected"), MATCHES)
def test_matching_follows_the_apiserver(text: str, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is expected


# (selector, the shard it serves: "" main, None none in Flux's convention)
SHARDS = [
    ("sharding.fluxcd.io/key=shard1", "shard1"),
    ("sharding.fluxcd.io/key in (shard1)", "shard1"),
    ("team=a,sharding.fluxcd.io/key=shard1", "shard1"),
    ("!sharding.fluxcd.io/key", ""),
    ("team=a,!sharding.fluxcd.io/key", ""),
    ("sharding.fluxcd.io/key in (shard1,shard2)", None),
    ("sharding.fluxcd.io/key!=shard1", None),
    ("sharding.fluxcd.io/key", None),
    ("team=a", None),
]


@pytest.mark.parametrize(("text", "shard"), SHARDS)
def test_the_shard_a_selector_serves(text: str, shard: str | None) -> None:
    assert LabelSelector.parse(text).shard == shard


# (selector, an object's labels, whether they name the selector's shard): only the shard label counts
NAMES_SHARD = [
    ("!sharding.fluxcd.io/key", {}, True),
    ("!sharding.fluxcd.io/key", {"sharding.fluxcd.io/key": "shard1"}, False),
    ("team=a,!sharding.fluxcd.io/key", {}, True),
    ("sharding.fluxcd.io/key=shard1", {}, False),
    ("sharding.fluxcd.io/key=shard1", {"sharding.fluxcd.io/key": "shard1"}, True),
    ("team=a,sharding.fluxcd.io/key=shard1", {"sharding.fluxcd.io/key": "shard1"}, True),
    ("sharding.fluxcd.io/key=shard1", {"sharding.fluxcd.io/key": "shard2"}, False),
    ("team=a", {}, True),
]


@pytest.mark.parametrize(("text", "labels", "expected"), NAMES_SHARD)
def test_an_objects_shard_label_names_one_shard_and_other_requirements_do_not_count(
    text: str, labels: dict[str, str], expected: bool
) -> None:
    assert LabelSelector.parse(text).names_shard_of(labels) is expected


def test_the_unserved_selector_selects_exactly_keys_no_shard_serves() -> None:
    main = LabelSelector.parse("team=a,!sharding.fluxcd.io/key")
    unserved = main.unserved(("shard2", "shard1", "shard2"))
    assert str(unserved) == "sharding.fluxcd.io/key,sharding.fluxcd.io/key notin (shard1,shard2),team=a"
    assert unserved.matches({"team": "a", SHARD_LABEL: "shard3"})
    assert not unserved.matches({"team": "a", SHARD_LABEL: "shard1"})
    assert not unserved.matches({"team": "a"})  # the main shard's own
    assert not unserved.matches({"team": "b", SHARD_LABEL: "shard3"})  # not this release's at all
    assert str(main.unserved(())) == "sharding.fluxcd.io/key,team=a"


def test_shard_keys_are_label_values() -> None:
    assert parse_shard_keys(" shard2,shard1,,shard2 ") == ("shard1", "shard2")
    with pytest.raises(SelectorError, match="'-x'"):
        parse_shard_keys("ok,-x")


def test_messages_name_the_key_and_the_shards_but_nothing_of_another_namespace() -> None:
    text = unserved_message(kind="StageSet", key="shard3", shard_keys=("shard1", "shard2"))
    assert "sharding.fluxcd.io/key='shard3'" in text
    assert "shard1, shard2" in text
    selector = LabelSelector.parse("sharding.fluxcd.io/key=shard1")
    own = foreign_source_message(what="GitRepository team/app", selector=selector, cross_namespace=False)
    assert "sharding.fluxcd.io/key=shard1" in own
    assert "give it this StageSet's" in own
    cross = foreign_source_message(what="GitRepository other/app", selector=selector, cross_namespace=True)
    assert "another shard fetches it" in cross
    assert "give it" not in cross


# -- the flags ------------------------------------------------------------------------------------


def test_flags_reach_the_settings() -> None:
    settings = controller_settings({
        "watch_label_selector": LABEL_SELECTOR.convert("!sharding.fluxcd.io/key", None, None),
        "shard_keys": SHARD_KEYS.convert("shard1,shard2", None, None)}, temporary_mirrors=False)
    assert str(settings.watch_label_selector) == "!sharding.fluxcd.io/key"
    assert settings.shard_keys == ("shard1", "shard2")
    plain = controller_settings({"watch_label_selector": LABEL_SELECTOR.convert("", None, None),
                                 "shard_keys": SHARD_KEYS.convert("", None, None)}, temporary_mirrors=False)
    assert plain.watch_label_selector is None
    assert plain.shard_keys is None


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--watch-label-selector", "a b"], {}, "an operator"),
    (["--watch-label-selector", "sharding.fluxcd.io/key=shard1", "--shard-keys", "shard2"], {}, "main shard"),
    (["--shard-keys", "shard2"], {}, "main shard"),
    (["--watch-label-selector", "!sharding.fluxcd.io/key", "--shard-keys", "-bad"], {}, "not label values"),
    ([], {"STAGESET_WATCH_LABEL_SELECTOR": "x in y"}, "'(' expected"),
])
def test_bad_shard_flags_are_usage_errors(args: list[str], env: dict[str, str], words: str) -> None:
    result = CliRunner().invoke(controller, args, env=env)
    assert result.exit_code == 2, result.output
    assert words in result.output
