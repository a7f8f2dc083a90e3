"""Which tenant each namespace belongs to, from the Namespace's ``stages.metio.wtf/tenant`` label.

Identity: the controller's own, for a metadata-only list and watch of Namespaces (a Reflector of
:data:`NAMESPACES` that :mod:`stageset.controller.namespaces` sets up as a runnable; the chart's
ClusterRole grants ``get``/``list``/``watch`` on namespaces).  Only metadata travels; labels are
kept, never annotations.

Invariant: a tenant is named by the Namespace and by nothing a tenant writes — a label on a
StageSet or GitRepository is never read here — so a tenant cannot put its series under another
tenant's name.  Used for the ``tenant`` label of the per-object metric series
(:mod:`stageset.controller.objectmetrics`), read at scrape time, so a relabelled namespace moves
its series at the next scrape.  Every label of each namespace is kept too, for a FleetRollout's
``namespaceSelector`` (the platform's labels on Namespaces, as the tenant label).  Thread-safe.
"""

from __future__ import annotations

import threading

from stageset.api.tenancy import TENANT_LABEL
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

NAMESPACES = Resource(group="", version="v1", kind="Namespace", plural="namespaces", namespaced=False)


class TenantLabels:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, str] = {}
        self._labels: dict[str, dict[str, str]] = {}

    def handle(self, event: str, obj: KubeObject) -> None:
        """A Reflector handler for Namespaces (metadata only)."""
        metadata = obj.get("metadata") or {}
        namespace = str(metadata.get("name") or "")
        labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()} if event != "DELETED" \
            else None
        tenant = (labels or {}).get(TENANT_LABEL)
        with self._lock:
            if labels is None:
                self._labels.pop(namespace, None)
            else:
                self._labels[namespace] = labels
            if tenant:
                self._tenants[namespace] = str(tenant)
            else:
                self._tenants.pop(namespace, None)

    def labels_of(self, namespace: str) -> dict[str, str] | None:
        """Every label of the namespace (``None``: not seen): what a FleetRollout's
        ``namespaceSelector`` matches (:mod:`stageset.controller.fleet`)."""
        with self._lock:
            found = self._labels.get(namespace)
            return None if found is None else dict(found)

    def of(self, namespace: str) -> str:
        """The namespace's tenant; empty (no ``tenant`` label on the series) when it names none."""
        with self._lock:
            return self._tenants.get(namespace, "")
