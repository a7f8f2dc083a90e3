"""Credentials for one fetch, as read from a GitRepository's ``secretRef``.

Why a plain dataclass with ``repr=False`` secrets: credentials travel from the controller
(which reads the Secret as the tenant) to the transport and nowhere else.  They are never
put into a URL, so they cannot reach the mirror's config on disk, an exception message or
a log line through one; and ``repr`` shows only which kinds are present.

The fields map one to one onto Flux's Secret keys:

* HTTPS: ``username``/``password`` (basic auth), ``bearer_token`` (``bearerToken``:
  ``Authorization: Bearer``), ``ca_pem`` (``caFile``: extra trusted CAs, added to the
  system's).
* SSH: ``identity`` (a private key, OpenSSH or PEM format), ``known_hosts`` (required: the
  server's host keys, as ``ssh-keyscan`` prints them) and, for an encrypted key, its
  passphrase in ``password``.  The SSH user comes from the URL (``git@host:x``), else
  ``username``, else ``git``.
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
