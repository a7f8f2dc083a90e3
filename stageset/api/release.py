"""Steering a release: promotion gates, update windows, rollback and version floors (the API).

The fields are the reference controller's (``promotion.soak``, ``promotion.requireManualPromotion``,
``updateWindows``, ``windowScope``, ``rollbackOnFailure``, ``onTimeout: Rollback``,
``dependsOn[].minVersion``; status ``promotionState``, ``pendingUpdate``, ``lastAppliedSnapshot``,
``lastHandledUpdateOverride``, ``lastHandledPromotion``), so a StageSet written for it means the
same here.  What we add to its status (``status.rollback``, ``status.overrideRevisions``,
``promotionState.revision``) is said where it is declared.

Every rule the CRD enforces (``x-kubernetes-validations``) is repeated by a validator, because the
reconciler re-checks specs with these models.  A cron schedule and a time zone are checked here
precisely (``cronsim`` parses the schedule, ``zoneinfo`` knows the zone); the CRD checks their
shape only, so a schedule the apiserver let through but the controller cannot read ends as
``InvalidSpec`` naming the window.  No I/O, no identity, no clock.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from enum import StrEnum
from typing import Annotated, cast

import cronsim
from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.config import JsonDict, JsonValue

from stageset.api.common import ApiModel, Count, DNSLabel, Duration, StatusModel, Time, duration_seconds

MAX_WINDOWS = 32
"""``updateWindows`` entries per StageSet."""

ANNOTATION_PROMOTE = "stages.metio.wtf/promote"
"""``<stage>@<token>``: promote ``stage`` past its gate, once per new token (the reference's)."""
ANNOTATION_UPDATE_NOW = "stages.metio.wtf/update-now"
"""Any new value: ship the revisions an update window holds, at once (the reference's)."""

SEMVER_PATTERN = (r"^v?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))?(\.(0|[1-9][0-9]*))?"
                  r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$")
CRON_PATTERN = r"^\s*\S+(\s+\S+){4}\s*$"
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"

# A fixed instant to parse schedules against: parsing must not read the clock.
_PARSE_AT = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def parse_schedule(schedule: str) -> None:
    """Raise ``ValueError`` unless ``schedule`` is a 5-field cron expression cronsim reads."""
    try:
        cronsim.CronSim(schedule.strip(), _PARSE_AT)
    except cronsim.CronSimError as error:
        raise ValueError(f"schedule {schedule!r} is not a 5-field cron expression: {error}") from None


def time_zone(name: str | None) -> datetime.tzinfo:
    """The IANA zone ``name`` (``None``: UTC); ``ValueError`` when it is unknown."""
    if not name:
        return datetime.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"timeZone {name!r} is not an IANA time zone (e.g. Europe/Berlin, "
                         "America/New_York, UTC)") from None


# -- promotion gates -------------------------------------------------------------------------

class Promotion(ApiModel):
    """What must happen after a stage is Ready before the stages that depend on it start.

    A held stage stays applied and its drift keeps being corrected; the stages after it are not
    touched.  ``soak`` runs first, then the manual gate.  The reference's ``analysis``,
    ``fastTrack``, ``restartGate`` and ``eventGate`` are refused (``stageset.api.unsupported``)."""

    soak: Duration | None = None
    """How long the stage must stay Ready, without interruption, at its revision before its
    dependents start (a stage seen not Ready restarts the clock; readiness is checked at least
    every 30 seconds meanwhile).  Left out or ``0``: no soak."""
    require_manual_promotion: bool = False
    """Hold the stage's dependents until someone promotes this stage at this revision:
    ``stageset promote NAME --stage STAGE`` (the ``stages.metio.wtf/promote`` annotation)."""

    @property
    def soak_seconds(self) -> float:
        return duration_seconds(self.soak) if self.soak else 0.0

    @property
    def gated(self) -> bool:
        return self.soak_seconds > 0 or self.require_manual_promotion


class PromotionPhase(StrEnum):
    """Where a stage stands against its promotion gate (``promotionState.phase``)."""

    SOAKING = "Soaking"
    """Ready; its dependents wait until it has stayed Ready for ``soak``."""
    AWAITING_MANUAL = "AwaitingManual"
    """Ready (and soaked); its dependents wait for ``stageset promote``."""
    PROMOTED = "Promoted"
    """Passed its gate at this revision; its dependents go on."""


class PromotionState(StatusModel):
    """A stage's promotion gate at its revision: what it waits for, and until when."""

    phase: Annotated[PromotionPhase, WithJsonSchema({"type": "string", "maxLength": 64})]
    """Soaking, AwaitingManual or Promoted."""
    revision: Annotated[str, Field(max_length=1024)] | None = None
    """The revision the gate is about (ours; the reference keys it to the applied revision too).
    A new revision starts the gate again."""
    since: Time | None = None
    """When this phase began; while Soaking, when the stage was last seen turning Ready (the soak
    counts from here)."""
    soak_until: Time | None = None
    """While Soaking: when the soak ends, if the stage stays Ready."""
    promoted_by: Annotated[str, Field(max_length=64)] | None = None
    """Once Promoted: ``soak``, ``manual`` (the promote annotation), ``none`` (no gate held it) or
    ``rollback`` (restored to a last good revision, which passed its gates before)."""


# -- update windows --------------------------------------------------------------------------

class WindowType(StrEnum):
    ALLOW = "Allow"
    """Roll out new revisions only while an Allow window is open (when any Allow is declared)."""
    DENY = "Deny"
    """Roll out no new revision while this window is open; wins over any Allow."""


class WindowScope(StrEnum):
    """What a closed update window holds back."""

    UPDATES = "Updates"
    """New revisions wait; the revisions already applied keep being applied (drift corrected)."""
    ALL = "All"
    """Nothing is applied at all while closed (drift is not corrected either)."""


_WINDOW_RULES: list[JsonDict] = [
    {"rule": "has(self.schedule) != (has(self.from) || has(self.to))",
     "message": "an update window is either recurring (schedule and duration) or absolute (from and to)"},
    {"rule": "!has(self.schedule) || has(self.duration)",
     "message": "a recurring update window needs duration: how long it stays open after each start",
     "fieldPath": ".duration", "reason": "FieldValueRequired"},
    {"rule": "has(self.schedule) || (!has(self.duration) && !has(self.timeZone))",
     "message": "duration and timeZone belong to a recurring window (with schedule)"},
    {"rule": "has(self.from) == has(self.to)",
     "message": "an absolute update window needs both from and to"},
    {"rule": "!has(self.from) || !has(self.to) || timestamp(self.to) > timestamp(self.from)",
     "message": "an absolute update window's to must be after its from", "fieldPath": ".to"},
    {"rule": f"!has(self.schedule) || self.schedule.matches(r'{CRON_PATTERN}')",
     "message": "schedule must be a 5-field cron expression (minute hour day-of-month month "
                "day-of-week), e.g. '0 18 * * FRI'", "fieldPath": ".schedule"},
    {"rule": f"!has(self.timeZone) || self.timeZone.matches('{TIME_ZONE_PATTERN}')",
     "message": "timeZone must be an IANA time zone name, e.g. Europe/Berlin", "fieldPath": ".timeZone"},
]


class UpdateWindow(ApiModel):
    """A window that allows or denies rolling out new revisions: recurring (``schedule`` +
    ``duration``, in ``timeZone``) or absolute (``from`` + ``to``)."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": cast("list[JsonValue]", _WINDOW_RULES)})

    type: WindowType
    """Allow or Deny.  A Deny always wins; with any Allow declared, new revisions roll out only
    while an Allow is open."""
    schedule: Annotated[str, Field(max_length=256)] | None = None
    """When a recurring window opens: a 5-field cron expression (minute hour day-of-month month
    day-of-week; names, ranges, steps, ``L`` and ``#`` as in Debian's cron), in ``timeZone``."""
    duration: Duration | None = None
    """How long a recurring window stays open after each start (elapsed time: an 8h window that
    spans a daylight-saving change still lasts 8 hours)."""
    time_zone: Annotated[str, Field(max_length=64)] | None = None
    """The IANA time zone the schedule is read in (e.g. ``Europe/Berlin``); defaults to UTC.  At
    a daylight-saving change a start time that does not exist runs at the first time after it,
    and one that exists twice runs once (the first)."""
    from_: Time | None = Field(default=None, alias="from")
    """Start of an absolute window (RFC 3339)."""
    to: Time | None = None
    """End of an absolute window (RFC 3339, exclusive)."""

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is not None:
            parse_schedule(value)
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        time_zone(value)
        return value

    @model_validator(mode="after")
    def _one_form(self) -> UpdateWindow:
        recurring, absolute = self.schedule is not None, self.from_ is not None or self.to is not None
        if recurring == absolute:
            raise ValueError(_WINDOW_RULES[0]["message"])
        if recurring and self.duration is None:
            raise ValueError(_WINDOW_RULES[1]["message"])
        if recurring and self.duration is not None and duration_seconds(self.duration) <= 0:
            raise ValueError("a recurring update window's duration must be longer than 0")
        if absolute and (self.duration is not None or self.time_zone is not None):
            raise ValueError(_WINDOW_RULES[2]["message"])
        if absolute:
            if self.from_ is None or self.to is None:
                raise ValueError(_WINDOW_RULES[3]["message"])
            start, end = _instant(self.from_), _instant(self.to)
            if end <= start:
                raise ValueError(_WINDOW_RULES[4]["message"])
        return self

    @property
    def opens(self) -> datetime.datetime | None:
        return _instant(self.from_) if self.from_ else None

    @property
    def closes(self) -> datetime.datetime | None:
        return _instant(self.to) if self.to else None


def _instant(value: str) -> datetime.datetime:
    parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


class PendingUpdate(StatusModel):
    """What an update window holds back, and when it may ship."""

    revisions: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The revisions held, by source (``namespace/name``), as the reference keys them.  Empty while
    a ``windowScope: All`` freeze pauses a StageSet that has nothing new."""
    stages: list[DNSLabel] = Field(default_factory=list,
                                   json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """The stages whose new revision is held (ours)."""
    next_window_opens: Time | None = None
    """When the windows next allow a rollout (none: they never will, as declared)."""
    fleet_rollout: Annotated[str, Field(max_length=253)] | None = None
    """The FleetRollout that holds (some of) these revisions until the member's wave opens."""
    wave: Annotated[str, Field(max_length=63)] | None = None
    """The member's wave in that FleetRollout (none: unassigned or contested, held until that is resolved)."""


# -- rollback --------------------------------------------------------------------------------

class StageSnapshot(StatusModel):
    """One stage of the last fully successful pass: what a rollback restores it to (the
    reference's ``StageArtifactRef``; ``url`` and ``digest`` are set for artifact sources)."""

    stage: DNSLabel
    """The stage."""
    revision: Annotated[str, Field(max_length=1024)]
    """The source revision (for Git: ``<ref>@sha1:<commit>``)."""
    url: Annotated[str, Field(max_length=2048)] | None = None
    """The artifact's URL, for sources that serve one (not Git sources)."""
    digest: Annotated[str, Field(max_length=256)] | None = None
    """The artifact's digest, for sources that serve one (not Git sources)."""
    substitution_digest: Annotated[str, Field(max_length=128)] | None = None
    """A sha256 of the stage's ``postBuild`` variables (names and values), never the values: a
    rollback is refused when they changed since (the old revision would not render the same)."""


class RollbackPhase(StrEnum):
    ROLLING_BACK = "RollingBack"
    """Restoring stages, in reverse order (``remaining``: those still to restore)."""
    ROLLED_BACK = "RolledBack"
    """Restored; the failed revisions are not tried again until a source or the spec changes."""


class Rollback(StatusModel):
    """A rollback of this StageSet (ours: the reference keeps no such record)."""

    phase: Annotated[RollbackPhase, WithJsonSchema({"type": "string", "maxLength": 64})]
    """RollingBack or RolledBack."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """What failed, and what was restored."""
    failed: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The revision of every stage when the release failed: not applied again while every stage's
    source still has this revision (and the spec is unchanged)."""
    restored: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The stages restored, and the revision each was restored to."""
    remaining: list[DNSLabel] = Field(default_factory=list,
                                      json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """While RollingBack: the stages still to restore, in order."""
    generation: Count | None = None
    """The ``metadata.generation`` the release failed at: a spec change tries again."""
    time: Time | None = None
    """When the rollback began."""


MIN_VERSION_RULE: JsonDict = {
    "rule": f"!has(self.minVersion) || self.minVersion == '' || self.minVersion.matches(r'{SEMVER_PATTERN}')",
    "message": "minVersion must be a semantic version, e.g. 5.2.0 or v5.2",
    "fieldPath": ".minVersion",
}

MinVersion = Annotated[str, Field(max_length=64)]
"""A semantic version (``5.2.0``, ``v5.2``): the dependency's applied revision must be a version
tag at or above it."""


def checked_min_version(value: str | None) -> str | None:
    """``value`` when it is a semantic version (``None`` for none); ``ValueError`` otherwise."""
    if value and re.fullmatch(SEMVER_PATTERN, value) is None:
        raise ValueError(MIN_VERSION_RULE["message"])
    return value or None
