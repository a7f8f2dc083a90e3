"""A loopback HTTP server for ``http`` actions: answers set per path, every request recorded.

Only loopback: tests never send traffic elsewhere.  ``answer(path, status, body=..., redirect=..., echo=...)``
sets what a path answers (``echo``: a body made from the request's headers, as a careless endpoint
reflects them); :attr:`ActionServer.requests` holds what arrived (method, path, headers,
body), so a test can assert a call happened once, or never.
``hold=`` (an event) keeps a path's answers back until the test sets it: a pass held in a slow
action, for as long as the test needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    redirect: str | None = None
    echo: Callable[[dict[str, str]], bytes] | None = None
    """The body made from the request's headers (an endpoint that reflects what it was sent)."""
    hold: threading.Event | None = None


@dataclass
class ActionServer:
    host: str = "127.0.0.1"
    replies: dict[str, Reply] = field(default_factory=dict)
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with server._lock:
                    server.requests.append(
                        Received(self.command, self.path, dict(self.headers.items()), body)
                    )
                    reply = server.replies.get(self.path, Reply(status=404, body=b"no such path"))
                if reply.hold is not None:
                    reply.hold.wait(timeout=300)  # bounded: a failed test never leaves it hanging
                if reply.redirect:
                    self.send_response(reply.status)
                    self.send_header("Location", reply.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = reply.echo(dict(self.headers.items())) if reply.echo is not None else reply.body
                self.send_response(reply.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

            def log_message(self, format: str, *args: object) -> None:  # noqa: ARG002 - the base's signature
                return  # quiet: the tests read what arrived from ``requests``

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="action-server", daemon=True
        )

    def __enter__(self) -> ActionServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def answer(
        self,
        path: str,
        status: int = 200,
        *,
        body: bytes = b"ok",
        redirect: str | None = None,
        echo: Callable[[dict[str, str]], bytes] | None = None,
        hold: threading.Event | None = None,
    ) -> str:
        with self._lock:
            self.replies[path] = Reply(status=status, body=body, redirect=redirect, echo=echo,
                                      hold=hold)
        return self.url(path)

    def received(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path == path]
