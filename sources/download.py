"""Downloading one artifact over HTTP(S) — and one ``http`` action's call (:func:`call`) — with the
address guard at every connection, bounded in bytes and time.

Identity: none — a download sends no credentials of anyone (Flux serves artifacts without them), a
:func:`call` only the headers its caller hands in (an ``http`` action's, read from Secrets as the
stage's ServiceAccount); no proxy of the environment is used (a proxy would connect where the guard
cannot see), and only ``http``/``https`` URLs are followed.

* **Address guard** (:class:`~sources.addresses.AddressGuard`): every connection — the first and
  each redirect hop — resolves its host once, checks every address, and connects to a checked
  address itself, so a DNS answer that changes between check and connect (rebinding) is never
  used.  The connected socket's peer is checked again.
* **Redirects** are followed by hand (at most :data:`MAX_REDIRECTS`), each hop a new guarded
  connection.
* **Bytes**: a ``Content-Length`` over the limit is refused before the body is read, and the body
  is counted as it arrives; ``Content-Encoding`` is refused (the digest is of the file as stored;
  a compressed transfer would also be a decompression bomb).
* **Time**: a :class:`Deadline` covers the whole download, hops included.  A watchdog shuts the
  socket down when it passes (or when the caller cancels: the controller is stopping), so a
  server that trickles one byte a second (a tarpit) cannot hold a worker longer than the
  deadline, whatever per-read timeouts say.

The body goes to a caller's file (spooled to disk by :mod:`sources.artifacts`) while a digest is
computed over it; nothing is parsed here.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError as Urllib3Error

from sources.addresses import AddressGuard, AddressRefusedError
from sources.digests import Hasher
from sources.errors import LimitExceededError, TransferError, UrlPolicyError
from sources.transport import Sockets

MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
_REDIRECTS = {301, 302, 303, 307, 308}


def display(url: str) -> str:
    """A URL as messages show it: scheme, host, port and path; never userinfo or query."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if ":" in netloc:
            netloc = f"[{netloc}]"
        if parts.port:
            netloc += f":{parts.port}"
        return f"{parts.scheme}://{netloc}{parts.path}"
    except ValueError:
        return "an invalid URL"


def check_url(url: str, *, what: str = "artifact URL") -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an artifact URL; :class:`UrlPolicyError` unless http(s) with a host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlPolicyError(f"{what} {display(url)} is malformed") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlPolicyError(f"{what} scheme {scheme!r} is not allowed (only http and https)")
    if not parts.hostname:
        raise UrlPolicyError(f"{what} has no host")
    if parts.username or parts.password:
        raise UrlPolicyError(f"{what} must not carry credentials")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80)


@dataclass
class Deadline:
    """When a download must be over (monotonic seconds)."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())


class _Guarded:
    """Mixin for urllib3's connections: resolve once, check, connect to the checked address."""

    guard: AddressGuard
    host: str
    port: int
    timeout: Any
    socket_options: Any

    def _new_conn(self) -> socket.socket:
        addresses = self.guard.addresses(self.host, self.port)
        last: OSError | None = None
        for address in addresses:
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                timeout = self.timeout if isinstance(self.timeout, (int, float)) else None
                sock.settimeout(timeout)
                for option in self.socket_options or ():
                    sock.setsockopt(*option)
                sock.connect((str(address), self.port))
                peer = ipaddress.ip_address(sock.getpeername()[0].split("%", 1)[0])
                self.guard.check(peer, host=self.host)  # what we are connected to, not what we meant
                return sock
            except AddressRefusedError:
                sock.close()
                raise
            except OSError as error:
                sock.close()
                last = error
        raise TransferError(f"cannot connect to {self.host}:{self.port}: {last}")


class GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


class _Watchdog:
    """Cuts the connections of one download when its deadline passes or ``cancel`` is set."""

    def __init__(self, deadline: Deadline, cancel: threading.Event | None = None):
        self._deadline = deadline
        self._cancel = cancel
        self._sockets = Sockets()
        self._done = threading.Event()
        self.fired = False
        self.cancelled = False
        self._thread = threading.Thread(target=self._watch, name="artifact-deadline", daemon=True)
        self._thread.start()

    def add(self, connection: Any) -> None:
        self._sockets.add(connection)

    def _watch(self) -> None:
        while not self._done.wait(min(0.25, self._deadline.remaining())):
            if self._cancel is not None and self._cancel.is_set():
                self.cancelled = True
                break
            if self._deadline.remaining() <= 0:
                break
        else:
            return
        self.fired = True
        self._sockets.cut()

    @property
    def expired(self) -> bool:
        """The deadline passed (or the download was cancelled): whatever error a read raised then,
        the deadline is why.  A read's own timeout is the time left, so it can fire just before
        the watchdog does."""
        return self.fired or self._deadline.remaining() <= 0

    def stop(self) -> None:
        self._done.set()


def _pool(scheme: str, host: str, port: int, *, guard: AddressGuard, watchdog: _Watchdog,
          timeout: urllib3.Timeout, ca_certs: str | None) -> urllib3.HTTPConnectionPool:
    base: type[urllib3.HTTPConnectionPool] = urllib3.HTTPSConnectionPool if scheme == "https" \
        else urllib3.HTTPConnectionPool
    connection_class = GuardedHTTPSConnection if scheme == "https" else GuardedHTTPConnection

    class Pool(base):  # type: ignore[valid-type,misc]
        ConnectionCls = connection_class

        def _new_conn(self) -> Any:
            connection = super()._new_conn()
            connection.guard = guard
            watchdog.add(connection)
            return connection

    kwargs: dict[str, Any] = {"timeout": timeout, "maxsize": 1, "retries": False}
    if scheme == "https":
        kwargs["cert_reqs"] = "CERT_REQUIRED"
        if ca_certs:
            kwargs["ca_certs"] = ca_certs
    return Pool(host, port, **kwargs)


@dataclass(frozen=True)
class Downloaded:
    """What a download wrote: its size, its digest (hex) and the URL it finally came from."""

    size: int
    digest: str
    final_url: str


def download(url: str, *, into: IO[bytes], hasher: Hasher, guard: AddressGuard, max_bytes: int,
             timeout: float, read_timeout: float = 30.0, ca_certs: str | None = None,
             on_chunk: Callable[[int], None] | None = None,
             cancel: threading.Event | None = None) -> Downloaded:
    """Write the body at ``url`` into ``into``, hashing it with ``hasher``.

    Raises :class:`~sources.addresses.AddressRefusedError` / :class:`UrlPolicyError` (refused: not
    worth retrying), :class:`LimitExceededError`, and :class:`TransferError` (worth retrying).
    """
    deadline = Deadline.after(timeout)
    watchdog = _Watchdog(deadline, cancel)
    try:
        current = url
        for _hop in range(MAX_REDIRECTS + 1):
            scheme, host, port = check_url(current)
            per_read = urllib3.Timeout(connect=min(10.0, max(0.1, deadline.remaining())),
                                       read=min(read_timeout, max(0.1, deadline.remaining())))
            pool = _pool(scheme, host, port, guard=guard, watchdog=watchdog, timeout=per_read,
                         ca_certs=ca_certs)
            try:
                response = _get(pool, current, deadline=deadline, watchdog=watchdog)
                if response.status in _REDIRECTS:
                    location = response.headers.get("Location")
                    response.release_conn()
                    if not location:
                        raise TransferError(f"{display(current)} answered HTTP {response.status} "
                                            "without a Location")
                    current = urljoin(current, location)
                    continue
                if response.status != 200:
                    response.release_conn()
                    raise TransferError(f"{display(current)} answered HTTP {response.status}")
                size, digest = _body(response, into=into, hasher=hasher, max_bytes=max_bytes,
                                     url=current, watchdog=watchdog, on_chunk=on_chunk)
                return Downloaded(size=size, digest=digest, final_url=current)
            finally:
                pool.close()
        raise TransferError(f"{display(url)}: more than {MAX_REDIRECTS} redirects")
    finally:
        watchdog.stop()


def _timed_out(url: str, watchdog: _Watchdog | None = None) -> TransferError:
    if watchdog is not None and watchdog.cancelled:
        return TransferError(f"downloading {display(url)} was abandoned: the controller is stopping")
    return TransferError(f"downloading {display(url)} took longer than the artifact timeout "
                         "(--artifact-timeout); the connection was closed")


def _get(pool: urllib3.HTTPConnectionPool, url: str, *, deadline: Deadline,
         watchdog: _Watchdog, method: str = "GET", headers: dict[str, str] | None = None,
         body: bytes | None = None, timed_out: Callable[[str, _Watchdog | None], TransferError] | None = None
         ) -> Any:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    timed_out = timed_out or _timed_out
    if deadline.remaining() <= 0:
        raise timed_out(url, None)
    try:
        return pool.urlopen(method, target, body=body, redirect=False, retries=False, preload_content=False,
                            decode_content=False, assert_same_host=False,
                            headers={**(headers or {}), "Accept-Encoding": "identity",
                                     "User-Agent": "stageset"})
    except AddressRefusedError:
        raise
    except (UrlPolicyError, TransferError):
        raise
    except (Urllib3Error, OSError) as error:
        if watchdog.expired:
            raise timed_out(url, watchdog) from None
        cause = error.__cause__ or error.__context__
        if isinstance(cause, (AddressRefusedError, UrlPolicyError, TransferError)):
            raise cause from None
        reason = getattr(error, "reason", None)
        if isinstance(reason, (AddressRefusedError, UrlPolicyError, TransferError)):
            raise reason from None
        raise TransferError(f"downloading {display(url)} failed: {type(error).__name__}: {error}") from None


def _body(response: Any, *, into: IO[bytes], hasher: Hasher, max_bytes: int, url: str,
          watchdog: _Watchdog, on_chunk: Callable[[int], None] | None) -> tuple[int, str]:
    try:
        encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise TransferError(f"{display(url)} sent the artifact with Content-Encoding {encoding!r}; "
                                "only the stored file itself is accepted")
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise LimitExceededError(f"the artifact at {display(url)} has {int(declared)} bytes, more than "
                                     f"{max_bytes} (--artifact-max-size)")
        size = 0
        while True:
            chunk = response.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise LimitExceededError(f"the artifact at {display(url)} is larger than {max_bytes} bytes "
                                         "(--artifact-max-size)")
            hasher.update(chunk)
            into.write(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
        if declared is not None and declared.strip().isdigit() and int(declared) != size:
            raise TransferError(f"{display(url)} sent {size} bytes of the {int(declared)} it announced")
        return size, hasher.hexdigest()
    except (Urllib3Error, OSError) as error:
        if watchdog.expired:
            raise _timed_out(url, watchdog) from None
        raise TransferError(f"downloading {display(url)} failed: {type(error).__name__}: {error}") from None
    finally:
        response.release_conn()


# -- a call: any method, headers and a body (the ``http`` action) ---------------------------------

MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Answer:
    """What a :func:`call` got: the final status, the first ``max_body`` bytes of the body, the URL."""

    status: int
    body: bytes
    url: str


def _origin(url: str) -> tuple[str, str, int]:
    scheme, host, port = check_url(url, what="URL")
    return scheme, host.lower(), port


def call(url: str, *, method: str, guard: AddressGuard, timeout: float, headers: dict[str, str] | None = None,
         body: bytes | None = None, check: Callable[[str], None] | None = None, same_origin: bool = False,
         max_body: int = MAX_ANSWER_BYTES, ca_certs: str | None = None,
         cancel: threading.Event | None = None) -> Answer:
    """One HTTP request through the same guard as :func:`download`: every connection (each redirect
    hop too) resolves once, is checked, and connects only to the checked address; one deadline
    covers every hop; no proxy, no credentials but the ``headers`` given.

    ``check(url)`` runs for the first URL and every redirect's target and raises
    :class:`UrlPolicyError` to refuse it (the caller's host allow-list).  With ``same_origin`` a
    redirect may not leave the first URL's scheme, host and port (the request carries secrets).
    A 301, 302 or 303 answer to anything but ``GET``/``HEAD`` is followed with a ``GET`` without
    body, as browsers do; a 307 or 308 repeats the method and body.

    Raises :class:`~sources.addresses.AddressRefusedError` / :class:`UrlPolicyError` (refused) and
    :class:`TransferError` (the connection failed or took longer than ``timeout``)."""
    deadline = Deadline.after(timeout)
    watchdog = _Watchdog(deadline, cancel)

    def timed_out(at: str, dog: _Watchdog | None) -> TransferError:
        if dog is not None and dog.cancelled:
            return TransferError(f"calling {display(at)} was abandoned: the controller is stopping")
        return TransferError(f"calling {display(at)} took longer than {timeout:g}s; "
                             "the connection was closed")

    try:
        origin = _origin(url)
        current, current_method, current_body = url, method.upper(), body
        for hop in range(MAX_REDIRECTS + 1):
            scheme, host, port = check_url(current, what="URL")
            if check is not None:
                check(current)
            if hop and same_origin and (scheme, host.lower(), port) != origin:
                raise UrlPolicyError(f"refusing to follow a redirect from {display(url)} to "
                                     f"{display(current)}: "
                                     "the request carries values from Secrets, which may only go to the host "
                                     "they were meant for")
            per_read = urllib3.Timeout(connect=min(10.0, max(0.1, deadline.remaining())),
                                       read=max(0.1, deadline.remaining()))
            pool = _pool(scheme, host, port, guard=guard, watchdog=watchdog, timeout=per_read,
                         ca_certs=ca_certs)
            try:
                response = _get(pool, current, deadline=deadline, watchdog=watchdog, method=current_method,
                                headers=headers, body=current_body, timed_out=timed_out)
                try:
                    if response.status in _REDIRECTS:
                        location = response.headers.get("Location")
                        if not location:
                            raise TransferError(f"{display(current)} answered HTTP {response.status} "
                                                "without a Location")
                        current = urljoin(current, location)
                        if response.status in (301, 302, 303) and current_method not in ("GET", "HEAD"):
                            current_method, current_body = "GET", None
                        continue
                    data = b"" if current_method == "HEAD" else response.read(max_body)
                    return Answer(status=response.status, body=data or b"", url=current)
                except (Urllib3Error, OSError) as error:
                    if watchdog.expired:
                        raise timed_out(current, watchdog) from None
                    raise TransferError(f"calling {display(current)} failed: {type(error).__name__}: "
                                        f"{error}") from None
                finally:
                    response.release_conn()
            finally:
                pool.close()
        raise TransferError(f"{display(url)}: more than {MAX_REDIRECTS} redirects")
    finally:
        watchdog.stop()
