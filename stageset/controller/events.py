"""Kubernetes Events about our objects (``kubectl describe`` shows them).

Identity: events are created with the controller's own identity (the chart lets
it create Events).  Messages name objects and reasons; every message passes the
caller's redactor, so Secret values never leave through an event.  A failure to
record an event is logged and otherwise ignored — events are advisory.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from stageset.api import format_time
from stageset.api.vocabulary import EventReason, EventType
from stageset.controller.clock import Clock, system_clock
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject, metadata

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024


class EventRecorder:
    def __init__(self, client: KubeClient, *, component: str = "stageset-controller",
                 clock: Clock = system_clock):
        self._client = client
        self._component = component
        self._clock = clock

    def emit(self, obj: KubeObject, *, type_: EventType, reason: EventReason, message: str,
             redact: Callable[[str], str] | None = None) -> None:
        meta = metadata(obj)
        namespace = meta.get("namespace") or "default"
        stamp = format_time(self._clock())
        text = redact(message) if redact is not None else message
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                               "name": meta["name"], "namespace": namespace,
                               "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": type_.value, "reason": reason.value, "message": text[:MAX_MESSAGE],
            "source": {"component": self._component},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": self._component, "reportingInstance": self._component,
        }
        try:
            self._client.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
        except ApiError as error:
            log.warning("could not record event %s on %s/%s: %s", reason.value, namespace, meta["name"],
                        error)
