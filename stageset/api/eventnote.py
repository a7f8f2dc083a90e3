"""How one Event tells several things: the note of an Event that stands for a whole pass.  Pure.

The controller records at most one Event per object per pass
(:meth:`~stageset.controller.events.EventRecorder.one_pass`).  When a pass has more than one thing
to say about an object, the Event carries the reason and message of the most important one (its
*headline*) and the note goes on with each other one, in the order the pass told them::

    stage 'app': restored ConfigMap shop/a; also ReconciliationSucceeded: ConfigMap/shop/a configured

A part whose message did not fit reads ``; also Reason: ...``; past :data:`NAMED` parts the rest
are counted (``; and 2 more``).  This module is the one spelling of that note, for the recorder
that writes it and for the readers that take it apart again (:func:`split`: the dashboard's last
change of each stage).

A message is free text (an apiserver's error, a tenant's object names), so :func:`split` can be
fooled by a message that itself contains ``; also <a reason>: ``: it then reads one part as two.
What it reads is only ever shown about the same object whose message it was; nothing is decided
on it.
"""

from __future__ import annotations

import re

from stageset.api.vocabulary import EventReason, Reason

ALSO = "; also "
"""Between the headline and each further part (then the part's reason, ``: ``, its message)."""
NAMED = 8
"""Further parts named in one note; the rest are counted (``; and N more``)."""

_REASONS = sorted({r.value for r in (*EventReason, *Reason)}, key=len, reverse=True)
_PART = re.compile(f"{re.escape(ALSO)}({'|'.join(map(re.escape, _REASONS))}): ")
_MORE = re.compile(r"; and (\d+) more$")


def part(reason: str, message: str) -> str:
    """One further part as it follows the headline: ``; also Reason: message``."""
    return f"{ALSO}{reason}: {message}"


def more(count: int) -> str:
    """What follows the named parts when ``count`` more were told."""
    return f"; and {count} more"


def split(reason: str, note: str) -> list[tuple[str, str]]:
    """``(reason, message)`` of each part of an Event's note, the headline (the Event's own
    ``reason``) first; an Event that told one thing is one part.  The count of parts not named
    (after the last one) is dropped."""
    found: list[tuple[str, str]] = []
    start, current = 0, reason
    for match in _PART.finditer(note):
        found.append((current, note[start:match.start()]))
        start, current = match.end(), match.group(1)
    last = note[start:]
    found.append((current, _MORE.sub("", last) if found else last))
    return found
