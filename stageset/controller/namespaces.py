"""Tenant watches, set up: the one metadata-only watch of Namespaces, for a cluster-wide release.

What it feeds: the metrics' ``tenant`` label and every namespace's labels (a FleetRollout's
``namespaceSelector``; :mod:`stageset.controller.tenants`), and the namespaces being deleted, which
a teardown leaves to the namespace's own deletion (:mod:`stageset.controller.terminating`).  A
release bound to some namespaces (``--watch-namespaces``) may not list Namespaces: then there is no
watch, no tenant label, and teardowns behave as before.  A report only, like the unserved watches:
not cached, not part of "synced".

Identity: the controller's own (the chart's ClusterRole grants ``get``/``list``/``watch`` on
namespaces); only metadata travels.
"""

from __future__ import annotations

import threading

from stageset.controller.setup import Setup
from stageset.controller.shared import Shared
from stageset.controller.tenants import NAMESPACES
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector


def setup(shared: Shared, *, stop: threading.Event) -> Setup:
    """The Namespace watch as a runnable (none on a release bound to some namespaces)."""
    settings = shared.settings
    if settings.watch_namespaces is not None:
        return Setup()
    tenants, terminating = shared.metrics.tenants, shared.terminating

    def handle(event: str, obj: KubeObject) -> None:
        tenants.handle(event, obj)
        terminating.handle(event, obj)

    return Setup(runnables=(Reflector(client=shared.clients.client(), resource=NAMESPACES, namespace=None,
                                      stop=stop, handler=handle, resync=settings.resync_period,
                                      metadata_only=True),))
