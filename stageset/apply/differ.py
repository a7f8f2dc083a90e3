"""Which fields of a live object differ from what applying our manifest would make of it.  Pure.

Drift reported rather than corrected (``driftDetection.mode: Warn``) names the field paths that
differ: ``spec.replicas``, ``spec.template.spec.containers[app].image``, ``data.k``.  The two objects
compared are the live one and the server's dry-run of our manifest over it (what a write would
leave), so fields the apiserver defaults, status, and what other managers own compare equal and are
never named.  Lists of objects keyed by ``name`` are compared per entry (``containers[app]``), other
lists whole.  Only names reach a path, never a value (a Secret's ``data.password`` is named, its
content is not).
"""

from __future__ import annotations

from typing import Any

from stageset.kube.types import KubeObject

IGNORED_METADATA = frozenset({"managedFields", "resourceVersion", "generation", "creationTimestamp", "uid",
                              "selfLink"})
"""What a dry-run changes without meaning (bookkeeping of the write itself)."""
MAX_DEPTH = 32


def _named(items: list[Any]) -> dict[str, Any] | None:
    """A list of objects each with a distinct ``name``, by name (``None``: not such a list)."""
    if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    named = {str(i["name"]): i for i in items}
    return named if len(named) == len(items) else None


def _walk(before: Any, after: Any, path: str, found: list[str], limit: int, depth: int, only: bool) -> None:
    if len(found) >= limit or before == after:
        return
    if depth < MAX_DEPTH and isinstance(before, dict) and isinstance(after, dict):
        keys = set(after) if only else set(before) | set(after)
        for key in sorted(keys, key=str):
            _walk(before.get(key), after.get(key), f"{path}.{key}" if path else str(key), found, limit,
                  depth + 1, only)
        return
    if depth < MAX_DEPTH and isinstance(before, list) and isinstance(after, list):
        old, new = _named(before), _named(after)
        if old is not None and new is not None:
            for name in sorted(set(new) if only else set(old) | set(new)):
                _walk(old.get(name), new.get(name), f"{path}[{name}]", found, limit, depth + 1, only)
            return
    found.append(path or "(the object)")


def differing_paths(live: KubeObject | None, wanted: KubeObject | None, *, limit: int = 16,
                    only_wanted: bool = False) -> list[str]:
    """The paths where ``live`` and ``wanted`` differ (at most ``limit``, in order), ignoring status
    and the metadata a write itself changes; ``[]`` when one of them is missing.  ``only_wanted``:
    ``wanted`` is a manifest, not a whole object: only the paths it sets are compared."""
    if live is None or wanted is None:
        return []

    def trimmed(obj: KubeObject) -> dict[str, Any]:
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in IGNORED_METADATA}
        return {**{k: v for k, v in obj.items() if k not in ("status", "metadata")}, "metadata": meta}

    found: list[str] = []
    _walk(trimmed(live), trimmed(wanted), "", found, limit, 0, only_wanted)
    return found
