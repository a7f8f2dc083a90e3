"""Go duration strings (``"1m30s"``, ``"500ms"``, ``"1h"``) as Python ``timedelta``.

Our spec fields (``interval``, ``timeout`` ...) keep the string form users know from
Flux and ``kubectl``; the controller needs a ``timedelta``.  :func:`parse_duration`
accepts exactly what Go's ``time.ParseDuration`` accepts, while
:data:`DURATION_PATTERN` — used by the CRD schema and the pydantic models — is the
stricter, unsigned subset that Flux's CRDs accept (``"5m"``, ``"1h30m"``,
``"1.5s"``), so every admitted value also parses in Go tooling.
"""

from __future__ import annotations

import datetime
import re

# Unsigned Go durations as Flux spells them; Greek mu and the micro sign both mean µ in Go.
DURATION_PATTERN = r"^([0-9]+([.][0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$"

_NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
# One "<number><unit>" term, with Go's number forms: "1", "1.5", "1.", ".5".
_TERM = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(s: str) -> datetime.timedelta:
    """Parse a Go duration string (``time.ParseDuration`` syntax) into a ``timedelta``.

    Precision below a microsecond is truncated towards zero, as ``timedelta`` cannot
    hold it.  Raises ``ValueError`` for anything Go would refuse.
    """
    text = s
    sign = 1
    if text[:1] in ("-", "+"):
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return datetime.timedelta(0)
    if not text:
        raise ValueError(f"invalid duration {s!r}")
    total = 0
    position = 0
    while position < len(text):
        match = _TERM.match(text, position)
        if match is None:
            rest = text[position:]
            raise ValueError(f"invalid duration {s!r}: expected <number><unit> at {rest!r}")
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not whole and not fraction:
            raise ValueError(f"invalid duration {s!r}: a number is missing before {unit!r}")
        scale = _NANOSECONDS[unit]
        total += int(whole or "0") * scale
        if fraction:
            # Exact integer arithmetic: 1.5h must not pick up float rounding.
            total += int(fraction) * scale // 10 ** len(fraction)
        position = match.end()
    try:
        return datetime.timedelta(microseconds=sign * (total // 1_000))
    except OverflowError as error:
        raise ValueError(f"invalid duration {s!r}: out of range") from error
