"""``status.history``: each stage's last applied releases (the API).  No I/O, no identity, no clock.

Each stage keeps its newest :data:`PER_STAGE` releases (fewer when a StageSet has many stages, so
that the whole history stays under :data:`TOTAL` entries), newest first.  A release is a revision
(or a spec generation that changed what was applied) the stage applied: when, at which phase the
pass left it, and what it wrote — counts per action and at most :data:`NAMED` objects by name.  A
failed attempt that applied nothing is an entry too (``attempt``, with its ``reason``).  Never an
object's content, never a message (it could echo a value).

Why status and not the durable record annotation (``stages.metio.wtf/inventory-record``): history
is observed state, written by the pass's own conclusion (the status write every pass that changed
something makes anyway, so it costs no request), while the annotation is metadata — writing it
is a separate request that bumps the object's ``metadata`` and wakes every watcher; the record is
there because losing it could orphan objects, and losing history (a restore without status)
loses nothing the controller needs.  Status survives controller and dashboard restarts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, WithJsonSchema

from stageset.api.common import Count, DNSLabel, StatusModel, Time
from stageset.api.vocabulary import StagePhase

PER_STAGE = 10
"""Releases kept per stage (at most)."""
TOTAL = 160
"""Releases kept per StageSet: with more than ``TOTAL / PER_STAGE`` stages each keeps fewer (at least 2)."""
NAMED = 5
"""Objects a release names (the counts cover every one)."""


def per_stage(stages: int) -> int:
    """How many releases each of ``stages`` stages keeps."""
    return max(2, min(PER_STAGE, TOTAL // max(stages, 1)))


class Release(StatusModel):
    """One revision (or spec generation) a stage applied."""

    revision: Annotated[str, Field(max_length=1024)] | None = None
    """The source revision applied."""
    generation: Count | None = None
    """The StageSet's ``metadata.generation`` applied."""
    applied_at: Time | None = None
    """When the stage released it: the pass that first applied this revision (or generation), also
    when that pass found nothing to change; for a failed attempt, when it first failed."""
    phase: Annotated[StagePhase, WithJsonSchema({"type": "string", "maxLength": 64})] = StagePhase.READY
    """Where the stage stood when the pass that applied it ended (its last pass at this release)."""
    created: Count = 0
    """Objects created."""
    configured: Count = 0
    """Objects changed (configured, or deleted and created again)."""
    deleted: Count = 0
    """Objects pruned: no longer rendered by the stage."""
    objects: list[Annotated[str, Field(max_length=600)]] = Field(
        default_factory=list, max_length=NAMED, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Up to five of the objects written, ``Kind/namespace/name action``."""
    reason: Annotated[str, Field(max_length=64)] | None = None
    """Why the stage failed (a Ready reason: ``StageFailed``, ``RBACDenied``, ...), when it did."""
    attempt: bool | None = None
    """True: a failed attempt, nothing applied (refused, denied, or it could not be built); the
    revision is the one it tried (unknown when it could not be built).  Consecutive failures with
    the same revision, generation and reason are one entry."""


class StageHistory(StatusModel):
    """One stage's releases, newest first."""

    stage: DNSLabel
    """Name of the stage."""
    releases: list[Release] = Field(default_factory=list, max_length=PER_STAGE,
                                    json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Newest first."""
