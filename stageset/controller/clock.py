"""The clock, injected: reconcilers ask it for "now" so timeouts can be tested without waiting."""

from __future__ import annotations

import datetime
from collections.abc import Callable

Clock = Callable[[], datetime.datetime]


def system_clock() -> datetime.datetime:
    """Now, timezone-aware UTC."""
    return datetime.datetime.now(datetime.UTC)
