"""The readiness wait: until every object of a stage is Current, one is Failed, or time is up.

Identity: every read goes through the ``client`` handed in (the stage's identity), and so does
every watch it opens (:mod:`stageset.apply.watching`); discovery of a reference's kind is the
core's (the controller's identity).

Invariants:
- The first round reads nothing it already holds: an object we wrote is judged from the apply
  response, one we did not from the preview; only what that says to wait for is read (or watched).
- While every awaited object is watched, the wait reads nothing until a watch event wakes it (or
  :data:`WATCHED_RECHECK` passes); what a watch cannot hold is read every ``poll_interval``.
- ``health`` (the stage's CEL rules) judges the kinds it has expressions for; kstatus the rest.
- An object that cannot be read, other than not found, fails the stage (:class:`StageError`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from stageset.apply.core import AppliedObject, ApplyCore, read_error
from stageset.apply.inventory import describe
from stageset.apply.readiness import Readiness, Status, readiness
from stageset.apply.watching import Watching, WatchSource
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

WATCHED_RECHECK = 10.0
"""When every object awaited is watched, judge again at least this often anyway (seconds)."""


class HealthJudge(Protocol):
    """Readiness by the stage's own rules (:class:`stageset.apply.health.HealthChecks`)."""

    def __bool__(self) -> bool: ...

    def judge(self, live: KubeObject, *, what: str) -> Readiness | None: ...


def wait_ready(core: ApplyCore, *, client: KubeClient, applied: list[AppliedObject], timeout: float,
               stop: threading.Event, progress: Callable[[Readiness], None] | None = None,
               health: HealthJudge | None = None, references: Sequence[KubeObject] = (),
               default_namespace: str = "", watches: WatchSource | None = None,
               wake: tuple[Hashable, Callable[[], None]] | None = None) -> Readiness:
    """Wait until every object is Current, one Failed, or ``timeout`` passes.

    With ``watches``, objects still awaited after the first round are watched as ``client``'s
    identity (:mod:`stageset.kube.watches`: label-selected by the stage's owner labels, or by
    name for an object the stage did not write) and judged from what the watch holds, woken by
    its events — no reads while nothing changes; an object the pool has no room for is read
    every ``poll_interval`` as before.  ``wake`` (a key and a callback) keeps listening after an
    unfinished wait returns, so the waiter's owner is woken by the next change.

    ``references`` (``readyChecks.checks``, as ``{apiVersion, kind, metadata}`` stubs) are
    waited for too, as the reference waits for them: a namespaced one without a namespace is
    in ``default_namespace``, a cluster-scoped one has none, and one whose kind the cluster
    does not serve (yet: its CRD may come from another release) is waited for, its kind
    looked up again each round.  ``health`` judges the kinds it has expressions for
    (``readyChecks.exprs``); kstatus the rest.  ``progress`` hears what is still awaited
    after each round that leaves something to wait for (the first object not ready, and how
    many more).  An object that cannot be read (other than not found) is a
    :class:`StageError`."""
    deadline = time.monotonic() + timeout
    # First round: judge each object from what we already hold — the apply response for an
    # object we wrote, the preview for one we did not — and read it only if that says wait.
    known: dict[int, KubeObject | None] = {
        id(item): (item.live if item.wrote else item.dry_run) for item in applied}
    changed = threading.Event()
    watching = Watching(watches, client, changed=changed, wake=wake)
    try:
        return _rounds(core, client=client, pending=list(applied), unserved=list(references), known=known,
                       deadline=deadline, stop=stop, progress=progress, health=health,
                       default_namespace=default_namespace, watching=watching)
    finally:
        watching.close()


def _rounds(core: ApplyCore, *, client: KubeClient, pending: list[AppliedObject], unserved: list[KubeObject],
            known: dict[int, KubeObject | None], deadline: float, stop: threading.Event,
            progress: Callable[[Readiness], None] | None, health: HealthJudge | None,
            default_namespace: str, watching: Watching) -> Readiness:
    first = True
    while True:
        still: list[AppliedObject] = []
        waiting: list[str] = []
        bound = [(stub, core.reference(stub, default_namespace)) for stub in unserved]
        pending.extend(item for _, item in bound if item is not None)
        unserved = [stub for stub, item in bound if item is None]
        for item in pending:
            live = known.pop(id(item), None)
            if live is None:
                # A watch opened by an earlier round (or pass) serves it; the first round of a
                # wait opens none (what it holds is often ready at once).
                live = watching.read(item, open_watch=not first)
            if live is None:
                try:
                    live = client.get(item.path)
                except ApiError as error:
                    if not error.not_found:
                        raise read_error(item, error, client.identity.describe()) from error
                    still.append(item)
                    waiting.append(f"{describe(item.manifest)} not found")
                    continue
            verdict = (health.judge(live, what=describe(item.manifest)) if health else None) \
                or readiness(live)
            if verdict.status is Status.FAILED:
                watching.done()
                return Readiness(Status.FAILED, f"{describe(item.manifest)}: {verdict.message}")
            if verdict.status is Status.IN_PROGRESS:
                still.append(item)
                waiting.append(f"{describe(item.manifest)}: {verdict.message}")
        waiting.extend(f"{describe(stub)}: the cluster does not serve {stub['apiVersion']} "
                       f"{stub['kind']} (yet)" for stub in unserved)
        if not still and not unserved:
            watching.done()
            return Readiness(Status.CURRENT)
        more = f" (and {len(waiting) - 1} more not ready)" if len(waiting) > 1 else ""
        # Every object still awaited is watched (its changes wake us) once the watches are in.
        watched = not unserved and watching.cover(still)
        last = Readiness(Status.IN_PROGRESS, waiting[0] + more, watched=watched)
        if time.monotonic() >= deadline or stop.is_set():
            return last
        if progress is not None:
            progress(last)
        pending = still
        first = False
        watching.wait(stop=stop, until=min(deadline, time.monotonic() + (
            WATCHED_RECHECK if watched else core.settings.poll_interval)))
