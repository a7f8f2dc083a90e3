"""Links in tenant-written text (a runbook in a condition message, a URL in an event).  Pure.

Invariant: what :func:`linkify` returns is markup built only from escaped text and ``<a>``
elements whose ``href`` is an ``http://`` or ``https://`` URL taken from the text, escaped for an
attribute (so it cannot close the attribute or the element).  Any other scheme (``javascript:``,
``data:``) stays text.  Links open in a new tab without a referrer or an opener, matching the
pages' ``Referrer-Policy: same-origin`` (never a referrer to another origin).
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

# What a URL in a message may hold: no whitespace, quotes, angle brackets or backticks (a message
# quoting a URL ends it there); trailing punctuation belongs to the sentence, not the URL.
URL = re.compile(r"https?://[^\s\"'<>`]+", re.IGNORECASE)
_TRAILING = ".,;:!?)]}"
RUNBOOK = re.compile(r";?\s*runbook:\s*(\S+)\s*$")


def _url_end(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in _TRAILING:
        end -= 1
    return end


def link(url: str, text: str | None = None, *, css: str = "") -> Markup:
    """One ``<a>`` to an http(s) URL (anything else: the text alone, escaped)."""
    shown = escape(text if text is not None else url)
    if URL.fullmatch(url) is None:
        return shown
    klass = f' class="{escape(css)}"' if css else ""
    return Markup(f'<a{klass} href="{escape(url)}" rel="noopener noreferrer" target="_blank">'  # noqa: S704
                  f"{shown}</a>")  # every part escaped above


def linkify(text: object) -> Markup:
    """``text`` escaped, with each http(s) URL in it a link."""
    raw = "" if text is None else str(text)
    parts: list[str] = []
    position = 0
    for found in URL.finditer(raw):
        end = _url_end(raw, found.start(), found.end())
        if end <= found.start() + len("http://"):
            continue
        parts.append(str(escape(raw[position:found.start()])))
        parts.append(str(link(raw[found.start():end])))
        position = end
    parts.append(str(escape(raw[position:])))
    return Markup("".join(parts))  # noqa: S704 - built from escaped pieces and link()


def split_runbook(message: str) -> tuple[str, str | None]:
    """A condition message and the runbook it ends with (``…; runbook: https://…/stagefailed/``),
    apart; ``None`` when it names none, or names something that is not an http(s) URL."""
    found = RUNBOOK.search(message)
    if found is None or URL.fullmatch(found.group(1)) is None:
        return message, None
    return message[:found.start()].rstrip("; ").rstrip(), found.group(1)
