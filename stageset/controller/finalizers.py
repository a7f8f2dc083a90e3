"""Adding and removing our finalizer on a StageSet, optimistically (tested resourceVersion).

Identity: the controller's own (its ClusterRole may patch StageSets and their
finalizers, nothing else of them).
"""

from __future__ import annotations

from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.apply.ownership import FINALIZER
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, metadata


def set_finalizer(client: KubeClient, *, resource: Resource, obj: KubeObject, present: bool
                  ) -> KubeObject | None:
    """Make :data:`FINALIZER` present or absent; returns the object as written (a new value; ``obj``
    is left as it was), ``None`` when there was nothing to do.  :class:`StageError` (Progressing)
    when the object changed meanwhile (the caller reads it again and retries)."""
    meta = metadata(obj)
    finalizers = list(meta.get("finalizers") or [])
    if (FINALIZER in finalizers) == present:
        return None
    finalizers = [*finalizers, FINALIZER] if present else [f for f in finalizers if f != FINALIZER]
    path = resource.object_path(name=meta["name"], namespace=meta.get("namespace"))
    try:
        written = client.request(
            "PATCH", path, content_type="application/json-patch+json",
            body=[{"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
                  {"op": "add" if "finalizers" not in meta else "replace",
                   "path": "/metadata/finalizers", "value": finalizers}])
    except ApiError as error:
        if not (error.not_found or error.conflict or error.invalid):
            raise
        raise StageError(Reason.PROGRESSING, "object changed while updating finalizers; retrying") from error
    return {**obj, "metadata": {**meta, "finalizers": finalizers,
                                "resourceVersion": metadata(written).get("resourceVersion",
                                                                         meta.get("resourceVersion"))}}
