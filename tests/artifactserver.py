"""A loopback artifact server, as Flux's source-controller serves ``status.artifact.url``, plus hostile modes.

``ArtifactServer`` serves files from memory at ``http://127.0.0.1:<port>/<path>`` (plain HTTP, like
source-controller's storage server), counts requests per path, and can be told, per path, to
redirect elsewhere, trickle bytes (a tarpit), lie about ``Content-Length``, or answer an error.

``tarball(files, ...)`` builds a gzip-compressed tarball the way Flux's archiver does, and
``hostile_tarball(entries)`` builds ones with whatever unsafe entries a test needs.  ``digest_of``
gives the ``sha256:<hex>`` a source object's status would name.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import socketserver
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def digest_of(data: bytes, algorithm: str = "sha256") -> str:
    return f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"


def tarball(files: Mapping[str, bytes | str], *, directories: bool = True) -> bytes:
    """A ``.tar.gz`` of ``files`` (regular files, mode 0644, with their parent directories)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
        seen: set[str] = set()
        for path in sorted(files):
            parts = path.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directories and directory not in seen:
                    seen.add(directory)
                    info = tarfile.TarInfo(directory + "/")
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
            content = files[path]
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class Entry:
    """One raw tar entry for hostile archives."""

    name: str
    type: bytes = tarfile.REGTYPE
    data: bytes = b""
    linkname: str = ""
    size: int | None = None
    """Declared size, when it should differ from ``len(data)``."""


def hostile_tarball(entries: Iterable[Entry]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed, \
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type, info.linkname, info.mode = entry.type, entry.linkname, 0o644
            info.size = len(entry.data) if entry.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            archive.addfile(info, io.BytesIO(entry.data) if info.size else None)
    return buffer.getvalue()


def gzip_bomb(*, inflated: int) -> bytes:
    """A tarball of one file of ``inflated`` zero bytes (compresses about 1000:1)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as compressed:
        info = tarfile.TarInfo("bomb.yaml")
        info.size = inflated
        compressed.write(info.tobuf(format=tarfile.GNU_FORMAT))
        chunk = b"\0" * (1 << 20)
        left = inflated
        while left > 0:
            compressed.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
        compressed.write(b"\0" * (tarfile.BLOCKSIZE * 2))
    return buffer.getvalue()


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    redirect: str | None = None
    trickle: float | None = None
    """Seconds between single bytes (a tarpit)."""
    content_length: int | None = None
    """Announced length; ``-1``: none (the body ends when the connection closes)."""
    headers: dict[str, str] = field(default_factory=dict)


class ArtifactServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.routes: dict[str, Route] = {}
        self.requests: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        """Responses being sent right now, per path."""
        self.log: list[tuple[str, dict[str, int]]] = []
        """Each request as it began: its path, and what else was in flight then."""
        self._count = threading.Lock()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}/{path.lstrip('/')}"

    def publish(self, path: str, body: bytes, **route: Any) -> str:
        """Serve ``body`` at ``path``; returns its URL."""
        self.routes["/" + path.lstrip("/")] = Route(body=body, **route)
        return self.url(path)

    def start(self) -> ArtifactServer:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with server._count:
                    server.requests[path] += 1
                    server.log.append((path, {p: n for p, n in server.in_flight.items() if n}))
                    server.in_flight[path] += 1
                try:
                    self._serve(path)
                finally:
                    with server._count:
                        server.in_flight[path] -= 1

            def _serve(self, path: str) -> None:
                route = server.routes.get(path)
                if route is None:
                    self.send_error(404)
                    return
                if route.redirect is not None:
                    self.send_response(302)
                    self.send_header("Location", route.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(route.status)
                length = route.content_length if route.content_length is not None else len(route.body)
                if length >= 0:
                    self.send_header("Content-Length", str(length))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.send_header("Content-Type", "application/gzip")
                for name, value in route.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if route.trickle is None:
                    self.wfile.write(route.body)
                    return
                for byte in route.body:
                    if server._stopping.is_set():
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(route.trickle)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((self.host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="artifact-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> ArtifactServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
