"""Notifications, set up: the notifier as a listener of the event recorder, closed last.

Off without ``--notification-namespace`` and ``--tenant-notifications`` (an empty
:class:`~stageset.controller.setup.Setup`).
Otherwise :func:`setup` builds the one :class:`~stageset.controller.notifications.notifier.Notifier`
(its dispatcher thread starts with it) and declares it: a listener of the StageSets' events (a
:class:`~stageset.controller.events.Subscription`: the recorder tells it every new event of that
kind; it queues and returns, so no reconcile waits for a receiver), and a closer that sends what is
queued within what is left of the shutdown deadline once the workers have stopped.

Identity: the controller's own, for reading the configuration in the notification namespace
(:mod:`~stageset.controller.notifications.config`); with tenant alerts, a tenant provider's Secret
as the provider's ServiceAccount (:mod:`~stageset.controller.notifications.tenants`); receivers
are called through the address guard (``--allow-insecure-sources`` relaxes it, as for sources).
"""

from __future__ import annotations

from sources.addresses import AddressGuard
from stageset.controller.events import Subscription
from stageset.controller.kinds import STAGESETS
from stageset.controller.notifications.delivery import Counters, http_sender
from stageset.controller.notifications.notifier import Notifier
from stageset.controller.notifications.tenants import TenantConfigs
from stageset.controller.settings import NotificationSettings
from stageset.controller.setup import Setup
from stageset.kube.client import ClientPool, KubeClient


def setup(*, admin: KubeClient, settings: NotificationSettings, counters: Counters,
          allow_insecure: bool, clients: ClientPool | None = None) -> Setup:
    """The notifier, declared (nothing without a notification namespace or tenant alerts).
    ``clients``: for tenant alerts, whose providers' Secrets are read as their ServiceAccounts."""
    if not settings.enabled:
        return Setup()
    tenants = None
    if settings.tenants:
        assert clients is not None, "tenant alerts read their Secrets as the tenants' accounts"
        tenants = TenantConfigs(clients, refresh=settings.refresh, platform_namespace=settings.namespace)
    notifier = Notifier(admin, settings=settings, counters=counters,
                        send=http_sender(AddressGuard(allow_insecure=allow_insecure, purpose="notifications",
                                                      verb="send to")), tenants=tenants)
    # Closed with what is left of the deadline, at least half a second.
    # StageSets' events only: what alerts select and providers are told about.
    return Setup(listeners=(Subscription(kinds=frozenset({STAGESETS.kind}), tell=notifier.offer),),
                 closers=(lambda left: notifier.close(timeout=max(0.5, left)),))
