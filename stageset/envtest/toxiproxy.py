"""Toxiproxy: a real TCP proxy that injects network faults, built from the Go module proxy.

Build, as every Go tool of the tests (:mod:`stageset.envtest.gotool`): the checked-in wrapper
module ``hack/toxiproxy`` requires ``github.com/Shopify/toxiproxy/v2`` at
:data:`TOXIPROXY_VERSION`, and ``cmd/server`` is built into
``<cache>/tools/toxiproxy-<version>/toxiproxy-server`` once.  Nothing prebuilt is downloaded;
``--update`` regenerates the wrapper after a version bump; ``STAGESET_TOXIPROXY`` naming an
executable uses that binary instead.

Run: :func:`start` runs ``toxiproxy-server`` on a free loopback port (it dies with its parent,
like the control plane) and returns a :class:`Toxiproxy` that speaks its HTTP API: create
proxies (each listens on another free loopback port and forwards to one upstream), add and
remove toxics (latency, bandwidth, reset_peer, timeout, slow_close, limit_data), disable and
enable a proxy (its listener closes: connections are refused).  Its log (JSON lines) records
every accepted client per proxy, which tests count to see how often the controller retried.

Identity: none.  The proxy relays bytes; TLS to the apiserver stays end to end between the
controller and the apiserver (the proxy sees ciphertext only).  Test traffic only: every
address is on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stageset.envtest.gotool import GoTool
from stageset.envtest.server import _die_with_parent, free_port

TOXIPROXY_VERSION = "v2.5.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
TOXIPROXY = GoTool(name="toxiproxy", version=TOXIPROXY_VERSION, module=TOXIPROXY_MODULE,
                   package=f"{TOXIPROXY_MODULE}/cmd/server", binary="toxiproxy-server",
                   env_override="STAGESET_TOXIPROXY",
                   ldflags=f"-X {TOXIPROXY_MODULE}.Version={TOXIPROXY_VERSION}", nosumdb="github.com/Shopify")


def ensure_toxiproxy(*, log: bool = True) -> Path:
    """The toxiproxy-server binary, building it once into the cache if needed."""
    return TOXIPROXY.ensure(log=log)


# -- running it --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proxy:
    """One proxy: ``listen`` (host:port on loopback) forwards to ``upstream``."""

    name: str
    listen: str
    upstream: str

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


@dataclass
class Toxiproxy:
    """A running ``toxiproxy-server`` and its HTTP API."""

    api: str
    log: Path
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method,  # noqa: S310
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - our loopback API
                text = reply.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"toxiproxy {method} {path}: {error.code} {error.read()[:500]!r}") from None
        return json.loads(text) if text.strip() else None

    def proxy(self, name: str, *, upstream: str) -> Proxy:
        """A new proxy on a free loopback port forwarding to ``upstream`` (``host:port``)."""
        listen = f"127.0.0.1:{free_port()}"
        self._call("POST", "/proxies",
                   {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        return Proxy(name=name, listen=listen, upstream=upstream)

    def set_enabled(self, proxy: Proxy, enabled: bool) -> None:
        """Disabled: the listener is closed and every open connection through it is cut."""
        self._call("POST", f"/proxies/{proxy.name}", {"enabled": enabled})

    def add_toxic(self, proxy: Proxy, *, name: str, type_: str, stream: str = "downstream",
                  toxicity: float = 1.0, **attributes: float) -> None:
        """Add a toxic; ``stream`` is ``downstream`` (server to client) or ``upstream``."""
        self._call("POST", f"/proxies/{proxy.name}/toxics",
                   {"name": name, "type": type_, "stream": stream, "toxicity": toxicity,
                    "attributes": attributes})

    def remove_toxic(self, proxy: Proxy, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy.name}/toxics/{name}")

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("POST", "/reset")

    @contextlib.contextmanager
    def toxic(self, proxy: Proxy, *, name: str, type_: str, stream: str = "downstream",
              **attributes: float) -> Iterator[None]:
        self.add_toxic(proxy, name=name, type_=type_, stream=stream, **attributes)
        try:
            yield
        finally:
            self.remove_toxic(proxy, name)

    def accepted(self, proxy: Proxy) -> list[float]:
        """When the proxy accepted each client connection (UNIX seconds), from its log."""
        found: list[float] = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("message") == "Accepted client" and record.get("name") == proxy.name:
                found.append(_epoch(str(record.get("time", ""))))
        return found

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=5)

    def __enter__(self) -> Toxiproxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _epoch(stamp: str) -> float:
    import datetime

    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def start(*, workdir: Path, binary: Path | None = None) -> Toxiproxy:
    """Run ``toxiproxy-server`` on loopback; the caller must ``stop()`` it."""
    binary = binary or ensure_toxiproxy()
    port = free_port()
    log = workdir / "toxiproxy.log"
    workdir.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(port)],
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "LOG_LEVEL": "info"},
            preexec_fn=_die_with_parent,  # no threads are started before fork here
        )
    proxy = Toxiproxy(api=f"http://127.0.0.1:{port}", log=log, _process=process)
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"toxiproxy-server exited with {process.returncode}: "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            proxy._call("GET", "/proxies")
            return proxy
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                proxy.stop()
                raise
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(TOXIPROXY.main(sys.argv[1:], generator="python -m stageset.envtest.toxiproxy"))
