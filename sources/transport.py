"""Talking to a remote: list its refs, fetch objects into a mirror.  Built on dulwich.

Why a thin layer of our own over dulwich's clients:

* Credentials go into request headers, never into a URL, so they cannot leak into the
  mirror's config, dulwich's messages or our logs.  The ``Authorization`` header (basic or
  bearer) is only sent to the origin of the configured URL; a redirect to another host
  does not carry it (urllib3 also strips it on cross-host redirects).
* Extra CAs (``Credentials.ca_pem``) are *added* to the system trust store, as Flux does,
  rather than replacing it.
* No user or system Git configuration is read: the controller's behaviour must not depend
  on files in its container image.
* dulwich's exceptions are translated into :mod:`sources.errors` with messages that name the
  URL (without credentials) and say what failed; any secret that still slipped into a
  library message is redacted.

* SSH goes through the system ``ssh`` client with the caller's key and ``known_hosts``
  only, and strict host key checking (:mod:`sources.ssh`); the key files live for one
  connection.
"""

from __future__ import annotations

import base64
import functools
import ssl
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
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
from sources.errors import AuthenticationError, GitOperationError, SourceError
from sources.ssh import StrictSSHVendor, classify_ssh_failure, scrub, ssh_session
from sources.urls import RemoteUrl, redact

INFINITE_DEPTH = 0x7FFFFFFF
"""What ``git fetch --unshallow`` sends as depth: all history."""


@dataclass(frozen=True)
class Listing:
    """A remote's refs: full name -> object id (``<tag>^{}`` = peeled), and symrefs."""

    refs: dict[str, str]
    symrefs: dict[str, str]


class _HttpClient(Urllib3HttpGitClient):
    """dulwich's urllib3 client that adds our ``Authorization`` header, same origin only."""

    def __init__(self, base_url: str, *, authorization: str | None, pool_manager: Any,
                 timeout: float) -> None:
        super().__init__(base_url, pool_manager=pool_manager, timeout=timeout)
        self._authorization = authorization
        self._authorization_origin = self._origin(base_url)

    def _http_request(self, url: str, headers: dict[str, str] | None = None,
                      data: Any = None, raise_for_status: bool = True) -> Any:
        headers = dict(headers or {})
        if self._authorization is not None and self._origin(url) == self._authorization_origin:
            headers["Authorization"] = self._authorization
        return super()._http_request(url, headers, data, raise_for_status)


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
    """One remote repository as seen with one set of credentials."""

    url: RemoteUrl
    credentials: Credentials | None
    timeout: float
    scratch_dir: Path | None = None
    """Where SSH key files are written for the length of one connection."""

    @contextmanager
    def _session(self, action: str) -> Iterator[tuple[GitClient, str]]:
        """A client for one operation; errors translated, everything cleaned up after."""
        if self.url.kind != "ssh":
            with self._errors(action):
                client, path = self._client()
                try:
                    yield client, path
                finally:
                    client.close()
            return
        creds = self.credentials or Credentials()
        session = ssh_session(identity=creds.identity, known_hosts=creds.known_hosts,
                              passphrase=creds.password, timeout=self.timeout,
                              host=self._ssh_host(), scratch_dir=self.scratch_dir)
        with session as vendor, self._ssh_errors(action, vendor):
            username = self.url.username or creds.username
            client = SSHGitClient(self.url.host.strip("[]"), port=self.url.port,
                                  username=username, vendor=vendor)
            try:
                yield client, self.url.path
            finally:
                client.close()

    def _ssh_host(self) -> str:
        return f"[{self.url.host}]:{self.url.port}" if self.url.port else self.url.host

    def _client(self) -> tuple[GitClient, str]:
        if self.url.kind in ("http", "https"):
            ca_pem = self.credentials.ca_pem if self.credentials else None
            pool_kwargs: dict[str, Any] = {}
            if ca_pem:
                pool_kwargs["ssl_context"] = _ssl_context(ca_pem)
            pool = default_urllib3_manager(
                None,
                # dulwich calls these with its own keyword arguments; partial adds ours.
                pool_manager_cls=cast(type, functools.partial(urllib3.PoolManager,
                                                              **pool_kwargs)),
                proxy_manager_cls=cast(type, functools.partial(urllib3.ProxyManager,
                                                               **pool_kwargs)),
                base_url=self.url.transport_url,
                timeout=self.timeout,
            )
            client = _HttpClient(self.url.transport_url,
                                 authorization=_authorization(self.url, self.credentials),
                                 pool_manager=pool, timeout=self.timeout)
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
                raise GitOperationError(
                    f"{action} {where} failed: timed out after {self.timeout:g}s"
                ) from None
            text = scrub(redact(str(error), secrets), vendor)
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
    def _errors(self, action: str) -> Iterator[None]:
        """Translate library exceptions into :class:`SourceError` with safe messages."""
        secrets = self.credentials.secrets() if self.credentials else ()
        where = self.url.display
        try:
            yield
        except SourceError:
            raise
        except (HTTPUnauthorized, HTTPProxyUnauthorized):
            hint = "" if self.credentials else " (no credentials were given)"
            raise AuthenticationError(f"authentication failed for {where}{hint}") from None
        except NotGitRepository:
            raise GitOperationError(f"no Git repository at {where}") from None
        except HangupException as error:
            message = redact(str(error) or "the remote hung up", secrets)
            raise GitOperationError(f"{action} {where} failed: {message}") from None
        except GitProtocolError as error:
            message = redact(_describe(error), secrets)
            if "http resp 403" in message:
                raise AuthenticationError(f"access to {where} was denied (HTTP 403)") from None
            raise GitOperationError(f"{action} {where} failed: {message}") from None
        except (OSError, urllib3.exceptions.HTTPError, ValueError, KeyError) as error:
            message = redact(f"{type(error).__name__}: {error}", secrets)
            raise GitOperationError(f"{action} {where} failed: {message}") from None

    def list_refs(self, prefixes: Sequence[str] | None = None) -> Listing:
        """``git ls-remote``: the remote's refs (annotated tags also as ``<tag>^{}``)."""
        with self._session("listing refs of") as (client, path):
            prefix_bytes = [p.encode() for p in prefixes] if prefixes else None
            result = client.get_refs(path.encode(), ref_prefix=prefix_bytes)
        refs = {name.decode("utf-8", "replace"): sha.decode("ascii")
                for name, sha in result.refs.items() if sha is not None}
        symrefs = {name.decode("utf-8", "replace"): target.decode("utf-8", "replace")
                   for name, target in result.symrefs.items()}
        return Listing(refs=refs, symrefs=symrefs)

    def fetch(self, repo: Repo, *, wants: Sequence[str], depth: int | None,
              blob_limit: int | None = None) -> None:
        """Fetch ``wants`` (object ids) and what they need into ``repo``.

        ``repo.get_graph_walker()`` supplies the commits we already have, to negotiate
        from; ``depth=1`` makes a shallow fetch of just the wanted commits.  With
        ``blob_limit``, servers that support partial clone (protocol v2 ``filter``, e.g.
        GitHub and GitLab) leave out blobs of that many bytes or more, so a hostile blob
        never reaches our memory or disk; other servers send everything.
        """
        filter_spec = f"blob:limit={blob_limit}".encode() if blob_limit is not None else None
        want_ids = [ObjectID(w.encode("ascii")) for w in wants]

        def determine_wants(refs: Mapping[Ref, ObjectID],
                            depth: int | None = None) -> list[ObjectID]:
            del refs, depth  # decided from our own listing already
            return want_ids

        with self._session("fetching from") as (client, path):
            client.fetch(path.encode(), repo, determine_wants=determine_wants, depth=depth,
                         filter_spec=filter_spec)
