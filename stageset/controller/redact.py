"""Secret values out of every message: status, events, logs.

A :class:`Redactor` holds the values one StageSet read from Secrets (``substituteFrom``)
in one pass, and replaces each of them in any text with ``***``.
"""

from __future__ import annotations

import threading

MASK = "***"


class Redactor:
    """Thread-safe: stages of one pass render concurrently and add their values."""

    def __init__(self, values: list[str] | None = None):
        self._lock = threading.Lock()
        self._values: set[str] = set(values or [])

    def add(self, values: list[str]) -> None:
        with self._lock:
            self._values.update(v for v in values if v)

    @property
    def values(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._values)

    def __call__(self, text: str) -> str:
        for value in sorted(self.values, key=len, reverse=True):
            text = text.replace(value, MASK)
        return text
