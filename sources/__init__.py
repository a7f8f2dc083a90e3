"""Git sources: resolve refs, fetch into shared mirrors, read trees.  Knows nothing of Kubernetes.

The controller uses it like this::

    store = MirrorStore(root=Path("/var/cache/stageset/git"), policy=UrlPolicy(), limits=Limits(),
                        max_bytes=10 * 2**30)   # LRU eviction past 10 GiB; None: unbounded
    creds = Credentials(username="git", password=token)              # HTTPS basic auth, or
    creds = Credentials(identity=key_pem, known_hosts=known_hosts)   # SSH, strict host keys
    snapshot = store.fetch(url, ref=RefSelector(branch="main"), credentials=creds, timeout=60)
    snapshot.revision                     # "main@sha1:<40 hex>", Flux's format
    files = store.read_tree(url, commit=snapshot.commit, path="./deploy", ignore=None)
    tree_id = store.tree_hash(url, commit=snapshot.commit, path="./deploy")

Every failure is a :class:`SourceError`; see :mod:`sources.errors` for the kinds
(:class:`HostKeyError` is an :class:`AuthenticationError`; :class:`NotFetchedError`, a
:class:`RefNotFoundError`, means "fetch again, then read": the mirror was evicted).  This
package must never import ``stageset`` or ``kubernetes`` (an import-linter contract): it is
reusable, and testable against a plain Git server.
"""

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
from sources.mirror import MirrorStore, Snapshot
from sources.refs import RefSelector
from sources.revision import format_revision, parse_revision
from sources.urls import UrlPolicy

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
