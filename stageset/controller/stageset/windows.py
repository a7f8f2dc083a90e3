"""Update windows: may a new revision roll out now, and when may it next?  Pure: no I/O, no clock.

The rules (the reference's):

- a window is **open** on ``[start, start + duration)`` for every start its cron ``schedule`` names
  in its ``timeZone`` (``duration`` is elapsed time, so a window across a daylight-saving change
  lasts exactly that long), or on ``[from, to)`` for an absolute one;
- updates are **allowed** when no Deny window is open and, if any Allow window is declared, an
  Allow window is open (a Deny always wins);
- :func:`decide` says whether updates are allowed at ``now`` and, when not, when they next are
  (``next_open``: the controller requeues then; ``None``: never, as declared).

Cron schedules are read by ``cronsim`` (Debian cron's syntax and its daylight-saving behaviour:
a start time that does not exist that day runs at the first minute after the gap, one that exists
twice runs once).  Every walk is bounded: a pathological set of windows costs at most
:data:`MAX_STEPS` boundary evaluations, each a constant number of cron look-ups.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import cronsim

from stageset.api import duration_seconds
from stageset.api.release import UpdateWindow, WindowType, time_zone

MAX_STEPS = 64
"""Window boundaries walked to find when the decision flips (beyond: "unknown", re-checked then)."""
MAX_COVERING = 1000
"""Overlapping starts followed to find where an open recurring window closes."""
_TICK = datetime.timedelta(microseconds=1)


@dataclass(frozen=True)
class Span:
    """One window at one instant: open or not, and when that next changes (``None``: never)."""

    open: bool
    changes: datetime.datetime | None


def _next_start(window: UpdateWindow, after: datetime.datetime) -> datetime.datetime | None:
    """The first start strictly after ``after``."""
    assert window.schedule is not None
    try:
        start: datetime.datetime = next(cronsim.CronSim(window.schedule.strip(),
                                                        after.astimezone(time_zone(window.time_zone))))
    except (StopIteration, cronsim.CronSimError):
        return None
    return start.astimezone(datetime.UTC)


def _last_start(window: UpdateWindow, at: datetime.datetime) -> datetime.datetime | None:
    """The last start at or before ``at``."""
    assert window.schedule is not None
    try:
        found = cronsim.CronSim(window.schedule.strip(), (at + _TICK).astimezone(time_zone(window.time_zone)),
                                reverse=True)
        start: datetime.datetime = next(found)
        while start > at:
            start = next(found)
    except (StopIteration, cronsim.CronSimError):
        return None
    return start.astimezone(datetime.UTC)


def span(window: UpdateWindow, at: datetime.datetime) -> Span:
    """Whether ``window`` is open at ``at``, and the next instant that changes."""
    if window.schedule is None:
        opens, closes = window.opens, window.closes
        assert opens is not None
        assert closes is not None
        if at < opens:
            return Span(False, opens)
        if at < closes:
            return Span(True, closes)
        return Span(False, None)
    assert window.duration is not None
    length = datetime.timedelta(seconds=duration_seconds(window.duration))
    latest = _last_start(window, at)
    if latest is None or latest + length <= at:
        return Span(False, _next_start(window, at))
    # Open: it closes at the end of the last start that begins before the window has closed
    # (a schedule more frequent than the duration keeps it open).
    end = latest + length
    for _ in range(MAX_COVERING):
        following = _next_start(window, latest)
        if following is None or following >= end:
            break
        latest, end = following, following + length
    return Span(True, end)


def allowed_at(windows: Sequence[UpdateWindow], at: datetime.datetime
               ) -> tuple[bool, datetime.datetime | None]:
    """Are updates allowed at ``at``; and the earliest instant any window opens or closes."""
    spans = [(w.type, span(w, at)) for w in windows]
    deny = any(s.open for t, s in spans if t is WindowType.DENY)
    allows = [s for t, s in spans if t is WindowType.ALLOW]
    allowed = not deny and (not allows or any(s.open for s in allows))
    changes = [s.changes for _, s in spans if s.changes is not None]
    return allowed, min(changes) if changes else None


@dataclass(frozen=True)
class Decision:
    """What the update windows say at one instant."""

    allowed: bool
    next_open: datetime.datetime | None = None
    """When not allowed: when updates are next allowed (``None``: never, as declared, or not found
    within :data:`MAX_STEPS` boundaries — then :attr:`recheck` says when to look again)."""
    recheck: datetime.datetime | None = None
    """When not allowed: when to evaluate again (``next_open``, else the last boundary walked)."""


def decide(windows: Sequence[UpdateWindow], now: datetime.datetime) -> Decision:
    """May new revisions roll out at ``now``?  When not, when next (walking window boundaries)."""
    if not windows:
        return Decision(True)
    allowed, boundary = allowed_at(windows, now)
    if allowed:
        return Decision(True)
    last: datetime.datetime | None = None
    for _ in range(MAX_STEPS):
        if boundary is None:
            return Decision(False, None, last)
        last = boundary
        allowed, following = allowed_at(windows, boundary)
        if allowed:
            return Decision(False, boundary, boundary)
        boundary = following
    return Decision(False, None, last)
