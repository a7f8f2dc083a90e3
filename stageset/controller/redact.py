"""Secret values out of every message the controller writes: status, events, logs.

Values a StageSet substitutes from Secrets (``postBuild.substituteFrom`` kind Secret) end up
in manifests, and the apiserver echoes manifests back in its errors ("metadata.labels:
Invalid value: \\"...\\"").  Anyone with ``view`` on the StageSet reads its status and
events, and the platform team reads the logs; neither may read the Secret.  So:

- a :class:`Redactor` holds the values one StageSet read from Secrets, and replaces each
  of them — raw and in every quoted form an echo may take (JSON-escaped, YAML-quoted,
  Go-quoted as the apiserver prints ``%q``/``%#v``, Python ``repr``, base64) — with ``***``.
  :meth:`StatusReport.write <stageset.controller.status.StatusReport.write>` and
  :meth:`EventRecorder.emit <stageset.controller.events.EventRecorder.emit>` run every
  message through the StageSet's own redactor (only its own values: redacting another
  tenant's values would tell this tenant which strings are secret somewhere);
- :data:`REGISTRY` remembers every StageSet's values, and :class:`LogRedactor` (installed on
  the log handlers by the CLI) removes all of them from every log line and traceback.

Values shorter than :data:`MIN_ANYWHERE` characters are redacted only where they stand as
a whole token (not inside a longer word), or every "1" in every message would go.

Matching stays fast however many values there are (a SOPS file may decrypt to hundreds): the
forms of a value are computed once (cached), and the long ones are matched by one RE2
automaton (``google-re2``: linear in the text, where Python's ``re`` tries every alternative
at every position — 130 ms per message at 1,000 values, against 3 ms).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Hashable, Iterable

import re2
import yaml

MASK = "***"
MIN_ANYWHERE = 4


def go_quote(value: str, *, ascii_only: bool = False) -> str:
    """The inside of Go's ``strconv.Quote`` (``QuoteToASCII`` with ``ascii_only``)."""
    out: list[str] = []
    simple = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
              "\\": "\\\\", '"': '\\"'}
    for char in value:
        code = ord(char)
        if char in simple:
            out.append(simple[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code > 0x7E and (ascii_only or not char.isprintable()):
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


def _yaml_quoted(value: str) -> set[str]:
    """The inside of the value as YAML writes it quoted (single, double; ASCII or not)."""
    found = {value.replace("'", "''")}
    for style in ('"', "'"):
        for unicode in (False, True):
            dumped = yaml.safe_dump(value, default_style=style, allow_unicode=unicode, width=10**9)
            text = dumped.removesuffix("\n").removesuffix("...").rstrip("\n")
            if len(text) >= 2 and text[0] == text[-1] == style:
                found.add(text[1:-1])
    return found


def forms(value: str) -> set[str]:
    """The value as it may appear in a message: raw, and escaped the ways echoes escape it."""
    found = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        go_quote(value),
        go_quote(value, ascii_only=True),
        *_yaml_quoted(value),
        repr(value)[1:-1],
        base64.b64encode(value.encode()).decode().rstrip("="),
    }
    # An echo may show one line of a multi-line value.
    found.update(line for line in value.splitlines() if len(line.strip()) >= MIN_ANYWHERE)
    return {f for f in found if f}


@functools.lru_cache(maxsize=1 << 16)
def _cached_forms(value: str) -> frozenset[str]:
    return frozenset(forms(value))


_RE2_MEMORY = 256 << 20
"""Bytes RE2 may use for one automaton (its DFA grows lazily, with the texts it scans)."""


class _Pattern:
    """Long forms through one RE2 alternation; short forms, as whole tokens, through ``re``
    (RE2 has no look-behind)."""

    def __init__(self, alternatives: list[str]):
        long = [f for f in alternatives if len(f) >= MIN_ANYWHERE]
        short = [f for f in alternatives if len(f) < MIN_ANYWHERE]
        options = re2.Options()
        options.max_mem = _RE2_MEMORY
        self._long = re2.compile("|".join(re2.escape(f) for f in long), options=options) if long else None
        self._short = re.compile("|".join(rf"(?<![A-Za-z0-9]){re.escape(f)}(?![A-Za-z0-9])" for f in short)) \
            if short else None

    def sub(self, mask: str, text: str) -> str:
        if self._long is not None:
            text = self._long.sub(mask, text)
        if self._short is not None:
            text = self._short.sub(mask, text)
        return text


def _pattern(values: Iterable[str]) -> _Pattern | None:
    # Longest first: where two forms start at one place, the longer one is masked whole.
    alternatives = sorted({f for v in values for f in _cached_forms(v)}, key=len, reverse=True)
    return _Pattern(alternatives) if alternatives else None


class Redactor:
    """The Secret values of one StageSet; calling it redacts a text.  Thread-safe (stages of a
    pass render concurrently and add their values).  ``on_add`` hears every new set of values
    as soon as one is read (the reconciler registers them for the log filter at once, so a line
    logged later in the same pass is redacted too)."""

    def __init__(self, values: Iterable[str] = (), *,
                 on_add: Callable[[frozenset[str]], None] | None = None):
        self._lock = threading.Lock()
        self._values: set[str] = {v for v in values if v}
        self._added: set[str] = set()
        self._pattern: _Pattern | None = _pattern(self._values)
        self._on_add = on_add

    def add(self, values: Iterable[str]) -> None:
        fresh = {v for v in values if v}
        with self._lock:
            self._added |= fresh
            if fresh <= self._values:
                return
            self._values |= fresh
            self._pattern = _pattern(self._values)
            known = frozenset(self._values)
        if self._on_add is not None:
            self._on_add(known)

    @property
    def added(self) -> frozenset[str]:
        """The values added since construction (read in this pass)."""
        with self._lock:
            return frozenset(self._added)

    @property
    def values(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._values)

    def __call__(self, text: str) -> str:
        with self._lock:
            pattern = self._pattern
        return text if pattern is None or not text else pattern.sub(MASK, text)


class Registry:
    """Every StageSet's Secret values, for the log filter (the platform team's logs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: dict[Hashable, frozenset[str]] = {}
        self._redactor = Redactor()

    def set(self, owner: Hashable, values: Iterable[str]) -> None:
        fresh = frozenset(v for v in values if v)
        with self._lock:
            if self._by_owner.get(owner, frozenset()) == fresh:
                return
            self._by_owner[owner] = fresh
            self._redactor = Redactor(v for vs in self._by_owner.values() for v in vs)

    def of(self, owner: Hashable) -> frozenset[str]:
        with self._lock:
            return self._by_owner.get(owner, frozenset())

    def drop(self, owner: Hashable) -> None:
        with self._lock:
            if self._by_owner.pop(owner, None) is not None:
                self._redactor = Redactor(v for vs in self._by_owner.values() for v in vs)

    def __call__(self, text: str) -> str:
        with self._lock:
            redactor = self._redactor
        return redactor(text)


REGISTRY = Registry()


class LogRedactor(logging.Filter):
    """A handler filter: every registered Secret value out of the message and the traceback."""

    def __init__(self, registry: Registry = REGISTRY):
        super().__init__()
        self._registry = registry
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self._registry(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._registry(record.exc_text)
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Put :class:`LogRedactor` on every handler of ``logger`` (the root logger by default)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, LogRedactor) for f in handler.filters):
            handler.addFilter(LogRedactor())
