"""Toxiproxy: a real TCP proxy that injects network faults, built from the Go module proxy.

Build, like helm (:mod:`stageset.envtest.helm`) and kustomize: the checked-in wrapper module
``hack/toxiproxy`` (go.mod + go.sum + tools.go) requires ``github.com/Shopify/toxiproxy/v2``
at :data:`TOXIPROXY_VERSION`, and ``go build -mod=readonly`` builds ``cmd/server`` into
``<cache>/tools/toxiproxy-<version>/toxiproxy-server`` once, under a file lock.  Nothing
prebuilt is downloaded; ``--update`` regenerates the wrapper after a version bump;
``STAGESET_TOXIPROXY`` naming an executable uses that binary instead.

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
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stageset.build.kustomize import cache_root
from stageset.envtest.server import _die_with_parent, free_port

TOXIPROXY_VERSION = "v2.5.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
TOXIPROXY_PACKAGE = f"{TOXIPROXY_MODULE}/cmd/server"
ENV_OVERRIDE = "STAGESET_TOXIPROXY"
WRAPPER = Path(__file__).resolve().parents[2] / "hack" / "toxiproxy"

_CHECKSUM_FAILURE = re.compile(r"verifying ([\w.\-/]+)@|sum\.golang\.org|checksum database")


class GoError(RuntimeError):
    pass


def cached_binary() -> Path:
    return cache_root() / "tools" / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _go(args: list[str], *, cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.pop("GOFLAGS", None)
    env.update(extra_env or {})
    result = subprocess.run(["go", *args], cwd=cwd, env=env, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise GoError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")
    return result.stdout


def _build_into(target: Path, *, log: bool) -> None:
    ldflags = f"-s -w -X {TOXIPROXY_MODULE}.Version={TOXIPROXY_VERSION}"
    with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=target.parent) as tmp:
        staged = Path(tmp) / "bin"
        staged.mkdir()
        if log:
            print(f"building toxiproxy {TOXIPROXY_VERSION} from the Go module proxy ...", file=sys.stderr,
                  flush=True)
        command = ["build", "-mod=readonly", "-trimpath", "-buildvcs=false", "-ldflags", ldflags,
                   "-o", str(staged / "toxiproxy-server"), TOXIPROXY_PACKAGE]
        try:
            _go(command, cwd=WRAPPER)
        except GoError as error:
            # go.sum is checked in, so the checksum database is normally never asked; should a proxy
            # fail to relay a look-up anyway, retry with verification scoped off for this module.
            if not _CHECKSUM_FAILURE.search(str(error)):
                raise
            _go(command, cwd=WRAPPER, extra_env={"GONOSUMDB": "github.com/Shopify"})
        # Publish atomically so a half-built directory is never mistaken for a cache hit.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)


def ensure_toxiproxy(*, log: bool = True) -> Path:
    """The toxiproxy-server binary, building it once into the cache if needed."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        if _executable(Path(override)):
            return Path(override)
        raise RuntimeError(f"{ENV_OVERRIDE}={override} is not an executable file")
    binary = cached_binary()
    if _executable(binary):
        return binary
    if shutil.which("go") is None:
        raise RuntimeError(f"the Go toolchain is needed to build toxiproxy; install go or set {ENV_OVERRIDE}")
    target = binary.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".toxiproxy-{TOXIPROXY_VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _executable(binary):
            _build_into(target, log=log)
    return binary


def update_wrapper() -> None:
    """Regenerate ``hack/toxiproxy`` (go.mod, go.sum, tools.go) for :data:`TOXIPROXY_VERSION`."""
    WRAPPER.mkdir(parents=True, exist_ok=True)
    (WRAPPER / "go.mod").write_text(
        "// Generated by `python -m stageset.envtest.toxiproxy --update`; do not edit.\n"
        "module stageset.local/tools/toxiproxy\n\ngo 1.24\n\n"
        f"require {TOXIPROXY_MODULE} {TOXIPROXY_VERSION}\n"
    )
    (WRAPPER / "tools.go").write_text(
        "//go:build tools\n\n"
        "// Package tools pins the command this module builds, so `go mod tidy` keeps go.sum whole.\n"
        "package tools\n\n"
        f'import _ "{TOXIPROXY_PACKAGE}"\n'
    )
    _go(["mod", "tidy"], cwd=WRAPPER)


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


def main(argv: list[str]) -> int:
    if "--update" in argv:
        update_wrapper()
    print(ensure_toxiproxy())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
