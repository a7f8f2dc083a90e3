"""Kubernetes Events about our objects (``kubectl describe`` shows them).

Identity: events are created with the controller's own identity (the chart lets
it create Events).  Messages never include Secret data or substituted values:
callers pass object names and reasons only.  A failure to record an event is
logged and otherwise ignored — events are advisory.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from stageset.controller.conditions import now
from stageset.kube.client import ApiError, KubeClient

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"


class EventRecorder:
    def __init__(self, client: KubeClient, *, component: str = "stageset-controller"):
        self._client = client
        self._component = component

    def emit(self, obj: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        metadata = obj["metadata"]
        namespace = metadata.get("namespace") or "default"
        stamp = now()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{metadata['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": metadata["name"], "namespace": namespace,
                               "uid": metadata.get("uid"),
                               "resourceVersion": metadata.get("resourceVersion")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": self._component},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": self._component, "reportingInstance": self._component,
        }
        try:
            self._client.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
        except ApiError as error:
            log.warning("could not record event %s on %s/%s: %s", reason, namespace, metadata["name"],
                        error)
