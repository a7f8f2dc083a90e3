"""``spec.supersedes``: the rules of a hand-over, as pure functions of what was read.  No I/O, no clock.

What is done with them — the reads, the access review, the record written on the predecessor — is
:mod:`~stageset.controller.stageset.supersedes` (and :mod:`~stageset.controller.stageset.handover`);
the record itself is :mod:`stageset.apply.handover`.

- :func:`verdict` — may this StageSet take over from a predecessor it names, given what its identity
  could read and was allowed: ``None`` (go on), or the refusal (reason and message);
- :func:`carried` — the action ledger a successor's stage starts with: what its predecessor's stage
  of the same name ran for this revision on this target, when it has nothing of its own for it;
- :func:`note` — what a predecessor that lets objects go says in its ``Ready`` message;
- :func:`taken` — what a successor's ``TakenOver`` event says.

Messages name a predecessor (``StageSet <namespace>/<name>``) only when the successor's identity may
read it; otherwise only its place in ``spec.supersedes`` (``spec.supersedes[1]``), and nothing about
whether it exists or what it holds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stageset.api.actions import ActionLedger
from stageset.api.vocabulary import Reason
from stageset.apply.handover import Entry, Ref


class Reading(enum.Enum):
    """What the successor's identity saw of a predecessor it names."""

    READ = "read"
    GONE = "gone"
    """Not found: nothing to take over (it was deleted, or never existed)."""
    UNREADABLE = "unreadable"
    """The identity may not read it (or it could not be read now)."""


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    message: str


def named(index: int, ref: Ref, *, readable: bool) -> str:
    """How a message names ``spec.supersedes[index]``."""
    return f"StageSet {ref[0]}/{ref[1]}" if readable else f"the StageSet spec.supersedes[{index}] names"


def verdict(*, index: int, ref: Ref, ours: Ref, seen: Reading, may_patch: bool | None, who: str
            ) -> Refusal | None:
    """May the StageSet ``ours`` take over ``ref`` (``spec.supersedes[index]``)?  ``seen``: whether its
    identity (``who``) could read it; ``may_patch``: whether that identity may patch it (``None``: not
    asked, since nothing was read).  A predecessor that is gone refuses nothing: there is nothing to take."""
    if ref == ours:
        return Refusal(Reason.INVALID_SPEC, f"spec.supersedes[{index}] names this StageSet itself")
    if seen is Reading.GONE:
        return None
    if seen is Reading.UNREADABLE:
        return Refusal(Reason.SUPERSEDE_DENIED,
                       f"spec.supersedes[{index}]: {who} may not read the StageSet it names, so this "
                       "StageSet takes nothing over from it: a successor takes over only what its "
                       "ServiceAccount could by hand (get and patch on that StageSet); nothing is applied")
    if not may_patch:
        return Refusal(Reason.SUPERSEDE_DENIED,
                       f"spec.supersedes[{index}]: {who} may not patch StageSet {ref[0]}/{ref[1]}, so this "
                       "StageSet may not take it over (grant get and patch on it, or remove it from "
                       f"spec.supersedes); nothing is applied, and {ref[0]}/{ref[1]} keeps everything it "
                       "holds")
    return None


def carried(own: ActionLedger | None, theirs: Sequence[ActionLedger | None], *,
            key: tuple[str, str, str]) -> ActionLedger | None:
    """The ledger a successor's stage starts this pass with.  Its own when it is for ``key`` (revision,
    inputs, target: it has acted for it already); else, when a predecessor's stage of the same name
    has a ledger for ``key``, what those ran (``executed``; an action still in progress there is not
    carried: it starts here); else its own (a new revision starts a new ledger, as always)."""
    if own is not None and own.key() == key:
        return own
    done: list[str] = []
    found: ActionLedger | None = None
    for ledger in theirs:
        if ledger is None or ledger.key() != key:
            continue
        found = found or ledger
        done.extend(name for name in ledger.executed if name not in done)
    if found is None:
        return own
    return ActionLedger(revision=found.revision, inputs=found.inputs, target=found.target, executed=done)


def note(entries: Iterable[Entry]) -> str:
    """A predecessor's note on what it handed over and to whom (it no longer applies, prunes or deletes
    those objects)."""
    parts = [f"{len(e.objects)} object(s) to StageSet {e.successor[0]}/{e.successor[1]}"
             for e in sorted(entries, key=lambda e: (e.successor, e.target))]
    if not parts:
        return ""
    return (f"handed over {', '.join(parts)} (its spec.supersedes names this StageSet): this StageSet no "
            "longer applies, prunes or deletes them")


def taken(*, stage: str, ref: Ref, objects: int) -> str:
    """The ``TakenOver`` event: a stage adopted ``objects`` object(s) of predecessor ``ref`` in place."""
    return (f"stage {stage!r} took over {objects} object(s) of StageSet {ref[0]}/{ref[1]} in place "
            "(spec.supersedes): same objects, new owner labels, nothing deleted or created")
