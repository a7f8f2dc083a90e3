"""One request builder for every caller: JSON in, JSON out, one identity per client.

We use the official client's configuration loading and TLS set-up, but build requests
ourselves so that server-side apply, dry-run, watch streaming and impersonation all go
through the same small function.  Whole requests (:meth:`KubeClient.request`) travel over
libcurl (:mod:`stageset.kube.curl`: half the client CPU of urllib3, one connection pool per
cluster shared by its identities); streams (watches, pod logs) and a configuration libcurl is
not given here over the official client's urllib3 pool.

Every request is reported to the pool's observer (metrics), if one is set, as a
:class:`RequestRecord`: the verb, the identity, the cluster and the answer's status code —
never a path, a body or a message.

Overload: an apiserver that sheds load (API Priority and Fairness, max-in-flight) answers
429 with ``Retry-After``; the official client does not honour it.  :meth:`KubeClient.request`
waits at least that long (capped, jittered) and tries again, up to :data:`THROTTLE_RETRIES`
times within the request's own timeout; a 429 that outlasts them reaches the caller as an
:class:`ApiError` carrying ``retry_after``, which the work queue's backoff and the watch
loop respect.  A 429 was not acted on by the server, so every verb may be retried.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlencode

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from stageset.kube import fence
from stageset.kube.curl import CurlFailure, CurlPool, supports
from stageset.kube.types import KubeObject

QueryValue = str | int | bool

log = logging.getLogger(__name__)

# urllib3 may retry a failed *connection* at once (nothing was sent); never a read that timed out or
# broke — that costs another full timeout, and the caller's backoff decides when to try again.
_RETRIES = urllib3.Retry(total=2, connect=2, read=0, redirect=0, status=0, other=0,
                         respect_retry_after_header=False)

# 429 answers retried within one request, and the longest single wait a Retry-After may ask for.
THROTTLE_RETRIES = 5
MAX_RETRY_AFTER = 10.0

# The bearer token is read through the official client's configuration, whose refresh hook re-reads
# a rotated ServiceAccount token or re-runs an exec plugin when due; but each call of that hook also
# re-sets the whole configuration (its host setter scans the environment for proxies), which cost
# 140-220 µs of a ~1 ms request when done per request (bench.transport).  So at most once per this
# many seconds per client: the hook refreshes a token long before it expires, so a second is nothing.
AUTH_REFRESH_SECONDS = 1.0


@dataclass(frozen=True)
class Identity:
    """Who a request acts as: ``None`` is the controller's own credentials."""

    user: str | None = None
    groups: tuple[str, ...] = ()
    """``Impersonate-Group`` values (with ``user`` only: the apiserver refuses groups alone); one
    header line each, as the apiserver reads them (a comma-joined value would be one group)."""

    @classmethod
    def service_account(cls, *, namespace: str, name: str) -> Identity:
        return cls(user=f"system:serviceaccount:{namespace}:{name}")

    def describe(self) -> str:
        return self.user or "the controller's own identity"


class ApiError(Exception):
    """A non-2xx answer from the apiserver, with the Status body's reason and message."""

    def __init__(self, *, status: int, reason: str, message: str, body: Mapping[str, Any] | None = None,
                 retry_after: float | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body: Mapping[str, Any] = body or {}
        self.retry_after = retry_after
        """Seconds the server asked us to wait (``Retry-After``), if it did."""

    @property
    def answered(self) -> str:
        """How the server answered, in our words: ``answered HTTP 403 Forbidden`` (its status and
        reason, never its message: a remote cluster is not trusted to write into status or logs)."""
        return f"answered HTTP {self.status}" + (f" {self.reason}" if self.reason else "")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def forbidden(self) -> bool:
        return self.status == 403

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def invalid(self) -> bool:
        return self.status == 422

    @property
    def throttled(self) -> bool:
        """Shed by the server before it acted (429), or unavailable with a ``Retry-After``."""
        return self.status == 429 or (self.status == 503 and self.retry_after is not None)


def retry_after(headers: Mapping[str, str] | Any) -> float | None:
    """The ``Retry-After`` header in seconds (delta-seconds form, as the apiserver sends it)."""
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    try:
        return max(0.0, min(float(value), MAX_RETRY_AFTER))
    except ValueError:
        return 1.0  # an HTTP date: not worth parsing, wait a little


class UnreachableError(Exception):
    """The cluster did not answer as an apiserver: refused, timed out, TLS failed, connection broke.

    The message is short and says nothing the server sent: a tenant's remote cluster is
    not trusted to write into our logs or status.
    """

    def __init__(self, *, server: str, why: str):
        super().__init__(f"{server}: {why}")
        self.server = server
        self.why = why


def how_failed(error: BaseException) -> str:
    """How a request to a cluster failed, in our words (nothing it sent): why it could not be reached,
    how it answered (:attr:`ApiError.answered`), an answer that is not JSON, or a broken connection.
    The one phrasing every status message, event and log line uses."""
    if isinstance(error, UnreachableError):
        return error.why
    if isinstance(error, ApiError):
        return error.answered
    if isinstance(error, ValueError):
        return "answered with something that is not JSON"
    return "the connection failed"


class CredentialUnavailable(UnreachableError):
    """No credential for this identity on this cluster now (a workload-identity token could not be
    had): the cluster cannot be used as that identity, so callers treat it as unreachable — nothing
    is pruned, the pass is retried.  ``why`` says what is missing (never a token)."""


class Bearer(Protocol):
    """Where one identity's bearer token on one cluster comes from (workload identity): asked before
    each request, and asked to renew after the server refused a token (401)."""

    def token(self) -> str:
        """The token to send; raises :class:`CredentialUnavailable`."""
        ...

    def renew(self, *, refused: str) -> str:
        """A new token after ``refused`` was refused; raises :class:`CredentialUnavailable`."""
        ...


BearerFor = Callable[[Identity], Bearer]
"""A cluster's credential per identity (:meth:`ClientPool.register`)."""


def _why(error: BaseException) -> str:
    cause = error.reason if isinstance(error, urllib3.exceptions.MaxRetryError) else error
    if isinstance(cause, urllib3.exceptions.NameResolutionError):
        return "the host name does not resolve"
    if isinstance(cause, urllib3.exceptions.NewConnectionError):
        return "connection refused"
    if isinstance(cause, urllib3.exceptions.ConnectTimeoutError):
        return "connection timed out"
    if isinstance(cause, urllib3.exceptions.ReadTimeoutError):
        return "no answer in time"
    if isinstance(cause, urllib3.exceptions.SSLError):
        return "TLS failed (certificate or protocol)"
    if isinstance(cause, urllib3.exceptions.ProtocolError):
        return "the connection broke"
    return "the connection failed"


@dataclass(frozen=True)
class ClusterKey:
    """Names a cluster for client caching: ``local`` or a remote kubeconfig's identity."""

    name: str


LOCAL = ClusterKey("local")


@dataclass(frozen=True)
class RequestRecord:
    """One request, as the pool's observer sees it (no path, body or message)."""

    verb: str
    """Kubernetes' verb: get, list, watch, create, apply, patch, update, delete, or discovery."""
    dry_run: bool
    identity: Identity
    cluster: ClusterKey
    code: int | None
    """The HTTP status; ``None`` when no answer came."""
    seconds: float


RequestObserver = Callable[[RequestRecord], None]


def request_verb(method: str, path: str, *, content_type: str | None = None, stream: bool = False) -> str:
    """The Kubernetes verb of a request (as the audit log names it): ``GET`` of a collection is a
    ``list``, of an object a ``get``; an apply patch is ``apply``; a GET of ``/api``, ``/apis``
    or a group version is ``discovery``."""
    method = method.upper()
    if stream:
        return "watch"
    if method == "PATCH":
        return "apply" if content_type == "application/apply-patch+yaml" else "patch"
    if method != "GET":
        return {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else []
    if not rest:
        return "discovery"
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    return "list" if len(rest) == 1 else "get"


class PathHealth:
    """Shared by every client of one cluster: a connection failure seen by one of them makes the
    others drop their idle connections too (they went down the same path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.epoch = 0

    def failed(self) -> None:
        with self._lock:
            self.epoch += 1


# Metadata-only lists and watches (PartialObjectMetadata, as client-go's metadata informers ask):
# only each object's metadata travels; plain JSON where a server cannot transform.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


class KubeClient:
    """Requests to one cluster as one identity.  Thread-safe (urllib3 pools are)."""

    def __init__(self, *, api_client: k8s.ApiClient, identity: Identity, timeout: float = 30.0,
                 cluster: ClusterKey = LOCAL, observer: RequestObserver | None = None,
                 health: PathHealth | None = None, curl: CurlPool | None = None, libcurl: bool = True,
                 bearer: Bearer | None = None):
        """``curl``: the cluster's shared libcurl pool (:class:`ClientPool` passes one per cluster);
        without it, a client whose configuration libcurl can serve keeps a pool of its own.
        ``libcurl=False``: urllib3 for every request (benchmarks compare the two).  ``bearer``: the
        identity's own token on this cluster (workload identity) — then ``identity`` is who the token
        is for, and no ``Impersonate-*`` header is ever sent; a 401 renews the token and the request
        is tried once more."""
        self._api = api_client
        self._owns_curl = libcurl and curl is None and supports(api_client.configuration)
        self._curl = CurlPool(api_client.configuration) if self._owns_curl else curl if libcurl else None
        self.identity = identity
        self._timeout = timeout
        self._cluster_key = cluster
        self.observer = observer
        self._health = health or PathHealth()
        self._epoch = self._health.epoch
        self._headers: dict[str, str] = {}
        self._bearer = bearer
        if identity.user and bearer is None:
            self._headers["Impersonate-User"] = identity.user
        self._auth_lock = threading.Lock()
        self._auth: tuple[float, str | None] = (float("-inf"), None)

    def _authorization(self) -> str | None:
        """The ``authorization`` header's value (``None``: a client certificate authenticates), as the
        official client's configuration gives it, asked again after :data:`AUTH_REFRESH_SECONDS`; with
        a :class:`Bearer`, its token (which it keeps and renews itself)."""
        if self._bearer is not None:
            return f"Bearer {self._bearer.token()}"
        with self._auth_lock:
            read_at, value = self._auth
            now = time.monotonic()
            if now - read_at >= AUTH_REFRESH_SECONDS:
                bearer = self._api.configuration.auth_settings().get("BearerToken")
                value = None if bearer is None or bearer["value"] is None else str(bearer["value"])
                self._auth = (now, value)
            return value

    def _prepare(self, _method: str, path: str, query: Mapping[str, QueryValue] | None,
                 headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        # What the generated client's param_serialize made of it (its default headers, the User-Agent,
        # last; then the token), without its per-request serialization of every header value.
        all_headers = {"Accept": "application/json", **self._headers, **headers, **self._api.default_headers}
        authorization = self._authorization()
        if authorization is not None:
            all_headers["authorization"] = authorization
        url = f"{self._api.configuration.host}{path}"
        if query:
            encoded = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()}
            url = f"{url}?{urlencode(encoded)}"
        if self.identity.groups and self._bearer is None:  # repeated header lines: urllib3 sends each value
            repeated = urllib3.HTTPHeaderDict(all_headers)
            for group in self.identity.groups:
                repeated.add("Impersonate-Group", group)
            return url, cast("dict[str, str]", repeated)
        return url, all_headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, QueryValue] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        status: list[int] | None = None,
        accept: str | None = None,
    ) -> KubeObject:
        """One request; ``status``, when given, is told the HTTP status of a successful answer
        (201 tells a create from an update); ``accept`` asks for another form of the answer
        (:data:`METADATA_LIST`: metadata only).  A write under a revoked fence is never sent
        (:mod:`stageset.kube.fence`)."""
        with fence.writing(method):
            return self._request(method, path, query=query, body=body, content_type=content_type,
                                 timeout=timeout, status=status, accept=accept)

    def _request(self, method: str, path: str, *, query: Mapping[str, QueryValue] | None, body: Any,
                 content_type: str, timeout: float | None, status: list[int] | None,
                 accept: str | None) -> KubeObject:
        headers = {"Content-Type": content_type} if body is not None else {}
        if accept:
            headers["Accept"] = accept
        url, headers = self._prepare(method, path, query, headers)
        # orjson: several times faster than the standard library both ways, on every request.
        payload = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        budget = timeout or self._timeout
        deadline = time.monotonic() + budget
        if self._epoch != self._health.epoch:
            self._epoch = self._health.epoch
            self._clear_pools()
        observed_type = content_type if body is not None else None
        attempt = 0
        renewed = False
        while True:
            started = time.monotonic()
            left = max(1.0, deadline - time.monotonic())
            try:
                code, answer_headers, data = self._send(method, url, headers, payload, left)
            except UnreachableError:
                self._observe(method, path, query, observed_type, None, started)
                self._drop_idle_connections()
                raise
            self._observe(method, path, query, observed_type, code, started)
            if code < 300:
                break
            if code == 401 and self._bearer is not None and not renewed:
                # The token was refused (expired early, its issuer's keys rotated, the remote's trust
                # changed): a new one, and this request once more — nothing was done with the refused one.
                renewed = True
                headers = {**headers, "authorization": f"Bearer {self._renew(headers)}"}
                continue
            failed = _api_error(code, data, retry_after(answer_headers))
            wait = _throttle_wait(failed, attempt=attempt)
            if wait is None or attempt >= THROTTLE_RETRIES or time.monotonic() + wait >= deadline:
                raise failed
            attempt += 1
            THROTTLED.add()
            log.debug("%s %s: %s (Retry-After %s); retrying in %.1fs", method, path, failed.status,
                      "none" if failed.retry_after is None else f"{failed.retry_after:g}s", wait)
            time.sleep(wait)
        if status is not None:
            status.append(code)
        if not data:
            return {}
        parsed: KubeObject = orjson.loads(data)
        return parsed

    def _send(self, method: str, url: str, headers: dict[str, str], payload: bytes | None,
              timeout: float) -> tuple[int, Mapping[str, str], bytes]:
        """One attempt: status, headers and body of the answer, over libcurl when the cluster's
        configuration allows, else urllib3; :class:`UnreachableError` when none came."""
        if self._curl is not None:
            try:
                answer = self._curl.send(method, url, headers, payload, timeout=timeout)
            except CurlFailure as failure:
                raise UnreachableError(server=self.server, why=failure.why) from None
            after = answer.headers.get("retry-after")
            return answer.status, {} if after is None else {"Retry-After": after}, answer.data
        try:
            response = self._api.rest_client.pool_manager.request(
                method, url, body=payload, headers=headers, timeout=urllib3.Timeout(total=timeout),
                preload_content=True, retries=_RETRIES,
            )
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise UnreachableError(server=self.server, why=_why(error)) from None
        return response.status, response.headers, response.data

    def stream(
        self, path: str, *, query: Mapping[str, QueryValue], timeout: float, accept: str | None = None,
        opened: Callable[[Callable[[], None] | None], None] | None = None, chunk: int = 64 * 1024,
    ) -> Iterator[KubeObject]:
        """Yield each JSON line of a streaming GET (a watch); ``accept`` as for :meth:`request`
        (:data:`METADATA`: each event's object as metadata only).  Blank lines are skipped, and so
        is a last line the server never ended (a connection broken mid-event is not an event).
        ``opened`` is handed a function that shuts the stream down from another thread once it is
        open (and ``None`` when it ended); ``chunk``: the most read at once (a watch blocked in its
        read holds that much: a quiet metadata watch needs little)."""
        with closing(self._lines(path, query=query, timeout=timeout, accept=accept or "application/json",
                                 tail=False, opened=opened, chunk=chunk)) as lines:
            for line in lines:
                if line.strip():
                    yield orjson.loads(line)

    def text_lines(self, path: str, *, query: Mapping[str, QueryValue], timeout: float | None
                   ) -> Iterator[str]:
        """Yield each line of a streaming text GET (a pod's ``log``, followed or not), decoded;
        ``timeout``: the longest wait for the next bytes (``None``: none, for ``--follow``).
        Blank lines and a last line without its newline are kept: they are the log's own."""
        with closing(self._lines(path, query=query, timeout=timeout, accept="*/*", tail=True)) as lines:
            for line in lines:
                yield line.decode("utf-8", "replace")

    def _lines(self, path: str, *, query: Mapping[str, QueryValue], timeout: float | None, accept: str,
               tail: bool, opened: Callable[[Callable[[], None] | None], None] | None = None,
               chunk: int = 64 * 1024) -> Generator[bytes]:
        """The one streaming GET under :meth:`stream` and :meth:`text_lines`: each line of the body
        as the server sent it (newline removed; chunks joined, so a line — or a character — split
        across reads arrives whole), and with ``tail`` the unterminated rest.  A connection that
        cannot be made is an :class:`UnreachableError`, an error status an :class:`ApiError`;
        ``timeout`` bounds each read, not the stream.  The connection goes back to the pool when
        the caller stops reading."""
        url, headers = self._prepare("GET", path, query, {"Accept": accept})
        started = time.monotonic()
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET", url, headers=headers, preload_content=False,
                timeout=urllib3.Timeout(connect=10.0, read=timeout))
        except (urllib3.exceptions.HTTPError, OSError) as error:
            self._observe("GET", path, query, None, None, started, stream=True)
            raise UnreachableError(server=self.server, why=_why(error)) from None
        self._observe("GET", path, query, None, response.status, started, stream=True)
        if opened is not None:
            opened(response.shutdown)
        try:
            if response.status == 401 and self._bearer is not None:
                self._renew(headers)  # the next attempt (the caller's) uses a new token
            if response.status >= 300:
                raise _api_error(response.status, response.read(), retry_after(response.headers))
            buffer = b""
            for data in response.stream(chunk):
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    yield line
            if tail and buffer:
                yield buffer
        finally:
            if opened is not None:
                opened(None)
            response.release_conn()

    def _renew(self, headers: Mapping[str, str]) -> str:
        """A new token from the :class:`Bearer`, after the one in ``headers`` was refused."""
        assert self._bearer is not None
        refused = str(headers.get("authorization", "")).removeprefix("Bearer ")
        return self._bearer.renew(refused=refused)

    def _observe(self, method: str, path: str, query: Mapping[str, QueryValue] | None,
                 content_type: str | None, code: int | None, started: float, *, stream: bool = False) -> None:
        observer = self.observer
        if observer is None:
            return
        observer(RequestRecord(verb=request_verb(method, path, content_type=content_type, stream=stream),
                               dry_run=bool(query and query.get("dryRun")), identity=self.identity,
                               cluster=self._cluster_key, code=code, seconds=time.monotonic() - started))

    def _drop_idle_connections(self) -> None:
        """After a connection failed (timed out, broke): the idle ones in the pool most likely went
        down the same path — a middlebox that silently dropped them all, an apiserver that
        restarted — and each would cost a full timeout to find out.  Open fresh ones instead."""
        self._clear_pools()
        self._health.failed()
        self._epoch = self._health.epoch

    def _clear_pools(self) -> None:
        self._api.rest_client.pool_manager.clear()
        if self._curl is not None:
            self._curl.clear()

    @property
    def server(self) -> str:
        return str(self._api.configuration.host)

    @property
    def transport(self) -> str:
        """What carries :meth:`request`: ``libcurl``, or ``urllib3`` for a configuration it is not given."""
        return "urllib3" if self._curl is None else "libcurl"

    @property
    def cluster(self) -> ClusterKey:
        """The cluster this client talks to (``LOCAL`` or a remote's key)."""
        return self._cluster_key

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]
        if self._owns_curl and self._curl is not None:
            self._curl.close()

    # Convenience verbs --------------------------------------------------------

    def get(self, path: str) -> KubeObject:
        return self.request("GET", path)

    def apply(self, path: str, obj: KubeObject, *, field_manager: str, force: bool = True,
              dry_run: bool = False, status: list[int] | None = None) -> KubeObject:
        """Server-side apply ``obj`` at ``path`` (the object's own URL); ``status`` hears 201 when
        the apply created the object."""
        query: dict[str, QueryValue] = {"fieldManager": field_manager, "force": force}
        if dry_run:
            query["dryRun"] = "All"
        return self.request("PATCH", path, query=query, body=obj,
                            content_type="application/apply-patch+yaml", status=status)

    def delete(self, path: str, *, propagation: str = "Background", dry_run: bool = False,
               resource_version: str | None = None) -> KubeObject:
        """Delete ``path``; with ``resource_version``, only if the object is still at that version
        (``DeleteOptions.preconditions``): a write since the read answers 409 Conflict."""
        query: dict[str, QueryValue] = {"propagationPolicy": propagation}
        if dry_run:
            query["dryRun"] = "All"
        body = None if resource_version is None else {
            "apiVersion": "v1", "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": resource_version}}
        return self.request("DELETE", path, query=query, body=body)

    def get_text(self, path: str, *, max_bytes: int = 8 * 2**20, timeout: float = 10.0) -> str:
        """A GET whose answer is not JSON (a pod's ``/metrics`` through the apiserver's proxy): the
        first ``max_bytes`` of the body as text.  Errors as :meth:`request` raises them."""
        url, headers = self._prepare("GET", path, None, {"Accept": "text/plain"})
        started = time.monotonic()
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET", url, headers=headers, preload_content=False, retries=_RETRIES,
                timeout=urllib3.Timeout(total=timeout))
        except (urllib3.exceptions.HTTPError, OSError) as error:
            self._observe("GET", path, None, None, None, started)
            raise UnreachableError(server=self.server, why=_why(error)) from None
        self._observe("GET", path, None, None, response.status, started)
        try:
            data = response.read(max_bytes)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise UnreachableError(server=self.server, why=_why(error)) from None
        finally:
            response.close()  # never back to the pool with unread bytes left (a body past max_bytes)
        if response.status >= 300:
            raise _api_error(response.status, data)
        return data.decode("utf-8", "replace")


def _api_error(status: int, data: bytes, after: float | None = None) -> ApiError:
    """An error from the response; only a Kubernetes ``Status`` body is read (a proxy's HTML
    page or a hostile server's text never reaches messages or logs)."""
    try:
        body = json.loads(data)
    except ValueError:
        body = {}
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return ApiError(status=status, reason="", message=f"HTTP {status} with an answer that is not a "
                        f"Kubernetes Status ({len(data)} bytes, not shown)", retry_after=after)
    reason = str(body.get("reason", ""))
    return ApiError(status=status, reason=reason if reason.isalnum() else "",
                    message=str(body.get("message") or "no message"), body=body, retry_after=after)


def _throttle_wait(error: ApiError, *, attempt: int) -> float | None:
    """How long to wait before retrying a throttled request (``None``: not throttled).

    At least the server's ``Retry-After``; each further attempt doubles it, with jitter so
    that requests shed together do not come back together."""
    if not error.throttled:
        return None
    base = error.retry_after if error.retry_after is not None else 1.0
    return float(min(MAX_RETRY_AFTER, max(base, 0.1) * 2 ** attempt) * (1 + 0.25 * random.random()))  # noqa: S311


class _Counter:
    """A thread-safe count (requests retried after a 429), for logs, tests and benchmarks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._lock:
            self.value += 1


THROTTLED = _Counter()


class ClientPool:
    """One cached :class:`KubeClient` per (cluster, identity); never rebuilt per reconcile."""

    def __init__(self, *, configuration: k8s.Configuration, timeout: float = 30.0, libcurl: bool = True):
        self._configurations: dict[ClusterKey, k8s.Configuration] = {LOCAL: configuration}
        self._libcurl = libcurl
        self._timeout = timeout
        self._clients: dict[tuple[ClusterKey, Identity], KubeClient] = {}
        self._health: dict[ClusterKey, PathHealth] = {}
        self._curls: dict[ClusterKey, CurlPool | None] = {}
        self._bearers: dict[ClusterKey, BearerFor] = {}
        self._lock = threading.Lock()
        self._observer: RequestObserver | None = None

    def observe(self, observer: RequestObserver | None) -> None:
        """Report every request of every client (made now or later) to ``observer``."""
        with self._lock:
            self._observer = observer
            for client in self._clients.values():
                client.observer = observer

    @classmethod
    def from_kubeconfig(cls, path: str | None, *, context: str | None = None,
                        libcurl: bool = True) -> ClientPool:
        configuration = k8s.Configuration()
        if path:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context,
                                        client_configuration=configuration)
        else:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        # One pool per client; enough connections for our worker threads.
        configuration.connection_pool_maxsize = 32
        return cls(configuration=configuration, libcurl=libcurl)

    @classmethod
    def from_token(cls, *, server: str, certificate_authority: str | None, token: str) -> ClientPool:
        """A pool whose one credential is a bearer ``token`` (the shared dashboard's logins): no
        kubeconfig, no in-cluster ServiceAccount."""
        configuration = k8s.Configuration()
        configuration.host = server
        if certificate_authority:
            configuration.ssl_ca_cert = certificate_authority
        configuration.api_key = {"authorization": f"Bearer {token}"}
        configuration.connection_pool_maxsize = 16
        return cls(configuration=configuration)

    def register(self, cluster: ClusterKey, configuration: k8s.Configuration, *,
                 bearers: BearerFor | None = None) -> None:
        """Make a remote cluster known; a key names one kubeconfig's content, so it never changes.
        ``bearers``: each identity's own token there (workload identity) instead of impersonation
        through the configuration's credential, which then has none."""
        with self._lock:
            self._configurations.setdefault(cluster, configuration)
            if bearers is not None:
                self._bearers.setdefault(cluster, bearers)

    def knows(self, cluster: ClusterKey) -> bool:
        with self._lock:
            return cluster in self._configurations

    def forget(self, cluster: ClusterKey) -> None:
        """Drop a remote cluster and its clients (a request in flight on one of them finishes)."""
        if cluster == LOCAL:
            return
        with self._lock:
            self._configurations.pop(cluster, None)
            self._bearers.pop(cluster, None)
            self._health.pop(cluster, None)
            curl = self._curls.pop(cluster, None)
            if curl is not None:
                curl.close()
            for key in [k for k in self._clients if k[0] == cluster]:
                del self._clients[key]

    def client(self, identity: Identity = Identity(), cluster: ClusterKey = LOCAL) -> KubeClient:
        key = (cluster, identity)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                configuration = self._configurations.get(cluster)
                if configuration is None:
                    raise UnreachableError(server=cluster.name, why="no longer among the remote clusters "
                                           "kept (evicted meanwhile); retrying")
                api = k8s.ApiClient(configuration=configuration)
                if cluster not in self._curls:
                    self._curls[cluster] = CurlPool(configuration) \
                        if self._libcurl and supports(configuration) else None
                bearers = self._bearers.get(cluster)
                found = KubeClient(api_client=api, identity=identity, timeout=self._timeout, cluster=cluster,
                                   observer=self._observer,
                                   health=self._health.setdefault(cluster, PathHealth()),
                                   curl=self._curls[cluster], libcurl=self._libcurl,
                                   bearer=bearers(identity) if bearers is not None else None)
                self._clients[key] = found
            return found

    def connections_opened(self) -> int:
        """Connections libcurl opened for this pool's clients so far (urllib3's are not counted)."""
        with self._lock:
            return sum(curl.opened for curl in self._curls.values() if curl is not None)

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
            for curl in self._curls.values():
                if curl is not None:
                    curl.close()
            self._curls.clear()
