"""Write fences: a reconcile's writes stop the moment its object is no longer this process's to write.

A :class:`Fence` is held for the whole of one reconcile (:func:`holding`, a context variable, so
the threads a pass runs its stages in — which run in the caller's context — hold it too).  Every
request :class:`~stageset.kube.client.KubeClient` sends that can change anything (any method but
``GET``/``HEAD``) passes :func:`writing` first: under a revoked fence it is refused with
:class:`WriteFenced` *before* it leaves the process; otherwise it is counted in flight until its
answer arrived.  :meth:`Fence.revoke` (another thread: the watch that saw the object leave) says
when the last write in flight has ended — from then on this process sends nothing more for that
reconcile, which is what a hand-off to another writer waits for.

What it is used for: label shards (:mod:`stageset.controller.handoff`) — a StageSet relabelled to
another shard while its pass waits in an action must not be written by that pass again.  Reads
are never fenced (they change nothing); requests outside any fence (the watches, the hand-off
record itself, another reconcile) are not affected.

Identity: none — a fence only lets a request of whatever client go, or not.
Invariant: after :meth:`Fence.revoke` has called its ``on_quiet`` (or returned ``True``), no
request under that fence that can change anything is sent or still in flight.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator

READS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: never fenced."""

_HELD: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("stageset_write_fence", default=None)


class WriteFenced(Exception):
    """A write refused before it was sent: the fence it was made under was revoked."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class Fence:
    """The right of one reconcile to write; revoked once, for good."""

    def __init__(self, *, why: str = "the object is no longer this controller's to write",
                 on_refused: Callable[[], None] | None = None):
        self._lock = threading.Lock()
        self._why = why
        self._on_refused = on_refused
        self._revoked = False
        self._in_flight = 0
        self._on_quiet: Callable[[], None] | None = None

    @property
    def revoked(self) -> bool:
        with self._lock:
            return self._revoked

    def check(self) -> None:
        """Raise :class:`WriteFenced` when revoked (for side effects outside the apiserver, such as
        an action's HTTP request, made under this fence)."""
        with self._lock:
            revoked = self._revoked
        if revoked:
            if self._on_refused is not None:
                self._on_refused()
            raise WriteFenced(self._why)

    def revoke(self, *, on_quiet: Callable[[], None] | None = None) -> bool:
        """No write under this fence is sent from now on.  ``True`` when none is in flight either;
        otherwise ``on_quiet`` is called (on the thread of the last one) once they all ended."""
        with self._lock:
            self._revoked = True
            if self._in_flight == 0:
                return True
            self._on_quiet = on_quiet
            return False

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        """Around one request that can change something: refused when revoked, else counted in flight."""
        with self._lock:
            refused = self._revoked
            if not refused:
                self._in_flight += 1
        if refused:
            if self._on_refused is not None:
                self._on_refused()
            raise WriteFenced(self._why)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                quiet = self._on_quiet if self._in_flight == 0 else None
                if quiet is not None:
                    self._on_quiet = None
            if quiet is not None:
                quiet()


@contextlib.contextmanager
def holding(fence: Fence | None) -> Iterator[None]:
    """Run the body (and whatever it starts in copies of this context) under ``fence``."""
    token = _HELD.set(fence)
    try:
        yield
    finally:
        _HELD.reset(token)


def current() -> Fence | None:
    """The fence held here, if any."""
    return _HELD.get()


def check() -> None:
    """Raise :class:`WriteFenced` when the fence held here was revoked: before a side effect that is
    no request to the apiserver (an action's HTTP call)."""
    held = _HELD.get()
    if held is not None:
        held.check()


@contextlib.contextmanager
def writing(method: str) -> Iterator[None]:
    """Around one request: refused under a revoked fence, counted in flight under a held one."""
    fence = _HELD.get()
    if fence is None or method.upper() in READS:
        yield
        return
    with fence.sending():
        yield
