"""Which Git URLs we accept, and the identity under which their mirrors are shared.

Identity: parsing a URL reads nothing; for local repositories the path is resolved on the
controller's own filesystem (``realpath``) to check it against the forbidden paths.

Why a policy: a GitRepository's URL is written by a tenant, and the controller fetches it
from inside the cluster.  ``http://`` sends credentials in clear text, so it is off unless
the operator allows it (``UrlPolicy.allow_http``).  ``file://`` URLs and local paths read
the controller's own disk, so they are a **separate** switch (``UrlPolicy.allow_file``)
meant for single-tenant set-ups only, and even then a local path is refused when it
resolves into the mirror root, the SSH scratch directory or another controller path
(``UrlPolicy.forbidden_paths``: ``/proc``, ``/sys``, ``/dev``, ``/run/secrets``,
``/var/run/secrets``; the :class:`~sources.MirrorStore` adds its own directories).
HTTPS, ``ssh://`` and scp-like ``git@host:path`` are always allowed; every other scheme
(``git://``, ``ext::``, ...) is refused, and so are hosts and user names that begin with
``-`` (they could be read as options by a command line) and URLs with control characters.

Mirror keys (:attr:`RemoteUrl.key`): many GitRepositories point at the same repository,
and they share one mirror so the repository is fetched once.  A key keeps **everything
that can change what a server returns**, and folds only spellings that put the same bytes
on the wire or that RFC 3986 defines as equal:

* folded: the case of the scheme and host, a default port (443, 80, 22), and for HTTP(S)
  trailing slashes (dulwich strips them before building the request URL);
* kept: the path exactly — ``/org/app`` and ``/org/app.git`` are different repositories
  on many servers (``git http-backend`` serves a directory ``app`` and a directory
  ``app.git`` side by side), so ``.git`` is **not** folded; the user name — for SSH the
  user that is sent (the URL's, else ``git``), for HTTP(S) a user in the URL — because
  servers show different users different repositories; and scp-like ``host:path``
  (relative to the login's home) versus ``ssh://host/path`` (absolute).

Keys are only an optimisation and a first wall: sharing a mirror is safe because a commit
is served to a caller only after it is proven readable with that caller's own credentials
(see :mod:`sources.mirror`), whatever else sits in the mirror.

Passwords in URLs are refused: they would end up in logs, statuses and on disk.  Use
:class:`~sources.Credentials` instead.  A user name alone (``ssh://git@host/x``) is fine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from sources.errors import UrlPolicyError

Kind = Literal["https", "http", "ssh", "file"]

DEFAULT_SSH_USER = "git"
"""The SSH user when the URL names none, as Flux does (``ssh://host/x`` is ``git@host``)."""

DEFAULT_FORBIDDEN_PATHS: tuple[Path, ...] = (
    Path("/proc"), Path("/sys"), Path("/dev"), Path("/run/secrets"), Path("/var/run/secrets"),
)
"""Local paths never served as repositories, whatever the policy (the mirror root and the
SSH scratch directory are added by :class:`~sources.MirrorStore`)."""

_SCP = re.compile(r"(?:(?P<user>[^@/:]+)@)?(?P<host>[^@/:\[\]]+|\[[^\]]+\]):(?P<path>[^/].*|/.*)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22}
_SCHEMES: dict[str, Kind] = {
    "https": "https", "http": "http", "ssh": "ssh", "git+ssh": "ssh", "ssh+git": "ssh",
    "file": "file",
}


@dataclass(frozen=True)
class UrlPolicy:
    """Which URL kinds may be fetched beyond the always-allowed HTTPS and SSH.

    ``allow_http``: plain ``http://`` (credentials in clear text; development).
    ``allow_file``: ``file://`` URLs and local paths (single-tenant only: a tenant could
    read any repository on the controller's disk).  ``forbidden_paths``: local paths that
    are refused even then (compared after resolving symlinks).
    """

    allow_http: bool = False
    allow_file: bool = False
    forbidden_paths: tuple[Path, ...] = DEFAULT_FORBIDDEN_PATHS

    def forbidding(self, *paths: Path | None) -> UrlPolicy:
        """This policy with ``paths`` added to the forbidden local paths."""
        extra = tuple(Path(p) for p in paths if p is not None)
        return UrlPolicy(allow_http=self.allow_http, allow_file=self.allow_file,
                         forbidden_paths=(*self.forbidden_paths, *extra))


@dataclass(frozen=True)
class RemoteUrl:
    """A checked Git URL.

    ``transport_url`` is what we connect to (never with a password; an SSH user is kept);
    ``display`` is safe for messages and disk (no userinfo at all); ``key`` identifies
    the repository for mirror sharing; ``username`` comes from the URL's userinfo (for
    SSH, the user that is sent: the URL's, else ``git``).
    """

    kind: Kind
    transport_url: str
    display: str
    key: str
    username: str | None
    host: str
    port: int | None
    path: str


def _check_allowed(kind: Kind, policy: UrlPolicy, *, scheme: str) -> None:
    if kind == "http" and not policy.allow_http:
        raise UrlPolicyError(
            "URL scheme 'http' is not allowed (plain HTTP is off; use https, or ask the "
            "operator to allow http with --allow-insecure-sources)"
        )
    if kind == "file" and not policy.allow_file:
        raise UrlPolicyError(
            f"URL scheme {scheme!r} is not allowed (local repositories are off; use https or "
            "ssh)"
        )


def _check_name(what: str, value: str | None) -> None:
    """Hosts and users must not look like command-line options."""
    if value is not None and (value.startswith("-") or not value.strip()):
        raise UrlPolicyError(f"the {what} in the URL must not be empty or begin with '-'")


def _within(path: Path, root: Path) -> bool:
    try:
        resolved_root = Path(os.path.realpath(root))
    except OSError:  # pragma: no cover - realpath does not raise on Linux
        resolved_root = root
    return path == resolved_root or resolved_root in path.parents


def _local(path_text: str, policy: UrlPolicy, *, scheme: str) -> RemoteUrl:
    _check_allowed("file", policy, scheme=scheme)
    absolute = Path(path_text).expanduser().absolute()
    try:
        real = Path(os.path.realpath(absolute))
    except OSError:
        raise UrlPolicyError(f"local repository {str(absolute)!r} cannot be resolved (the "
                             "controller never serves paths it cannot resolve)") from None
    for forbidden in policy.forbidden_paths:
        if _within(real, forbidden):
            raise UrlPolicyError(
                f"local repository {str(absolute)!r} is inside a path the controller never "
                "serves (its mirrors, scratch files or system paths)"
            )
    text = str(real)
    return RemoteUrl(kind="file", transport_url=text, display=text, key=f"file://{text}",
                     username=None, host="", port=None, path=text)


def parse_url(url: str, policy: UrlPolicy) -> RemoteUrl:
    """Check ``url`` against ``policy`` and normalise it; raise :class:`UrlPolicyError`."""
    url = url.strip()
    if not url:
        raise UrlPolicyError("empty Git URL")
    if _CONTROL.search(url):
        raise UrlPolicyError("Git URL contains control characters")
    if "://" in url:
        return _parse_with_scheme(url, policy)
    if "::" in url.split("/", 1)[0]:
        # git's "<transport>::<address>" remote helpers, e.g. "ext::sh -c ...".
        raise UrlPolicyError(
            f"URL scheme {url.split('::', 1)[0]!r} (remote helper) is not allowed"
        )
    if url.startswith("-"):
        raise UrlPolicyError("a Git URL must not begin with '-'")
    scp = _SCP.fullmatch(url)
    if scp is not None and not url.startswith((".", "/")):
        host = scp["host"].lower()
        path = scp["path"]
        user = scp["user"]
        _check_name("host", host)
        _check_name("user", user)
        sent_user = user or DEFAULT_SSH_USER
        display = f"{host}:{path}"
        transport = f"{user}@{display}" if user else display
        # The path is sent as written: relative to the login's home here, unlike ssh://.
        key = f"ssh://{sent_user}@{host}:{path}" if not path.startswith("/") else (
            f"ssh://{sent_user}@{host}{path}")
        return RemoteUrl(kind="ssh", transport_url=transport, display=display, key=key,
                         username=sent_user, host=host, port=None, path=path)
    return _local(url, policy, scheme="local path")


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
    if parts.query or parts.fragment:
        raise UrlPolicyError(f"{scheme} URL must not have a query or fragment")
    if kind == "file":
        if parts.netloc not in ("", "localhost"):
            raise UrlPolicyError("file URL must not name a host")
        return _local(parts.path or "/", policy, scheme=scheme)
    host = (parts.hostname or "").lower()
    if not host:
        raise UrlPolicyError(f"{scheme} URL has no host")
    user = parts.username
    _check_name("host", host)
    _check_name("user", user if user is not None else None)
    netloc = host if ":" not in host else f"[{host}]"
    if port is not None:
        netloc += f":{port}"
    path = parts.path or "/"
    display = f"{kind}://{netloc}{path}"
    key_port = "" if port in (None, _DEFAULT_PORTS.get(kind)) else f":{port}"
    key_netloc = (host if ":" not in host else f"[{host}]") + key_port
    if kind == "ssh":
        sent_user = user or DEFAULT_SSH_USER
        transport = f"ssh://{user}@{netloc}{path}" if user else display
        key = f"ssh://{sent_user}@{key_netloc}{path}"
        return RemoteUrl(kind=kind, transport_url=transport, display=display, key=key,
                         username=sent_user, host=host, port=port, path=path)
    # HTTP(S): dulwich requests "<url without trailing slashes>/info/refs".
    key_user = f"{user}@" if user else ""
    key = f"{kind}://{key_user}{key_netloc}{path.rstrip('/') or '/'}"
    return RemoteUrl(kind=kind, transport_url=display, display=display, key=key,
                     username=user, host=host, port=port, path=path)


def redact(text: str, secrets: tuple[str | None, ...]) -> str:
    """``text`` with every non-empty secret replaced by ``***`` (defence in depth)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
