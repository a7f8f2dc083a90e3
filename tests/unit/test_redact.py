"""Secret values out of messages, in every form an echo may take."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from stageset.controller.redact import MASK, LogRedactor, Redactor, Registry, forms, go_quote

VALUES = ["s3cr3t-Label_Value", 'quote"back\\slash', "naïve ünïcode", "tab\there\nnewline", "Bad Name!"]


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain", "plain"),
        ('a"b', 'a\\"b'),
        ("a\\b", "a\\\\b"),
        ("a\nb\tc", "a\\nb\\tc"),
        ("\x00\x7f", "\\x00\\x7f"),
        ("é", "é"),
    ],
)
def test_go_quote_matches_strconv_quote(value: str, quoted: str) -> None:
    assert go_quote(value) == quoted


def test_go_quote_to_ascii() -> None:
    assert go_quote("é☃😀", ascii_only=True) == "\\u00e9\\u2603\\U0001f600"


@pytest.mark.parametrize("value", VALUES)
def test_every_echo_of_a_value_is_redacted(value: str) -> None:
    redact = Redactor([value])
    echoes = [
        f'metadata.labels: Invalid value: "{go_quote(value)}": a valid label must be ...',
        f'spec.rules[0].host: Invalid value: "{go_quote(value, ascii_only=True)}"',
        f"body: {json.dumps({'name': value})}",
        f"body: {json.dumps({'name': value}, ensure_ascii=False)}",
        f"yaml: {yaml.safe_dump({'k': value})}",
        f"yaml: {yaml.safe_dump({'k': value}, default_style=chr(39))}",
        f"yaml: {yaml.safe_dump({'k': value}, default_style=chr(34))}",
        f"python: {value!r}",
        f"raw: {value}",
    ]
    for echo in echoes:
        redacted = redact(echo)
        assert value not in redacted, echo
        for form in forms(value):
            assert form not in redacted, (echo, form)
        assert MASK in redacted


def test_short_values_are_redacted_only_as_whole_tokens() -> None:
    redact = Redactor(["42"])
    assert redact("replicas 42 of 420") == f"replicas {MASK} of 420"


def test_values_inside_longer_values_and_overlaps() -> None:
    redact = Redactor(["abcdef", "abcdefghij"])
    assert redact("x abcdefghij y abcdef z") == f"x {MASK} y {MASK} z"


def test_a_redactor_records_what_this_pass_added() -> None:
    redact = Redactor(["old-value"])
    redact.add(["new-value", ""])
    assert redact.added == {"new-value"}
    assert redact.values == {"old-value", "new-value"}


def test_the_log_filter_redacts_messages_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry()
    registry.set(("StageSet", "a", "b"), ["hunter2-password"])
    logger = logging.getLogger("test.redact")
    caplog.handler.addFilter(LogRedactor(registry))
    try:
        raise ValueError('Invalid value: "hunter2-password"')
    except ValueError:
        logger.exception("failed with %s", "hunter2-password")
    assert "hunter2-password" not in caplog.text
    assert f"failed with {MASK}" in caplog.text
    assert f'Invalid value: "{MASK}"' in caplog.text
    registry.drop(("StageSet", "a", "b"))
    logger.warning("now %s", "hunter2-password")
    assert caplog.records[-1].getMessage() == "now hunter2-password"
