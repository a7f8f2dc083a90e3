"""Where each stage renders in this pass, and what the pass concludes: the release's steering rules.
Pure: no I/O; time comes in as ``now``.

:func:`steer` decides, from the spec, the status the last pass left and each stage's current
revision (what its source offers now):

- a rollback interrupted mid-way (``status.rollback.phase: RollingBack``) is **resumed** first,
  and nothing else is done in that pass;
- a **parked** rollback (``RolledBack``, the failed revisions still current, the spec unchanged)
  pins the release's stages to their last good revisions (:func:`rollback.parked`);
- **update windows**: while they are closed, a stage whose source offers a revision it has not
  applied yet is **held**: pinned to the revision it applied (drift keeps being corrected there),
  or, never applied, not applied at all.  ``windowScope: All`` **freezes** the StageSet: nothing is
  applied.  ``stages.metio.wtf/update-now`` (a new value) lets the held revisions through, and
  they stay let through (``status.overrideRevisions``) until each stage has applied its own, so a
  rollout that takes several passes finishes.  Deleting a StageSet is never held (teardown does
  not come here).
- **a FleetRollout** (:mod:`.fleethold`): a member holds every new revision its wave was not
  released, the same way (pinned, or not applied); both holds apply, and ``update-now`` lifts
  only the windows'.  ``pendingUpdate`` names the rollout and the wave.

:func:`verdict` turns the pass's outcomes into the Ready condition when steering says more than
the plain verdict (:func:`plan.verdict`): promotion gates holding (``Soaking``,
``AwaitingPromotion``), revisions deferred (``UpdateDeferred``: Ready stays True when what is
applied is Ready), a parked rollback (``RolledBack``, Stalled).  Whether the pass prunes is not a
verdict's: :func:`~stageset.controller.stageset.pruning.permission` decides it (never while a
stage is held back entirely — its objects would look stale — nor while a rollback is parked).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from stageset.api import StageSet, StageSetStatus, format_time
from stageset.api.fleet import NO_FLEET, FleetView, read_release
from stageset.api.release import ANNOTATION_UPDATE_NOW, PendingUpdate, Rollback, RollbackPhase, WindowScope
from stageset.api.vocabulary import Reason, StagePhase
from stageset.controller.stageset import fleethold, gates, rollback, windows
from stageset.controller.stageset.plan import StageOutcome, Verdict
from stageset.controller.stageset.pruning import PrunePermission, prunes_stale

RECHECK_MAX = 3600.0
"""A closed window is looked at again at least this often (seconds), even when it opens later."""


@dataclass(frozen=True)
class Steering:
    """What steering decided for one pass."""

    pins: Mapping[str, str] = field(default_factory=dict)
    """Stages rendered at a recorded revision instead of their source's current one."""
    skip: Mapping[str, str] = field(default_factory=dict)
    """Stages not applied at all in this pass, and why (their dependents wait)."""
    frozen: bool = False
    """``windowScope: All`` and the windows are closed: nothing is applied."""
    pending: PendingUpdate | None = None
    """What the windows hold back (``status.pendingUpdate``)."""
    reopen_in: float | None = None
    """Seconds until the windows should be looked at again (when they hold something)."""
    override: str | None = None
    """A new ``update-now`` value this pass acts on (an event says so)."""
    override_revisions: Mapping[str, str] = field(default_factory=dict)
    """What ``update-now`` let through and is not applied yet."""
    rollback: Rollback | None = None
    """The rollback record to keep (``None``: none, or lifted)."""
    resume: Sequence[str] = ()
    """A rollback to finish first: the stages still to restore, in order."""
    lifted: bool = False
    """A parked rollback ended in this pass (a source or the spec moved on)."""
    window_held: tuple[str, ...] = ()
    """Stages the update windows hold back."""
    fleet: fleethold.FleetHold | None = None
    """What the member's FleetRollout holds back."""

    @property
    def parked(self) -> bool:
        return self.rollback is not None and self.rollback.phase is RollbackPhase.ROLLED_BACK

    def newly_deferred(self, before: PendingUpdate | None) -> bool:
        """Does this pass hold back revisions the last pass did not (an event and a metric)?"""
        if self.pending is None or not self.pending.revisions:
            return False
        return before is None or dict(before.revisions) != dict(self.pending.revisions)


def steer(stageset: StageSet, status: StageSetStatus, *, current: Mapping[str, str],
          sources: Mapping[str, str], now: datetime.datetime, generation: int,
          fleet: FleetView = NO_FLEET) -> Steering:
    """``current``: each rendered stage's revision as its source offers it now; ``sources``: each
    stage's source (``namespace/name``, for ``pendingUpdate.revisions``); ``fleet``: what the
    controller's watch of FleetRollouts says of the StageSet (:func:`.fleethold.of_view`)."""
    record = status.rollback
    if record is not None and record.phase is RollbackPhase.ROLLING_BACK:
        return Steering(rollback=record, resume=tuple(record.remaining))
    good = rollback.good_of(status.last_applied_snapshot)
    lifted = rollback.lifted(record, current=current, generation=generation)
    kept = None if lifted else record
    pins, parked = rollback.parked(kept, current=current, good=good, generation=generation)
    skip = {s: f"stage {s!r}: not applied while the rolled-back release waits for a new revision "
               "(it has no last good revision to return to)" for s in parked}
    applied = {s.name: s.revision for s in status.stages}
    spec = stageset.spec
    token = (stageset.metadata.get("annotations") or {}).get(ANNOTATION_UPDATE_NOW) or None
    override = token if token and token != status.last_handled_update_override else None
    overridden = {s: r for s, r in status.override_revisions.items()
                  if current.get(s) == r and applied.get(s) != r}
    new = {s: r for s, r in current.items() if s not in pins and s not in skip and applied.get(s) != r}
    if override:
        overridden.update(new)
    decision = windows.decide(spec.update_windows, now)
    base = Steering(pins=pins, skip=skip, override=override, override_revisions=overridden, rollback=kept,
                    lifted=lifted)
    annotations = stageset.metadata.get("annotations") or {}
    fleet_hold = fleethold.of_view(fleet, annotation=read_release(annotations), new=new, sources=sources)
    if decision.allowed and fleet_hold is None:
        return base
    window = {} if decision.allowed else {s: r for s, r in new.items() if overridden.get(s) != r}
    held = {**window, **(fleet_hold.held if fleet_hold else {})}
    opens = None if decision.allowed else decision.next_open
    reopen = None if decision.allowed else \
        min(RECHECK_MAX, max(1.0, ((decision.recheck or now) - now).total_seconds() + 0.5)) \
        if decision.recheck else RECHECK_MAX
    until = f"until {format_time(opens)}" if opens else "(the windows never open again, as declared)"
    pending = PendingUpdate(revisions={sources.get(s, s): r for s, r in held.items()}, stages=sorted(held),
                            next_window_opens=format_time(opens) if opens else None,
                            fleet_rollout=fleet_hold.rollout if fleet_hold else None,
                            wave=(fleet_hold.wave or None) if fleet_hold else None)
    base = replace(base, window_held=tuple(sorted(window)), fleet=fleet_hold)
    if not decision.allowed and spec.window_scope is WindowScope.ALL and not overridden:
        return replace(base, frozen=True, pending=pending, reopen_in=reopen)
    if not held:
        return base
    pins = dict(pins)
    skip = dict(skip)
    for stage, revision in held.items():
        if applied.get(stage):
            pins[stage] = str(applied[stage])
        elif fleet_hold is not None and stage in fleet_hold.held:
            skip[stage] = f"stage {stage!r}: revision {revision} is {fleet_hold.why}"
        else:
            skip[stage] = f"stage {stage!r}: revision {revision} is held by the update windows {until}"
    return replace(base, pins=pins, skip=skip, pending=pending, reopen_in=reopen)


def deferral(steering: Steering) -> str:
    """The words for what the windows (and a FleetRollout) hold back."""
    pending = steering.pending
    if pending is None:
        return ""
    until = f"until {pending.next_window_opens}" if pending.next_window_opens \
        else "(the windows never open again, as declared)"
    if not pending.stages:
        return f"nothing is applied while the update windows are closed (windowScope: All) {until}"
    said = []
    fleet = steering.fleet
    windowed = [s for s in pending.stages if s in steering.window_held or fleet is None]
    if windowed:
        said.append(f"new revision(s) of stage(s) {', '.join(windowed)} held by the update windows {until}")
    if fleet is not None:
        said.append(f"new revision(s) of stage(s) {', '.join(sorted(fleet.held))} {fleet.why}")
    return "; ".join(said)


def verdict(base: Verdict, outcomes: Sequence[StageOutcome], *, steering: Steering, now: datetime.datetime,
            interval: float) -> Verdict:
    """The pass's Ready condition with steering taken into account (``base``: :func:`plan.verdict`)."""
    skipped = set(steering.skip)
    failures = [o for o in outcomes if o.reason and o.name not in skipped
                and o.phase not in (StagePhase.READY, StagePhase.WAITING)]
    if failures or any(o.phase is StagePhase.WAITING for o in outcomes):
        return base
    held = [(o.name, o.promotion) for o in outcomes
            if o.phase is StagePhase.READY and o.promotion is not None and gates.held(o.promotion)]
    if held:
        said = gates.held_verdict(held, now=now, interval=interval)
        return Verdict(False, said.reason, said.message, requeue_after=said.requeue_after)
    if steering.parked and steering.rollback is not None:
        return Verdict(False, Reason.ROLLED_BACK, steering.rollback.message, requeue_after=interval)
    if steering.pending is None:
        return base
    again = min(interval, steering.reopen_in or interval)
    if skipped:
        return Verdict(False, Reason.UPDATE_DEFERRED, deferral(steering), requeue_after=again)
    if not base.ready:
        return base
    return replace(base, reason=Reason.UPDATE_DEFERRED, message=f"{base.message}; {deferral(steering)}",
                   requeue_after=min(base.requeue_after or again, again))


def frozen_verdict(steering: Steering, *, was_ready: bool, interval: float) -> Verdict:
    """``windowScope: All`` while closed: nothing applied; Ready stays what it was."""
    return Verdict(was_ready, Reason.UPDATE_DEFERRED, deferral(steering),
                   requeue_after=min(interval, steering.reopen_in or interval))


def succeeded(prune: PrunePermission, steering: Steering) -> bool:
    """A fully successful pass (every stage Ready and promoted, nothing held back or parked: the
    pass may prune what is stale): its revisions are the new last good snapshot."""
    return prunes_stale(prune.scope) and not steering.parked and not steering.skip
