"""Owner labels that tie every applied object to its StageSet and stage; the opt-out; the finalizer.

Prune and teardown only ever delete objects that still carry these labels, so an
object a user adopted (by removing the labels) is never deleted by us, nor one that
opts out with ``stages.metio.wtf/prune: disabled`` (annotation or label).  The labels also say
which StageSet holds an object (:func:`holder`): one that another *live* StageSet holds is never
written (:mod:`stageset.apply.claims`).  Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from stageset.kube.types import KubeObject

FIELD_MANAGER = "stageset-controller"
LABEL_NAME = "stages.metio.wtf/name"
LABEL_NAMESPACE = "stages.metio.wtf/namespace"
LABEL_STAGE = "stages.metio.wtf/stage"
# On a live object (annotation or label): never delete it in prune or teardown.
PRUNE_OPT_OUT = "stages.metio.wtf/prune"
PRUNE_DISABLED = "disabled"
# On every StageSet: its stages' objects are torn down before it goes.
FINALIZER = "stages.metio.wtf/teardown"


@dataclass(frozen=True)
class StageOwner:
    """The StageSet (namespace/name) and the stage an object belongs to."""

    namespace: str
    name: str
    stage: str

    def labels(self) -> dict[str, str]:
        return {LABEL_NAME: self.name, LABEL_NAMESPACE: self.namespace, LABEL_STAGE: self.stage}


def owned_by(obj: KubeObject, *, namespace: str, name: str) -> bool:
    """Does the live object still carry the owner labels of StageSet ``namespace/name``?"""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(LABEL_NAME) == name and labels.get(LABEL_NAMESPACE) == namespace)


def holder(obj: KubeObject | None) -> tuple[str, str] | None:
    """The StageSet ``(namespace, name)`` the live object's owner labels name (``None``: none, or
    only part of them, so no StageSet can claim it)."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    namespace, name = labels.get(LABEL_NAMESPACE), labels.get(LABEL_NAME)
    return (str(namespace), str(name)) if namespace and name else None


def prune_disabled(obj: KubeObject) -> bool:
    """Has the live object opted out of deletion (annotation or label)?"""
    metadata = obj.get("metadata") or {}
    return PRUNE_DISABLED in ((metadata.get("annotations") or {}).get(PRUNE_OPT_OUT),
                              (metadata.get("labels") or {}).get(PRUNE_OPT_OUT))


def label_object(obj: KubeObject, owner: StageOwner) -> KubeObject:
    """A copy of ``obj`` with the owner labels set (the manifest itself is left untouched).

    Only the dicts on the path to the labels are copied: this runs for every object on
    every pass, and nothing downstream mutates the rest of a manifest.
    """
    metadata = obj.get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), **owner.labels()}
    return {**obj, "metadata": {**metadata, "labels": labels}}
