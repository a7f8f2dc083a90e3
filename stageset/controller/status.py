"""Writing the status of our own kinds.

Identity: status is written with the controller's own identity — the status
subresource of StageSets and GitRepositories is the one thing the controller's
ClusterRole may write.  A write that would change nothing is skipped, so a warm
no-op reconcile makes no status write either.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from stageset.controller.conditions import find_condition, summarize
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


REQUESTED_AT = "reconcile.fluxcd.io/requestedAt"


def requested_at(obj: dict[str, Any]) -> str | None:
    """The ``reconcile.fluxcd.io/requestedAt`` annotation (asks for a reconcile now), as in Flux."""
    value = (obj.get("metadata", {}).get("annotations") or {}).get(REQUESTED_AT)
    return str(value) if value else None


def validation_message(error: ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message``."""
    first = error.errors()[0]
    return f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}"


class StatusReport:
    """The status one reconcile builds for one object; :meth:`conclude` writes it.

    Conditions are always summarized from those the object had when the reconcile
    began, so a transition time moves only when the status really changed.
    """

    def __init__(self, *, client: KubeClient, resource: Resource, obj: dict[str, Any]):
        self._client = client
        self._resource = resource
        self.obj = obj
        self.status: dict[str, Any] = dict(obj.get("status") or {})
        self._conditions = list(self.status.get("conditions") or [])
        self.generation = int(obj["metadata"].get("generation", 0))
        if requested := requested_at(obj):
            self.status["lastHandledReconcileAt"] = requested

    def condition(self, type_: str) -> dict[str, Any]:
        """A condition as it was when the reconcile began (empty if absent)."""
        return find_condition(self._conditions, type_)

    def conclude(self, *, ready: bool | None, reason: str, message: str, stalled: bool = False) -> None:
        self.status["observedGeneration"] = self.generation
        self.status["conditions"] = summarize(self._conditions, ready=ready, reason=reason, message=message,
                                              generation=self.generation, stalled=stalled)
        write_status(self._client, resource=self._resource, obj=self.obj, status=self.status)
