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
  released again; after a fix, later waves go straight to the fixed revision).  A member still
  released a withdrawn revision (it failed at it, and that halt was counted) does not halt the next
  round: its source may fetch the fix after another member's started that round, and it then fails
  at what it ran before, not at anything the round released to it;
- **membership is the platform's for a round**: each member's wave is taken when the round begins
  and recorded (``status.releases``); a member that changes its labels mid-round keeps that wave
  until the next round.  A member that joins mid-round (not recorded when it began) is released as
  its wave is, but is **joined**: it neither holds its wave back nor halts the round;
- **what each member may apply** is recorded in ``status.releases`` (every member, up to
  :data:`~stageset.api.fleet.MAX_RELEASES`; more are held as unassigned): the member's pass takes
  its release from there, and the next decision takes "what it was released" from there too —
  never from anything on the member;
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
    MAX_RELEASES,
    FleetRelease,
    FleetRolloutStatus,
    FleetRound,
    FleetWave,
    Halt,
    MemberRelease,
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
    """What this rollout's status recorded as released to it (``status.releases``)."""
    contested_by: Sequence[str] = ()
    """The other rollouts that select it too."""
    selected: bool = True
    """Its labels (and its namespace's) select it now; ``False``: a member only because the round it
    was recorded in goes on (it changed its labels mid-round): freed when that round ends."""

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
    """The release annotation each member should carry (what ``status.releases`` records, as the
    annotation says it)."""
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


def _failing(member: Member, released: Mapping[str, str], withdrawn: Sequence[str]) -> bool:
    # A member holding something new failed at what it ran before (a withdrawn revision, say):
    # that is no failure of what this round released to it.  Nor is one still released a withdrawn
    # revision: it failed at it before, and that halt was counted.
    return not member.ready and member.reason in HALTING and not member.pending \
        and not set(released.values()) & set(withdrawn)


def _assigned(member: Member, names: Sequence[str], record: MemberRelease | None) -> list[str]:
    """The member's waves: the one recorded for the round (``record``, when the round goes on),
    else the ones its labels match now."""
    if record is not None and not record.hold and record.wave in names:
        return [record.wave]
    return list(member.waves)


@dataclass(frozen=True)
class _Round:
    """Who is a member of the round, in which wave, and whether this decision starts a new one."""

    waves_of: Mapping[Key, Sequence[str]]
    assigned: Sequence[Member]
    unassigned: Sequence[Member]
    contested: Sequence[Member]
    overflow: Sequence[Member]
    """Members past what a rollout records (held, as unassigned)."""
    unrecorded: frozenset[Key]
    started: bool
    offered: frozenset[str]
    joined: frozenset[Key]


def _sorted(members: Sequence[Member], *, names: Sequence[str], previous: FleetRolloutStatus,
            withdrawn: Sequence[str]) -> _Round:
    """Sort the members for this decision (the rules on membership in the module docstring)."""
    # A member only by its record (it changed its labels mid-round) stays one while its round goes
    # on; once that round is over it is free (and what it holds starts no round).
    over = previous.round is None or (bool(previous.waves) and all(w.phase is WavePhase.DONE
                                                                   for w in previous.waves))
    ordered = sorted((m for m in members if m.selected or not over), key=lambda m: m.key)
    recordable, overflow = ordered[:MAX_RELEASES], ordered[MAX_RELEASES:]
    records = {(r.namespace, r.name): r for r in previous.releases}

    def sort(among: list[Member], *, sticky: bool) -> tuple[dict[Key, list[str]], list[Member], list[Member]]:
        waves_of = {m.key: _assigned(m, names, records.get(m.key) if sticky else None) for m in among}
        fits = {m.key for m in among if not m.contested_by and len(waves_of[m.key]) == 1
                and waves_of[m.key][0] in names}
        return (waves_of, [m for m in among if m.key in fits],
                [m for m in among if not m.contested_by and m.key not in fits])

    waves_of, assigned, unassigned = sort(recordable, sticky=True)
    offered = {r for m in assigned if m.selected for r in m.pending.values()} - set(withdrawn)
    known = set(previous.round.revisions) if previous.round else set()
    started = bool(offered - known)
    if started:
        # A new round: everyone's wave afresh, and who left the selection is free.
        recordable = [m for m in recordable if m.selected]
        waves_of, assigned, unassigned = sort(recordable, sticky=False)
    # Joined mid-round: not recorded as a member of it when it began (or recorded as joined).  A
    # status from before records were kept (an upgrade mid-round): everyone counts, by its labels.
    going_on = previous.round is not None and not started and bool(previous.releases)
    joined = frozenset(m.key for m in assigned if going_on and (
        (record := records.get(m.key)) is None or record.joined or bool(record.hold)))
    return _Round(waves_of=waves_of, assigned=assigned, unassigned=unassigned,
                  contested=[m for m in [*recordable, *overflow] if m.contested_by],
                  overflow=[m for m in overflow if not m.contested_by],
                  unrecorded=frozenset(m.key for m in overflow), started=started, offered=frozenset(offered),
                  joined=joined)


def decide(*, rollout: str, waves: Sequence[FleetWave], members: Sequence[Member],
           previous: FleetRolloutStatus | None, now: datetime.datetime) -> Decision:
    """The rollout's decision at ``now`` (``previous``: the status the last decision left)."""
    previous = previous or FleetRolloutStatus()
    withdrawn = list(previous.withdrawn)
    names = [w.name for w in waves]
    sorted_ = _sorted(members, names=names, previous=previous, withdrawn=withdrawn)
    started, joined = sorted_.started, sorted_.joined
    current: FleetRound | None
    if started:
        current = FleetRound(revisions=sorted(sorted_.offered), started_at=format_time(now))
        before: dict[str, WaveStatus] = {}
        halt = None
    else:
        current = previous.round
        before = {w.name: w for w in previous.waves}
        halt = previous.halted
    revisions = set(current.revisions) if current else set()
    by_wave = {name: [m for m in sorted_.assigned if sorted_.waves_of[m.key][0] == name] for name in names}
    recorded: list[MemberRelease] = []
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
            late = member.key in joined
            count += done and not late
            if is_open and current is not None and halt is None and not late \
                    and _failing(member, released, withdrawn):
                halt = new_halt = Halt(member=member.ref, wave=wave.name, reason=member.reason,
                                       at=format_time(now))
                withdrawn = (withdrawn + sorted(set(released.values()) & revisions - set(withdrawn)))[
                    -MAX_WITHDRAWN:]
            releases[member.key] = FleetRelease(rollout=rollout, wave=wave.name, revisions=released)
            recorded.append(MemberRelease(namespace=member.namespace, name=member.name, wave=wave.name,
                                          revisions=released, joined=late))
            shown.append(MemberStatus(namespace=member.namespace, name=member.name, wave=wave.name,
                                      released=released, pending=dict(member.pending), ready=done,
                                      joined=late))
        counted = len([m for m in by_wave[wave.name] if m.key not in joined])
        all_done = count == counted
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
        statuses.append(WaveStatus(name=wave.name, phase=phase, members=counted, ready=count,
                                   opened_at=opened_at, ready_at=ready_at))
        may_open = phase is WavePhase.DONE and halt is None

    contested, unassigned = sorted_.contested, [*sorted_.unassigned, *sorted_.overflow]
    _held(rollout, sorted_, releases=releases, shown=shown, recorded=recorded)

    status = FleetRolloutStatus(round=current, waves=statuses, members=shown[:MAX_MEMBERS_SHOWN], halted=halt,
                                withdrawn=withdrawn, releases=recorded)
    ready, reason, message = _condition(rollout, statuses, halt=halt, contested=contested,
                                        unassigned=unassigned)
    was_complete = not started and bool(previous.waves) and \
        all(w.phase is WavePhase.DONE for w in previous.waves)
    completed = reason is Reason.COMPLETED and current is not None and not was_complete
    return Decision(status=status, releases=releases, ready=ready, reason=reason, message=message,
                    requeue_after=requeue, opened=opened, halted=new_halt, completed=completed,
                    started=started)


def _held(rollout: str, sorted_: _Round, *, releases: dict[Key, FleetRelease], shown: list[MemberStatus],
          recorded: list[MemberRelease]) -> None:
    """The release (a hold), the status line and the record of each contested, unassigned or
    unrecorded member (into ``releases``, ``shown`` and ``recorded``)."""
    def held(member: Member, hold: str, *, everyone: str = rollout) -> None:
        releases[member.key] = FleetRelease(rollout=everyone, hold=hold)
        shown.append(MemberStatus(namespace=member.namespace, name=member.name, pending=dict(member.pending),
                                  hold=hold))
        if member.key not in sorted_.unrecorded:
            recorded.append(MemberRelease(namespace=member.namespace, name=member.name, hold=hold))

    for member in sorted_.contested:
        everyone = ", ".join(sorted({rollout, *member.contested_by}))
        held(member, f"selected by the FleetRollouts {everyone}: no new revision is applied until all but "
                     "one let go", everyone=everyone)
    for member in sorted_.unassigned:
        where = "no wave" if not member.waves else f"the waves {', '.join(member.waves)}"
        held(member, f"in {where} of FleetRollout {rollout}: no new revision is applied until it matches "
                     "exactly one wave")
    for member in sorted_.overflow:
        held(member, f"beyond the {MAX_RELEASES} members FleetRollout {rollout} records: no new revision is "
                     "applied; split the rollout")


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
