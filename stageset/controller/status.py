"""Writing the status of our own kinds: built as the pydantic status models, written in one place.

Identity: status is written with the controller's own identity — the status
subresource of StageSets and GitRepositories is the one thing (with finalizers) the
controller's ClusterRole may write.  A write that would change nothing is skipped, so a
warm no-op reconcile makes no status write either.

Every message that leaves through status passes :meth:`StatusReport.write`, which runs
it through the report's redactor (Secret values never reach status).  Every message of a
condition that is not ``Ready=True`` ends with the runbook link of its reason
(:func:`with_runbook`), as the reference controller's do: ``…; runbook: <base>/<reason>/``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from stageset.api import Condition, GitRepositoryStatus, StageSetStatus, format_time
from stageset.api.vocabulary import ConditionType, Reason
from stageset.controller.clock import Clock
from stageset.controller.conditions import MAX_MESSAGE, find, summarize
from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, metadata

REQUESTED_AT = "reconcile.fluxcd.io/requestedAt"

S = TypeVar("S", StageSetStatus, GitRepositoryStatus)


def dump_status(status: StageSetStatus | GitRepositoryStatus) -> dict[str, Any]:
    """The wire form of a status model (the one serializer)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v not in (None, [], {})}


def write_status(client: KubeClient, *, resource: Resource, obj: KubeObject, status: dict[str, Any]) -> bool:
    """Replace ``status`` fields via a merge patch; ``False`` when nothing changed or it is gone."""
    if _comparable(obj.get("status") or {}) == _comparable(status):
        return False
    meta = metadata(obj)
    path = resource.object_path(name=meta["name"], namespace=meta.get("namespace")) + "/status"
    # Merge patch: lists (conditions, stages) are replaced whole; removed keys are nulled.
    body = {"status": {**{k: None for k in (obj.get("status") or {}) if k not in status}, **status}}
    try:
        written = client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
    except ApiError as error:
        if error.not_found:
            return False
        raise
    # Later optimistic writes (finalizers) must test against the version we just made.
    if version := metadata(written).get("resourceVersion"):
        obj["metadata"]["resourceVersion"] = version
    # Remember what we wrote (a copy: the caller may keep changing its model).
    obj["status"] = copy.deepcopy(status)
    return True


def requested_at(obj: KubeObject) -> str | None:
    """The ``reconcile.fluxcd.io/requestedAt`` annotation (asks for a reconcile now), as in Flux."""
    value = (metadata(obj).get("annotations") or {}).get(REQUESTED_AT)
    return str(value) if value else None


def validation_message(error: ValidationError) -> str:
    """The first problem pydantic found, as ``field.path: message``."""
    first = error.errors()[0]
    return f"{'.'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg')}"


def _identity(text: str) -> str:
    return text


def runbook_url(base: str, reason: Reason) -> str:
    """The runbook page of ``reason`` under ``base`` (``https://…/runbooks/`` -> ``…/rbacdenied/``)."""
    return f"{base.rstrip('/')}/{reason.value.lower()}/"


def with_runbook(message: str, reason: Reason, base: str) -> str:
    """``message`` ending with its runbook link (cut first, so the link always survives the bound)."""
    if not base:
        return message[:MAX_MESSAGE]
    link = f"runbook: {runbook_url(base, reason)}"
    if not message:
        return link
    suffix = f"; {link}"
    return message[:MAX_MESSAGE - len(suffix)] + suffix


class StatusReport(Generic[S]):
    """The status one reconcile builds for one object; :meth:`conclude` and :meth:`write` write it.

    Conditions are always summarized from those the object had when the reconcile
    began, so a transition time moves only when the status really changed.  Raises
    ``ValidationError`` when the stored status cannot be read (nothing is written then).
    """

    def __init__(self, *, client: KubeClient, resource: Resource, obj: KubeObject, model: type[S],
                 clock: Clock, redact: Callable[[str], str] = _identity,
                 runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL):
        self._client = client
        self._runbooks = runbook_base_url
        self._resource = resource
        self._clock = clock
        self.redact = redact
        self.obj = obj
        self.status: S = model.model_validate(obj.get("status") or {})
        self._conditions = list(self.status.conditions)
        self.generation = int(metadata(obj).get("generation", 0))
        if requested := requested_at(obj):
            self.status.last_handled_reconcile_at = requested

    def condition(self, type_: ConditionType) -> Condition | None:
        """A condition as it was when the reconcile began."""
        return find(self._conditions, type_)

    def now(self) -> str:
        return format_time(self._clock())

    def conclude(self, *, ready: bool | None, reason: Reason, message: str, stalled: bool = False) -> None:
        """Set the conditions for this outcome and write; a non-ready message gets its runbook link."""
        self.status.observed_generation = self.generation
        # Redacted before it is cut to length: a cut must never leave half a Secret value.
        text = self.redact(message)
        if ready is not True:
            text = with_runbook(text, reason, self._runbooks)
        self.status.conditions = summarize(self._conditions, ready=ready, reason=reason,
                                           message=text,
                                           generation=self.generation, now=self.now(), stalled=stalled)
        self.write()

    def write(self) -> bool:
        """Write the status as it stands (messages redacted); ``False`` when nothing changed."""
        for condition in self.status.conditions:
            condition.message = self.redact(condition.message)[:MAX_MESSAGE]
        if isinstance(self.status, StageSetStatus):
            for stage in self.status.stages:
                if stage.message:
                    stage.message = self.redact(stage.message)[:MAX_MESSAGE]
        return write_status(self._client, resource=self._resource, obj=self.obj,
                            status=dump_status(self.status))
