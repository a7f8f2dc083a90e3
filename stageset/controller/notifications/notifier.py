"""The notifier: hears every event the recorder records (:mod:`stageset.controller.events`) and
hands what an alert selects to its provider's outbox.

Identity: the controller's own, for reading the configuration in the notification namespace
(:mod:`~stageset.controller.notifications.config`); with tenant alerts, the two kinds of an event's
own namespace as the controller and their providers' Secrets as each provider's ServiceAccount
(:mod:`~stageset.controller.notifications.tenants`); no Kubernetes request otherwise.

Invariants: :meth:`Notifier.offer` (called from the recorder, in a reconcile's thread) only puts
the event on a bounded intake queue -- a full queue drops it, counted -- so neither a slow
receiver nor a slow configuration read stalls a reconcile.  One dispatcher thread matches events
to alerts; per-provider outboxes send (:mod:`~stageset.controller.notifications.delivery`), fair
between tenants (the namespace of the StageSet an event is about).  Every
text of a notice passes the StageSet's redactor once more (:data:`~stageset.controller.redact.REGISTRY`
holds its Secret values), beside the recorder's own redaction.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from dataclasses import replace

from stageset.controller.events import Recorded
from stageset.controller.notifications.config import ConfigReader, Subject, routes
from stageset.controller.notifications.delivery import Counters, Outboxes, Send
from stageset.controller.notifications.payloads import AddressError, notice, requests_for
from stageset.controller.notifications.tenants import TenantConfigs
from stageset.controller.redact import REGISTRY, Redactor
from stageset.controller.settings import (
    NotificationSettings as NotificationSettings,  # declared with the others
)
from stageset.kube.client import KubeClient

log = logging.getLogger(__name__)

INTAKE_PROVIDER = ""
"""The provider label of a drop at intake (before any provider was chosen)."""


class Notifier:
    def __init__(self, client: KubeClient, *, settings: NotificationSettings, counters: Counters, send: Send,
                 tenants: TenantConfigs | None = None):
        """``tenants``: the tenants' own configurations (with ``settings.tenants``)."""
        assert settings.enabled, "the notifier needs a namespace or tenant alerts"
        self._reader = ConfigReader(client, namespace=settings.namespace, refresh=settings.refresh) \
            if settings.namespace else None
        self._tenants = tenants
        self._counters = counters
        self._intake: queue.Queue[Recorded | None] = queue.Queue(maxsize=settings.intake)
        self._outboxes = Outboxes(settings=settings.delivery, send=send, counters=counters)
        self._thread = threading.Thread(target=self._run, name="notifier", daemon=True)
        self._thread.start()

    def offer(self, event: Recorded) -> None:
        """Queue ``event`` (never blocks): an event of a kind the notifier subscribed to (its setup
        declares which, :mod:`~stageset.controller.notifications.setup`)."""
        try:
            self._intake.put_nowait(event)
        except queue.Full:
            self._counters.notification_dropped(INTAKE_PROVIDER, "intake_full")

    def idle(self) -> bool:
        """Nothing waits to be matched or sent (tests and shutdown)."""
        return self._intake.unfinished_tasks == 0 and self._outboxes.pending() == 0

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(queue.Full):  # full: the dispatcher is a daemon, left to the exit
            self._intake.put_nowait(None)
        self._outboxes.close(timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            event = self._intake.get()
            try:
                if event is None:
                    return
                self._dispatch(event)
            except Exception:  # one bad event never ends the dispatcher
                log.exception("notifications: dispatching an event failed")
            finally:
                self._intake.task_done()

    def _dispatch(self, event: Recorded) -> None:
        ref = event.regarding
        subject = Subject(namespace=ref["namespace"], name=ref["name"], labels=event.labels, type=event.type,
                          reason=event.reason)
        found = routes(self._reader.get(), subject) if self._reader is not None else []
        if self._tenants is not None:  # the StageSet's own namespace's alerts: its events only
            found += routes(self._tenants.get(subject.namespace), subject)
        if not found:
            return
        redact = Redactor(REGISTRY.of((ref["kind"], ref["namespace"], ref["name"])))
        base = notice(obj_ref=ref, type_=event.type, reason=event.reason, message=event.note,
                      annotations=event.annotations, timestamp=event.time, redact=redact)
        for provider, summary in found:
            if provider.problem:
                self._counters.notification_failed(provider.name, provider.type.value)
                log.warning("notifications: provider %s cannot send: %s", provider.name, provider.problem)
                continue
            item = replace(base, summary=redact(summary)) if summary else base
            try:
                requests = requests_for(provider.type, item, address=provider.address, token=provider.token,
                                        channel=provider.channel, username=provider.username)
            except AddressError as error:
                self._counters.notification_failed(provider.name, provider.type.value)
                log.warning("notifications: provider %s cannot send: %s", provider.name, error)
                continue
            self._outboxes.put(provider, requests, tenant=ref["namespace"])
