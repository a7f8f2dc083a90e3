"""Typed shapes of the raw Kubernetes JSON we touch, as ``TypedDict``s (no runtime cost)."""

from __future__ import annotations

from typing import Any, TypedDict

# A manifest or live object: always a plain dict straight from YAML/JSON.
KubeObject = dict[str, Any]


class WatchEvent(TypedDict):
    type: str
    object: KubeObject
