"""Re-targeting is make-before-break: a StageSet whose stages move to another cluster is applied and
Ready there first; only then is the previous cluster cleaned up.

A move is a pass whose target (:attr:`Target.id <stageset.controller.targets.clusters.Target.id>`,
a stable cluster id, never a credential) differs from the one a stage's inventory or durable record
names: ``spec.kubeConfig`` set, removed or pointed at another Secret, or a Secret whose content now
names another cluster.  The steps:

- :func:`~stageset.apply.inventory.split_by_target` (pure), before anything is applied: the
  inventories on the current target are what the pass prunes against and reports drift against
  (so nothing a move creates is ``DriftCorrected``); the rest is ``status.previousTargets`` (with
  ``since``, when the move began), kept — and in the durable record's ``previous`` — until
  cleaned up.  A previous target that is current again is no longer one: its inventory is the
  stages' own again, and nothing is deleted from it.  :meth:`Moves.start` also lists, on the
  previous cluster, what the record names there when status lost it (a restore, a re-created
  StageSet);
- the pass applies every stage on the new target as usual (actions too: the action ledger is keyed
  by target, so ``pre`` and ``post`` run there once);
- :meth:`Moves.clean` only under the pass's one prune permission ``Scope.MOVED``
  (:func:`~stageset.controller.stageset.pruning.permission`: every stage Ready on the new target):
  per previous target, dependents first, each stage's objects deleted there — ``prune: false``
  stages released (owner labels removed, objects kept) — with the teardown's own machinery
  (:meth:`Teardown.attempt <stageset.controller.stageset.teardown.Teardown.attempt>`).  Then a
  Normal ``Retargeted`` event names the previous and new targets (server URL or "this cluster").
- a previous target that cannot be used (unreachable, its credentials gone) does not hold the new
  one back: it is retried with backoff until ``--max-teardown-wait`` after the cleanup began
  (``cleanupSince``: every stage Ready on the new cluster), then given up with a Warning
  ``RetargetAbandoned`` in ``TeardownForced``'s words; what was left keeps its owner labels.

Identity: the kubeConfig Secret of a previous target is read as the StageSet's identity on this
cluster (only a Secret of its own namespace, :meth:`Targets.previous
<stageset.controller.targets.clusters.Targets.previous>`); lists, deletes and releases there are
made as the identity each inventory (or record) names — the one that applied the objects; events
as the controller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from stageset.api import (
    PreviousTargets,
    StageInventory,
    format_time,
)
from stageset.api.stageset import DeletionPolicy
from stageset.api.vocabulary import EventReason
from stageset.apply.errors import StageError
from stageset.apply.inventory import left_behind, split_by_target
from stageset.apply.prune import Owner, unpruned_stages
from stageset.apply.rebuild import rebuild
from stageset.apply.record import Previous, StageRecord, parse
from stageset.controller.clock import Clock
from stageset.controller.events import EventRecorder, normal, warning
from stageset.controller.identity import IdentityPolicy
from stageset.controller.stageset import pruning
from stageset.controller.stageset.context import PassContext
from stageset.controller.stageset.plan import teardown_expired, teardown_retry
from stageset.controller.stageset.progress import Progress
from stageset.controller.stageset.records import applied_target, on_target
from stageset.controller.stageset.teardown import AGAIN, CLUSTER_ERRORS, Teardown, by_target
from stageset.controller.targets.clusters import (
    LOCAL_TARGET,
    Target,
    Targets,
    inventory_clients,
    named,
    where,
)
from stageset.kube.client import ClientPool, KubeClient, how_failed

log = logging.getLogger(__name__)


@dataclass
class _Counts:
    """What a cleanup did so far (across passes: the move's own counts carried in status)."""

    deleted: int
    released: int
    failure: str | None = None


@dataclass(frozen=True)
class Cleaned:
    """What :meth:`Moves.clean` left: the move still in flight (``None``: done or given up), the
    stages still unlisted, and when to look again (``None``: no sooner than the pass wants)."""

    moving: PreviousTargets | None
    unlisted: Previous
    requeue_after: float | None


class Moves:
    def __init__(self, *, clients: ClientPool, identities: IdentityPolicy, targets: Targets,
                 teardown: Teardown, events: EventRecorder, clock: Clock, max_wait: float):
        self._clients = clients
        self._identities = identities
        self._targets = targets
        self._teardown = teardown
        self._events = events
        self._clock = clock
        self._max_wait = max_wait

    def start(self, ctx: PassContext, progress: Progress) -> Progress:
        """Before anything is applied: what is on the current target, and what is left elsewhere."""
        record = parse(ctx.writer.obj)
        now = format_time(self._clock())
        inventories = progress.previous.inventories
        if record.targetless and progress.moving is None:
            # Written before targets were recorded: applied where the StageSet pointed then, taken
            # to be where it points now (an upgrade is never a move).
            inventories = {n: on_target(inv, ctx.target, stageset=ctx.stageset, recorded=None)
                           for n, inv in inventories.items()}
        current, moving = split_by_target(inventories, progress.moving, target=ctx.target.id, now=now)
        rebased = record.rebased(ctx.target.id, now=now)
        known = {(inv.name, inv.target_id) for inv in (moving.inventory if moving is not None else [])}
        lost = tuple((stage, r) for stage, r in rebased.previous if (stage, r.target) not in known)
        found, unlisted = self._relist(ctx, lost)
        if found:
            moving = PreviousTargets(since=rebased.since or now, inventory=found) if moving is None else \
                moving.model_copy(update={"inventory": [*moving.inventory, *found]})
        if moving is not None or unlisted:
            log.info("StageSet %s/%s moves to %s: %d stage inventory(ies) left on a previous cluster%s",
                     *ctx.ref, ctx.target.named, len(moving.inventory) if moving else 0,
                     f", {len(unlisted)} not listed yet" if unlisted else "")
        return progress.moved(current, moving, unlisted, since=rebased.since)

    def _previous(self, ctx: PassContext, inv: StageInventory) -> Target:
        """The cluster ``inv`` was applied on; raises :class:`StageError` or a cluster error."""
        client = self._stageset_client(ctx)
        return self._targets.previous(client, stageset=ctx.stageset, applied=inv.target)

    def _stageset_client(self, ctx: PassContext) -> KubeClient:
        identity = self._identities.for_stageset(ctx.stageset, what="reading spec.kubeConfig")
        return self._clients.client(identity)

    def _relist(self, ctx: PassContext, lost: Previous) -> tuple[list[StageInventory], Previous]:
        """Status lost what the record names on previous targets: list it there by the owner labels
        (as each stage's recorded identity).  Returns what was found, and what could not be listed."""
        found: list[StageInventory] = []
        unlisted: list[tuple[str, StageRecord]] = []
        namespace, name = ctx.ref
        for stage, record in lost:
            applied = None if record.target == LOCAL_TARGET else applied_target(record)
            try:
                target = self._targets.previous(self._stageset_client(ctx), stageset=ctx.stageset,
                                                applied=applied)
                clients = inventory_clients(clients=self._clients, identities=self._identities,
                                            namespace=namespace, target=target)
                rebuilt = rebuild(stages={stage: record}, owner=Owner(namespace, name),
                                  applier=target.applier, client_for=clients)
            except (StageError, *CLUSTER_ERRORS) as error:
                log.warning("cannot list stage %s's objects on %s yet: %s", stage, where(record.target),
                            error.message if isinstance(error, StageError) else how_failed(error))
                unlisted.append((stage, record))
                continue
            if not rebuilt.complete:
                unlisted.append((stage, record))
                continue
            for inv in rebuilt.inventories.values():
                found.append(on_target(inv, target, stageset=None, recorded=record))
        return found, tuple(unlisted)

    def clean(self, ctx: PassContext, progress: Progress) -> Cleaned:
        """Only under ``Scope.MOVED``: delete (or release) what is left on previous targets, one target
        at a time (:meth:`_clean_target`), then tell how the move stands (:meth:`_told`)."""
        moving = progress.moving
        if moving is None and not progress.unlisted:
            return Cleaned(None, (), None)
        counts = _Counts(deleted=(moving.deleted or 0) if moving is not None else 0,
                         released=(moving.released or 0) if moving is not None else 0)
        names: dict[str, str] = {r.target: where(r.target) for _, r in progress.unlisted}
        remaining: list[StageInventory] = []
        for target_id, invs in by_target(moving.inventory if moving is not None else []).items():
            names[target_id] = named(invs[0].target)
            remaining.extend(self._clean_target(ctx, invs, counts, name=names[target_id]))
        return self._told(ctx, progress, remaining, counts, previous=", ".join(sorted(set(names.values()))))

    def _clean_target(self, ctx: PassContext, invs: list[StageInventory], counts: _Counts, *, name: str
                      ) -> list[StageInventory]:
        """One previous target: reached again (as the StageSet), its stages cleared dependents first —
        released instead of deleted as leaving a cluster says (``prune: false``, ``deletionPolicy:
        Orphan``: :func:`~stageset.controller.stageset.pruning.released_stages`); what is left there."""
        try:
            target = self._previous(ctx, invs[0])
        except StageError as error:
            counts.failure = error.message
            return invs
        except CLUSTER_ERRORS as error:
            counts.failure = f"{name} cannot be used: {how_failed(error)}"
            return invs
        released = pruning.released_stages([inv.name for inv in invs], unpruned=unpruned_stages(ctx.stageset),
                                           policy=ctx.stageset.spec.deletion_policy)
        namespace, stageset = ctx.ref
        cleared = self._teardown.clear(invs, stageset=ctx.stageset, target=target,
                                       owner=Owner(namespace, stageset), released=released)
        counts.deleted += cleared.deleted
        counts.released += cleared.released
        counts.failure = cleared.failure or counts.failure
        return cleared.remaining

    def _told(self, ctx: PassContext, progress: Progress, remaining: list[StageInventory], counts: _Counts, *,
              previous: str) -> Cleaned:
        """Done: ``Retargeted``; the wait over: ``RetargetAbandoned``; else what is left, and when to
        look again."""
        moving, now = progress.moving, self._clock()
        namespace, name = ctx.ref
        # The wait counts from the first cleanup attempt (a new cluster slow to turn Ready does not
        # use it up); what only the record names (status lost) counts from the move's start.
        since = (moving.cleanup_since or format_time(now)) if moving is not None else \
            progress.moving_since or format_time(now)
        if not remaining and not progress.unlisted:
            moved = sum(len(inv.entries) for inv in progress.fresh.values())
            why_released = "deletionPolicy: Orphan" \
                if ctx.stageset.spec.deletion_policy is DeletionPolicy.ORPHAN else "prune: false"
            message = (f"moved from {previous} to {ctx.target.named}: {moved} object(s) applied and "
                       f"ready there; on {previous}: {counts.deleted} deleted, {counts.released} released "
                       f"({why_released})")
            log.info("StageSet %s/%s %s", namespace, name, message)
            self._events.emit(normal(ctx.writer.obj, EventReason.RETARGETED, message, action="Retarget",
                                     redact=ctx.redactor))
            return Cleaned(None, (), None)
        if teardown_expired(now=now, deleted_at=since, max_wait=self._max_wait):
            self._abandoned(ctx, previous, remaining, progress.unlisted, counts.failure)
            return Cleaned(None, (), None)
        if counts.failure:
            log.warning("StageSet %s/%s: cleaning up %s waits: %s", namespace, name, previous, counts.failure)
        left = PreviousTargets(since=moving.since if moving is not None else since, cleanup_since=since,
                               inventory=remaining, deleted=counts.deleted or None,
                               released=counts.released or None)
        again = teardown_retry(now=now, deleted_at=since, max_wait=self._max_wait) \
            if counts.failure or progress.unlisted else AGAIN
        return Cleaned(left if remaining else None, progress.unlisted, again)

    def _abandoned(self, ctx: PassContext, previous: str, left: list[StageInventory], unlisted: Previous,
                   failure: str | None) -> None:
        count = sum(len(inv.entries) for inv in left)
        cause = f" (last failure: {failure})" if failure else ""
        counted = left_behind(left) if left else "none listed"
        unknown = f"; stage(s) {', '.join(sorted({s for s, _ in unlisted}))} could not be listed there" \
            if unlisted else ""
        message = (f"gave up cleaning up {previous} after {self._max_wait:.0f}s: {count} object(s) left "
                   f"behind{cause}: {counted}{unknown}; they keep their stages.metio.wtf owner labels")
        log.warning("StageSet %s/%s: %s", *ctx.ref, message)
        self._events.emit(warning(ctx.writer.obj, EventReason.RETARGET_ABANDONED, message, action="Retarget",
                                  redact=ctx.redactor))
