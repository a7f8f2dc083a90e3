"""Typed shapes of the raw Kubernetes JSON we read, as ``TypedDict``s (no runtime cost).

Objects stay plain dicts (``KubeObject``) from YAML, JSON and the apiserver alike;
where code reads a well-known part of one, it names the part's shape here so mypy
checks the keys: ``meta: ObjectMeta = obj["metadata"]``.
"""

from __future__ import annotations

from typing import Any, TypedDict

# A manifest or live object: always a plain dict straight from YAML/JSON.
KubeObject = dict[str, Any]


class ObjectMeta(TypedDict, total=False):
    """``metadata`` of any object (the fields we read)."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    deletionTimestamp: str
    creationTimestamp: str
    managedFields: list[dict[str, Any]]


class ConditionDict(TypedDict, total=False):
    """One entry of ``status.conditions`` (``metav1.Condition`` and its older look-alikes)."""

    type: str
    status: str
    reason: str
    message: str
    observedGeneration: int
    lastTransitionTime: str


class WatchEvent(TypedDict):
    """One line of a watch stream."""

    type: str
    object: KubeObject


def metadata(obj: KubeObject) -> ObjectMeta:
    """``obj["metadata"]`` typed (an empty mapping when absent)."""
    meta: ObjectMeta = obj.get("metadata") or {}
    return meta


def conditions(obj: KubeObject) -> list[ConditionDict]:
    """``obj["status"]["conditions"]`` typed (empty when absent)."""
    found: list[ConditionDict] = (obj.get("status") or {}).get("conditions") or []
    return found
