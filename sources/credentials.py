"""Credentials for one fetch, as read from a GitRepository's ``secretRef``.

Why a plain dataclass with ``repr=False`` secrets: credentials travel from the controller
(which reads the Secret as the tenant) to the transport and nowhere else.  They are never
put into a URL, so they cannot reach the mirror's config on disk, an exception message or
a log line through one; and ``repr`` shows only which kinds are present.

This round uses ``username``/``password`` (HTTP basic auth), ``bearer_token`` (HTTP
``Authorization: Bearer``) and ``ca_pem`` (extra trusted CAs for HTTPS).  ``identity`` and
``known_hosts`` are for SSH and are accepted now so callers can be written against the
final shape; SSH transport is not implemented yet (:class:`~sources.GitOperationError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Credentials:
    """Secrets for a remote; all optional.  ``repr`` never shows a secret value."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    ca_pem: bytes | None = field(default=None, repr=False)
    identity: bytes | None = field(default=None, repr=False)
    known_hosts: bytes | None = field(default=None, repr=False)

    def secrets(self) -> tuple[str | None, ...]:
        """The secret strings, for redacting messages that came from a library."""
        identity = self.identity.decode("utf-8", "replace") if self.identity else None
        return (self.password, self.bearer_token, identity)

    def __repr__(self) -> str:
        present = [name for name in ("password", "bearer_token", "ca_pem", "identity",
                                     "known_hosts") if getattr(self, name)]
        return f"Credentials(username={self.username!r}, present={present})"
