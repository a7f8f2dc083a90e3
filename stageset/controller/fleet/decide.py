"""What a FleetRollout decides: which waves are open, which revisions each member is released,
whether the round halted or completed.  Pure: no I/O; time comes in as ``now``.

The rules:

- **a round** is the set of new revisions being rolled out (``status.round.revisions``).  The
  members tell what is new by holding it (``status.pendingUpdate.revisions``, by source).  A held
  revision not in the round (and never withdrawn) starts a **new round**: the first wave opens
  at once, every later wave waits again, a halt is lifted.  A revision that joins under a name
  the round already has (another member's source fetched the same commit) starts nothing;
- **a member of an open wave** is released the revisions it holds (those of the round, never a
  withdrawn one); a member whose wave is not open keeps the release it had (what it runs), so it
  never applies an intermediate revision it was never released;
- **a wave is Ready** when every member is Ready at its generation with nothing held, the
  revisions released to it applied, and at least one of the round's revisions among what it
  applied (a member whose source has not fetched the round's commit yet holds its wave back);
  the next wave opens once its ``soak`` has passed since then (a wave opened in this round
  stays open);
- **a member of an open wave that fails** (Ready False: ``StageFailed``, ``ActionFailed``,
  ``StageProgressing`` — past its timeout — or ``RolledBack``), holding nothing new, halts the
  round: no further wave opens, and the revisions released to it are **withdrawn** (never
  released again; after a fix, later waves go straight to the fixed revision);
- **fail closed**: an unassigned member (in no wave, or in several) and a contested one (selected
  by another rollout too) are released nothing: they apply no new revision until it is resolved;
- the condition: ``Halted`` > ``MembersContested`` > ``MembersUnassigned`` > ``Completed``
  (Ready True: every wave Ready at the newest revisions) > ``Progressing`` (Ready Unknown).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stageset.api import duration_seconds, format_time, parse_time
from stageset.api.fleet import (
    MAX_MEMBERS_SHOWN,
    FleetRelease,
    FleetRolloutStatus,
    FleetRound,
    FleetWave,
    Halt,
    MemberStatus,
    WavePhase,
    WaveStatus,
)
from stageset.api.vocabulary import Reason

HALTING = frozenset({Reason.STAGE_FAILED, Reason.ACTION_FAILED, Reason.STAGE_PROGRESSING, Reason.ROLLED_BACK})
"""A member's Ready reasons that halt its rollout (``StageProgressing``: past its timeout)."""
MAX_WITHDRAWN = 64

Key = tuple[str, str]


@dataclass(frozen=True)
class Member:
    """A selected StageSet as the rollout reads it (from the watch cache; nothing a request returned)."""

    namespace: str
    name: str
    waves: Sequence[str]
    """The waves whose selector matches it (exactly one: assigned)."""
    pending: Mapping[str, str] = field(default_factory=dict)
    """What it holds back now, by source (``status.pendingUpdate.revisions``)."""
    applied: frozenset[str] = frozenset()
    """The revisions its stages applied (``status.stages[].revision``)."""
    ready: bool = False
    """Ready True at its generation."""
    reason: str = ""
    """Its Ready reason."""
    released: Mapping[str, str] = field(default_factory=dict)
    """What its current release annotation (from this rollout) released to it."""
    contested_by: Sequence[str] = ()
    """The other rollouts that select it too."""

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Decision:
    status: FleetRolloutStatus
    """Every field but the conditions and ``observedGeneration``."""
    releases: Mapping[Key, FleetRelease]
    """The release annotation each member should carry."""
    ready: bool | None
    reason: Reason
    message: str
    requeue_after: float | None = None
    """When a soak ends (seconds)."""
    opened: Sequence[str] = ()
    """Waves this decision opened (an event each)."""
    halted: Halt | None = None
    """The halt this decision found (``None``: none new)."""
    completed: bool = False
    """This decision completed the round (an event)."""
    started: bool = False
    """This decision started a new round."""


def _done(member: Member, released: Mapping[str, str], revisions: set[str]) -> bool:
    # In a round, a member that applied none of its revisions has not seen it yet (its source has
    # not fetched it): it is not Ready at the new revisions, whatever its condition says.
    at_round = not revisions or bool(member.applied & revisions)
    return member.ready and not member.pending and set(released.values()) <= member.applied and at_round


def _failing(member: Member) -> bool:
    # A member holding something new failed at what it ran before (a withdrawn revision, say):
    # that is no failure of what this round released to it.
    return not member.ready and member.reason in HALTING and not member.pending


def decide(*, rollout: str, waves: Sequence[FleetWave], members: Sequence[Member],
           previous: FleetRolloutStatus | None, now: datetime.datetime) -> Decision:
    """The rollout's decision at ``now`` (``previous``: the status the last decision left)."""
    previous = previous or FleetRolloutStatus()
    withdrawn = list(previous.withdrawn)
    names = [w.name for w in waves]
    contested = [m for m in members if m.contested_by]
    unassigned = [m for m in members if not m.contested_by and len(m.waves) != 1]
    assigned = [m for m in members if not m.contested_by and len(m.waves) == 1 and m.waves[0] in names]
    unassigned += [m for m in members if not m.contested_by and len(m.waves) == 1 and m.waves[0] not in names]
    offered = {r for m in assigned for r in m.pending.values()} - set(withdrawn)
    known = set(previous.round.revisions) if previous.round else set()
    started = bool(offered - known)
    current: FleetRound | None
    if started:
        current = FleetRound(revisions=sorted(offered), started_at=format_time(now))
        before: dict[str, WaveStatus] = {}
        halt = None
    else:
        current = previous.round
        before = {w.name: w for w in previous.waves}
        halt = previous.halted
    revisions = set(current.revisions) if current else set()
    by_wave = {name: sorted((m for m in assigned if m.waves[0] == name), key=lambda m: m.key)
               for name in names}

    releases: dict[Key, FleetRelease] = {}
    shown: list[MemberStatus] = []
    statuses: list[WaveStatus] = []
    opened: list[str] = []
    requeue: float | None = None
    new_halt: Halt | None = None
    may_open = True  # the previous wave is Done and nothing halted
    for wave in waves:
        was = before.get(wave.name)
        opened_at = was.opened_at if was else None
        if current is None:
            is_open = True  # no round yet: nothing to hold back
        elif opened_at is None and may_open:
            opened_at = format_time(now)
            is_open = True
            opened.append(wave.name)
        else:
            is_open = opened_at is not None
        count = 0
        for member in by_wave[wave.name]:
            kept = dict(member.released)
            if is_open and member.pending:
                fresh = {s: r for s, r in member.pending.items() if r in revisions and r not in withdrawn}
                released = fresh or kept
            else:
                released = kept
            done = _done(member, released, revisions)
            count += done
            if is_open and current is not None and halt is None and _failing(member):
                halt = new_halt = Halt(member=member.ref, wave=wave.name, reason=member.reason,
                                       at=format_time(now))
                withdrawn = (withdrawn + sorted(set(released.values()) & revisions - set(withdrawn)))[
                    -MAX_WITHDRAWN:]
            releases[member.key] = FleetRelease(rollout=rollout, wave=wave.name, revisions=released)
            shown.append(MemberStatus(namespace=member.namespace, name=member.name, wave=wave.name,
                                      released=released, pending=dict(member.pending), ready=done))
        all_done = count == len(by_wave[wave.name])
        ready_at = was.ready_at if was else None
        if current is None:
            ready_at = None
        elif all_done and is_open and ready_at is None:
            ready_at = format_time(now)  # the soak starts now
        elif not all_done and not (was and was.phase is WavePhase.DONE):
            ready_at = None  # Ready again later: the soak starts over
        phase = _phase(is_open=is_open, all_done=all_done, ready_at=ready_at, soak=wave.soak, now=now,
                       halted=halt is not None and halt.wave == wave.name, round_=current is not None)
        if phase is WavePhase.SOAKING and ready_at is not None and wave.soak:
            ends = (parse_time(ready_at) or now) + datetime.timedelta(seconds=duration_seconds(wave.soak))
            left = ends - now
            wait = max(1.0, left.total_seconds() + 0.5)
            requeue = wait if requeue is None else min(requeue, wait)
        statuses.append(WaveStatus(name=wave.name, phase=phase, members=len(by_wave[wave.name]), ready=count,
                                   opened_at=opened_at, ready_at=ready_at))
        may_open = phase is WavePhase.DONE and halt is None

    for member in contested:
        everyone = ", ".join(sorted({rollout, *member.contested_by}))
        releases[member.key] = FleetRelease(
            rollout=everyone, hold=f"selected by the FleetRollouts {everyone}: no new revision is applied "
                                   "until all but one let go")
        shown.append(MemberStatus(namespace=member.namespace, name=member.name, pending=dict(member.pending),
                                  hold=releases[member.key].hold))
    for member in unassigned:
        where = "no wave" if not member.waves else f"the waves {', '.join(member.waves)}"
        releases[member.key] = FleetRelease(
            rollout=rollout, hold=f"in {where} of FleetRollout {rollout}: no new revision is applied "
                                  "until it matches exactly one wave")
        shown.append(MemberStatus(namespace=member.namespace, name=member.name, pending=dict(member.pending),
                                  hold=releases[member.key].hold))

    status = FleetRolloutStatus(round=current, waves=statuses, members=shown[:MAX_MEMBERS_SHOWN], halted=halt,
                                withdrawn=withdrawn)
    ready, reason, message = _condition(rollout, statuses, halt=halt, contested=contested,
                                        unassigned=unassigned)
    was_complete = not started and bool(previous.waves) and \
        all(w.phase is WavePhase.DONE for w in previous.waves)
    completed = reason is Reason.COMPLETED and current is not None and not was_complete
    return Decision(status=status, releases=releases, ready=ready, reason=reason, message=message,
                    requeue_after=requeue, opened=opened, halted=new_halt, completed=completed,
                    started=started)


def _phase(*, is_open: bool, all_done: bool, ready_at: str | None, soak: str | None, now: datetime.datetime,
           halted: bool, round_: bool) -> WavePhase:
    if not round_:
        return WavePhase.DONE if all_done else WavePhase.OPEN
    if halted:
        return WavePhase.HALTED
    if not is_open:
        return WavePhase.WAITING
    if not all_done or ready_at is None:
        return WavePhase.OPEN
    since = parse_time(ready_at) or now
    if soak and now < since + datetime.timedelta(seconds=duration_seconds(soak)):
        return WavePhase.SOAKING
    return WavePhase.DONE


def _condition(rollout: str, waves: Sequence[WaveStatus], *, halt: Halt | None, contested: Sequence[Member],
               unassigned: Sequence[Member]) -> tuple[bool | None, Reason, str]:
    if halt is not None:
        return (False, Reason.HALTED,
                f"member {halt.member} of wave {halt.wave} failed ({halt.reason}); no further wave opens "
                "until a new revision arrives")
    if contested:
        named = "; ".join(f"{m.ref} (also selected by {', '.join(sorted(m.contested_by))})"
                          for m in contested)
        return (False, Reason.MEMBERS_CONTESTED,
                f"StageSets selected by another FleetRollout apply no new revision: {named}")
    if unassigned:
        named = ", ".join(m.ref for m in unassigned)
        return (False, Reason.MEMBERS_UNASSIGNED,
                f"StageSets of FleetRollout {rollout} in no wave (or in several) apply no new revision: "
                f"{named}")
    if all(w.phase is WavePhase.DONE for w in waves):
        return True, Reason.COMPLETED, "every wave is Ready at the newest revisions"
    moving = next((w for w in waves if w.phase is not WavePhase.DONE), None)
    assert moving is not None
    what = {WavePhase.OPEN: f"wave {moving.name} is rolling out ({moving.ready}/{moving.members} Ready)",
            WavePhase.SOAKING: f"wave {moving.name} is soaking",
            WavePhase.WAITING: f"wave {moving.name} waits"}.get(moving.phase, f"wave {moving.name}")
    return None, Reason.PROGRESSING, what
