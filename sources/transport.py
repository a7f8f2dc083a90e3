"""Talking to a remote: list its refs, fetch objects into a mirror.  Built on dulwich.

Identity: every request is made with the caller's :class:`~sources.Credentials` only (the
GitRepository's Secret, read by the controller as the GitRepository's ServiceAccount); no
user or system Git configuration, SSH configuration, agent or key of the controller's own
is ever used.

Why a thin layer of our own over dulwich's clients:

* Credentials go into request headers, never into a URL, so they cannot leak into the
  mirror's config, dulwich's messages or our logs.  The ``Authorization`` header (basic or
  bearer) is only sent to the origin of the configured URL; a redirect to another host
  does not carry it (urllib3 also strips it on cross-host redirects).
* Extra CAs (``Credentials.ca_pem``) are *added* to the system trust store, as Flux does,
  rather than replacing it.
* dulwich's exceptions are translated into :mod:`sources.errors` with messages that name the
  URL (without credentials) and say what failed; any secret that still slipped into a
  library message is redacted.
* SSH goes through the system ``ssh`` client with the caller's key and ``known_hosts``
  only, and strict host key checking (:mod:`sources.ssh`); the key files live for one
  connection.

What a hostile server can make us do is bounded (a GitRepository's URL is tenant input):

* **Time**: a :class:`Deadline` covers a whole operation.  Over HTTP a watchdog shuts the
  sockets down when it passes (per-read socket timeouts alone let a server that trickles a
  byte at a time hold a worker forever); over SSH the ``ssh`` process is killed.
* **Memory**: packs go through :class:`~sources.pack.PackInspector` before dulwich sees
  them (sizes checked from headers, inflation counted in small steps); ref listings and
  other responses are cut off past :data:`LISTING_BYTES`; dumb-HTTP servers (which dulwich
  would serve by loading whole objects) are refused.

**One discovery per fetch over HTTP.**  Smart HTTP is stateless: every request stands alone
and carries the caller's ``Authorization``.  So a fetch that follows a listing of the same
:class:`Remote` (``Remote.fetch(..., listing=)``) reuses that listing's discovery (the
``info/refs`` advertisement and, for protocol version 2, the ``ls-refs`` answer) instead of
making its own: a cold fetch costs 3 requests (``GET info/refs``, ``POST ls-refs``,
``POST fetch``), not 5.  Nothing is given up by it: the wants are always decided from the
listing, never from the fetch's own discovery, and the server judges the ``fetch`` request
itself, made with the caller's credentials.  A listing is only reused by a ``Remote`` for the
same URL and credentials, and never over SSH or for local paths (an SSH connection must read
its own advertisement; those keep one connection to list and one to fetch).  dulwich has no
public way to hand ``fetch_pack`` refs it already has, so :class:`_HttpClient` answers its
(private) ``_discover_references`` from the listing; tests/sources/test_git_requests.py
counts the requests and fails if a dulwich upgrade bypasses it.
"""

from __future__ import annotations

import base64
import functools
import heapq
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import SpooledTemporaryFile
from typing import Any, cast

import urllib3
from dulwich.client import (
    GitClient,
    HTTPProxyUnauthorized,
    HTTPUnauthorized,
    LocalGitClient,
    SSHGitClient,
    Urllib3HttpGitClient,
    default_urllib3_manager,
)
from dulwich.errors import GitProtocolError, HangupException, NotGitRepository
from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from sources.credentials import Credentials
from sources.errors import AuthenticationError, GitOperationError, LimitExceededError, SourceError
from sources.limits import Limits
from sources.pack import PackInspector
from sources.ssh import StrictSSHVendor, classify_ssh_failure, scrub, ssh_session
from sources.urls import RemoteUrl, redact

INFINITE_DEPTH = 0x7FFFFFFF
"""What ``git fetch --unshallow`` sends as depth: all history."""

LISTING_BYTES = 16 * 1024 * 1024
"""Most bytes read for a ref listing (or before a pack starts): ~100 000 refs."""

_SPOOL_BYTES = 8 * 1024 * 1024
"""A received pack stays in memory up to this size, then goes to a file in the mirror."""

_REFUSED_WANT = ("not our ref", "unadvertised object", "not allowed", "no such object",
                 "bad object", "not valid")


def _hung_up(error: BaseException) -> bool:
    """Did the other side close the connection under us (dulwich wraps the ``OSError`` of a write
    in a ``GitProtocolError``)?"""
    seen: BaseException | None = error
    for _ in range(4):  # the error, and what it was raised from
        if seen is None:
            return False
        if isinstance(seen, (BrokenPipeError, ConnectionResetError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass
class Deadline:
    """The moment an operation (listing, fetching, or all of one ``MirrorStore.fetch``) must end."""

    timeout: float
    at: float = field(default=0.0)

    def __post_init__(self) -> None:
        if not self.at:
            self.at = time.monotonic() + self.timeout

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


@dataclass(frozen=True)
class _Discovery:
    """What dulwich's HTTP discovery returned for one listing, kept so that a fetch right after
    it need not ask again.  ``owner`` is the :class:`Remote` object that listed: only it may
    reuse it (same URL, same credentials, same deadline)."""

    owner: object
    protocol_version: int
    refs: dict[Ref, ObjectID | None]
    capabilities: frozenset[bytes]
    base_url: str
    symrefs: dict[Ref, Ref]
    peeled: dict[Ref, ObjectID]

    def answer(self) -> tuple[dict[Ref, ObjectID | None], set[bytes], str, dict[Ref, Ref],
                              dict[Ref, ObjectID]]:
        """Fresh copies, in ``_discover_references``' shape (dulwich mutates what it gets)."""
        return (dict(self.refs), set(self.capabilities), self.base_url, dict(self.symrefs),
                dict(self.peeled))


@dataclass(frozen=True)
class Listing:
    """A remote's refs: full name -> object id (``<tag>^{}`` = peeled), and symrefs.

    ``protocol_version`` is the Git protocol the server spoke (0 or 2): servers speaking
    version 2 send any object they have by id, while version 0 servers without
    ``allow-*-sha1-in-want`` send only what they advertised.  ``discovery`` (HTTP only) lets
    a fetch by the same :class:`Remote` skip its own discovery (see the module docstring).
    """

    refs: dict[str, str]
    symrefs: dict[str, str]
    protocol_version: int = 2
    discovery: _Discovery | None = field(default=None, compare=False, repr=False)


class WantRefusedError(GitOperationError):
    """The server refused to send an object we asked for by id."""

    def __init__(self, message: str, *, protocol_version: int) -> None:
        super().__init__(message)
        self.protocol_version = protocol_version


class _ReadBudget:
    """Counts the bytes a remote sends; past the listing allowance only a pack may follow.

    It also notices an ``ERR`` pkt-line before the pack (dulwich reads a pkt-line as one
    4-byte read and one read of its payload): a server that refuses a want says so that
    way, and a refusal must never pass for an empty answer.
    """

    def __init__(self, *, listing: int, pack: int) -> None:
        self._listing = listing
        self._pack = pack
        self._pkt_pending = False
        self.used = 0
        self.pack_started = False
        self.server_error: str | None = None

    def wrap(self, read: Callable[..., bytes]) -> Callable[..., bytes]:
        def limited(*args: Any) -> bytes:
            data = read(*args)
            self.used += len(data)
            allowed = self._listing + (self._pack if self.pack_started else 0)
            if self.used > allowed:
                raise LimitExceededError(
                    f"the remote sent more than {allowed} bytes "
                    f"({'a pack over the limit' if self.pack_started else 'a ref listing over the limit'}); "
                    "the operation was stopped"
                )
            if not self.pack_started:
                self._sniff(data)
            return data
        return limited

    def _sniff(self, data: bytes) -> None:
        if self._pkt_pending and data.startswith(b"ERR ") and self.server_error is None:
            self.server_error = data[4:].decode("utf-8", "replace").strip()[:200]
        self._pkt_pending = len(data) == 4 and all(c in b"0123456789abcdef" for c in data)


class Sockets:
    """The HTTP connections of one operation, so that a watchdog can cut them."""

    def __init__(self) -> None:
        self._connections: list[Any] = []
        self._lock = threading.Lock()
        self.fired = threading.Event()

    def add(self, connection: Any) -> None:
        with self._lock:
            self._connections.append(connection)

    def cut(self) -> None:
        """Shut every socket down: a read blocked in another thread returns at once."""
        self.fired.set()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            sock = getattr(connection, "sock", None)
            if sock is not None:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Armed:
    """One deadline the :class:`Watchdog` keeps: its action runs at the deadline unless cancelled."""

    __slots__ = ("action", "cancelled")

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Watchdog:
    """One thread that runs each armed action at its deadline (cutting an HTTP session's sockets).

    A timer thread per session cost a thread start and its wake-up per Git request: with a
    repository per GitRepository, about 4 % of the controller's busy time in a cold run of 300.
    Cancelled deadlines are dropped when they come up; the thread starts with the first one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Armed]] = []
        self._serial = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, action: Callable[[], None]) -> _Armed:
        armed = _Armed(action)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._serial), armed))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="git-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return armed

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due = self._heap[0][0] - time.monotonic()
                if due > 0:
                    self._cond.wait(due)
                    continue
                armed = heapq.heappop(self._heap)[2]
                self._cond.release()
                try:
                    with suppress(Exception):  # an action's failure must not stop every deadline
                        armed.action()
                finally:
                    self._cond.acquire()


WATCHDOG = Watchdog()
"""The process's watchdog of Git HTTP sessions."""


def _watched(manager: urllib3.PoolManager, sockets: Sockets) -> None:
    """Register every connection any pool of ``manager`` opens — HTTP and HTTPS alike — with
    ``sockets``, so the watchdog can cut it."""
    original = manager._new_pool

    def new_pool(scheme: str, host: str, port: int,
                 request_context: dict[str, Any] | None = None) -> Any:
        pool = original(scheme, host, port, request_context)
        opened = pool._new_conn

        def registered() -> Any:
            connection = opened()
            sockets.add(connection)
            return connection

        pool._new_conn = registered  # type: ignore[method-assign]
        return pool

    manager._new_pool = new_pool  # type: ignore[method-assign]


class _WatchedPoolManager(urllib3.PoolManager):
    def __init__(self, *args: Any, sockets: Sockets, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _watched(self, sockets)


class _WatchedProxyManager(urllib3.ProxyManager):
    def __init__(self, *args: Any, sockets: Sockets, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _watched(self, sockets)


class _HttpClient(Urllib3HttpGitClient):
    """dulwich's urllib3 client: our ``Authorization`` header (same origin only), a byte
    budget on every response, and no dumb-HTTP fallback.

    With ``reuse``, the discovery of an upload-pack (fetch) is answered from that earlier
    listing, without a request; ``discovered`` is what the last real discovery returned.
    """

    def __init__(self, base_url: str, *, authorization: str | None, pool_manager: Any,
                 timeout: float, budget: _ReadBudget, reuse: _Discovery | None = None) -> None:
        super().__init__(base_url, pool_manager=pool_manager, timeout=timeout)
        self._authorization = authorization
        self._authorization_origin = self._origin(base_url)
        self._budget = budget
        self._reuse = reuse
        self.discovered: tuple[Any, ...] | None = None

    def _http_request(self, url: str, headers: dict[str, str] | None = None,
                      data: Any = None, raise_for_status: bool = True) -> Any:
        headers = dict(headers or {})
        if self._authorization is not None and self._origin(url) == self._authorization_origin:
            headers["Authorization"] = self._authorization
        response, read = super()._http_request(url, headers, data, raise_for_status)
        return response, self._budget.wrap(read)

    def _discover_references(self, service: bytes, base_url: str,
                             protocol_version: int | None = None,
                             ref_prefix: Sequence[bytes] | None = None) -> Any:
        if self._reuse is not None and service == b"git-upload-pack":
            # The caller's own listing, made moments ago with these same credentials: the
            # fetch request that follows is judged by the server on its own (stateless HTTP).
            self.dumb = False
            self.protocol_version = self._reuse.protocol_version
            return self._reuse.answer()
        found = super()._discover_references(service, base_url, protocol_version=protocol_version,
                                             ref_prefix=ref_prefix)
        if self.dumb:
            # dulwich serves dumb HTTP by loading whole objects into memory.
            raise GitOperationError("the server does not speak Git's smart HTTP protocol (dumb "
                                    "HTTP servers are not supported)")
        refs, capabilities, url, symrefs, peeled = found
        # Copied now: get_refs adds the peeled tags to the refs dict it is returned.
        self.discovered = (dict(refs), set(capabilities), url, dict(symrefs), dict(peeled))
        return found


def _authorization(url: RemoteUrl, credentials: Credentials | None) -> str | None:
    if credentials is not None and credentials.bearer_token:
        return f"Bearer {credentials.bearer_token}"
    username = (credentials.username if credentials else None) or url.username
    password = credentials.password if credentials else None
    if username is None and password is None:
        return None
    token = base64.b64encode(f"{username or ''}:{password or ''}".encode()).decode("ascii")
    return f"Basic {token}"


def _ssl_context(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    except (ssl.SSLError, ValueError, UnicodeDecodeError):
        raise GitOperationError("the CA certificate (caFile) is not valid PEM") from None
    return context


def _describe(error: GitProtocolError) -> str:
    """The useful part of a dulwich error: urllib3's reason rather than its retry summary."""
    cause = error.__cause__
    if isinstance(cause, urllib3.exceptions.MaxRetryError) and cause.reason is not None:
        reason = cause.reason
        if isinstance(reason, urllib3.exceptions.SSLError) and reason.args:
            return f"TLS error: {reason.args[0]}"
        return str(reason)
    return str(error)


@dataclass(frozen=True)
class Remote:
    """One remote repository as seen with one set of credentials.

    ``deadline`` bounds every operation made through this object together (by default
    each operation gets ``timeout`` on its own); ``limits`` bound what a fetch accepts.
    """

    url: RemoteUrl
    credentials: Credentials | None
    timeout: float
    scratch_dir: Path | None = None
    """Where SSH key files are written for the length of one connection."""
    deadline: Deadline | None = None
    limits: Limits = field(default_factory=Limits)

    def _deadline(self) -> Deadline:
        return self.deadline if self.deadline is not None else Deadline(self.timeout)

    def _timed_out(self, action: str) -> GitOperationError:
        return GitOperationError(f"{action} {self.url.display} failed: timed out after "
                                 f"{self.timeout:g}s")

    @contextmanager
    def _session(self, action: str, budget: _ReadBudget, *,
                 reuse: _Discovery | None = None) -> Iterator[tuple[GitClient, str]]:
        """A client for one operation; errors translated, everything cleaned up after.
        ``reuse``: an HTTP discovery of this remote to answer the client's own from."""
        deadline = self._deadline()
        if deadline.expired():
            raise self._timed_out(action)
        if self.url.kind != "ssh":
            sockets = Sockets()
            armed: _Armed | None = None
            try:
                with self._errors(action, sockets):
                    client, path = self._client(sockets, budget, deadline, reuse=reuse)
                    armed = WATCHDOG.arm(deadline.remaining(), sockets.cut)
                    try:
                        yield client, path
                    finally:
                        client.close()
            finally:
                if armed is not None:
                    armed.cancel()
            return
        creds = self.credentials or Credentials()
        session = ssh_session(identity=creds.identity, known_hosts=creds.known_hosts,
                              passphrase=creds.password, timeout=deadline.remaining(),
                              host=self._ssh_host(), scratch_dir=self.scratch_dir,
                              read_budget=budget.wrap)
        with session as vendor, self._ssh_errors(action, vendor):
            # The SSH user is the URL's (else "git"), never the Secret's: it is part of the
            # mirror key, and Flux does the same.
            client = SSHGitClient(self.url.host.strip("[]"), port=self.url.port,
                                  username=self.url.username, vendor=vendor)
            try:
                yield client, self.url.path
            finally:
                client.close()

    def _ssh_host(self) -> str:
        return f"[{self.url.host}]:{self.url.port}" if self.url.port else self.url.host

    def _client(self, sockets: Sockets, budget: _ReadBudget, deadline: Deadline, *,
                reuse: _Discovery | None = None) -> tuple[GitClient, str]:
        if self.url.kind in ("http", "https"):
            ca_pem = self.credentials.ca_pem if self.credentials else None
            pool_kwargs: dict[str, Any] = {"sockets": sockets}
            if ca_pem:
                pool_kwargs["ssl_context"] = _ssl_context(ca_pem)
            timeout = max(0.1, min(self.timeout, deadline.remaining()))
            pool = default_urllib3_manager(
                None,
                # dulwich calls these with its own keyword arguments; partial adds ours.
                pool_manager_cls=cast(type, functools.partial(_WatchedPoolManager,
                                                              **pool_kwargs)),
                proxy_manager_cls=cast(type, functools.partial(_WatchedProxyManager,
                                                               **pool_kwargs)),
                base_url=self.url.transport_url,
                timeout=timeout,
            )
            client = _HttpClient(self.url.transport_url,
                                 authorization=_authorization(self.url, self.credentials),
                                 pool_manager=pool, timeout=timeout, budget=budget,
                                 reuse=reuse)
            return client, ""
        if self.url.kind == "file":
            return LocalGitClient(), self.url.path
        raise GitOperationError(f"cannot fetch {self.url.display}: unsupported transport")

    @contextmanager
    def _ssh_errors(self, action: str, vendor: StrictSSHVendor) -> Iterator[None]:
        """Like :meth:`_errors`, judging failures by what ``ssh`` wrote to stderr."""
        secrets = self.credentials.secrets() if self.credentials else ()
        where = self.url.display
        try:
            yield
        except SourceError:
            raise
        except (GitProtocolError, OSError, ValueError, KeyError) as error:
            if vendor.timed_out.is_set():
                raise self._timed_out(action) from None
            text = str(error)
            if _hung_up(error):
                # The server hung up while we wrote: its reason, if it gave one, is on stderr.
                text = "\n".join(t for t in (text, vendor.hangup_reason()) if t)
            text = scrub(redact(text, secrets), vendor)
            classified = classify_ssh_failure(
                text, where=where, host=self._ssh_host(),
                has_identity=bool(self.credentials and self.credentials.identity))
            if classified is not None:
                raise classified from None
            if "does not appear to be a git repository" in text or (
                isinstance(error, NotGitRepository)
            ):
                raise GitOperationError(f"no Git repository at {where}") from None
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            message = "; ".join(lines[-3:]) or type(error).__name__
            if "timed out" in message:
                message = f"timed out after {self.timeout:g}s ({message})"
            raise GitOperationError(f"{action} {where} failed: {message}") from None

    @contextmanager
    def _errors(self, action: str, sockets: Sockets | None = None) -> Iterator[None]:
        """Translate library exceptions into :class:`SourceError` with safe messages."""
        secrets = self.credentials.secrets() if self.credentials else ()
        where = self.url.display
        try:
            yield
        except SourceError:
            if sockets is not None and sockets.fired.is_set():
                raise self._timed_out(action) from None
            raise
        except Exception as error:
            if sockets is not None and sockets.fired.is_set():
                raise self._timed_out(action) from None
            self._translate(error, action=action, where=where, secrets=secrets)
            raise

    def _translate(self, error: Exception, *, action: str, where: str,
                   secrets: tuple[str | None, ...]) -> None:
        if isinstance(error, (HTTPUnauthorized, HTTPProxyUnauthorized)):
            hint = "" if self.credentials else " (no credentials were given)"
            raise AuthenticationError(f"authentication failed for {where}{hint}") from None
        if isinstance(error, NotGitRepository):
            raise GitOperationError(f"no Git repository at {where}") from None
        if isinstance(error, HangupException):
            message = redact(str(error) or "the remote hung up", secrets)
            raise GitOperationError(f"{action} {where} failed: {message}") from None
        if isinstance(error, GitProtocolError):
            message = redact(_describe(error), secrets)
            if "http resp 403" in message:
                raise AuthenticationError(f"access to {where} was denied (HTTP 403)") from None
            raise GitOperationError(f"{action} {where} failed: {message}") from None
        if isinstance(error, (OSError, urllib3.exceptions.HTTPError, ValueError, KeyError)):
            message = redact(f"{type(error).__name__}: {error}", secrets)
            raise GitOperationError(f"{action} {where} failed: {message}") from None

    def list_refs(self, prefixes: Sequence[str] | None = None) -> Listing:
        """``git ls-remote``: the remote's refs (annotated tags also as ``<tag>^{}``)."""
        budget = _ReadBudget(listing=LISTING_BYTES, pack=0)
        discovery: _Discovery | None = None
        with self._session("listing refs of", budget) as (client, path):
            prefix_bytes = [p.encode() for p in prefixes] if prefixes else None
            result = client.get_refs(path.encode(), ref_prefix=prefix_bytes)
            version = int(getattr(client, "protocol_version", 0) or 0)
            if isinstance(client, _HttpClient) and client.discovered is not None:
                found_refs, capabilities, base_url, found_symrefs, peeled = client.discovered
                discovery = _Discovery(owner=self, protocol_version=version,
                                       refs=dict(found_refs), capabilities=frozenset(capabilities),
                                       base_url=base_url, symrefs=dict(found_symrefs),
                                       peeled=dict(peeled))
        refs = {name.decode("utf-8", "replace"): sha.decode("ascii")
                for name, sha in result.refs.items() if sha is not None}
        symrefs = {name.decode("utf-8", "replace"): target.decode("utf-8", "replace")
                   for name, target in result.symrefs.items()}
        return Listing(refs=refs, symrefs=symrefs, protocol_version=version, discovery=discovery)

    def fetch(self, repo: Repo, *, wants: Sequence[str], depth: int | None,
              blob_limit: int | None = None, haves: Sequence[str] = (),
              listing: Listing | None = None) -> int:
        """Fetch ``wants`` (object ids) and what they need into ``repo``; the protocol version.

        The server is asked even when ``repo`` already holds every wanted object: the fetch
        is also how a caller proves that the server lets *it* read them.  ``haves`` are
        extra commits to tell the server we have (so such a proof transfers nothing).
        ``depth=1`` makes a shallow fetch of just the wanted commits.  With ``blob_limit``,
        servers that support partial clone (protocol v2 ``filter``, e.g. GitHub and GitLab)
        leave out blobs of that many bytes or more.  Every pack byte passes a
        :class:`~sources.pack.PackInspector` first; a refused pack is never stored.
        Raises :class:`WantRefusedError` when the server will not send a wanted object.
        ``listing``: this remote's own :meth:`list_refs` result, whose discovery an HTTP fetch
        then reuses instead of making its own (module docstring); another's is ignored.
        """
        filter_spec = f"blob:limit={blob_limit}".encode() if blob_limit is not None else None
        want_ids = [ObjectID(w.encode("ascii")) for w in wants]
        hash_size = len(wants[0]) // 2 if wants else 20

        def determine_wants(refs: Mapping[Ref, ObjectID],
                            depth: int | None = None) -> list[ObjectID]:
            del refs, depth  # decided from our own listing already
            return want_ids

        budget = _ReadBudget(listing=LISTING_BYTES, pack=self.limits.max_fetch_bytes + STEP_SLACK)
        inspector = PackInspector(self.limits, hash_size=hash_size)
        walker = repo.get_graph_walker(
            [*(h for h in {ObjectID(x.encode("ascii")) for x in haves} if h in repo.object_store),
             *_heads(repo)] if haves else None)
        with SpooledTemporaryFile(max_size=_SPOOL_BYTES, prefix="incoming-",
                                  dir=getattr(repo.object_store, "path", None)) as spool:

            def pack_data(data: bytes) -> int:
                budget.pack_started = True
                inspector.feed(data)
                return spool.write(data)

            used: list[GitClient] = []
            try:
                with self._session("fetching from", budget,
                                   reuse=self._reusable(listing)) as (client, path):
                    used.append(client)
                    result = client.fetch_pack(path.encode(), determine_wants, walker, pack_data,
                                               depth=depth, filter_spec=filter_spec)
            except GitOperationError as error:
                if budget.server_error is not None or any(
                        marker in str(error) for marker in _REFUSED_WANT):
                    raise self._refused(budget, used, str(error)) from None
                raise
            if budget.server_error is not None or not inspector.started:
                # An ERR line, or no pack at all: the server did not send what we asked for.
                raise self._refused(budget, used, "the remote sent no pack")
            inspector.finish()
            if spool.tell():
                spool.seek(0)
                repo.object_store.add_thin_pack(spool.read, None)
        repo.update_shallow(result.new_shallow, result.new_unshallow)
        return _protocol(used)


    def _reusable(self, listing: Listing | None) -> _Discovery | None:
        """``listing``'s discovery if this very remote made it (never another caller's)."""
        if listing is None or listing.discovery is None or listing.discovery.owner is not self:
            return None
        return listing.discovery

    def _refused(self, budget: _ReadBudget, clients: list[GitClient],
                 detail: str) -> WantRefusedError:
        reason = budget.server_error or detail
        return WantRefusedError(f"fetching from {self.url.display} failed: the remote refused: "
                                f"{reason}", protocol_version=_protocol(clients))


STEP_SLACK = 1024 * 1024
"""Bytes of protocol framing (pkt-lines, side-band) allowed around a pack."""


def _heads(repo: Repo) -> list[ObjectID]:
    return [sha for name, sha in repo.refs.as_dict().items()
            if name != b"HEAD" and sha in repo.object_store]


def _protocol(clients: list[GitClient]) -> int:
    """The Git protocol version the (one) client spoke, 0 if unknown."""
    return int(getattr(clients[0], "protocol_version", 0) or 0) if clients else 0
