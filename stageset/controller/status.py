"""Writing the status of our own kinds: one writer per reconcile, whole values in, nothing changed in place.

Identity: status is written with the controller's own identity — the status
subresource of StageSets and GitRepositories is the one thing (with finalizers) the
controller's ClusterRole may write.  A write that would change nothing is skipped, so a
warm no-op reconcile makes no status write either.

A reconcile hands its :class:`StatusWriter` whole status values, made by pure functions
(:func:`~stageset.controller.conditions.concluded` and, for a StageSet pass,
:mod:`stageset.controller.stageset.progress`).  The writer never changes the object it was
given — objects from the watch cache are shared with the watch and the next reconcile, and
are read-only (as in controller-runtime and kopf) — and keeps the object as written instead:
a new value after each write, told to ``on_write`` (the manager keeps it until the watch
cache has caught up).

Every message that leaves through status passes :meth:`StatusWriter.write`, which runs it
through the reconcile's redactor (Secret values never reach status).  Every message of a
condition that is not ``Ready=True`` ends with the runbook link of its reason
(:func:`~stageset.controller.conditions.with_runbook`), as the reference controller's do:
``…; runbook: <base>/<reason>/``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Generic

from pydantic import ValidationError

from stageset.api import Condition, GitRepositoryStatus, StageSetStatus, StageTargetStatus, format_time
from stageset.api.fleet import FleetRolloutStatus
from stageset.api.vocabulary import ConditionType, Reason
from stageset.controller.clock import Clock
from stageset.controller.conditions import S, concluded, find, redacted
from stageset.controller.conditions import runbook_url as runbook_url  # re-exported
from stageset.controller.conditions import with_runbook as with_runbook  # re-exported
from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject, metadata

REQUESTED_AT = "reconcile.fluxcd.io/requestedAt"

# Told every object a reconcile's own writes made (status, the inventory record, finalizers).
WriteListener = Callable[[KubeObject], None]


def dump_status(status: StageSetStatus | GitRepositoryStatus | StageTargetStatus | FleetRolloutStatus
                ) -> dict[str, Any]:
    """The wire form of a status model (the one serializer)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v not in (None, [], {})}


def with_version(obj: KubeObject, written: KubeObject, **metadata_changes: Any) -> KubeObject:
    """``obj`` after a write of ours: a new value with the resourceVersion the write made (and
    ``metadata_changes``); ``obj`` itself is left as it was."""
    meta = {**metadata(obj), **metadata_changes}
    if version := metadata(written).get("resourceVersion"):
        meta["resourceVersion"] = version
    return {**obj, "metadata": meta}


def write_status(client: KubeClient, *, resource: Resource, obj: KubeObject, status: dict[str, Any]
                 ) -> KubeObject | None:
    """Replace ``status`` fields via a merge patch.  Returns the object as written — a new value:
    ``obj`` with this status and the resourceVersion the write made (later optimistic writes, such
    as finalizers, must test against it) — or ``None`` when nothing changed or the object is gone."""
    if _comparable(obj.get("status") or {}) == _comparable(status):
        return None
    meta = metadata(obj)
    path = resource.object_path(name=meta["name"], namespace=meta.get("namespace")) + "/status"
    # Merge patch: lists (conditions, stages) are replaced whole; removed keys are nulled.
    body = {"status": {**{k: None for k in (obj.get("status") or {}) if k not in status}, **status}}
    try:
        written = client.request("PATCH", path, body=body, content_type="application/merge-patch+json")
    except ApiError as error:
        if error.not_found:
            return None
        raise
    return {**with_version(obj, written), "status": copy.deepcopy(status)}


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


class StatusWriter(Generic[S]):
    """The one writer of one object's status during one reconcile.

    :attr:`status` is the status as last written (at first: as read, with the
    ``requestedAt`` it acts on); new values are made from it, never by changing it.
    Conditions are always summarized from those the object had when the reconcile began
    (:attr:`conditions`), so a transition time moves only when the status really changed.
    Raises ``ValidationError`` when the stored status cannot be read (nothing is written then).
    """

    def __init__(self, *, client: KubeClient, resource: Resource, obj: KubeObject, model: type[S],
                 clock: Clock, redact: Callable[[str], str] = _identity,
                 runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL, on_write: WriteListener | None = None):
        self._client = client
        self._runbooks = runbook_base_url
        self._resource = resource
        self._clock = clock
        self._on_write = on_write
        self.redact = redact
        self._obj = obj
        self.writes = 0
        """How many writes this reconcile made to the object (status, finalizer, record)."""
        read = model.model_validate(obj.get("status") or {})
        self.conditions: tuple[Condition, ...] = tuple(read.conditions)
        self.generation = int(metadata(obj).get("generation", 0))
        requested = requested_at(obj)
        self.requested = bool(requested) and requested != read.last_handled_reconcile_at
        """Someone asked for this reconcile (a ``requestedAt`` not acted on yet): not a periodic one."""
        self._status: S = read.model_copy(update={"last_handled_reconcile_at": requested}) if requested \
            else read

    @property
    def obj(self) -> KubeObject:
        """The object as this reconcile's writes left it (read-only: a new value after each write)."""
        return self._obj

    @property
    def status(self) -> S:
        """The status as last written (read-only: make new values with ``model_copy(update=…)``)."""
        return self._status

    def condition(self, type_: ConditionType) -> Condition | None:
        """A condition as it was when the reconcile began."""
        return find(self.conditions, type_)

    def now(self) -> str:
        return format_time(self._clock())

    def write(self, status: S) -> bool:
        """Write ``status`` (messages redacted); ``False`` when nothing changed."""
        self._status = redacted(status, self.redact)
        written = write_status(self._client, resource=self._resource, obj=self._obj,
                               status=dump_status(self._status))
        if written is None:
            return False
        self.wrote(written)
        return True

    def conclude(self, *, ready: bool | None, reason: Reason, message: str, stalled: bool = False,
                 status: S | None = None) -> bool:
        """Write ``status`` (default: :attr:`status`) with the conditions of this outcome; a non-ready
        message gets its runbook link."""
        return self.write(concluded(self._status if status is None else status, start=self.conditions,
                                    generation=self.generation, ready=ready, reason=reason, message=message,
                                    now=self.now(), redact=self.redact, runbook_base_url=self._runbooks,
                                    stalled=stalled))

    def wrote(self, obj: KubeObject) -> None:
        """A write of this reconcile made ``obj`` (status here; a finalizer or record elsewhere)."""
        self._obj = obj
        self.writes += 1
        if self._on_write is not None:
            self._on_write(obj)
