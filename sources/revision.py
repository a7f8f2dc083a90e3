"""Revisions in Flux's format: ``main@sha1:<hex>``, ``v1.2.3@sha1:<hex>``, ``sha1:<hex>``.

Why Flux's format: users port GitRepositories from Flux and read our status with the same
eyes and the same tooling, so ``status.artifact.revision`` must look the same.  The ref part
is the short branch or tag name for branches, tags and semver matches, the full ref name for
``ref.name`` (``refs/pull/7/head``), and absent for a bare commit pin.  The digest algorithm
follows the commit id's length (40 hex digits: ``sha1``, 64: ``sha256``).

:func:`parse_revision` also reads Flux's legacy ``<ref>/<hex>`` form, so revisions recorded
by older tools can still be compared.  Both functions are pure.
"""

from __future__ import annotations

import re

_HEX = re.compile(r"[0-9a-f]+")
_ALGORITHMS = {40: "sha1", 64: "sha256"}


def _algorithm(commit: str) -> str:
    if not _HEX.fullmatch(commit) or len(commit) not in _ALGORITHMS:
        raise ValueError(f"not a full lowercase hex commit id: {commit!r}")
    return _ALGORITHMS[len(commit)]


def format_revision(ref_name: str | None, commit: str) -> str:
    """``main@sha1:<commit>``, or ``sha1:<commit>`` when there is no ref name."""
    digest = f"{_algorithm(commit)}:{commit}"
    return f"{ref_name}@{digest}" if ref_name else digest


def parse_revision(revision: str) -> tuple[str | None, str]:
    """The inverse of :func:`format_revision`: ``(ref_name or None, commit)``.

    Raises :class:`ValueError` for anything that is not a revision.
    """
    for algorithm in _ALGORITHMS.values():
        marker = f"{algorithm}:"
        if revision.startswith(marker):
            ref_name, commit = None, revision[len(marker):]
            break
        ref_part, sep, commit = revision.rpartition(f"@{marker}")
        if sep:
            if not ref_part:
                raise ValueError(f"empty ref name in revision {revision!r}")
            ref_name = ref_part
            break
    else:
        # Legacy Flux form "<ref>/<hex>".
        ref_part, sep, commit = revision.rpartition("/")
        if not sep or not ref_part:
            raise ValueError(f"not a revision: {revision!r}")
        if not _HEX.fullmatch(commit) or len(commit) not in _ALGORITHMS:
            raise ValueError(f"not a revision: {revision!r}")
        return ref_part, commit
    if _ALGORITHMS.get(len(commit)) != algorithm or not _HEX.fullmatch(commit):
        raise ValueError(f"bad {algorithm} digest in revision {revision!r}")
    return ref_name, commit
