"""A StageSet's ``status.history`` read back as rows, for ``stageset history`` and the dashboard.  Pure.

Tolerant: status is written by controllers (a newer one may add fields, an older one wrote none),
so anything malformed is skipped, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stageset.kube.types import KubeObject


@dataclass(frozen=True)
class HistoryRow:
    """One release of one stage, as the CLI and the dashboard show it."""

    stage: str
    revision: str | None
    generation: int | None
    applied_at: str | None
    phase: str
    created: int
    configured: int
    deleted: int
    objects: tuple[str, ...]
    reason: str | None = None
    """Why it failed (a Ready reason), when it did."""
    attempt: bool = False
    """A failed attempt: nothing was applied."""

    def changed(self) -> str:
        """``2 created, 1 configured, 1 pruned`` (``no changes`` when it wrote nothing); a failed
        attempt: ``failed: RBACDenied, nothing applied``."""
        if self.attempt:
            return f"failed: {self.reason or 'unknown reason'}, nothing applied"
        parts = [f"{count} {what}" for count, what in ((self.created, "created"),
                                                       (self.configured, "configured"),
                                                       (self.deleted, "pruned")) if count]
        changed = ", ".join(parts) or "no changes"
        return f"{changed} (failed: {self.reason})" if self.reason else changed


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def history_rows(obj: KubeObject) -> list[HistoryRow]:
    """Every recorded release of every stage, newest first (stages in the order status lists them)."""
    rows: list[HistoryRow] = []
    for entry in (obj.get("status") or {}).get("history") or []:
        if not isinstance(entry, dict):
            continue
        for release in entry.get("releases") or []:
            if not isinstance(release, dict):
                continue
            generation = release.get("generation")
            rows.append(HistoryRow(
                stage=str(entry.get("stage") or ""), revision=release.get("revision"),
                generation=generation if isinstance(generation, int) else None,
                applied_at=release.get("appliedAt"), phase=str(release.get("phase") or ""),
                created=_int(release.get("created")), configured=_int(release.get("configured")),
                deleted=_int(release.get("deleted")),
                objects=tuple(str(o) for o in release.get("objects") or []),
                reason=str(release["reason"]) if release.get("reason") else None,
                attempt=release.get("attempt") is True))
    return sorted(rows, key=lambda r: r.applied_at or "", reverse=True)
