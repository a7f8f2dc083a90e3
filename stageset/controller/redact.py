"""Secret values out of every message the controller writes -- status, events, logs, the CLI --
in any common encoding an echo may give them.

Identity: none; this module only rewrites text.  Its users are the status writer
(:class:`~stageset.controller.status.StatusWriter`), the event recorder
(:meth:`EventRecorder.emit <stageset.controller.events.EventRecorder.emit>`), the log filter
(:class:`LogRedactor`, installed on every handler by :func:`stageset.controller.logs.setup`) and the
CLI's ``render``/``diff``/``preview`` (their own :class:`Redactor`).

Values a StageSet reads from Secrets (``postBuild.substituteFrom``, SOPS files, an ``http``
action's ``headersFrom``/``bodyFrom``) end up in manifests and requests, and whoever answers may
echo them: the apiserver in its errors ("Invalid value: \\"...\\""), an endpoint in its error page.
Anyone with ``view`` on the StageSet reads its status and events, and the platform team reads the
logs; neither may read the Secret.  So:

- a :class:`Redactor` holds the values one StageSet read from Secrets and replaces each of them with
  ``***`` in every form below (only its own values: redacting another tenant's values would tell
  this tenant which strings are secret somewhere);
- :data:`REGISTRY` remembers every StageSet's values, and :class:`LogRedactor` removes all of them
  from every log line and traceback.

**What is masked**, for each value of at least :data:`MIN_ANYWHERE` characters (shorter ones only
where they stand as a whole token, or every "1" in every message would go):

- *the encodings*: the value, each of its lines, its hex (lower or upper case) and its base64
  (standard and URL-safe alphabets, at each of the three alignments it can have inside a longer
  encoded text) -- each made with the standard library's encoders (:func:`forms` lists them);
- *the escapes*: any character of those spelled as an escape -- URL or form encoding (``%XX`` in
  either case, ``+`` for a space), HTML/XML entities (named, decimal, hex), JSON, Go, Python and YAML
  string escapes (``\\"``, ``\\n``, ``\\xXX``, ``\\uXXXX`` with surrogate pairs, ``\\UXXXXXXXX``),
  a backslash before punctuation, ``''`` for a quote; ASCII letters and digits only as themselves
  (no standard encoder escapes them);
- *split over lines*: whitespace, an escaped line break (``\\n``) or ``<br>`` between any two
  characters (an echo wrapped at 76 columns, or a message whose whitespace was collapsed);
- *a prefix at a cut*: at least :data:`MIN_CUT` characters of the start of any of those where a text
  was cut -- before ``...`` or ``…`` (how this project, the apiserver and most servers mark a cut),
  and at the end of a text the caller says was cut (``cut=True``), a half-written escape included.

Beyond that no redactor can go (an echo may hash, reverse or re-encode a value twice), which is why
an ``http`` action shows nothing of a response to a request that carried a Secret's value
(``docs/actions.md``).  **Order**: a text is redacted whole, then cut (:func:`bounded`); a cut made
before redaction (by a server, or code that bounds what it quotes) is what the prefix rule is for.

Matching stays fast however many values there are (a SOPS file may decrypt to hundreds): the forms
of a value are computed once (cached), and all of them are matched by one RE2 automaton
(``google-re2``: linear in the text, where Python's ``re`` tries every alternative at every
position).  Prefixes are looked for only in texts with a cut: one RE2 set finds which forms start
there, and only those are followed to the cut.
"""

from __future__ import annotations

import base64
import bisect
import functools
import html
import html.entities
import json
import logging
import re
import threading
from collections.abc import Callable, Hashable, Iterable
from urllib.parse import quote, quote_plus

import re2
import yaml

MASK = "***"
MIN_ANYWHERE = 4
"""Values at least this long are masked wherever they stand (inside words too)."""
MIN_CUT = 6
"""Characters of a value's start that are masked before a cut (fewer tell too little to guess by,
and would mask common word stems at the end of every message)."""
CUT_MARKS = ("...", "\u2026")
"""How a cut is marked (``bounded`` writes ``...``)."""

_SEPARATOR = re.compile(r"\s+|(?:(?<!\\)\\[rn]|<[bB][rR]\s*/?>)+")
"""What may stand between two characters of a value split over lines: blanks, an escaped line
break (not an escaped backslash before an ``n``), an HTML line break.  Texts are matched with
these taken out (:class:`_Squeezed`), so a value is found however its echo was wrapped."""
_FOLDED = re.compile(r"\\[\r\n]\s*|" + _SEPARATOR.pattern)
"""The same, with YAML's fold of a double-quoted line (a backslash before the line break, taken out
too); a text with one is matched both ways (the backslash may as well start an escape)."""
_UNESCAPED = re.compile(r"\s+|(?:<[bB][rR]\s*/?>)+")
"""The separators without the escaped line break: a text with a backslash before an ``r`` or ``n``
is matched this way too, since the value itself may hold that backslash (``ab\\rcd`` as written)."""
_PARTIAL = r"(?:%[0-9A-Fa-f]{0,2}|\\[xuU]?\{?[0-9A-Fa-f]*)*(?:&#?[xX]?[0-9A-Za-z]*)?"
"""A half-written escape (or character: some of its UTF-8 bytes) between a prefix and its cut."""


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


def base64_windows(data: bytes) -> set[str]:
    """The base64 characters that ``data`` alone decides wherever it stands in a longer encoded
    text: for each of the three alignments (0, 1 or 2 bytes before it in its group of three), the
    characters whose six bits all come from ``data``; standard and URL-safe alphabets."""
    found: set[str] = set()
    for before in range(3):
        encoded = base64.b64encode(bytes(before) + data).decode("ascii")
        window = encoded[(8 * before + 5) // 6: (8 * (before + len(data))) // 6]
        found |= {window, window.translate(_URLSAFE)}
    return {w for w in found if w}


_URLSAFE = str.maketrans("+/", "-_")


def forms(value: str) -> set[str]:
    """The value as the standard encoders write it -- every one of these is masked (and more: see
    the module's doc).  Tests assert that none of them survives a redaction."""
    data = value.encode("utf-8", "surrogatepass")
    found = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        go_quote(value),
        go_quote(value, ascii_only=True),
        *_yaml_quoted(value),
        repr(value)[1:-1],
        quote(value, safe=""),
        quote(value),
        quote_plus(value),
        re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(value, safe="")),  # lower-case escapes
        html.escape(value),
        html.escape(value, quote=False),
        value.encode("ascii", "xmlcharrefreplace").decode("ascii"),
        data.hex(),
        data.hex().upper(),
        base64.b64encode(data).decode("ascii").rstrip("="),
        base64.urlsafe_b64encode(data).decode("ascii").rstrip("="),
        *base64_windows(data),
    }
    # An echo may show one line of a multi-line value.
    found.update(line for line in value.splitlines() if len(line.strip()) >= MIN_ANYWHERE)
    return {f for f in found if f}


def _bases(value: str) -> set[str]:
    """What the pattern is built from (the escapes of each character come from :func:`_unit`)."""
    data = value.encode("utf-8", "surrogatepass")
    found = {value, data.hex(), data.hex().upper()}
    found.update(line for line in value.splitlines() if len(line.strip()) >= MIN_ANYWHERE)
    return found


def _hex(number: int, width: int) -> str:
    """``number`` in hex as a pattern that takes either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{number:0{width}x}")


@functools.cache
def _named_entities() -> dict[str, tuple[str, ...]]:
    """HTML5's named character references, by the character they stand for."""
    by_char: dict[str, list[str]] = {}
    for name, char in html.entities.html5.items():
        if len(char) == 1:
            by_char.setdefault(char, []).append(name)
    return {char: tuple(names) for char, names in by_char.items()}


@functools.lru_cache(maxsize=1 << 14)
def _unit(char: str) -> str:
    """A pattern for one character of a value, spelled as itself or as any common escape (on a
    squeezed text: a spelling that is a separator, such as a blank or ``\\n``, is taken out there,
    so the character may be missing)."""
    if char.isascii() and char.isalnum():
        return char
    point, data = ord(char), char.encode("utf-8", "surrogatepass")
    literal = {char, html.escape(char), json.dumps(char)[1:-1], go_quote(char),
               go_quote(char, ascii_only=True),
               char.encode("unicode_escape").decode("ascii"), repr(char)[1:-1], *_yaml_quoted(char),
               *(f"&{name}" for name in _named_entities().get(char, ()))}
    if char.isascii() and char.isprintable():
        literal.add(f"\\{char}")  # a backslash before punctuation (JSON's \/, shells, regexes)
    if char == " ":
        literal.add("+")  # form encoding
    squeezed = {_SEPARATOR.sub("", spelling) for spelling in literal}
    patterns = {re2.escape(spelling) for spelling in squeezed if spelling}
    patterns |= {
        "".join(f"%{_hex(b, 2)}" for b in data),  # URL and form encoding
        f"&#0*{point};?", f"&#[xX]0*{_hex(point, 1)};?",  # HTML and XML character references
        "".join(f"\\\\x{_hex(b, 2)}" for b in data),  # byte escapes
        f"\\\\U{_hex(point, 8)}", f"\\\\u\\{{0*{_hex(point, 1)}\\}}",
    }
    if point < 0x100:
        patterns.add(f"\\\\x{_hex(point, 2)}")
    if point < 0x10000:
        patterns.add(f"\\\\u{_hex(point, 4)}")
    else:
        high, low = 0xD800 + ((point - 0x10000) >> 10), 0xDC00 + ((point - 0x10000) & 0x3FF)
        patterns.add(f"\\\\u{_hex(high, 4)}\\\\u{_hex(low, 4)}")  # JSON's surrogate pair
    alternatives = "(?:" + "|".join(sorted(patterns, key=lambda p: (-len(p), p))) + ")"
    return alternatives + "?" if "" in squeezed else alternatives


@functools.lru_cache(maxsize=1 << 16)
def _value_forms(value: str) -> tuple[tuple[str, ...], ...]:
    """Every form of ``value``, each a sequence of character patterns.  (A base64 window leaves the
    character it shares with a neighbour at either end: at most four bits of the value, mixed with
    the neighbour's.)"""
    data = value.encode("utf-8", "surrogatepass")
    found: list[tuple[str, ...]] = []
    for base in _bases(value):
        if len("".join(base.split())) >= MIN_ANYWHERE:  # blanks may be squeezed out of an echo
            found.append(tuple(map(_unit, base)))
    for window in base64_windows(data):
        if len(window) >= MIN_ANYWHERE:
            found.append(tuple(map(_unit, window)))
    return tuple(found)


_RE2_MEMORY = 256 << 20
"""Bytes RE2 may use for one automaton (its DFA grows lazily, with the texts it scans)."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _RE2_MEMORY
    return options


@functools.lru_cache(maxsize=1 << 12)
def _compiled(pattern: str) -> re2._Regexp:
    return re2.compile(pattern, options=_options())


_CUT_AHEAD = re2.compile(_PARTIAL + "(?:" + "|".join(re2.escape(m) for m in CUT_MARKS) + ")")
_PARTIAL_TO_END = re2.compile(_PARTIAL + "$")


class _Squeezed:
    """A text with its separators (:data:`_SEPARATOR`) taken out, and the way back: a span of the
    squeezed text to the span of the text it came from."""

    def __init__(self, text: str, separators: re.Pattern[str] = _SEPARATOR):
        parts: list[str] = []
        self._breaks: list[int] = []  # squeezed positions where text was taken out
        self._removed: list[int] = []  # how much was taken out up to (and at) each break
        at, removed = 0, 0
        for match in separators.finditer(text):
            parts.append(text[at:match.start()])
            removed += match.end() - match.start()
            self._breaks.append(match.start() - (removed - (match.end() - match.start())))
            self._removed.append(removed)
            at = match.end()
        parts.append(text[at:])
        self.text = "".join(parts)

    def start(self, position: int) -> int:
        """Where the character at squeezed ``position`` stands in the original."""
        index = bisect.bisect_right(self._breaks, position) - 1
        return position + (self._removed[index] if index >= 0 else 0)

    def end(self, position: int) -> int:
        """Where a span ending at squeezed ``position`` ends in the original (separators inside
        the span are in it; one just after it is not)."""
        return self.start(position - 1) + 1 if position > 0 else 0


class _Prefixes:
    """The starts of the forms (:data:`MIN_CUT` characters each), to find a form cut short."""

    def __init__(self, forms: Iterable[tuple[str, ...]]):
        self._forms = [units for units in forms if len(units) > MIN_CUT]
        self._set = re2.Set.SearchSet(_options()) if self._forms else None
        self._heads: list[str] = []
        for units in self._forms:
            assert self._set is not None
            head = "".join(units[:MIN_CUT])
            self._set.Add(head)
            self._heads.append(head)
        if self._set is not None:
            self._set.Compile()

    def spans(self, text: str, *, cut: bool) -> list[tuple[int, int]]:
        """Where a form starts and runs, unbroken, into a cut mark (or the end of a cut text)."""
        if self._set is None:
            return []
        found: list[tuple[int, int]] = []
        for index in self._set.Match(text) or ():
            units, head, start = self._forms[index], _compiled(self._heads[index]), 0
            while (match := head.search(text, start)) is not None:
                end = self._cut_after(text, match.start(), units, cut=cut)
                if end is not None:
                    found.append((match.start(), end))
                start = match.start() + 1
        return found

    @staticmethod
    def _cut_after(text: str, start: int, units: tuple[str, ...], *, cut: bool) -> int | None:
        """Where the prefix ends (half-written escape included) when the form, followed from
        ``start``, meets a cut at some point after its first :data:`MIN_CUT` units; ``None`` when it
        runs into anything else.  Every way through is followed: a unit that may be missing (a
        blank, taken out of a squeezed text) is also skipped, so one that could swallow the start
        of the next unit's escape (a space's ``\\`` before ``\\u00a1``) does not hide it."""
        best: int | None = None
        ways = {start}
        for index, unit in enumerate((*units, None)):
            if index >= MIN_CUT:
                for at in ways:
                    end: int | None = None
                    if (mark := _CUT_AHEAD.match(text, at)) is not None:
                        end = mark.end() - next(len(m) for m in CUT_MARKS
                                                if text.startswith(m, mark.end() - len(m)))
                    elif cut and (tail := _PARTIAL_TO_END.match(text, at)) is not None:
                        end = tail.end()
                    if end is not None and (best is None or end > best):
                        best = end
            if unit is None:
                return best
            optional = unit.startswith("(?:") and unit.endswith(")?")
            step = _compiled(unit[:-1] if optional else unit)
            ways = {m.end() for at in ways if (m := step.match(text, at)) is not None} | \
                (ways if optional else set())
            if not ways:
                return best
        return best


class _Pattern:
    """All forms through one RE2 alternation on the squeezed text; short values, as whole tokens,
    through ``re`` (RE2 has no look-behind); prefixes at a cut through :class:`_Prefixes`, built
    when first needed."""

    def __init__(self, values: Iterable[str]):
        values = set(values)
        short = sorted((v for v in values if len(v) < MIN_ANYWHERE), key=len, reverse=True)
        # Longest first: where two forms start at one place, the longer one is masked whole.
        self._forms = sorted({units for v in values if len(v) >= MIN_ANYWHERE for units in _value_forms(v)},
                             key=len, reverse=True)
        self._long = re2.compile("|".join("".join(u) for u in self._forms), options=_options()) \
            if self._forms else None
        self._short = re.compile("|".join(rf"(?<![A-Za-z0-9]){re.escape(v)}(?![A-Za-z0-9])" for v in short)) \
            if short else None
        self._lock = threading.Lock()
        self._prefixes: _Prefixes | None = None

    def _cut_prefixes(self) -> _Prefixes:
        with self._lock:
            if self._prefixes is None:
                self._prefixes = _Prefixes(self._forms)
            return self._prefixes

    def sub(self, mask: str, text: str, *, cut: bool) -> str:
        if self._long is not None:
            text = _masked(text, self._spans(text, self._full), mask)
            if cut or any(mark in text for mark in CUT_MARKS):
                prefixes = self._cut_prefixes()
                text = _masked(text, self._spans(text, lambda t: prefixes.spans(t, cut=cut)), mask)
        if self._short is not None:
            text = self._short.sub(mask, text)
        return text

    def _full(self, squeezed: str) -> list[tuple[int, int]]:
        assert self._long is not None
        # Most texts hold no value: one scan says so, before anything else is done.
        if self._long.search(squeezed) is None:
            return []
        return [(m.start(), m.end()) for m in self._long.finditer(squeezed) if m.end() > m.start()]

    @staticmethod
    def _spans(text: str, find: Callable[[str], list[tuple[int, int]]]) -> list[tuple[int, int]]:
        """What ``find`` finds in ``text`` squeezed (both ways when it has a YAML fold; also with no
        escaped line break taken out when it has a backslash before an ``r`` or ``n``, which may be
        the value's own), as spans of ``text``."""
        spans: list[tuple[int, int]] = []
        folded = "\\\n" in text or "\\\r" in text
        ways = [_SEPARATOR, _FOLDED] if folded else [_SEPARATOR]
        if "\\r" in text or "\\n" in text:
            ways.append(_UNESCAPED)
        for separators in ways:
            found = find(separators.sub("", text))
            if found:
                squeezed = _Squeezed(text, separators)
                spans += [(squeezed.start(start), squeezed.end(end)) for start, end in found]
        return spans


def _masked(text: str, spans: list[tuple[int, int]], mask: str) -> str:
    """``text`` with each span (they may overlap) replaced by one ``mask``."""
    if not spans:
        return text
    out: list[str] = []
    at = 0
    for start, end in sorted(spans):
        if end <= at:
            continue
        out.append(text[at:max(at, start)])
        if start >= at:
            out.append(mask)
        at = end
    out.append(text[at:])
    return "".join(out)


def _pattern(values: Iterable[str]) -> _Pattern | None:
    values = set(values)
    return _Pattern(values) if values else None


def bounded(text: str, *, limit: int, redact: Callable[[str], str]) -> str:
    """``text`` redacted whole, then cut to ``limit`` characters (marked ``...``) and redacted again
    (a start of a value that happens to end at the cut is masked too): what leaves for a field
    with a bound."""
    text = redact(text)
    if len(text) <= limit:
        return text
    return redact(text[: max(0, limit - 3)] + "...")


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

    def __call__(self, text: str, *, cut: bool = False) -> str:
        """``text`` with every form of every value masked; ``cut``: the text was cut at its end (a
        start of a value there is masked too)."""
        with self._lock:
            pattern = self._pattern
        return text if pattern is None or not text else pattern.sub(MASK, text, cut=cut)


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

    def __call__(self, text: str, *, cut: bool = False) -> str:
        with self._lock:
            redactor = self._redactor
        return redactor(text, cut=cut)


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
