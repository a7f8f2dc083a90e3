"""Shared by both reconcilers: whom the Git mirror serves a GitRepository's commits to (its consumer).

The GitRepository reconciler fetches as that consumer; the StageSet reconciler reads only
commits served to the GitRepository its stage names, and so does ``stageset build``/``diff``
in its own mirror (through the same render service), so no CLI path derives a consumer of its
own.  Kept here, not in either reconciler,
so the two stay independent of each other (an import-linter contract).  Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def artifact_consumer(metadata: Mapping[str, Any]) -> str:
    """Who a GitRepository's commits are served to in the shared mirror: this object (by
    uid), so a reader can only read what this GitRepository itself was served."""
    return f"{metadata['namespace']}/{metadata['name']}/{metadata.get('uid', '')}"
