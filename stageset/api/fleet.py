"""``FleetRollout`` (cluster-scoped, ``stages.metio.wtf/v1``): one change across many StageSets, in waves.

A FleetRollout selects StageSets (its *members*: ``spec.selector``, narrowed by the required
``spec.namespaceSelector`` — namespace labels are the platform's: a tenant may not label its own
namespace) and sorts each into exactly one of ``spec.waves`` by the wave's own ``selector``.  A
member holds every new revision its sources offer until its wave opens for it; the first wave
opens at once, each later one when every member of the wave before is Ready at
the new revisions and that wave's ``soak`` has passed.  A failing member of an open wave halts the
rollout.  The decisions: :mod:`stageset.controller.fleet.decide`; the hold on the member's side:
:mod:`stageset.controller.stageset.fleethold`.

The reference's version-based fields (``targetVersion``, ``previousVersion``, ``onRegression``,
``waves[].gate``) are declared and refused by name (:mod:`stageset.api.unsupported`): here the
unit of change is a revision of the members' sources, not a ``spec.version``.

Written by the platform, not by tenants: the chart aggregates no right on FleetRollouts into
``admin``/``edit``.  What a member may apply rests on the rollout's own status
(``status.releases``: one record per member, written by the controller to a subresource no tenant
may write); the release annotation the controller also writes on each member is a hint a tenant can
edit: it may narrow what the member applies (a forged, edited or removed one holds everything new),
never widen it.  No I/O here; these are schema and models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from stageset.api.actions import LabelSelector
from stageset.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    Count,
    DNSLabel,
    DNSSubdomain,
    Duration,
    StatusModel,
    Time,
)

ANNOTATION_FLEET_RELEASE: Final = "stages.metio.wtf/fleet-release"
"""On a member StageSet, written by the controller: which FleetRollout holds it, in which wave, and
the revisions (by source, ``namespace/name``) its wave released to it (JSON, :class:`FleetRelease`).
A hint: the member applies a released revision only when this says exactly what the rollout's
status records for it (:attr:`FleetRolloutStatus.releases`)."""

MAX_WAVES = 32
MAX_MEMBERS_SHOWN = 500
"""Members listed in ``status.members`` (the counts cover every member)."""
MAX_RELEASES = 5000
"""Members a rollout records a release for (``status.releases``); more are held, as unassigned."""


class FleetWave(ApiModel):
    """One wave: the members whose labels match its ``selector``, released together."""

    name: DNSLabel
    """The wave's name (unique in the rollout)."""
    selector: LabelSelector
    """Which members belong to this wave (by the StageSet's labels); a member must match exactly one wave."""
    soak: Duration | None = None
    """How long this wave stays Ready at the new revisions before the next wave opens."""


NAMESPACE_SELECTOR_RULE = ("(has(self.matchLabels) && size(self.matchLabels) > 0)"
                           " || (has(self.matchExpressions) && size(self.matchExpressions) > 0)")
NAMESPACE_SELECTOR_MESSAGE = ("namespaceSelector must name at least one namespace label: which namespaces "
                              "may hold members is the platform's choice (a tenant cannot label its "
                              "namespace)")


class FleetRolloutSpec(ApiModel):
    """Which StageSets roll out together, and in which waves."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.namespaceSelector) || "
                 + NAMESPACE_SELECTOR_RULE.replace("self.", "self.namespaceSelector."),
         "message": NAMESPACE_SELECTOR_MESSAGE, "fieldPath": ".namespaceSelector"}]})

    selector: LabelSelector
    """The StageSets this rollout governs (its members), by their labels."""
    namespace_selector: LabelSelector
    """Required: only StageSets in namespaces whose labels match (at least one label or expression;
    namespace labels are set by whoever may write Namespaces — the platform, not a tenant)."""
    waves: list[FleetWave] = Field(
        min_length=1, max_length=MAX_WAVES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """The waves, in the order they open."""

    @model_validator(mode="after")
    def _platform_namespaces(self) -> FleetRolloutSpec:
        if not self.namespace_selector.query():
            raise ValueError(NAMESPACE_SELECTOR_MESSAGE)
        return self


class WavePhase(StrEnum):
    """Where one wave stands in the current round (``status.waves[].phase``)."""

    WAITING = "Waiting"
    """Not open: its members hold the new revisions."""
    OPEN = "Open"
    """Released: its members ship the new revisions independently."""
    SOAKING = "Soaking"
    """Every member is Ready at the new revisions; the next wave opens when the soak has passed."""
    DONE = "Done"
    """Every member is Ready at the new revisions and the soak has passed."""
    HALTED = "Halted"
    """A member failed: no later wave opens until a new revision arrives."""


class WaveStatus(StatusModel):
    """One wave in the current round."""

    name: DNSLabel
    phase: WavePhase
    members: Count = 0
    """How many members the wave has."""
    ready: Count = 0
    """How many of them are Ready at the revisions released to them."""
    opened_at: Time | None = None
    """When the wave opened in the current round."""
    ready_at: Time | None = None
    """When every member was first Ready at the new revisions (its soak starts then)."""


class MemberStatus(StatusModel):
    """One member: where it is sorted, and what its wave released to it."""

    namespace: DNSLabel
    name: DNSSubdomain
    wave: DNSLabel | None = None
    """Its wave (none: unassigned or contested)."""
    released: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The revisions its wave released to it, by source (``namespace/name``)."""
    pending: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The new revisions it holds (its ``status.pendingUpdate``)."""
    ready: bool = False
    """Ready at the revisions released to it, with nothing held."""
    hold: Annotated[str, Field(max_length=1024)] | None = None
    """Why it applies no new revision at all (unassigned, contested)."""
    joined: bool = False
    """It became a member after the round began: it neither holds its wave back nor halts the round."""


class MemberRelease(StatusModel):
    """What one member may apply (``status.releases``): the record its pass takes its release from."""

    namespace: DNSLabel
    name: DNSSubdomain
    wave: Annotated[str, Field(max_length=63)] = ""
    """Its wave for the round (taken when the round began, or when it joined): a member that changes
    its labels mid-round keeps it until the next round."""
    revisions: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The revisions released to it, by source (``namespace/name``); anything else new is held."""
    hold: Annotated[str, Field(max_length=1024)] = ""
    """Why nothing new is applied at all (unassigned, contested); empty otherwise."""
    joined: bool = False
    """It became a member after the round began: it neither holds its wave back nor halts the round."""

    def release(self, rollout: str) -> FleetRelease:
        """The same, as the annotation says it (:class:`FleetRelease`)."""
        return FleetRelease(rollout=rollout, wave=self.wave, revisions=dict(self.revisions), hold=self.hold)


class Halt(StatusModel):
    """What halted the current round."""

    member: Annotated[str, Field(max_length=320)]
    """The member that failed (``namespace/name``)."""
    wave: DNSLabel
    reason: Annotated[str, Field(max_length=128)]
    """Its Ready reason (``StageFailed``, ``ActionFailed``, ``StageProgressing``, ``RolledBack``)."""
    at: Time


class FleetRound(StatusModel):
    """The revisions being rolled out now."""

    revisions: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Every revision the members held back when the round began (and any that joined it since
    under the same names): a revision not among them starts a new round from the first wave."""
    started_at: Time | None = None


class FleetRolloutStatus(StatusModel):
    """The observed state, written by the controller."""

    observed_generation: Count | None = None
    last_handled_reconcile_at: Annotated[str, Field(max_length=256)] | None = None
    """The last ``reconcile.fluxcd.io/requestedAt`` value acted on."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    round: FleetRound | None = None
    """The round in progress (or the last one)."""
    waves: list[WaveStatus] = Field(default_factory=list,
                                    json_schema_extra={"x-kubernetes-list-type": "atomic"})
    members: list[MemberStatus] = Field(default_factory=list,
                                        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Up to 500 members, by wave then namespace/name."""
    halted: Halt | None = None
    """Set while the current round is halted."""
    withdrawn: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=64, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Revisions a halt withdrew: never released again (after a fix, later waves go straight to it)."""
    releases: list[MemberRelease] = Field(default_factory=list, max_length=MAX_RELEASES,
                                          json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """What each member may apply, by namespace and name (every member, up to 5000): the record a
    member's pass takes its release from — the controller's, on a subresource no tenant may write."""


class FleetRollout(ApiModel):
    """One change across many StageSets, in waves (cluster-scoped; written by the platform)."""

    api_version: Literal["stages.metio.wtf/v1"] = API_VERSION
    """``stages.metio.wtf/v1``."""
    kind: Literal["FleetRollout"] = "FleetRollout"
    """``FleetRollout``."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: FleetRolloutSpec
    """The desired state."""
    status: FleetRolloutStatus | None = None
    """The observed state, written by the controller."""


# -- what a member's pass knows of the rollouts ---------------------------------------------------

@dataclass(frozen=True)
class FleetView:
    """What the controller's own watch of FleetRollouts says of one StageSet: a member's pass reads
    it (no request) to learn which rollout holds it and what that rollout's status released to it."""

    selected_by: Sequence[str] = ()
    """The rollouts whose selectors select it now (its labels, its namespace's labels)."""
    records: Mapping[str, FleetRelease] = field(default_factory=dict)
    """What each rollout's ``status.releases`` records for it (a rollout keeps a member it recorded
    until the round ends, whatever its labels say now)."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Rollouts whose spec is refused (``InvalidSpec``: one stored before a rule it breaks existed)
    but whose label selector picks it, and why: they hold it."""
    unknown: Sequence[str] = ()
    """Rollouts whose label selector picks it while its namespace's labels are not known yet."""

    @property
    def rollouts(self) -> list[str]:
        """Every rollout that holds it in some way, sorted."""
        return sorted({*self.selected_by, *self.records, *self.refused, *self.unknown})


NO_FLEET = FleetView()
"""No rollout runs (a namespaced or label-sharded release), or none concerns the StageSet."""


# -- the annotation on members -----------------------------------------------------------------

class FleetRelease(StatusModel):
    """The value of :data:`ANNOTATION_FLEET_RELEASE` (the controller's, on a member StageSet)."""

    rollout: Annotated[str, Field(max_length=253)]
    """The FleetRollout (for a contested member: every rollout selecting it, comma-separated)."""
    wave: Annotated[str, Field(max_length=63)] = ""
    """The member's wave (empty: unassigned or contested)."""
    revisions: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The revisions released to the member, by source (``namespace/name``); anything else new is held."""
    hold: Annotated[str, Field(max_length=1024)] = ""
    """Why nothing new is applied at all (unassigned, contested); empty otherwise."""

    def encode(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, exclude_defaults=True), sort_keys=True,
                          separators=(",", ":"))


def read_release(annotations: dict[str, Any] | None) -> FleetRelease | None:
    """The member's release (``None``: no rollout holds it).  An unreadable value holds everything
    new (fail closed): only the controller writes it."""
    raw = (annotations or {}).get(ANNOTATION_FLEET_RELEASE)
    if raw is None:
        return None
    try:
        return FleetRelease.model_validate(json.loads(str(raw)))
    except ValueError:
        return FleetRelease(rollout="?", hold=f"the {ANNOTATION_FLEET_RELEASE} annotation is unreadable")
