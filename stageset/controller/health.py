"""The process around the manager: probes, metrics port, start-up waits, leader election, stop.

Identity: the probe and metrics endpoints serve this process's own state and make no request
to any cluster; leader election (:mod:`stageset.controller.leader`) uses the controller's own
identity.

:class:`Lifecycle` is what :class:`~stageset.controller.manager.Manager` calls at two points
of ``run()``:

* :meth:`Lifecycle.before_workers` -- after the watches are started: waits until every cache
  has synced (then ``/readyz`` answers 200), then, with leader election, until this process
  holds the release's Lease.  Both waits end as soon as the process is asked to stop
  (SIGTERM during start-up stops within a poll interval, not after a 60 s sync timeout), and
  a stop makes it return False so no worker ever starts.
* :meth:`Lifecycle.after_workers` -- after the workers stopped: releases the Lease and closes
  the HTTP endpoints.

``/healthz`` answers 200 while the process runs (the probe server is a thread of it);
``/readyz`` answers 200 once the caches have synced -- a standby replica is ready too, so a
rolling update can proceed and hand the Lease over.  ``/metrics`` (on its own address) serves
every series of :class:`~stageset.controller.metrics.Metrics` (``docs/operations.md#metrics``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stageset.controller.leader import LeaderElectionConfig, LeaderElector
from stageset.controller.metrics import Metrics
from stageset.kube.client import KubeClient

log = logging.getLogger(__name__)

_SYNC_WARNING_AFTER = 60.0


def parse_address(value: str) -> tuple[str, int]:
    """``:8081`` (all interfaces), ``127.0.0.1:8081``, ``[::1]:0`` -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not an address: {value!r} (use :8081 or 127.0.0.1:8081)")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 -- a pod's probes come from the node


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], routes: dict[str, Callable[[], tuple[int, str]]]):
        self.routes = routes
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path.split("?", 1)[0])
        status, body = route() if route else (404, "not found\n")
        payload = body.encode()
        self.send_response(status)
        content = "text/plain; version=0.0.4" if self.path.startswith("/metrics") else "text/plain"
        self.send_header("Content-Type", f"{content}; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass  # kubelet probes every few seconds: not worth a log line each


@dataclass(frozen=True)
class LifecycleSettings:
    """The process-level flags: where to serve probes and metrics, and leader election."""

    probe_address: str | None = None
    metrics_address: str | None = None
    leader_election: LeaderElectionConfig | None = None


class Lifecycle:
    def __init__(self, *, settings: LifecycleSettings, client: KubeClient, stop: threading.Event,
                 on_leadership_lost: Callable[[], None], metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._stop = stop
        self.synced = threading.Event()
        self.elector = (LeaderElector(client=client, config=settings.leader_election, stop=stop,
                                      on_lost=on_leadership_lost)
                        if settings.leader_election else None)
        self._servers: list[_Server] = []
        self.addresses: dict[str, tuple[str, int]] = {}

    # -- endpoints ---------------------------------------------------------------------

    def _healthz(self) -> tuple[int, str]:
        return 200, "ok\n"

    def _readyz(self) -> tuple[int, str]:
        return (200, "ok\n") if self.synced.is_set() else (503, "caches not synced\n")

    def _metrics(self) -> tuple[int, str]:
        return 200, self.metrics.exposition().decode()

    def _serve(self, name: str, address: str, routes: dict[str, Callable[[], tuple[int, str]]]) -> None:
        server = _Server(parse_address(address), routes)
        threading.Thread(target=server.serve_forever, name=f"{name}-server", daemon=True).start()
        self._servers.append(server)
        self.addresses[name] = server.server_address[:2]  # type: ignore[assignment]
        log.info("serving %s on %s:%d", ", ".join(routes), *self.addresses[name])

    def start(self) -> None:
        """Open the probe and metrics ports (before anything slow, so liveness holds at once)."""
        if self.settings.probe_address:
            self._serve("probes", self.settings.probe_address,
                        {"/healthz": self._healthz, "/readyz": self._readyz})
        if self.settings.metrics_address:
            self._serve("metrics", self.settings.metrics_address, {"/metrics": self._metrics})

    # -- the manager's hooks -----------------------------------------------------------

    def before_workers(self, synced: Sequence[threading.Event]) -> bool:
        """Wait for the caches (60 s at most), then for leadership; False once a stop is requested.

        Caches that have not synced after 60 s (a watch refused, say) are logged and waited for
        in the background: the workers start anyway, as before, and ``/readyz`` says 503 until
        they sync.
        """
        waited = 0.0
        while not all(event.is_set() for event in synced):
            if self._stop.wait(0.1):
                return False
            waited += 0.1
            if waited >= _SYNC_WARNING_AFTER:
                log.warning("caches not synced after %.0fs; starting anyway", _SYNC_WARNING_AFTER)
                threading.Thread(target=self._mark_synced, args=(synced,), name="sync-wait",
                                 daemon=True).start()
                break
        else:
            self.synced.set()
        if self._stop.is_set():
            return False
        if self.elector is None:
            return True
        log.info("waiting for the Lease %s/%s", self.elector.config.namespace, self.elector.config.name)
        self.elector.start()
        return self.elector.wait_leading()

    def _mark_synced(self, synced: Sequence[threading.Event]) -> None:
        for event in synced:
            while not event.wait(1.0):
                if self._stop.is_set():
                    return
        self.synced.set()

    def after_workers(self) -> None:
        """Release the Lease (the workers have stopped writing) and close the endpoints."""
        if self.elector is not None:
            self.elector.release()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()
