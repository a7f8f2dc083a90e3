"""``dependsOn[].minVersion`` and held updates: when a Ready StageSet is still not ready for the
StageSets that depend on it.  Pure: no I/O.

- :func:`version_floor` — the dependency's applied revisions (``status.lastAppliedRevision``) must
  all be version tags (``v5.2.1@sha1:…``, ``refs/tags/v5.2.1@…``; semantic versions as
  :mod:`sources.semver` reads them) at or above ``minVersion``.  The reference compares its
  ``status.version`` (from ``spec.version``, which is refused here); the applied tag is what says
  the version here.  A dependency whose update windows hold a new revision back is not ready
  either: its dependents would be built against a revision about to be replaced (the reference's
  rule too).
"""

from __future__ import annotations

from collections.abc import Mapping

from sources.revision import parse_revision
from sources.semver import Version


def revision_version(revision: str) -> Version | None:
    """The semantic version a revision's ref names (``v5.2.1@sha1:…``, ``refs/tags/v5.2.1@…``);
    ``None`` for a branch, a bare commit or anything else."""
    try:
        ref, _ = parse_revision(revision.strip())
    except ValueError:
        return None
    if not ref:
        return None
    try:
        return Version.parse(ref.removeprefix("refs/tags/"))
    except ValueError:
        return None


def version_floor(status: Mapping[str, object] | None, min_version: str | None, *, name: str) -> str | None:
    """Why a Ready dependency is still not ready for this StageSet (``None``: it is).  ``status``:
    the dependency's raw status; ``name``: how to call it in the message."""
    status = status or {}
    pending = status.get("pendingUpdate")
    if isinstance(pending, Mapping) and pending.get("revisions"):
        return f"StageSet {name} has a new revision held back by its update windows"
    if not min_version:
        return None
    floor = Version.parse(min_version)
    applied = str(status.get("lastAppliedRevision") or "")
    revisions = [r for r in (part.strip() for part in applied.split(",")) if r]
    if not revisions:
        return f"StageSet {name} has applied no revision yet; minVersion {min_version} needs a version tag"
    for revision in revisions:
        version = revision_version(revision)
        if version is None:
            return (f"StageSet {name} applied {revision}, which is not a version tag; "
                    f"minVersion {min_version} needs one")
        if version < floor:
            return f"StageSet {name} is at version {version}, minVersion needs {min_version} or later"
    return None
