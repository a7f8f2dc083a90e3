"""Owner labels that tie every applied object to its StageSet and stage.

Prune and teardown only ever delete objects that still carry these labels, so an
object a user adopted (by removing the labels) is never deleted by us.
"""

from __future__ import annotations

from dataclasses import dataclass

from stageset.kube.types import KubeObject

FIELD_MANAGER = "stageset-controller"
LABEL_NAME = "stages.metio.wtf/name"
LABEL_NAMESPACE = "stages.metio.wtf/namespace"
LABEL_STAGE = "stages.metio.wtf/stage"


@dataclass(frozen=True)
class StageOwner:
    """The StageSet (namespace/name) and the stage an object belongs to."""

    namespace: str
    name: str
    stage: str

    def labels(self) -> dict[str, str]:
        return {LABEL_NAME: self.name, LABEL_NAMESPACE: self.namespace, LABEL_STAGE: self.stage}


def label_object(obj: KubeObject, owner: StageOwner) -> KubeObject:
    """A copy of ``obj`` with the owner labels set (the manifest itself is left untouched).

    Only the dicts on the path to the labels are copied: this runs for every object on
    every pass, and nothing downstream mutates the rest of a manifest.
    """
    metadata = obj.get("metadata") or {}
    labels = {**(metadata.get("labels") or {}), **owner.labels()}
    return {**obj, "metadata": {**metadata, "labels": labels}}
