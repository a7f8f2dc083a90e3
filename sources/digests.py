"""Artifact digests as Flux writes them (``<algorithm>:<hex>``): parsed, checked, computed.

Identity: none (pure; no I/O).

A Flux source's ``status.artifact.digest`` is the digest of the artifact file (the
``.tar.gz`` served at ``status.artifact.url``).  The controller verifies every download
against it before reading a byte of the archive, and keys its shared store by it: a digest
is what makes one download safe to share between readers (a reader is only ever handed
content whose digest its own source object named).

Accepted algorithms: ``sha256`` (Flux's default), ``sha384`` and ``sha512``.  ``blake3``
(Flux's optional ``--artifact-digest-algo``) is refused with a message that says so: the
standard library cannot compute it, and a digest that cannot be checked is never trusted.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Protocol

from sources.errors import SourceError

ALGORITHMS: dict[str, int] = {"sha256": 64, "sha384": 96, "sha512": 128}
"""Accepted algorithms and the length of their hex digest."""

_FORM = re.compile(r"([a-z0-9]+(?:[.+_-][a-z0-9]+)*):([A-Za-z0-9=_-]+)")


class DigestError(SourceError):
    """A digest that is malformed or of an algorithm we cannot verify."""


class DigestMismatchError(SourceError):
    """A download whose digest is not the one its source object names."""


class Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class Digest:
    """A checked ``<algorithm>:<hex>`` digest (hex in lower case)."""

    algorithm: str
    hex: str

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Raise :class:`DigestError` unless ``text`` is a digest we can verify."""
        match = _FORM.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise DigestError(f"status.artifact.digest {text!r} is not of the form <algorithm>:<hex>")
        algorithm, value = match.group(1), match.group(2).lower()
        length = ALGORITHMS.get(algorithm)
        if length is None:
            raise DigestError(f"status.artifact.digest uses {algorithm!r}, which this controller cannot "
                              f"verify (supported: {', '.join(ALGORITHMS)}); an artifact is only used "
                              "once its digest is verified")
        if len(value) != length or not all(c in "0123456789abcdef" for c in value):
            raise DigestError(f"status.artifact.digest {text!r} is not a {algorithm} digest "
                              f"({length} hex digits)")
        return cls(algorithm=algorithm, hex=value)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def key(self) -> str:
        """A file-system-safe name: ``sha256-<hex>``."""
        return f"{self.algorithm}-{self.hex}"

    def hasher(self) -> Hasher:
        return hashlib.new(self.algorithm)

    def matches(self, computed: str) -> bool:
        """Compare with a computed hex digest (constant time)."""
        return hmac.compare_digest(self.hex, computed.lower())


def verify(expected: Digest, computed: str, *, what: str) -> None:
    """Raise :class:`DigestMismatchError` naming both digests unless they are equal."""
    if not expected.matches(computed):
        raise DigestMismatchError(
            f"digest mismatch: {what} has {expected.algorithm}:{computed}, but status.artifact.digest "
            f"is {expected}; the artifact was discarded unread (nothing applied, nothing pruned) and is "
            "not downloaded again until the source names another artifact")
