"""The dry-run: what applying a stage would do, asked of the apiserver before anything is written.

:func:`dry_run` is the step every apply takes before its first write (:mod:`stageset.apply.write`);
:func:`preview` is the same step alone, with each object's planned action (``stageset diff``).

Identity: every read and server-side dry-run goes through the ``client`` handed in (the stage's
identity: the tenant's ServiceAccount, or the controller in single-tenant mode).

Invariants:
- Nothing here writes: every apply is ``dryRun=All``.
- A stage the tenant may not fully write fails whole: every object is dry-run, and any denial or
  validation error is raised (a denial before any other failure) once all have been asked.
- A change the apiserver refuses as immutable gets the stage's conflict policy
  (:mod:`stageset.apply.conflicts`): fail, recreate (``RECREATED``), or keep the live object
  untouched (``SKIPPED``).
- Only an object applied before is read first (or every object, for ``stageset diff``): reading
  a new one would only say to write it anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from stageset.api import InventoryEntry
from stageset.api.stageset import ConflictAction
from stageset.api.vocabulary import Reason
from stageset.apply.changeset import Action, ChangeSet
from stageset.apply.conflicts import ConflictResolver
from stageset.apply.core import (
    AppliedObject,
    ApplyCore,
    apply_error,
    comparable,
    created_namespaces,
    is_immutable_error,
)
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId, describe
from stageset.apply.ownership import FIELD_MANAGER, StageOwner, label_object
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject


@dataclass
class Preview:
    """What applying a stage would do (:func:`preview`)."""

    objects: list[AppliedObject]
    pending: list[KubeObject]
    """Manifests that cannot be dry-run before an earlier phase of the stage is written (their
    kind's CRD, or their Namespace, is in the same stage): they would be created then."""

    @property
    def changes(self) -> ChangeSet:
        return ChangeSet([o.change() for o in self.objects])


def dry_run(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject], conflicts: ConflictResolver,
            previous: Mapping[ObjectId, InventoryEntry], created: frozenset[str] = frozenset(),
            read_live: bool = False) -> list[AppliedObject]:
    """Dry-run each object's apply (and read the live one if we applied it before, or
    ``read_live``); raise on the first kind of failure.  Returns the objects that could not
    be dry-run because their namespace is one of ``created`` (Namespaces of this very stage,
    not written yet): they are previewed again in their phase, once it exists."""
    failures: list[StageError] = []
    deferred: list[AppliedObject] = []
    lock = threading.Lock()

    def one(item: AppliedObject) -> None:
        # Only an object we applied before can be unchanged: reading the others would
        # only tell us to write them anyway (saves a read per object on first apply).
        try:
            item.live = client.get(item.path) if read_live or item.id in previous else None
        except ApiError as error:
            if not error.not_found:
                with lock:
                    failures.append(apply_error(item, error, client.identity.describe()))
                return
            item.live = None
        try:
            item.dry_run = client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER,
                                        dry_run=True)
        except ApiError as error:
            if is_immutable_error(error):
                resolution = conflicts.resolve(item.manifest)
                if resolution.action is ConflictAction.RECREATE:
                    item.action = Action.RECREATED
                    return
                if resolution.action is ConflictAction.KEEP_EXISTING:
                    item.action = Action.SKIPPED  # left exactly as it is; still waited for
                    return
                if resolution.refusal:
                    with lock:
                        failures.append(StageError(Reason.STAGE_FAILED, f"{describe(item.manifest)} "
                                                   f"changed an immutable field: {resolution.refusal}"))
                    return
            details = error.body.get("details") or {}
            if error.not_found and details.get("kind") == "namespaces" and details.get("name") in created:
                with lock:
                    deferred.append(item)
                return
            with lock:
                failures.append(apply_error(item, error, client.identity.describe()))

    core.each(items, one)
    if failures:
        denied = [f for f in failures if f.reason is Reason.RBAC_DENIED]
        first = (denied or failures)[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise StageError(first.reason, first.message + more)
    return deferred


def preview(core: ApplyCore, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
            default_namespace: str, conflicts: ConflictResolver | None = None) -> Preview:
    """What an apply would change, writing nothing (``stageset diff``).

    The same dry-run step as an apply — labelled, bound, every object read and server-side
    dry-run as ``client``'s identity — then each object's planned action: ``UNCHANGED`` when the
    dry-run equals the live object, ``CREATED``, ``CONFIGURED``, or ``RECREATED`` / ``SKIPPED``
    (an immutable change the stage's conflict policy recreates or keeps).  Raises
    :class:`StageError` as an apply does (a denial fails the whole stage)."""
    labelled = [label_object(obj, owner) for obj in objects]
    bound = [(obj, core.bind_object(obj, default_namespace)) for obj in labelled]
    deferred = {id(item) for item in dry_run(
        core, client=client, items=[item for _, item in bound if item is not None],
        conflicts=conflicts or ConflictResolver.forcing(False), previous={},
        created=created_namespaces(labelled), read_live=True)}
    items = [item for _, item in bound if item is not None and id(item) not in deferred]
    pending = [obj for obj, item in bound if item is None or id(item) in deferred]
    for item in items:
        if item.action in (Action.RECREATED, Action.SKIPPED):
            continue
        if item.live is None:
            item.action = Action.CREATED
        elif comparable(item.dry_run) == comparable(item.live):
            item.action = Action.UNCHANGED
        else:
            item.action = Action.CONFIGURED
    return Preview(objects=items, pending=pending)
