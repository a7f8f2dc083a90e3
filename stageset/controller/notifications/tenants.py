"""Tenant-owned alerts (``--tenant-notifications``): the ``NotificationAlert`` and
``NotificationProvider`` objects an app team keeps in its own namespace, for that namespace's
StageSets only.

An event about StageSet ``N/x`` is matched against the platform's configuration (the notification
namespace) and, with this on, against namespace ``N``'s own -- and no other namespace's: an alert
in ``N`` can only ever hear ``N``'s events, whatever its ``eventSources`` say (``namespace: "*"``
means ``N`` there), and a tenant can neither subscribe to another namespace's events nor have its
events sent by another namespace's provider.  A tenant's provider sends through the same outboxes
as the platform's: the same address guard (no loopback, link-local or metadata address unless
``--allow-insecure-sources``), the same per-provider rate and burst, named ``N/provider`` in the
metrics and logs.

Identity: the two kinds are listed in ``N`` with the controller's own identity (the chart grants
``get``/``list`` of them where the controller watches); a provider's Secret is read as
``system:serviceaccount:N:<spec.serviceAccountName>`` (impersonated), so a provider can use only a
Secret its own account may read, and one without ``serviceAccountName`` sends nothing (fail
closed).  The controller itself reads no tenant Secret.

Bounded: at most :data:`MAX_NAMESPACES` namespaces' configurations are kept (least recently used
go first), each read again after the notifier's ``refresh``, in the notifier's own thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from stageset.controller.notifications.config import Config, ConfigReader
from stageset.kube.client import ClientPool, Identity, KubeClient

MAX_NAMESPACES = 512


class TenantConfigs:
    """The configuration of each tenant namespace events come from (thread-safe)."""

    def __init__(self, clients: ClientPool, *, refresh: float = 30.0, platform_namespace: str | None = None,
                 clock: Callable[[], float] = time.monotonic, capacity: int = MAX_NAMESPACES):
        self._clients = clients
        self._refresh = refresh
        self._platform = platform_namespace
        self._clock = clock
        self._capacity = capacity
        self._lock = threading.Lock()
        self._readers: OrderedDict[str, ConfigReader] = OrderedDict()

    def get(self, namespace: str) -> Config:
        """Namespace ``namespace``'s own alerts and providers (none for the platform's namespace,
        whose configuration is the platform's)."""
        if not namespace or namespace == self._platform:
            return Config()
        with self._lock:
            reader = self._readers.get(namespace)
            if reader is None:
                reader = ConfigReader(self._clients.client(), namespace=namespace, refresh=self._refresh,
                                      clock=self._clock, secrets_as=self._as(namespace))
                self._readers[namespace] = reader
                while len(self._readers) > self._capacity:
                    self._readers.popitem(last=False)
            else:
                self._readers.move_to_end(namespace)
        return reader.get()

    def _as(self, namespace: str) -> Callable[[str], KubeClient]:
        def client(account: str) -> KubeClient:
            return self._clients.client(Identity.service_account(namespace=namespace, name=account))
        return client
