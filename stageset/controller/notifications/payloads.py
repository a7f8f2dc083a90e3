"""What a notification says, per provider type: pure builders, no I/O.

Identity: none (pure).  Invariant: a payload holds only what the :class:`Notice` holds, and a
notice is built from an Event the recorder already redacted (:mod:`stageset.controller.events`)
and redacts every text again with the StageSet's redactor (:func:`notice`), so nothing of a
Secret reaches a payload.  A provider's own credentials (its ``token``) travel only in request
headers, never in a body.

The generic payload is Flux's event JSON (``involvedObject``, ``severity``, ``reason``,
``message``, ``metadata``, ``reportingController``), so whatever reads Flux's events reads ours.
Commit statuses name their context ``stageset/<namespace>/<name>``; their state follows the event:
a Warning fails it, a release held (awaiting promotion, deferred) keeps it pending, a success
passes it, and other Normal events set none.

Tenant text is inert in every receiver that formats it: an event's message quotes what a tenant's
Git holds (a kind, a name), its revision a tenant's branch or tag.  Slack's mrkdwn reads ``<...>``
as a link or a mention (``<!channel>``): every text of a Slack payload has ``&``, ``<`` and ``>``
escaped (:func:`slack_escape`, Slack's own rule), so nothing a tenant writes pings a channel or
disguises a link.  Teams' Adaptive Card text is a CommonMark subset (links ``[t](url)``, emphasis,
lists): every text there has its markdown punctuation backslash-escaped (:func:`teams_escape`).
GitHub's and GitLab's commit-status descriptions are plain text by their APIs; the generic payload
is Flux's event JSON, verbatim (its receiver must treat ``message`` as untrusted text, as Flux's do).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from stageset.api.notification import ProviderType, Severity
from stageset.api.vocabulary import EVENT_REVISION_ANNOTATION, EventReason, EventType, Reason

REVISION_ANNOTATION = EVENT_REVISION_ANNOTATION
REPORTING_CONTROLLER = "stageset-controller"
MAX_SHAS = 8
"""Commit statuses one event sets at most (a StageSet whose stages stand at several commits)."""
GITHUB_DESCRIPTION = 140  # GitHub refuses longer descriptions
GITLAB_DESCRIPTION = 255

PENDING_REASONS = frozenset({EventReason.AWAITING_PROMOTION.value, EventReason.UPDATE_DEFERRED.value,
                             Reason.SOAKING.value, Reason.PROGRESSING.value, Reason.STAGE_PROGRESSING.value})
SUCCESS_REASONS = frozenset({EventReason.RECONCILIATION_SUCCEEDED.value, EventReason.PROMOTED.value})

_SHA = re.compile(r"(?:sha1:|sha256:|^|[^0-9a-f])([0-9a-f]{40}|[0-9a-f]{64})(?![0-9a-f])")


@dataclass(frozen=True)
class Notice:
    """One event about one StageSet, redacted, as every provider type reads it."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    type: EventType
    reason: str
    message: str
    revision: str
    timestamp: str
    summary: str = ""

    @property
    def severity(self) -> Severity:
        return Severity.ERROR if self.type is EventType.WARNING else Severity.INFO

    @property
    def subject(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def text(self) -> str:
        """The message, with the alert's summary line before it."""
        return f"{self.summary}\n{self.message}" if self.summary else self.message


def notice(*, obj_ref: Mapping[str, str], type_: EventType, reason: str, message: str,
           annotations: Mapping[str, str] | None, timestamp: str, redact: Callable[[str], str]) -> Notice:
    """A notice of one recorded event; every text passes ``redact`` (again: the note already did)."""
    revision = (annotations or {}).get(REVISION_ANNOTATION, "")
    return Notice(api_version=obj_ref.get("apiVersion", ""), kind=obj_ref.get("kind", ""),
                  namespace=obj_ref.get("namespace", ""), name=obj_ref.get("name", ""),
                  uid=obj_ref.get("uid", ""), type=type_, reason=reason, message=redact(message),
                  revision=redact(revision), timestamp=timestamp)


def commit_shas(revision: str) -> list[str]:
    """The commits a revision names (``main@sha1:<hex>``, several joined by ``, ``), in order, each once."""
    found: list[str] = []
    for match in _SHA.finditer(revision.lower()):
        if match.group(1) not in found:
            found.append(match.group(1))
    return found[:MAX_SHAS]


class CommitState:
    SUCCESS = "success"
    FAILURE = "failure"
    PENDING = "pending"


def commit_state(item: Notice) -> str | None:
    """The commit status an event sets (GitHub's words); ``None``: this event sets none."""
    if item.type is EventType.WARNING:
        return CommitState.FAILURE
    if item.reason in PENDING_REASONS:
        return CommitState.PENDING
    if item.reason in SUCCESS_REASONS:
        return CommitState.SUCCESS
    return None


def context(item: Notice) -> str:
    return f"stageset/{item.namespace}/{item.name}"


_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_MARKDOWN = frozenset("\\`*_{}[]()<>#!|~")
_LIST_MARKER = re.compile(r"^(\s*\d*)([-+.)])(?=\s|$)", re.MULTILINE)


def slack_escape(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it literally: ``&``, ``<`` and ``>`` escaped, so no
    ``<!channel>``, ``<@user>`` or ``<url|label>`` of a tenant's is ever a mention or a link."""
    return text.translate(_SLACK)


def teams_escape(text: str) -> str:
    """``text`` as an Adaptive Card's markdown shows it literally: every punctuation mark that
    opens a link, an emphasis or code backslash-escaped, and a list marker at a line's start too."""
    escaped = "".join(f"\\{c}" if c in _MARKDOWN else c for c in text)
    def marker(match: re.Match[str]) -> str:
        number, mark = match.group(1), match.group(2)
        return f"{number}\\{mark}" if number.strip() or mark in "-+" else match.group(0)
    return _LIST_MARKER.sub(marker, escaped)


def generic(item: Notice) -> dict[str, object]:
    """Flux's event JSON."""
    metadata = {"revision": item.revision} if item.revision else {}
    if item.summary:
        metadata["summary"] = item.summary
    return {
        "involvedObject": {"apiVersion": item.api_version, "kind": item.kind, "namespace": item.namespace,
                           "name": item.name, "uid": item.uid},
        "severity": item.severity.value,
        "timestamp": item.timestamp,
        "message": item.message,
        "reason": item.reason,
        "metadata": metadata,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": REPORTING_CONTROLLER,
    }


def slack(item: Notice, *, channel: str | None = None, username: str | None = None) -> dict[str, object]:
    """A Slack incoming-webhook message: one attachment, red for a Warning, green otherwise."""
    esc = slack_escape
    fields = [{"title": "revision", "value": esc(item.revision), "short": False}] if item.revision else []
    body: dict[str, object] = {
        "text": esc(f"{item.subject}: {item.reason}"),
        "attachments": [{
            "color": "danger" if item.severity is Severity.ERROR else "good",
            "author_name": esc(item.subject),
            "title": esc(item.reason),
            "text": esc(item.text),
            "mrkdwn_in": ["text"],
            "fields": fields,
        }],
    }
    if channel:
        body["channel"] = channel
    if username:
        body["username"] = username
    return body


def msteams(item: Notice) -> dict[str, object]:
    """A Teams workflow-webhook message: an Adaptive Card with the subject, reason and facts."""
    esc = teams_escape
    facts = [{"title": "reason", "value": esc(item.reason)}]
    if item.revision:
        facts.append({"title": "revision", "value": esc(item.revision)})
    return {
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [
                    {"type": "TextBlock", "text": esc(item.subject), "weight": "Bolder", "size": "Medium",
                     "color": "Attention" if item.severity is Severity.ERROR else "Good"},
                    {"type": "TextBlock", "text": esc(item.text), "wrap": True},
                    {"type": "FactSet", "facts": facts},
                ],
            },
        }],
    }


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def github_status(item: Notice, state: str) -> dict[str, object]:
    return {"state": state, "context": context(item),
            "description": _cut(f"{item.reason}: {item.message}", GITHUB_DESCRIPTION)}


_GITLAB_STATES = {CommitState.SUCCESS: "success", CommitState.FAILURE: "failed",
                  CommitState.PENDING: "pending"}


def gitlab_status(item: Notice, state: str) -> dict[str, object]:
    return {"state": _GITLAB_STATES[state], "name": context(item),
            "description": _cut(f"{item.reason}: {item.message}", GITLAB_DESCRIPTION)}


@dataclass(frozen=True)
class Outgoing:
    """One HTTP request to make: a POST of ``body`` (JSON) to ``url`` with ``headers``."""

    url: str
    body: dict[str, object]
    headers: Mapping[str, str]


class AddressError(ValueError):
    """A provider's address cannot be sent to (told in the provider's failure, by its name only)."""


def _repository(address: str) -> tuple[str, str, str]:
    """``(scheme://host[:port], path without .git, host)`` of a repository URL."""
    parts = urlsplit(address)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise AddressError("the address must be an https:// repository URL")
    path = parts.path.strip("/").removesuffix(".git")
    if "/" not in path:
        raise AddressError("the address must name a repository: https://HOST/OWNER/REPO")
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return origin, path, parts.hostname


def github_api(address: str) -> tuple[str, str]:
    """``(API base, owner/repo)``: api.github.com for github.com, ``<host>/api/v3`` for Enterprise."""
    origin, path, host = _repository(address)
    owner_repo = "/".join(path.split("/")[:2])
    return ("https://api.github.com" if host == "github.com" else f"{origin}/api/v3"), owner_repo


def gitlab_api(address: str) -> tuple[str, str]:
    """``(API base, project id)``: the project's path, URL-encoded, as GitLab accepts for an id."""
    origin, path, _ = _repository(address)
    return f"{origin}/api/v4", quote(path, safe="")


def requests_for(type_: ProviderType, item: Notice, *, address: str, token: str = "",
                 channel: str | None = None, username: str | None = None) -> list[Outgoing]:
    """What one provider sends for one notice (none: a commit status provider and an event that
    sets none, or names no commit)."""
    json_headers = {"Content-Type": "application/json"}
    if type_ is ProviderType.GENERIC:
        headers = {**json_headers, **({"Authorization": f"Bearer {token}"} if token else {})}
        return [Outgoing(address, generic(item), headers)]
    if type_ is ProviderType.SLACK:
        return [Outgoing(address, slack(item, channel=channel, username=username), json_headers)]
    if type_ is ProviderType.MSTEAMS:
        return [Outgoing(address, msteams(item), json_headers)]
    state = commit_state(item)
    if state is None:
        return []
    if type_ is ProviderType.GITHUB:
        base, repo = github_api(address)
        headers = {**json_headers, "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28",
                   **({"Authorization": f"Bearer {token}"} if token else {})}
        return [Outgoing(f"{base}/repos/{repo}/statuses/{sha}", github_status(item, state), headers)
                for sha in commit_shas(item.revision)]
    base, project = gitlab_api(address)
    headers = {**json_headers, **({"PRIVATE-TOKEN": token} if token else {})}
    return [Outgoing(f"{base}/projects/{project}/statuses/{sha}", gitlab_status(item, state), headers)
            for sha in commit_shas(item.revision)]
