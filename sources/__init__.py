"""Git sources: resolve refs, fetch into shared mirrors, read trees.  Knows nothing of Kubernetes.

The controller uses it like this::

    store = MirrorStore(root=Path("/var/cache/stageset/git"), policy=UrlPolicy(), limits=Limits(),
                        max_bytes=10 * 2**30)   # LRU eviction past 10 GiB; None: unbounded
    creds = Credentials(username="git", password=token)              # HTTPS basic auth, or
    creds = Credentials(identity=key_pem, known_hosts=known_hosts)   # SSH, strict host keys
    snapshot = store.fetch(url, ref=RefSelector(branch="main"), credentials=creds, timeout=60,
                           consumer="payments/app/<uid>")  # served to this source only
    snapshot.revision                     # "main@sha1:<40 hex>", Flux's format
    store.is_served(url, commit=snapshot.commit, consumer="payments/app/<uid>")  # True
    store.keep(url, consumer="payments/app/<uid>", holder="payments/shop/app",   # still served
               commits=[snapshot.commit])                                        # after newer ones
    files = store.read_tree(url, commit=snapshot.commit, path="./deploy", ignore=None)
    tree_id = store.tree_hash(url, commit=snapshot.commit, path="./deploy")

Identity: every network operation uses the caller's :class:`Credentials` and nothing of the
controller's own; a commit is served to a caller only once proven readable with them
(:mod:`sources.mirror`).  Everything a server sends is bounded (:mod:`sources.pack`,
:mod:`sources.limits`); ignore rules are Flux's, matched in linear time
(:mod:`sources.ignore`).

Every failure is a :class:`SourceError`; see :mod:`sources.errors` for the kinds
(:class:`HostKeyError` is an :class:`AuthenticationError`; :class:`NotFetchedError`, a
:class:`RefNotFoundError`, means "fetch again, then read": the mirror was evicted).  This
package must never import ``stageset`` or ``kubernetes`` (an import-linter contract): it is
reusable, and testable against a plain Git server.
"""

import importlib
from typing import TYPE_CHECKING, Any

from sources.credentials import Credentials
from sources.errors import (
    AuthenticationError,
    GitOperationError,
    HostKeyError,
    InvalidRefError,
    LimitExceededError,
    NotFetchedError,
    PathNotFoundError,
    RefNotFoundError,
    SourceError,
    UnsafePathError,
    UrlPolicyError,
)
from sources.limits import Limits
from sources.revision import format_revision, parse_revision
from sources.urls import UrlPolicy

if TYPE_CHECKING:
    from sources.mirror import MirrorStore, Snapshot
    from sources.refs import RefSelector

# The Git machinery (dulwich) loads only when first used, so that the pure modules of this
# package (``sources.revision``, ``sources.digests`` ...) import without it.
_LAZY = {"MirrorStore": "sources.mirror", "Snapshot": "sources.mirror", "RefSelector": "sources.refs"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sources' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

__all__ = [
    "AuthenticationError",
    "Credentials",
    "GitOperationError",
    "HostKeyError",
    "InvalidRefError",
    "LimitExceededError",
    "Limits",
    "MirrorStore",
    "NotFetchedError",
    "PathNotFoundError",
    "RefNotFoundError",
    "RefSelector",
    "Snapshot",
    "SourceError",
    "UnsafePathError",
    "UrlPolicy",
    "UrlPolicyError",
    "format_revision",
    "parse_revision",
]
