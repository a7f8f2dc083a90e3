"""A new StageSet's first word, held back while it only waits for another object.

A StageSet is often created together with its GitRepository (or with the StageSet it depends
on): its first pass finds the source not fetched yet, and would write ``Ready=False
SourceNotReady`` (finalizer, status, a Warning event) only for the next pass, a moment later, to
write ``Ready=True`` over it.  Status writes are the costliest requests of a pass
(``docs/scale.md``), and nobody sees a state that lasts less than a second.  So such a pass ends
without writing anything and looks again when the awaited object changes (its watch wakes the
StageSet) or at the deadline, whichever comes first (the deadline's requeue is dropped when
the wait ended sooner: :meth:`Holding.pending`); only a StageSet still waiting
:data:`GRACE` seconds after its first such pass says so — exactly what it would have said.
A StageSet waiting only for GitRepositories that have said nothing yet (not fetched yet) waits
for them (their first word, whatever it is, wakes it), up to
:data:`PATIENCE`: a hundred StageSets created with their GitRepositories queue for the source
workers far longer than a second, and "not there yet" is what the awaited object's own empty
status already shows.

Invariants (what :meth:`~stageset.controller.stageset.writer.PassWriter.held` checks first):

- only a pass that wrote nothing at all — nothing applied, pruned or deleted, no record,
  finalizer, status or event — and ends waiting for another object (:data:`WAITING`) is held;
  a destructive decision (prune, teardown, rollback) is never held: it is carried out and told
  in the same pass, as before;
- only a generation status does not show yet (a new StageSet, a changed spec): a StageSet that
  already says where it stands is never made to repeat passes;
- never a pass someone asked for (``reconcile.fluxcd.io/requestedAt``: they wait for its answer);
- at most :data:`GRACE` (:data:`PATIENCE` while only objects that said nothing yet are awaited)
  seconds after the first held pass of that generation, by the injected monotonic ``ticks``
  (unit tests move it by hand).

Identity: none — no I/O.  Memory: one entry per StageSet held right now; dropped when its pass
concludes (:meth:`Holding.release`) or it is deleted (:meth:`Holding.forget`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from stageset.api.vocabulary import Reason

Ticks = Callable[[], float]  # seconds, monotonic: only ever compared with itself
Ref = tuple[str, str]  # (namespace, name)

# Seconds a person would not notice: a wait shorter than this is never written.
GRACE = 1.0
# Waiting only for GitRepositories that have said nothing yet, their first fetch queued or running
# (:class:`~stageset.controller.render.reads.NothingSaidYet`): their first conclusion, whatever
# it is, wakes the StageSet, so it waits for that — many created at once queue for the source
# workers — at most as long as one fetch may take by default (a GitRepository's ``spec.timeout``).
# (Not a dependency: only its turning Ready wakes its dependents, so they get the short grace.)
PATIENCE = 60.0
# What a pass may be waiting for without having written anything: another object, about to change.
WAITING = frozenset({Reason.SOURCE_NOT_READY, Reason.ARTIFACT_NOT_FOUND, Reason.DEPENDENCY_NOT_READY})
# A requeue sooner than this is not asked for (a deadline just missed is written at once next time).
SOONEST = 0.05


class Holding:
    """Since when each StageSet's first word is held, per generation.  Thread-safe: every
    worker's reconciles share it."""

    def __init__(self, *, ticks: Ticks, grace: float = GRACE, patience: float = PATIENCE):
        self._ticks = ticks
        self._grace = grace
        self._patience = max(grace, patience)
        self._since: dict[Ref, tuple[int, float, float]] = {}
        """Per StageSet held: (generation, first held pass, the deadline its last pass asked for)."""
        self._lock = threading.Lock()

    def hold(self, ref: Ref, *, generation: int, patient: bool = False) -> float | None:
        """Seconds to hold the StageSet's conclusion back (then look again), or ``None``: the
        grace is over, say it now.  ``patient``: it waits only for objects that said nothing yet
        (:data:`PATIENCE` instead of :data:`GRACE`, both counted from the first held pass)."""
        now = self._ticks()
        grace = self._patience if patient else self._grace
        with self._lock:
            first = self._since.get(ref)
            if first is None or first[0] != generation:
                self._since[ref] = (generation, now, now + grace)
                return grace
            left = first[1] + grace - now
            if left > 0:
                self._since[ref] = (generation, first[1], first[1] + grace)
                return max(left, SOONEST)
            del self._since[ref]
            return None

    def wanted(self, ref: Ref) -> Callable[[], bool]:
        """Whether the look-again just asked for (by :meth:`hold`) is still wanted when it is due:
        not once the StageSet concluded or was deleted, nor once a later pass asked for another
        deadline (a first pass before its GitRepository existed asks for :data:`GRACE`; the next,
        finding it not fetched yet, for :data:`PATIENCE` — the first's requeue would land in the
        middle of the pass the fetch woke, and run a needless re-check after it)."""
        with self._lock:
            held = self._since.get(ref)
        deadline = None if held is None else held[2]

        def still() -> bool:
            with self._lock:
                current = self._since.get(ref)
                return current is not None and current[2] == deadline
        return still

    def pending(self, ref: Ref) -> bool:
        """Still held (its look-again is wanted); false once its pass concluded or it was deleted,
        so the requeue of a wait that ended sooner is dropped, not run as an extra pass."""
        with self._lock:
            return ref in self._since

    def release(self, ref: Ref) -> None:
        """The StageSet's pass concluded (it said where it stands): nothing is held any more."""
        with self._lock:
            self._since.pop(ref, None)

    def forget(self, namespace: str, name: str) -> None:
        """The StageSet is gone."""
        self.release((namespace, name))

    def __len__(self) -> int:
        with self._lock:
            return len(self._since)
