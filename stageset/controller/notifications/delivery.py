"""Sending notifications: one bounded outbox and one worker thread per provider, rate-limited,
retried with bounded backoff.

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
from collections import deque
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
        self._queue: deque[Outgoing] = deque()
        self._sending = False
        self._ready = threading.Condition()
        self._bucket = _TokenBucket(rate=settings.rate, burst=settings.burst, clock=clock)
        self._thread = threading.Thread(target=self._run, name=f"notify-{provider.name}"[:60], daemon=True)
        self._thread.start()

    def put(self, provider: Provider, requests: list[Outgoing]) -> None:
        with self._ready:
            self.provider = provider  # the latest spec and credentials
            for request in requests:
                if len(self._queue) >= self._settings.capacity:
                    self._counters.notification_dropped(provider.name, "queue_full")
                    continue
                self._queue.append(request)
            self._ready.notify()

    def pending(self) -> int:
        """Requests queued or being sent."""
        with self._ready:
            return len(self._queue) + (1 if self._sending else 0)

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._ready:
                while not self._queue and not self._stop.is_set():
                    self._ready.wait(1.0)
            # What waits for a token stays in the queue (and counts against its bound); only this
            # thread takes from it, so it is still there after the wait.
            while (delay := self._bucket.wait_time()) > 0:
                if self._stop.wait(delay):
                    return
            if self._stop.is_set():
                return
            with self._ready:
                request, provider = self._queue.popleft(), self.provider
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

    def put(self, provider: Provider, requests: list[Outgoing]) -> None:
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
        box.put(provider, requests)

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
