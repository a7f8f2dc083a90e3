"""Writing the status of our own kinds.

Identity: status is written with the controller's own identity — the status
subresource of StageSets and GitRepositories is the one thing the controller's
ClusterRole may write.  A write that would change nothing is skipped, so a warm
no-op reconcile makes no status write either.
"""

from __future__ import annotations

import copy
from typing import Any

from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v not in (None, [], {})}


def write_status(client: KubeClient, *, resource: Resource, obj: dict[str, Any],
                 status: dict[str, Any]) -> bool:
    """Replace ``status`` fields via a merge patch; ``False`` when nothing changed or it is gone."""
    if _comparable(obj.get("status") or {}) == _comparable(status):
        return False
    metadata = obj["metadata"]
    path = resource.object_path(name=metadata["name"], namespace=metadata.get("namespace")) + "/status"
    # Merge patch: lists (conditions, stages) are replaced whole; removed keys are nulled.
    body = {"status": {**{k: None for k in (obj.get("status") or {}) if k not in status}, **status}}
    try:
        written = client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
    except ApiError as error:
        if error.not_found:
            return False
        raise
    # Later optimistic writes (finalizers) must test against the version we just made.
    if version := written.get("metadata", {}).get("resourceVersion"):
        metadata["resourceVersion"] = version
    # Remember what we wrote (a copy: callers keep mutating their dict).
    obj["status"] = copy.deepcopy(status)
    return True
