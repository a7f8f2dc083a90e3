"""Sending notifications: one bounded outbox and one worker thread per provider, rate-limited,
retried with bounded backoff, fair between tenants.

Identity: none towards Kubernetes.  Requests go to the provider's address with only the headers
its payload builder set (its token); through :func:`sources.download.call`, so every connection
is resolved once and checked by the address guard (loopback, link-local and metadata addresses
are refused unless ``--allow-insecure-sources``), one deadline covers every redirect, and a
redirect never leaves the first origin (the request may carry a token).

Invariants:

- A reconcile never waits here: :meth:`Outboxes.put` only appends to a bounded queue, and a full
  queue drops the notification (``stageset_notifications_dropped_total{reason="queue_full"}``).
- Per provider at most ``burst`` requests go out at once and ``rate`` per second after that
  (a token bucket); what waits for a token waits in the bounded queue.
- Fair between tenants (the namespace of the StageSet an event is about): a provider's queue is
  one queue per tenant, served round-robin — a tenant that has just been served goes behind every
  tenant waiting, a newcomer included — so one tenant's burst delays another tenant's first alert
  by at most the one send in flight.  When the provider's queue is full, room is made by dropping
  the newest request of the tenant holding the most (never one of a tenant with fewer queued than
  the one putting).
- A request is tried at most ``attempts`` times: again after a transport error, a 429 or a 5xx,
  after ``backoff`` seconds doubling up to ``backoff_cap``; a final failure is counted
  (``stageset_notification_failures_total``), a success too (``..._sent_total``).  Labels are
  the provider's name (platform-owned) and type, never anything of a tenant's.
- What a receiver answers is never logged (it may echo the request), nor a receiver's path (a
  webhook URL's path is its credential): only its origin.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from sources.addresses import AddressGuard
from sources.download import call, display
from sources.errors import SourceError
from stageset.controller.notifications.config import Provider
from stageset.controller.notifications.payloads import Outgoing
from stageset.controller.settings import DeliverySettings as DeliverySettings  # declared with the others

log = logging.getLogger(__name__)


class Counters(Protocol):
    """What deliveries report (:class:`~stageset.controller.metrics.Metrics` implements it)."""

    def notification_sent(self, provider: str, type_: str) -> None: ...
    def notification_failed(self, provider: str, type_: str) -> None: ...
    def notification_dropped(self, provider: str, reason: str) -> None: ...


Send = Callable[[Outgoing, float], int]
"""Sends one request (a timeout in seconds); the HTTP status.  Raises :class:`SourceError`."""


def http_sender(guard: AddressGuard) -> Send:
    def send(request: Outgoing, timeout: float) -> int:
        body = json.dumps(request.body, separators=(",", ":")).encode()
        answer = call(request.url, method="POST", guard=guard, timeout=timeout, headers=dict(request.headers),
                      body=body, same_origin=True, max_body=4096)
        return answer.status
    return send


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


def retryable(status: int) -> bool:
    return status == 429 or status >= 500


class _TokenBucket:
    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float]):
        self._rate, self._burst, self._clock = rate, max(1, burst), clock
        self._tokens = float(self._burst)
        self._at = clock()

    def wait_time(self) -> float:
        """0 and a token taken, or how long until one is there."""
        now = self._clock()
        self._tokens = min(float(self._burst), self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate if self._rate > 0 else 60.0


class _Outbox:
    def __init__(self, provider: Provider, *, settings: DeliverySettings, send: Send, counters: Counters,
                 stop: threading.Event, clock: Callable[[], float]):
        self.provider = provider
        self._settings = settings
        self._send = send
        self._counters = counters
        self._stop = stop
        self._queues: OrderedDict[str, deque[Outgoing]] = OrderedDict()
        """One queue per tenant, in the order they are served (round-robin)."""
        self._queued = 0
        self._served: str | None = None
        """The tenant served last (at the end of the order until someone else is)."""
        self._sending = False
        self._ready = threading.Condition()
        self._bucket = _TokenBucket(rate=settings.rate, burst=settings.burst, clock=clock)
        self._thread = threading.Thread(target=self._run, name=f"notify-{provider.name}"[:60], daemon=True)
        self._thread.start()

    def put(self, provider: Provider, requests: list[Outgoing], *, tenant: str = "") -> None:
        with self._ready:
            self.provider = provider  # the latest spec and credentials
            for request in requests:
                if self._queued >= self._settings.capacity and not self._make_room(tenant):
                    self._counters.notification_dropped(provider.name, "queue_full")
                    continue
                self._enqueue(tenant, request)
            self._ready.notify()

    def _enqueue(self, tenant: str, request: Outgoing) -> None:
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
            if self._served is not None and self._served in self._queues:
                # A newcomer waits ahead of the tenant served last (which stays at the end).
                self._queues.move_to_end(self._served)
        queue.append(request)
        self._queued += 1

    def _make_room(self, tenant: str) -> bool:
        """The queue is full: drop the newest request of the tenant holding the most, if it holds
        more than ``tenant`` would after this put (else nothing is dropped: ``False``)."""
        fullest = max(self._queues, key=lambda known: len(self._queues[known]))
        if fullest == tenant or len(self._queues[fullest]) <= len(self._queues.get(tenant, ())) + 1:
            return False
        self._queues[fullest].pop()
        self._queued -= 1
        self._counters.notification_dropped(self.provider.name, "queue_full")
        return True

    def _take(self) -> Outgoing:
        """The next request, round-robin between tenants (the caller holds the lock; one is queued)."""
        tenant, queue = next(iter(self._queues.items()))
        request = queue.popleft()
        self._queued -= 1
        if queue:
            self._queues.move_to_end(tenant)
        else:
            del self._queues[tenant]
        self._served = tenant
        return request

    def pending(self) -> int:
        """Requests queued or being sent."""
        with self._ready:
            return self._queued + (1 if self._sending else 0)

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._ready:
                while not self._queued and not self._stop.is_set():
                    self._ready.wait(1.0)
            # What waits for a token stays in the queue (and counts against its bound); only this
            # thread takes from it, so it is still there after the wait.
            while (delay := self._bucket.wait_time()) > 0:
                if self._stop.wait(delay):
                    return
            if self._stop.is_set():
                return
            with self._ready:
                request, provider = self._take(), self.provider
                self._sending = True
            try:
                self._deliver(request, provider)
            finally:
                with self._ready:
                    self._sending = False

    def _deliver(self, request: Outgoing, provider: Provider) -> None:
        delay = self._settings.backoff
        problem = ""
        for attempt in range(1, self._settings.attempts + 1):
            try:
                status = self._send(request, provider.timeout)
            except SourceError as error:
                problem, again = str(error), True
            else:
                if 200 <= status < 300:
                    self._counters.notification_sent(provider.name, provider.type.value)
                    return
                problem, again = f"HTTP {status}", retryable(status)
            if not again or attempt == self._settings.attempts:
                break
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self._settings.backoff_cap)
        self._counters.notification_failed(provider.name, provider.type.value)
        # Only the receiver's origin: a webhook URL's path is its credential (Slack, Teams).
        origin = _origin(request.url)
        log.warning("notifications: provider %s could not send to %s: %s", provider.name, origin,
                    problem.replace(display(request.url), origin))


class Outboxes:
    """Every provider's outbox, made when the provider is first sent to."""

    def __init__(self, *, settings: DeliverySettings, send: Send, counters: Counters,
                 clock: Callable[[], float] = time.monotonic):
        self._settings = settings
        self._send = send
        self._counters = counters
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._boxes: dict[str, _Outbox] = {}

    def put(self, provider: Provider, requests: list[Outgoing], *, tenant: str = "") -> None:
        """Queue ``requests`` for ``provider``, on behalf of ``tenant`` (the namespace the event is about)."""
        if not requests:
            return
        with self._lock:
            box = self._boxes.get(provider.name)
            if box is None:
                if len(self._boxes) >= self._settings.max_providers:
                    self._counters.notification_dropped(provider.name, "too_many_providers")
                    return
                box = self._boxes[provider.name] = _Outbox(provider, settings=self._settings, send=self._send,
                                                           counters=self._counters, stop=self._stop,
                                                           clock=self._clock)
        box.put(provider, requests, tenant=tenant)

    def pending(self) -> int:
        with self._lock:
            boxes = list(self._boxes.values())
        return sum(box.pending() for box in boxes)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            boxes = list(self._boxes.values())
        for box in boxes:
            box.wake()
        deadline = time.monotonic() + timeout
        for box in boxes:
            box.join(max(0.0, deadline - time.monotonic()))
