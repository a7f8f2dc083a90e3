"""Promotion gates: what holds a Ready stage's dependents back.  Pure: no I/O;
time comes in as ``now``.

- :func:`judge` — a stage's promotion gate after this pass saw it (Ready or not) at a revision:
  the new :class:`~stageset.api.release.PromotionState` and whether its dependents may start.
  ``soak`` first: the stage must be seen Ready at that revision for the whole soak, and a stage
  seen not Ready restarts it; then ``requireManualPromotion``: a promote request for this stage
  (a new ``stages.metio.wtf/promote`` token) releases it.  A promote request also ends a soak
  early, as the reference's break-glass does.  A stage promoted at a revision stays promoted at it
  (a later flap does not hold dependents that already run it); a new revision starts the gate again.
- :func:`promote_request` — the ``<stage>@<token>`` annotation, when it is new for that stage.
- :func:`held_verdict` — the Ready reason while gates hold: ``Soaking`` (requeue when the soak
  ends, and at least every :data:`SOAK_CHECK` seconds to see a flap) or ``AwaitingPromotion``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stageset.api import format_time, parse_time
from stageset.api.release import ANNOTATION_PROMOTE, Promotion, PromotionPhase, PromotionState
from stageset.api.vocabulary import Reason

SOAK_CHECK = 30.0
"""A soaking stage's readiness is checked at least this often (seconds), and when the soak ends."""

HOW_SOAK, HOW_MANUAL, HOW_NONE, HOW_ROLLBACK = "soak", "manual", "none", "rollback"


@dataclass(frozen=True)
class Gate:
    """A stage's gate after this pass: its state (``None``: no gate), whether its dependents may
    start, and how it was promoted in this pass (``None``: not in this pass)."""

    state: PromotionState | None
    released: bool
    promoted: str | None = None
    """``soak`` or ``manual`` when this pass promoted the stage (an event and a metric say so)."""


def _soaking(revision: str, since: datetime.datetime, soak: float) -> PromotionState:
    return PromotionState(phase=PromotionPhase.SOAKING, revision=revision, since=format_time(since),
                          soak_until=format_time(since + datetime.timedelta(seconds=soak)))


def _promoted(revision: str, now: datetime.datetime, how: str) -> PromotionState:
    return PromotionState(phase=PromotionPhase.PROMOTED, revision=revision, since=format_time(now),
                          promoted_by=how)


def _awaiting(revision: str, now: datetime.datetime) -> PromotionState:
    return PromotionState(phase=PromotionPhase.AWAITING_MANUAL, revision=revision, since=format_time(now))


def judge(promotion: Promotion | None, before: PromotionState | None, *, revision: str | None, ready: bool,
          now: datetime.datetime, promote: bool = False) -> Gate:
    """The gate of a stage this pass saw ``ready`` (or not) at ``revision``; ``promote``: a new
    promote request names it."""
    if promotion is None or not promotion.gated:
        return Gate(None, released=ready)
    if revision is None:
        return Gate(before, released=False)
    current = before if before is not None and before.revision == revision else None
    if current is not None and current.phase is PromotionPhase.PROMOTED:
        return Gate(current, released=ready)
    if promote:
        return Gate(_promoted(revision, now, HOW_MANUAL), released=ready, promoted=HOW_MANUAL)
    if not ready:
        # Not Ready: a soak starts again from the next time it is seen Ready.
        if promotion.soak_seconds > 0 and (current is None or current.phase is PromotionPhase.SOAKING):
            return Gate(PromotionState(phase=PromotionPhase.SOAKING, revision=revision), released=False)
        return Gate(current, released=False)
    soak = promotion.soak_seconds
    if soak > 0 and (current is None or current.phase is PromotionPhase.SOAKING):
        since = parse_time(current.since) if current is not None else None
        if since is None:
            return Gate(_soaking(revision, now, soak), released=False)
        if (now - since).total_seconds() < soak:
            return Gate(_soaking(revision, since, soak), released=False)
        if not promotion.require_manual_promotion:
            return Gate(_promoted(revision, now, HOW_SOAK), released=True, promoted=HOW_SOAK)
        return Gate(_awaiting(revision, now), released=False)
    if promotion.require_manual_promotion:
        if current is not None and current.phase is PromotionPhase.AWAITING_MANUAL:
            return Gate(current, released=False)
        return Gate(_awaiting(revision, now), released=False)
    return Gate(_promoted(revision, now, HOW_NONE), released=True)


def held(state: PromotionState | None) -> bool:
    return state is not None and state.phase in (PromotionPhase.SOAKING, PromotionPhase.AWAITING_MANUAL)


def promote_request(annotations: Mapping[str, str] | None, *, handled: Mapping[str, str | None]
                    ) -> tuple[str, str] | None:
    """``(stage, token)`` of the promote annotation when its token is new for that stage (each
    token acts once); ``None`` otherwise.  ``handled``: each stage's ``lastHandledPromotion``."""
    value = (annotations or {}).get(ANNOTATION_PROMOTE) or ""
    stage, sep, token = value.partition("@")
    stage, token = stage.strip(), token.strip()
    if not sep or not stage or not token or stage not in handled:
        return None
    return None if handled[stage] == token else (stage, token)


@dataclass(frozen=True)
class Held:
    """The Ready condition while promotion gates hold a release (no stage failed or waits)."""

    reason: Reason
    message: str
    requeue_after: float


def held_verdict(states: Sequence[tuple[str, PromotionState]], *, now: datetime.datetime,
                 interval: float) -> Held:
    """``states``: the held stages (name, state).  Soaking wins the reason while any stage soaks
    (it ends by itself); the requeue is when the first soak ends (at most :data:`SOAK_CHECK`
    seconds away), else the interval (a promote request wakes the StageSet at once)."""
    soaking = [(n, s) for n, s in states if s.phase is PromotionPhase.SOAKING]
    waiting = [n for n, s in states if s.phase is PromotionPhase.AWAITING_MANUAL]
    parts: list[str] = []
    requeue = interval
    for name, state in soaking:
        until = parse_time(state.soak_until)
        if until is None:
            parts.append(f"stage {name!r} soaks from when it is Ready again")
            requeue = min(requeue, SOAK_CHECK)
            continue
        parts.append(f"stage {name!r} soaks until {format_time(until)}")
        requeue = min(requeue, max(0.0, (until - now).total_seconds()) + 0.5, SOAK_CHECK)
    for name in waiting:
        parts.append(f"stage {name!r} awaits promotion (stageset promote NAME --stage {name})")
    reason = Reason.SOAKING if soaking else Reason.AWAITING_PROMOTION
    return Held(reason, "; ".join(parts) + "; the stages after it wait", requeue)
