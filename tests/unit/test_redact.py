"""Secret values out of messages, in every form an echo may take."""

from __future__ import annotations

import base64
import html
import json
import logging
import re
from collections.abc import Callable
from urllib.parse import quote, quote_plus, urlencode

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stageset.controller.redact import (
    MASK,
    MIN_ANYWHERE,
    MIN_CUT,
    LogRedactor,
    Redactor,
    Registry,
    bounded,
    forms,
    go_quote,
)

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


# -- every common encoding, generated -------------------------------------------------------------

ENCODERS: dict[str, Callable[[str], str]] = {
    "raw": lambda v: v,
    "url": lambda v: quote(v, safe=""),
    "url-path": quote,
    "url-lower": lambda v: re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(v, safe="")),
    "form": quote_plus,
    "form-urlencode": lambda v: urlencode({"token": v}),
    "hex": lambda v: v.encode().hex(),
    "HEX": lambda v: v.encode().hex().upper(),
    "html": html.escape,
    "html-numeric": lambda v: "".join(c if c.isascii() and c.isalnum() else f"&#{ord(c)};" for c in v),
    "html-hex": lambda v: "".join(c if c.isascii() and c.isalnum() else f"&#x{ord(c):X};" for c in v),
    "xml": lambda v: html.escape(v).encode("ascii", "xmlcharrefreplace").decode(),
    "json": lambda v: json.dumps(v),
    "json-utf8": lambda v: json.dumps({"echo": v}, ensure_ascii=False),
    "go": go_quote,
    "python": repr,
    "base64": lambda v: base64.b64encode(v.encode()).decode(),
    "base64url": lambda v: base64.urlsafe_b64encode(v.encode()).decode(),
    "base64-in-1": lambda v: base64.b64encode(b"{" + v.encode() + b"}").decode(),
    "base64-in-2": lambda v: base64.b64encode(b'{"' + v.encode() + b'"}').decode(),
    "base64-mime": lambda v: base64.encodebytes(b"user:" + v.encode() * 3).decode(),
    "html-of-url": lambda v: html.escape(quote(v)),
    "json-of-form": lambda v: json.dumps(quote_plus(v)),
}

WRAPPING = {"form-urlencode", "json-utf8", "base64-in-1", "base64-in-2", "base64-mime"}
"""Encoders that write more than the value (the split test cuts the value's own encoding)."""

SPLITTERS: dict[str, Callable[[str, int], str]] = {
    "newline": lambda t, at: t[:at] + "\n" + t[at:],
    "crlf-indent": lambda t, at: t[:at] + "\r\n    " + t[at:],
    "collapsed": lambda t, at: t[:at] + " " + t[at:],
    "json-newline": lambda t, at: t[:at] + "\\n" + t[at:],
    "html-br": lambda t, at: t[:at] + "<br>" + t[at:],
}

# Values as headers and tokens are: printable, at least a few characters, some punctuation.
secret_values = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")),
    min_size=MIN_ANYWHERE + 4, max_size=48,
).filter(lambda v: len("".join(v.split())) >= MIN_ANYWHERE + 4 and sum(c.isalnum() for c in v) >= 2)
around = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "Zs")), max_size=20)


def survives(value: str, text: str) -> list[str]:
    """The encodings of ``value`` (at least 8 characters of them) still in ``text``."""
    return [name for name, encode in ENCODERS.items()
            if len(encoded := encode(value)) >= 8 and encoded in text]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=secret_values, before=around, after=around, encoder=st.sampled_from(sorted(ENCODERS)))
def test_no_encoding_of_a_value_survives(value: str, before: str, after: str, encoder: str) -> None:
    echo = f"{before}{ENCODERS[encoder](value)}{after}"
    redacted = Redactor([value])(f"endpoint said: {echo}")
    assert MASK in redacted
    assert not survives(value, redacted), (encoder, redacted)
    assert value not in redacted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=secret_values, encoder=st.sampled_from(sorted(set(ENCODERS) - WRAPPING)),
       splitter=st.sampled_from(sorted(SPLITTERS)), where=st.floats(min_value=0.05, max_value=0.95))
def test_a_value_split_over_lines_is_masked(value: str, encoder: str, splitter: str, where: float) -> None:
    encoded = ENCODERS[encoder](value)
    at = max(1, int(len(encoded) * where))
    # An escaped line break right after a backslash reads as an escaped backslash and an "n".
    assume(splitter != "json-newline" or not encoded[:at].endswith("\\"))
    split = SPLITTERS[splitter](encoded, at)
    redacted = Redactor([value])(f"body: {split} end")
    assert MASK in redacted, (encoder, splitter, redacted)
    for piece in re.split(r"\s+|\\n|<br>", split):
        # Neither half of the split is left that tells more than a few characters.
        assert len(piece) < MIN_CUT or piece not in redacted, (encoder, splitter, piece, redacted)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=secret_values, encoder=st.sampled_from(sorted(ENCODERS)),
       where=st.floats(min_value=0, max_value=1), mark=st.sampled_from(["...", "…", ""]))
def test_a_prefix_of_a_value_at_a_cut_is_masked(value: str, encoder: str, where: float, mark: str) -> None:
    encoded = ENCODERS[encoder](value)
    # A prefix is masked from MIN_CUT characters of the value on (an escape counts as one).
    least = len(ENCODERS[encoder](value[: MIN_CUT + 1]))
    assume(least < len(encoded) - 1)
    cut = encoded[: least + int((len(encoded) - 1 - least) * where)]
    redacted = Redactor([value])(f"body: {cut}{mark}", cut=not mark)
    assert cut not in redacted, (encoder, redacted)
    assert MASK in redacted


@pytest.mark.parametrize(("value", "echo"), [("00000 \u00a100", '"00000 \\u00a10...'),
                                             ("00000 \u00a100", "00000 \\u00a1..."),
                                             ("00000 +00", "\"00000 +0..."),
                                             ("ab cd \u00e9fgh", "x ab cd \\xe9f...")])
def test_a_prefix_is_masked_when_a_blank_stands_before_an_escape(value: str, echo: str) -> None:
    """A blank's spellings include a lone backslash (an escaped blank, squeezed): the prefix is
    still found when the next character's escape starts with one."""
    redacted = Redactor([value])(echo)
    assert MASK in redacted, redacted


@pytest.mark.parametrize("echo", ["x 00000\\r00 y", "body: 00000\\r...", "a\\nb 00000\\r00", "00000\\r\n00"])
def test_a_value_holding_a_backslash_before_r_or_n_is_masked(echo: str) -> None:
    """A backslash and an ``r`` in the value itself is not an escaped line break to take out."""
    redacted = Redactor(["00000\\r00"])(echo, cut=False)
    assert MASK in redacted, redacted
    assert "00000\\r" not in redacted, redacted


@given(value=secret_values, filler=st.integers(min_value=0, max_value=400))
@settings(max_examples=60, deadline=None)
def test_bounded_redacts_before_it_cuts(value: str, filler: int) -> None:
    redact = Redactor([value])
    text = "x" * filler + quote(value, safe="") + " trailing words"
    out = bounded(text, limit=256, redact=redact)
    assert len(out) <= 256
    encoded = quote(value, safe="")
    for size in range(MIN_CUT, len(encoded) + 1):
        assert encoded[:size] not in out or encoded[:size] in "x" * filler, (size, out)


def test_the_attack_encodings_of_a_bearer_token_are_all_masked() -> None:
    """The echoes that leaked before: URL- and form-encoded, hex, HTML-escaped, split, cut."""
    header = "Bearer tok_9c2e81d4b5a0/Zq+w=="
    redact = Redactor([header, "tok_9c2e81d4b5a0/Zq+w=="])
    echoes = [quote(header), quote_plus(header), header.encode().hex(), html.escape(f"<{header}>"),
              header[:15] + "\n" + header[15:], "x" * 230 + header[:26] + "..."]
    for echo in echoes:
        out = redact(f"error page: {echo}")
        assert "9c2e81" not in out, out
        assert b"9c2e81".hex() not in out, out
