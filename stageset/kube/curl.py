"""libcurl under :meth:`KubeClient.request`: one whole request and its answer, bytes in and out.

Why: ``bench/transport.py`` measured our request mix (impersonated applies, dry-runs, gets, status
patches) over urllib3 and over libcurl (``pycurl``): the apiserver's CPU is the same, the client's
is half with libcurl — HTTP parsing and TLS stay in C.  Watches and pod logs (streams) stay on
urllib3: they are few and long.

Identity: none of its own.  The headers the caller built (the controller's token, the
``Impersonate-*`` lines of a tenant) are sent exactly as given, and the TLS material is the
cluster's, as the official client's configuration holds it (CA file, client certificate and key
files, verification on or off, the proxy it chose); so a request reaches the server and proves the
identity the urllib3 path would.  A configuration with something libcurl is not given here
(``tls-server-name``, hostname checks off while the chain is checked, proxy headers or a proxy TLS
context, socket options) is not served: :func:`supports` says no and the client keeps urllib3.

Connections: one :class:`CurlPool` per cluster, shared by every identity of that cluster (an
impersonated request differs only in its headers; the TLS connection authenticates the controller,
never a tenant), so a thousand tenants do not hold a thousand idle connections.  A handle is used by
one thread at a time (libcurl's rule) and goes back to the pool with its live connection;
:meth:`CurlPool.clear` closes them all after a path failed.

Invariant: a header name or value holding CR, LF or NUL is refused before anything is sent (libcurl
would send it as given; ``http.client`` refuses it too) — no input can add a header line.
"""

from __future__ import annotations

import io
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import pycurl
from kubernetes import client as k8s
from kubernetes.client.rest import should_bypass_proxies

# What a libcurl error code says, in the words urllib3's failures are reported with
# (:func:`stageset.kube.client._why`); nothing the server sent.
_RESOLVE = {pycurl.E_COULDNT_RESOLVE_HOST, pycurl.E_COULDNT_RESOLVE_PROXY}
_REFUSED = {pycurl.E_COULDNT_CONNECT}
_TLS = {pycurl.E_SSL_CONNECT_ERROR, pycurl.E_PEER_FAILED_VERIFICATION, pycurl.E_SSL_CERTPROBLEM,
        pycurl.E_SSL_CIPHER, pycurl.E_SSL_CACERT_BADFILE, pycurl.E_SSL_ENGINE_NOTFOUND,
        pycurl.E_SSL_ENGINE_SETFAILED, pycurl.E_SSL_SHUTDOWN_FAILED, pycurl.E_SSL_CRL_BADFILE,
        pycurl.E_SSL_ISSUER_ERROR, pycurl.E_USE_SSL_FAILED}
_BROKEN = {pycurl.E_GOT_NOTHING, pycurl.E_SEND_ERROR, pycurl.E_RECV_ERROR, pycurl.E_PARTIAL_FILE,
           8}  # CURLE_WEIRD_SERVER_REPLY (pycurl names no constant for it)

# Idle handles kept per cluster: as many as the urllib3 pool's connections (``ClientPool``).
MAX_IDLE = 32
CONNECT_TIMEOUT_MS = 10_000


class CurlFailure(Exception):
    """No answer: ``why`` in the words of :class:`stageset.kube.client.UnreachableError`."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """The last response's headers, names lower-cased (one value each: the last)."""
    data: bytes


def supports(configuration: k8s.Configuration) -> bool:
    """Whether this configuration's TLS and proxy set-up is one libcurl is given here in full."""
    return (str(configuration.host).startswith(("https://", "http://"))
            and configuration.tls_server_name is None
            and (configuration.assert_hostname is None or configuration.assert_hostname is True)
            and configuration.proxy_headers is None
            and getattr(configuration, "proxy_ssl_context", None) is None
            and getattr(configuration, "socket_options", None) is None)


def _proxy(configuration: k8s.Configuration) -> str:
    """The proxy the official client chose for this host (``""``: none; libcurl is told so
    explicitly, else it would read ``*_proxy`` from the environment itself)."""
    proxy = configuration.proxy
    if proxy and not should_bypass_proxies(configuration.host, configuration.no_proxy or ""):
        return str(proxy)
    return ""


def _checked(line: str) -> str:
    if "\r" in line or "\n" in line or "\0" in line:
        raise ValueError("a request header holds a line break or NUL; not sent")
    return line


class CurlPool:
    """Easy handles for one cluster's configuration; thread-safe (each handle on one thread at a time)."""

    def __init__(self, configuration: k8s.Configuration):
        self._configuration = configuration
        self._proxy = _proxy(configuration)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._generation = 0
        self.opened = 0
        """Connections opened so far (libcurl's ``NUM_CONNECTS``), for benchmarks and tests."""

    def _new(self) -> Any:
        c = self._configuration
        curl = pycurl.Curl()
        curl.setopt(pycurl.NOSIGNAL, 1)
        curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        curl.setopt(pycurl.CONNECTTIMEOUT_MS, CONNECT_TIMEOUT_MS)
        curl.setopt(pycurl.PROXY, self._proxy)
        curl.setopt(pycurl.FOLLOWLOCATION, 0)
        if c.verify_ssl:
            curl.setopt(pycurl.SSL_VERIFYPEER, 1)
            curl.setopt(pycurl.SSL_VERIFYHOST, 2)
            # The trust urllib3 is given: the CA file and the CA data (a remote cluster's inline
            # certificate-authority-data) together; with neither, Python's default paths (the
            # system's store, SSL_CERT_FILE/SSL_CERT_DIR honoured), not the wheel's own OpenSSL's.
            if c.ssl_ca_cert:
                curl.setopt(pycurl.CAINFO, str(c.ssl_ca_cert))
            data = getattr(c, "ca_cert_data", None)
            if data:
                curl.setopt(pycurl.CAINFO_BLOB, data.encode() if isinstance(data, str) else bytes(data))
            if not c.ssl_ca_cert and not data:
                defaults = ssl.get_default_verify_paths()
                if defaults.cafile:
                    curl.setopt(pycurl.CAINFO, defaults.cafile)
                if defaults.capath:
                    curl.setopt(pycurl.CAPATH, defaults.capath)
        else:
            curl.setopt(pycurl.SSL_VERIFYPEER, 0)
            curl.setopt(pycurl.SSL_VERIFYHOST, 0)
        if c.cert_file:
            curl.setopt(pycurl.SSLCERT, str(c.cert_file))
        if c.key_file:
            curl.setopt(pycurl.SSLKEY, str(c.key_file))
        return curl

    def _take(self) -> tuple[Any, int]:
        with self._lock:
            generation = self._generation
            if self._idle:
                return self._idle.pop(), generation
        return self._new(), generation

    def _give(self, curl: Any, generation: int) -> None:
        with self._lock:
            if generation == self._generation and len(self._idle) < MAX_IDLE:
                self._idle.append(curl)
                return
        curl.close()

    @property
    def idle(self) -> int:
        """Handles (each with its kept-alive connection) waiting for the next request."""
        with self._lock:
            return len(self._idle)

    def clear(self) -> None:
        """Close every idle handle (and its connection); handles in use are closed when given back."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for curl in idle:
            curl.close()

    def send(self, method: str, url: str, headers: Any, body: bytes | None, *, timeout: float) -> Answer:
        """One request; ``headers`` a mapping (or urllib3's ``HTTPHeaderDict``, whose repeated
        values become repeated lines).  Raises :class:`CurlFailure` when no answer came."""
        lines = [_checked(f"{name}: {value}") for name, value in headers.items()]
        # No "Expect: 100-continue" round trip before a large body: the apiserver never asks for it.
        lines.append("Expect:")
        _checked(url)
        curl, generation = self._take()
        sink = io.BytesIO()
        received: dict[str, str] = {}

        def header(raw: bytes) -> None:
            line = raw.decode("iso-8859-1").rstrip("\r\n")
            if line.startswith("HTTP/"):
                received.clear()  # a new response (after a proxy's CONNECT, or a 1xx)
            elif ":" in line:
                name, value = line.split(":", 1)
                received[name.strip().lower()] = value.strip()

        kept = False
        try:
            curl.setopt(pycurl.URL, url)
            curl.setopt(pycurl.HTTPHEADER, lines)
            curl.setopt(pycurl.WRITEDATA, sink)
            curl.setopt(pycurl.HEADERFUNCTION, header)
            curl.setopt(pycurl.TIMEOUT_MS, max(1, int(timeout * 1000)))
            if body is None:
                curl.setopt(pycurl.HTTPGET, 1)
                if method == "GET":
                    curl.unsetopt(pycurl.CUSTOMREQUEST)
                else:
                    curl.setopt(pycurl.CUSTOMREQUEST, method)
            else:
                curl.setopt(pycurl.POSTFIELDS, body)
                curl.setopt(pycurl.CUSTOMREQUEST, method)
            try:
                curl.perform()
            except pycurl.error as error:
                raise CurlFailure(_why(curl, int(error.args[0]))) from None
            status = int(curl.getinfo(pycurl.RESPONSE_CODE))
            opened = int(curl.getinfo(pycurl.NUM_CONNECTS))
            if opened:
                with self._lock:
                    self.opened += opened
            curl.setopt(pycurl.HEADERFUNCTION, _ignore)  # drop the closure (and its dict) with the request
            kept = True
            return Answer(status=status, headers=received, data=sink.getvalue())
        finally:
            if kept:
                self._give(curl, generation)
            else:
                curl.close()  # a handle whose transfer failed is not trusted with the next request

    def close(self) -> None:
        self.clear()


def _ignore(_raw: bytes) -> None:
    return None


def _why(curl: Any, code: int) -> str:
    if code in _RESOLVE:
        return "the host name does not resolve"
    if code in _REFUSED:
        return "connection refused"
    if code == pycurl.E_OPERATION_TIMEDOUT:
        connected = float(curl.getinfo(pycurl.CONNECT_TIME)) > 0
        return "no answer in time" if connected else "connection timed out"
    if code in _TLS:
        return "TLS failed (certificate or protocol)"
    if code in _BROKEN:
        return "the connection broke"
    return "the connection failed"
