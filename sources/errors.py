"""Errors raised by :mod:`sources`.

Every failure a caller may want to report to a user is a :class:`SourceError`, so the
controller can catch one type and turn it into a condition.  The subclasses say *what kind*
of failure it was, which decides the condition's reason and whether retrying can help.

Messages are written for the person who owns the GitRepository: they name the URL (always
without credentials), the ref, the path or the limit at fault.  They never contain a
password, token or private key — callers may put them in a Kubernetes status or event,
which other people can read.
"""

from __future__ import annotations


class SourceError(Exception):
    """Base of every error :mod:`sources` raises on purpose."""


class AuthenticationError(SourceError):
    """The remote refused the credentials (or required some and none were given)."""


class HostKeyError(AuthenticationError):
    """The SSH server's host key is not in ``known_hosts``, differs from it, or no
    ``known_hosts`` was given.  Never retried with a laxer check: it may be an attack."""


class RefNotFoundError(SourceError):
    """The branch, tag, ref, semver match or commit does not exist on the remote."""


class NotFetchedError(RefNotFoundError):
    """A commit was asked of a mirror that does not hold it (never fetched, or evicted):
    :meth:`~sources.MirrorStore.fetch` it again, then read."""


class InvalidRefError(SourceError, ValueError):
    """A :class:`~sources.RefSelector` that cannot be used (bad commit id, bad constraint)."""


class GitOperationError(SourceError):
    """Talking to the remote or reading the mirror failed (network, protocol, storage)."""


class LimitExceededError(SourceError):
    """A tree is larger than :class:`~sources.Limits` allows."""


class UnsafePathError(SourceError):
    """A path, symlink or submodule would read outside the requested tree."""


class PathNotFoundError(SourceError):
    """The requested path does not exist in the commit, or is not a directory."""


class UrlPolicyError(SourceError):
    """The URL's scheme is not allowed by the :class:`~sources.UrlPolicy`, or it is malformed."""


class TransferError(SourceError):
    """Downloading an artifact failed on the way (connection, HTTP status, time limit): worth
    retrying with backoff, unlike a refused address, a digest mismatch or an unsafe archive."""
