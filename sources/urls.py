"""Which Git URLs we accept, and the identity under which their mirrors are shared.

Why a policy: a GitRepository's URL is written by a tenant, and the controller fetches it
from inside the cluster.  ``http://`` sends credentials in clear text, and ``file://`` or a
local path would let a tenant read repositories on the controller's own disk, so both are
off unless the operator turns them on.  HTTPS, ``ssh://`` and scp-like ``git@host:path``
are always allowed; every other scheme (``git://``, ``ext::``, ...) is refused.

Why normalise: many GitRepositories point at the same repository spelled slightly
differently (``.git`` or not, a trailing slash, host case, ``git@host:x`` vs
``ssh://git@host/x``).  They share one mirror, keyed by :attr:`RemoteUrl.key`, so the
repository is fetched once.  The key drops userinfo: sharing is safe because every fetch
lists the remote's refs with the caller's own credentials first (see :mod:`sources.mirror`).

Passwords in URLs are refused: they would end up in logs, statuses and on disk.  Use
:class:`~sources.Credentials` instead.  A user name alone (``ssh://git@host/x``) is fine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from sources.errors import UrlPolicyError

Kind = Literal["https", "http", "ssh", "file"]

_SCP = re.compile(r"(?:(?P<user>[^@/:]+)@)?(?P<host>[^@/:\[\]]+|\[[^\]]+\]):(?P<path>[^/].*|/.*)")
_DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22}
_SCHEMES: dict[str, Kind] = {
    "https": "https", "http": "http", "ssh": "ssh", "git+ssh": "ssh", "ssh+git": "ssh",
    "file": "file",
}


@dataclass(frozen=True)
class UrlPolicy:
    """Which URL kinds may be fetched beyond the always-allowed HTTPS and SSH."""

    allow_http: bool = False
    allow_file: bool = False


@dataclass(frozen=True)
class RemoteUrl:
    """A checked Git URL.

    ``transport_url`` is what we connect to (never with a password; an SSH user is kept);
    ``display`` is safe for messages and disk (no userinfo at all); ``key`` identifies
    the repository for mirror sharing; ``username`` comes from the URL's userinfo.
    """

    kind: Kind
    transport_url: str
    display: str
    key: str
    username: str | None
    host: str
    port: int | None
    path: str


def _strip_repo_suffix(path: str) -> str:
    path = path.rstrip("/")
    path = path.removesuffix(".git")
    return path.rstrip("/")


def _check_allowed(kind: Kind, policy: UrlPolicy, *, scheme: str) -> None:
    if kind == "http" and not policy.allow_http:
        raise UrlPolicyError(
            "URL scheme 'http' is not allowed (plain HTTP is off; use https, or ask the "
            "operator to allow http)"
        )
    if kind == "file" and not policy.allow_file:
        raise UrlPolicyError(
            f"URL scheme {scheme!r} is not allowed (local repositories are off; use https or "
            "ssh)"
        )


def parse_url(url: str, policy: UrlPolicy) -> RemoteUrl:
    """Check ``url`` against ``policy`` and normalise it; raise :class:`UrlPolicyError`."""
    url = url.strip()
    if not url:
        raise UrlPolicyError("empty Git URL")
    if "://" in url:
        return _parse_with_scheme(url, policy)
    if "::" in url.split("/", 1)[0]:
        # git's "<transport>::<address>" remote helpers, e.g. "ext::sh -c ...".
        raise UrlPolicyError(
            f"URL scheme {url.split('::', 1)[0]!r} (remote helper) is not allowed"
        )
    scp = _SCP.fullmatch(url)
    if scp is not None and not url.startswith((".", "/")):
        host = scp["host"].lower()
        path = scp["path"]
        display = f"{host}:{path}"
        user = scp["user"]
        transport = f"{user}@{display}" if user else display
        key_path = "/" + _strip_repo_suffix(path).lstrip("/")
        return RemoteUrl(kind="ssh", transport_url=transport, display=display,
                         key=f"ssh://{host}{key_path}", username=user, host=host,
                         port=None, path=path)
    # A local path.
    _check_allowed("file", policy, scheme="local path")
    absolute = str(Path(url).expanduser().absolute())
    return RemoteUrl(kind="file", transport_url=absolute, display=absolute,
                     key=f"file://{_strip_repo_suffix(absolute)}", username=None, host="",
                     port=None, path=absolute)


def _parse_with_scheme(url: str, policy: UrlPolicy) -> RemoteUrl:
    scheme = url.split("://", 1)[0].lower()
    kind = _SCHEMES.get(scheme)
    if kind is None:
        raise UrlPolicyError(
            f"URL scheme {scheme!r} is not allowed (use https, ssh or git@host:path)"
        )
    _check_allowed(kind, policy, scheme=scheme)
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlPolicyError(f"malformed {scheme} URL") from None
    if parts.password is not None:
        raise UrlPolicyError(
            f"{scheme} URL must not contain a password; put credentials in the secret instead"
        )
    host = (parts.hostname or "").lower()
    if kind != "file" and not host:
        raise UrlPolicyError(f"{scheme} URL has no host")
    if parts.query or parts.fragment:
        raise UrlPolicyError(f"{scheme} URL must not have a query or fragment")
    netloc = host if ":" not in host else f"[{host}]"
    if port is not None:
        netloc += f":{port}"
    path = parts.path or "/"
    display = f"{kind}://{netloc}{path}"
    user = parts.username
    transport = display if kind != "ssh" or not user else f"ssh://{user}@{netloc}{path}"
    key_port = "" if port in (None, _DEFAULT_PORTS.get(kind)) else f":{port}"
    key_netloc = (host if ":" not in host else f"[{host}]") + key_port
    key = f"{kind}://{key_netloc}{_strip_repo_suffix(path)}"
    return RemoteUrl(kind=kind, transport_url=transport, display=display, key=key,
                     username=user, host=host, port=port, path=path)


def redact(text: str, secrets: tuple[str | None, ...]) -> str:
    """``text`` with every non-empty secret replaced by ``***`` (defence in depth)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
