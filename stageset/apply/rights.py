"""When each identity last showed it may write a kind in a namespace: rights re-checked on a schedule.

A warm pass over an unchanged stage writes nothing, so nothing in it needs the identity's rights;
it still asks, with one server-side dry-run per kind and namespace, so that rights taken away turn
the StageSet ``RBACDenied`` before its next change does.  That question costs a request per
StageSet per interval (a third of a periodic pass); its answer changes only when someone edits
RBAC.  So a *periodic* pass (the interval, or ``driftDetectionInterval``) asks only when the
identity has not shown those rights within ``max_age`` (``--rights-recheck-interval``, 1 hour by
default) — shown by any write or dry-run of that kind in that namespace, by any stage of the same
identity.  A requested pass (``reconcile.fluxcd.io/requestedAt``), a pass after a failure or a
change of spec, a pass with anything to write, and the first pass after a start always ask, as
before.

What this never does: let anything be written without the apiserver deciding.  A skipped check
only skips a question whose answer would have written nothing either way; every write is still the
identity's own request, authorized by the apiserver.

Keys are ``(cluster, identity, collection path)`` (the collection path names the kind and the
namespace): rights one identity showed are never assumed for another.  Bounded in entries
(:data:`DEFAULT_MAX_ENTRIES`, about 120 bytes each), least recently shown first out; an entry lost
costs one dry-run.  No I/O; thread-safe; the clock is injected.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_MAX_AGE = 3600.0
"""Seconds a shown right spares periodic passes the question (``--rights-recheck-interval``)."""
DEFAULT_MAX_ENTRIES = 65536
"""Identities x kinds x namespaces remembered; past that the least recently shown are asked again."""

Key = tuple[str, str, str]  # (cluster, identity, collection path: kind and namespace)


class ShownRights:
    def __init__(self, *, max_age: float = DEFAULT_MAX_AGE, max_entries: int = DEFAULT_MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic):
        self.max_age = max_age
        self._max_entries = max_entries
        self._clock = clock
        self._shown: OrderedDict[Key, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._shown)

    def fresh(self, key: Key) -> bool:
        """Did the identity show these rights within ``max_age``?  (``max_age`` 0: never.)"""
        if self.max_age <= 0:
            return False
        with self._lock:
            at = self._shown.get(key)
        return at is not None and self._clock() - at < self.max_age

    def shown(self, key: Key) -> None:
        """The identity just wrote or dry-ran an object of this kind in this namespace."""
        if self.max_age <= 0:
            return
        with self._lock:
            self._shown[key] = self._clock()
            self._shown.move_to_end(key)
            while len(self._shown) > self._max_entries:
                self._shown.popitem(last=False)

    def denied(self, key: Key) -> None:
        """The identity was refused there: ask again next time, whoever asks."""
        with self._lock:
            self._shown.pop(key, None)
