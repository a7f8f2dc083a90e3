"""The ``NotificationProvider`` and ``NotificationAlert`` kinds: where the controller tells
people about StageSet events (a webhook, Slack, Microsoft Teams, a commit status on GitHub or
GitLab), and which events it tells.

The platform's are read in the one namespace its ``--notification-namespace`` flag (chart value
``controller.notifications.namespace``) gives, with the controller's identity, Secrets included,
and may select any StageSet.  With ``--tenant-notifications`` (chart value
``controller.notifications.tenants``) an app team may own alerts too: those in its namespace are
read there and match only that namespace's StageSets, whatever their event sources say, and a
tenant provider's Secret is read as the provider's ``serviceAccountName`` (impersonated), never
with the controller's own rights -- so a tenant can neither point another tenant's events at its
receiver nor read a Secret its own account could not.  Without the flag, objects of these kinds
outside the notification namespace are ignored.

The field names follow Flux's ``notification.toolkit.fluxcd.io/v1beta3`` ``Provider`` and
``Alert`` so a platform team can port theirs by changing ``apiVersion`` and ``kind`` (and the
alert's event sources to ``kind: StageSet``).  They are our own kinds rather than Flux's because
Flux's ``Alert`` schema refuses an event source of kind ``StageSet`` (its ``kind`` is an enum of
Flux's kinds), and Flux's objects are already delivered by a running notification-controller:
honouring them here too would send every matching event twice.  ``eventReasons`` is our
addition (Flux matches messages by regular expression only).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from stageset.api.common import (
    API_VERSION,
    ApiModel,
    DNSLabel,
    Duration,
    LocalObjectRef,
)


class ProviderType(StrEnum):
    """Where a provider sends (Flux's type names)."""

    GENERIC = "generic"
    """An HTTP POST of the event as JSON in Flux's event shape (``involvedObject``, ``severity``,
    ``reason``, ``message``, ``metadata.revision`` ...), so a Flux notification-controller's event
    receiver or anything that reads Flux events reads it."""
    SLACK = "slack"
    """A Slack incoming webhook (or a Slack-compatible one: Mattermost, Rocket.Chat)."""
    MSTEAMS = "msteams"
    """A Microsoft Teams workflow webhook (an Adaptive Card)."""
    GITHUB = "github"
    """A commit status on the GitHub (or GitHub Enterprise) repository of ``address``."""
    GITLAB = "gitlab"
    """A commit status on the GitLab project of ``address``."""


COMMIT_STATUS_TYPES = frozenset({ProviderType.GITHUB, ProviderType.GITLAB})


class Severity(StrEnum):
    """An event's severity as Flux names it: ``info`` (Normal events) or ``error`` (Warnings)."""

    INFO = "info"
    ERROR = "error"


_Text = Annotated[str, Field(max_length=2048)]


class NotificationProviderSpec(ApiModel):
    """Where to send."""

    type: ProviderType
    """``generic``, ``slack``, ``msteams``, ``github`` or ``gitlab``."""
    address: _Text | None = None
    """The webhook URL (``generic``, ``slack``, ``msteams``), or the repository URL
    (``github``: ``https://github.com/ORG/REPO``; ``gitlab``: ``https://gitlab.com/GROUP/PROJECT``).
    The Secret's ``address`` key, when set, wins (a webhook URL is a credential)."""
    channel: Annotated[str, Field(max_length=2048)] | None = None
    """The Slack channel to post to (when the webhook allows it)."""
    username: Annotated[str, Field(max_length=2048)] | None = None
    """The name the Slack message is posted as."""
    secret_ref: LocalObjectRef | None = None
    """A Secret in the provider's namespace: ``address`` (the webhook URL) and ``token`` (GitHub's or
    GitLab's API token; for ``generic``, sent as a bearer token)."""
    timeout: Duration = "15s"
    """How long one attempt to send may take."""
    suspend: bool = False
    """Send nothing."""
    service_account_name: DNSLabel | None = None
    """A tenant's provider (in its own namespace, with ``--tenant-notifications``): the
    ServiceAccount of that namespace whose rights read ``secretRef`` (the controller impersonates
    it; without it a provider with a Secret sends nothing).  Ignored in the platform's notification
    namespace, whose Secrets the controller reads itself."""


class NotificationProvider(ApiModel):
    """A receiver of StageSet events: the platform's (in the notification namespace, for any
    StageSet its alerts select) or, with ``--tenant-notifications``, a tenant's (in its namespace,
    for that namespace's StageSets only)."""

    api_version: Literal["stages.metio.wtf/v1"] = API_VERSION
    """``stages.metio.wtf/v1``."""
    kind: Literal["NotificationProvider"] = "NotificationProvider"
    """``NotificationProvider``."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: NotificationProviderSpec
    """Where to send."""


class EventSource(ApiModel):
    """StageSets whose events an alert sends (Flux's ``CrossNamespaceObjectReference``)."""

    kind: Literal["StageSet"] = "StageSet"
    """``StageSet``."""
    name: Annotated[str, Field(min_length=1, max_length=253)] = "*"
    """The StageSet's name, or ``*`` for every StageSet (of ``namespace``, matching ``matchLabels``)."""
    namespace: Annotated[str, Field(min_length=1, max_length=63)] = "*"
    """The StageSet's namespace, or ``*`` for every namespace."""
    # (Keys unbounded in the schema: the apiserver drops ``propertyNames``; no CEL rule reads them.)
    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict, max_length=32)
    """Labels the StageSet must carry (all of them)."""


class NotificationAlertSpec(ApiModel):
    """Which events to send, and to which provider."""

    provider_ref: LocalObjectRef
    """The ``NotificationProvider`` in the same namespace."""
    event_sources: list[EventSource] = Field(min_length=1, max_length=64)
    """StageSets whose events are sent (any one matching is enough)."""
    event_severity: Severity = Severity.INFO
    """``info``: every event; ``error``: Warnings only."""
    event_reasons: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list, max_length=64)
    """Event reasons to send (``ReconciliationSucceeded``, ``RolledBack``, ``AwaitingPromotion``,
    ``UpdateDeferred``, a Ready reason such as ``StageFailed`` ...); empty: every reason."""
    summary: Annotated[str, Field(max_length=255)] | None = None
    """A line added to every message (e.g. the cluster's name)."""
    suspend: bool = False
    """Send nothing."""


class NotificationAlert(ApiModel):
    """Which StageSet events go to a provider (platform-owned; read only in the notification
    namespace)."""

    api_version: Literal["stages.metio.wtf/v1"] = API_VERSION
    """``stages.metio.wtf/v1``."""
    kind: Literal["NotificationAlert"] = "NotificationAlert"
    """``NotificationAlert``."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: NotificationAlertSpec
    """Which events to send."""


__all__ = ["COMMIT_STATUS_TYPES", "EventSource", "NotificationAlert", "NotificationAlertSpec",
           "NotificationProvider", "NotificationProviderSpec", "ProviderType", "Severity"]
