"""Kubeconfigs for remote clusters, taken from tenants' Secrets — and kept harmless.

A tenant's kubeconfig is user data: it must not run commands on the controller
(``exec`` credential plugins, legacy ``auth-provider``), read the controller's files
(``certificate-authority``, ``client-certificate``, ``client-key``, ``tokenFile`` paths),
or route through a proxy of its choosing.  Only inline data is accepted: ``server``,
``certificate-authority-data``, ``client-certificate-data`` + ``client-key-data`` or
``token``.  We build the client configuration ourselves instead of handing the file to
the official loader, which would honour all of the above.

Every value is checked where it is read (:func:`check_server`, :func:`check_token`): the server is
an ``https://`` URL with a host and nothing else — no ``user:password@`` (basic auth is refused,
and a userinfo would otherwise be sent as one), no query or fragment, no whitespace; a token is
one line of visible ASCII (a CR/LF would otherwise reach a request header).  A refusal is a
:class:`KubeconfigError` naming the field, never quoting its value (it may be a credential).

Client certificates must be files for the transport; they are written into a private
directory (0700, files 0600) owned by the :class:`RemoteConfig` and never logged.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes import client as k8s

_FORBIDDEN_USER_FIELDS = ("exec", "auth-provider", "client-certificate", "client-key", "tokenFile",
                          "username", "password", "as", "as-groups", "as-user-extra")
_FORBIDDEN_CLUSTER_FIELDS = ("certificate-authority", "proxy-url")
MAX_TOKEN = 16384
"""Bytes of a bearer token at most (an OIDC id token with many groups stays well below)."""
MAX_SERVER = 2048


class KubeconfigError(ValueError):
    """The kubeconfig is unusable or asks for something we refuse; the message says which field."""


@dataclass(frozen=True)
class RemoteConfig:
    fingerprint: str
    configuration: k8s.Configuration
    server: str
    cluster_id: str = ""
    """Which cluster this is, stably across credential rotations: :func:`cluster_id`."""


def cluster_id(*, server: str, ca_data: bytes | None) -> str:
    """A cluster's stable identity: its server URL and the fingerprint of the CA it is trusted by.

    Never a credential: a rotated token or client certificate for the same cluster keeps the id, a
    kubeconfig that names another cluster (another URL, or the same URL served under another CA, as a
    re-created cluster or a vcluster behind one address is) changes it.  ``insecure`` when the
    kubeconfig trusts no CA (``insecure-skip-tls-verify``, or the system store).
    """
    fingerprint = hashlib.sha256(ca_data).hexdigest()[:16] if ca_data else "insecure"
    return f"{server}#{fingerprint}"


def _named(entries: Any, name: Any, what: str) -> dict[str, Any]:
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(what), dict):
            found: dict[str, Any] = entry[what]
            return found
    shown = repr(name) if isinstance(name, str) and len(name) <= 253 else "(the one named)"
    raise KubeconfigError(f"kubeconfig has no {what} named {shown}")


def _decode(value: Any, field: str) -> bytes:
    if not isinstance(value, str):
        raise KubeconfigError(f"kubeconfig field {field} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as error:
        raise KubeconfigError(f"kubeconfig field {field} is not valid base64") from error


class UrlProblem(enum.Enum):
    """What makes a remote API server's URL unusable (a kubeconfig's ``cluster.server``, a workload
    identity ConfigMap's ``address``): one set of rules for both, each caller naming its field."""

    NOT_HTTPS = "must be an https:// URL"
    NOT_ONE_LINE = "must be one line of printable ASCII without spaces"
    INVALID = "is not a valid URL"
    USERINFO = "must not carry user:password@"
    NO_HOST = "names no host"
    QUERY = "must not carry a query or fragment"


def https_url_problem(url: Any, *, limit: int = MAX_SERVER) -> UrlProblem | None:
    """Why ``url`` may not name a remote API server (``None``: it may): ``https://``, one line of
    printable ASCII of at most ``limit`` characters, a host, and nothing a request would carry
    besides the address (no ``user:password@``, query or fragment)."""
    if not isinstance(url, str) or not url.startswith("https://"):
        return UrlProblem.NOT_HTTPS
    if len(url) > limit or any(not 33 <= ord(c) < 127 for c in url):
        return UrlProblem.NOT_ONE_LINE
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return UrlProblem.INVALID
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return UrlProblem.USERINFO
    if not parts.hostname:
        return UrlProblem.NO_HOST
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return UrlProblem.QUERY
    return None


def check_server(server: Any) -> str:
    """``cluster.server`` as a client may use it, or :class:`KubeconfigError` naming what is wrong."""
    problem = https_url_problem(server)
    if problem is not None:
        extra = {UrlProblem.USERINFO: " (basic auth is refused: use a token or client-certificate-data)"}
        raise KubeconfigError(f"kubeconfig cluster.server {problem.value}{extra.get(problem, '')}")
    assert isinstance(server, str)
    return server


def check_token(token: Any) -> str:
    """``user.token`` as a request header may carry it, or :class:`KubeconfigError` (the value is
    never quoted)."""
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN \
            or any(not 33 <= ord(c) < 127 for c in token):
        raise KubeconfigError("kubeconfig user field 'token' must be one line of printable ASCII "
                              f"(no spaces, CR or LF; at most {MAX_TOKEN} bytes)")
    return token


def parse_remote_kubeconfig(raw: bytes, *, scratch: Path | None = None) -> RemoteConfig:
    """A client configuration for the kubeconfig's current context, or :class:`KubeconfigError`."""
    try:
        document = yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError) as error:
        raise KubeconfigError("the kubeconfig is not valid YAML") from error
    if not isinstance(document, dict):
        raise KubeconfigError("the kubeconfig is not a mapping")
    context_name = document.get("current-context")
    if not context_name:
        raise KubeconfigError("the kubeconfig has no current-context")
    context = _named(document.get("contexts"), context_name, "context")
    cluster = _named(document.get("clusters"), str(context.get("cluster")), "cluster")
    user = _named(document.get("users"), str(context.get("user")), "user")
    for field in _FORBIDDEN_CLUSTER_FIELDS:
        if field in cluster:
            raise KubeconfigError(f"kubeconfig cluster field {field!r} is not allowed (use inline data)")
    for field in _FORBIDDEN_USER_FIELDS:
        if field in user:
            raise KubeconfigError(f"kubeconfig user field {field!r} is not allowed: no commands, "
                                  "files or impersonation; use inline certificate data or a token")
    server = check_server(cluster.get("server"))

    configuration = k8s.Configuration()
    configuration.host = server
    configuration.connection_pool_maxsize = 32
    if cluster.get("insecure-skip-tls-verify"):
        configuration.verify_ssl = False
    ca_data = None
    if "certificate-authority-data" in cluster:
        ca_data = _decode(cluster["certificate-authority-data"], "certificate-authority-data")
        configuration.ca_cert_data = ca_data.decode()
    if "token" in user:
        configuration.api_key = {"authorization": f"Bearer {check_token(user['token'])}"}
    elif "client-certificate-data" in user and "client-key-data" in user:
        directory = Path(tempfile.mkdtemp(prefix="stageset-remote-", dir=scratch))
        os.chmod(directory, 0o700)
        for name, field in (("client.crt", "client-certificate-data"), ("client.key", "client-key-data")):
            path = directory / name
            path.write_bytes(_decode(user[field], field))
            path.chmod(0o600)
        configuration.cert_file = str(directory / "client.crt")
        configuration.key_file = str(directory / "client.key")
    else:
        raise KubeconfigError("kubeconfig user needs a token or client-certificate-data and "
                              "client-key-data")
    return RemoteConfig(fingerprint=hashlib.sha256(raw).hexdigest()[:16], configuration=configuration,
                        server=server, cluster_id=cluster_id(server=server, ca_data=ca_data))
