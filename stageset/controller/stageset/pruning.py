"""Whether a pass may delete, and what: the one decision.  Pure: no I/O, no clock.

Deleting is the destructive path, so it is decided in one place, explicitly: the pass runner
asks :func:`permission` once per pass (a teardown asks it once too), telling it how the pass went
(a :data:`Course`), and gets a :class:`PrunePermission` — a :class:`Scope`, the
:class:`PruneReason` for it and the :class:`Reach` of every delete or release.  Every field of
every value here is required: no code path enables or disables deletion by leaving something out,
and nothing downstream decides it again (the pass prunes, settles the record and takes the last
good snapshot only under ``Scope.STALE``; a rollback deletes only under ``Scope.RESTORED``; a
teardown deletes only under ``Scope.ALL``, and touches nothing in its own namespace under
``Reach.OUTSIDE_OWN_NAMESPACE``).

The rules (first match wins the reason):

- a pass that applied its stages (:class:`Applied`) deletes what no stage renders any more only
  when no stage is held back entirely by steering (its objects would look stale), every stage is
  Ready, no Ready stage is held by its promotion gate, no rolled-back release is parked, and the
  inventory it prunes against is complete (not rebuilt from a partial view of the cluster);
- a pass that applied every stage on a cluster the StageSet moved to (``moving``: objects of it
  are still recorded on a previous target) may, under the very same conditions, also clean the
  previous targets up (``Scope.MOVED``: what is stale here, and there every object deleted —
  ``prune: false`` stages released — dependents first); never otherwise, and never by default:
  a pass that fails any condition deletes nothing anywhere;
- **what leaving a cluster does** to a stage's objects there (:func:`released_stages`) is one rule
  for a teardown and a move alike: ``deletionPolicy: Orphan`` releases every stage's objects (owner
  labels removed, objects kept), ``Delete`` deletes them but releases a ``prune: false`` stage's.  A
  move is the StageSet leaving that cluster, so it keeps to what the user said leaving means: under
  ``Orphan`` a move deletes nothing on the previous cluster;
- a frozen pass (``windowScope: All`` while the update windows are closed) applies nothing and
  deletes nothing;
- a rollback, run or resumed (:class:`RollingBack`), deletes, per stage it restores, what the
  failed revision added to that stage — nothing of a stage it does not restore;
- a teardown (:class:`TearingDown`) deletes every stage's objects under ``deletionPolicy: Delete``,
  and nothing under ``Orphan`` (every stage's objects are released: labels removed, objects kept);
- a teardown while the StageSet's own namespace is terminating (offboarding: the namespace was
  deleted with the StageSet in it) neither deletes nor releases anything in that namespace — its
  deletion takes those objects, and the tenant's RoleBindings there go with them, so a delete as the
  tenant would race the namespace controller, be denied and only wait — and treats every object
  elsewhere (other namespaces, cluster-scoped, on a remote cluster) by the policy as before.

What a permitted deletion may touch object by object — the owner check, ``prune: false`` stages
(never deleted: released on teardown), API paths — is :mod:`stageset.apply.prune`'s; identity
is the caller's (each inventory's recorded identity, :mod:`stageset.controller.identity`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never

from stageset.api.stageset import DeletionPolicy
from stageset.api.vocabulary import StagePhase
from stageset.controller.stageset import gates
from stageset.controller.stageset.plan import StageOutcome


class Scope(StrEnum):
    """What a pass may delete."""

    NOTHING = "Nothing"
    STALE = "Stale"
    """Every inventoried object no stage renders any more (a complete pass)."""
    RESTORED = "Restored"
    """Per stage a rollback restores: what the failed revision added to it."""
    ALL = "All"
    """Every stage's objects (the StageSet is deleted)."""
    MOVED = "Moved"
    """What ``STALE`` deletes on the current target, and every object on the targets the stages
    moved away from (``prune: false`` stages released there)."""


def prunes_stale(scope: Scope) -> bool:
    """Does the pass delete what no stage renders any more on its current target (and settle the
    record, and take the last good snapshot)?"""
    return scope in (Scope.STALE, Scope.MOVED)


class PruneReason(StrEnum):
    """Why a pass may (or may not) delete."""

    ALL_READY = "AllReady"
    MOVED = "Moved"
    """Every stage is Ready on the cluster the StageSet moved to: the previous one may be cleaned up."""
    HELD_BACK = "HeldBack"
    """Steering holds a stage back entirely (update windows, a parked stage with no last good revision)."""
    NOT_READY = "NotReady"
    """A stage failed, waits, or was not started."""
    PROMOTION_HELD = "PromotionHeld"
    """A Ready stage soaks or awaits a manual promotion."""
    ROLLBACK_PARKED = "RollbackParked"
    INVENTORY_INCOMPLETE = "InventoryIncomplete"
    """The inventory was rebuilt from a partial view of the cluster."""
    FROZEN = "Frozen"
    ROLLING_BACK = "RollingBack"
    DELETED = "Deleted"
    ORPHANED = "Orphaned"
    """The StageSet is deleted with ``deletionPolicy: Orphan``: its objects are released, never deleted."""
    NAMESPACE_TERMINATING = "NamespaceTerminating"
    """The StageSet is deleted with its namespace: what is in the namespace goes with it."""


class Reach(StrEnum):
    """Where a pass may delete or release objects at all."""

    EVERYWHERE = "Everywhere"
    OUTSIDE_OWN_NAMESPACE = "OutsideOwnNamespace"
    """Nothing in the StageSet's own namespace on its own cluster: the namespace is terminating
    and its deletion takes every object in it."""


@dataclass(frozen=True)
class PrunePermission:
    """What a pass may delete, and why."""

    scope: Scope
    reason: PruneReason
    reach: Reach


@dataclass(frozen=True)
class Applied:
    """The pass applied its stages as the graph allowed."""

    outcomes: Sequence[StageOutcome]
    """Every stage's outcome, in spec order."""
    held_back: Collection[str]
    """Stages steering did not apply at all in this pass (``Steering.skip``)."""
    parked: bool
    """A rolled-back release is parked (``Steering.parked``)."""
    partial: str | None
    """Why the inventory before the pass is incomplete (rebuilt from a partial view); ``None``: complete."""
    moving: bool
    """Objects of the StageSet are still recorded on a cluster it moved away from."""


@dataclass(frozen=True)
class Frozen:
    """``windowScope: All`` while the update windows are closed: nothing was applied."""


@dataclass(frozen=True)
class RollingBack:
    """The pass rolls a failed release back, or finishes a rollback left mid-way."""


@dataclass(frozen=True)
class TearingDown:
    """The StageSet is deleted."""

    policy: DeletionPolicy
    """``spec.deletionPolicy`` (a StageSet whose spec cannot be read: ``Delete``, as before)."""
    namespace_terminating: bool
    """The StageSet's own namespace is being deleted (its ``deletionTimestamp`` is set): offboarding."""


Course = Applied | Frozen | RollingBack | TearingDown
"""How a pass went, as far as deleting is concerned."""


def permission(course: Course) -> PrunePermission:
    """The one decision of whether and what a pass may delete."""
    match course:
        case Applied():
            return _after_apply(course)
        case Frozen():
            return PrunePermission(Scope.NOTHING, PruneReason.FROZEN, Reach.EVERYWHERE)
        case RollingBack():
            return PrunePermission(Scope.RESTORED, PruneReason.ROLLING_BACK, Reach.EVERYWHERE)
        case TearingDown():
            return _teardown(course)
        case _:
            assert_never(course)


def _teardown(course: TearingDown) -> PrunePermission:
    reach = Reach.OUTSIDE_OWN_NAMESPACE if course.namespace_terminating else Reach.EVERYWHERE
    if course.policy is DeletionPolicy.ORPHAN:
        return PrunePermission(Scope.NOTHING, PruneReason.ORPHANED, reach)
    if course.namespace_terminating:
        return PrunePermission(Scope.ALL, PruneReason.NAMESPACE_TERMINATING, reach)
    return PrunePermission(Scope.ALL, PruneReason.DELETED, reach)


def _after_apply(course: Applied) -> PrunePermission:
    if course.held_back:
        return PrunePermission(Scope.NOTHING, PruneReason.HELD_BACK, Reach.EVERYWHERE)
    if any(o.phase is not StagePhase.READY for o in course.outcomes):
        return PrunePermission(Scope.NOTHING, PruneReason.NOT_READY, Reach.EVERYWHERE)
    if any(o.promotion is not None and gates.held(o.promotion) for o in course.outcomes):
        return PrunePermission(Scope.NOTHING, PruneReason.PROMOTION_HELD, Reach.EVERYWHERE)
    if course.parked:
        return PrunePermission(Scope.NOTHING, PruneReason.ROLLBACK_PARKED, Reach.EVERYWHERE)
    if course.partial is not None:
        return PrunePermission(Scope.NOTHING, PruneReason.INVENTORY_INCOMPLETE, Reach.EVERYWHERE)
    if course.moving:
        return PrunePermission(Scope.MOVED, PruneReason.MOVED, Reach.EVERYWHERE)
    return PrunePermission(Scope.STALE, PruneReason.ALL_READY, Reach.EVERYWHERE)


def released_stages(stages: Collection[str], *, unpruned: Collection[str], policy: DeletionPolicy
                    ) -> frozenset[str]:
    """Of ``stages`` (on a cluster the StageSet leaves: deleted, or moved away from), the ones whose
    objects are released instead of deleted: every one under ``deletionPolicy: Orphan``, else the
    ``prune: false`` ones (``unpruned``)."""
    if policy is DeletionPolicy.ORPHAN:
        return frozenset(stages)
    return frozenset(stages) & frozenset(unpruned)
