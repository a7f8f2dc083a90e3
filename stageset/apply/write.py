"""Apply one stage: dry-run everything as the tenant, write only what differs, phase by phase.

The verb that writes; it asks the others in turn: the warm check (:mod:`stageset.apply.warm`),
the dry-run (:mod:`stageset.apply.preview`) or the access reviews that replace it where a stage
opts in (:mod:`stageset.apply.access`), deletion for recreation
(:mod:`stageset.apply.delete`), and the wait for this stage's CRDs (:mod:`stageset.apply.wait`).

Identity: every request made here goes through the ``client`` handed in, which the
controller binds to the stage's identity (the tenant's ServiceAccount, or the
controller itself in single-tenant mode).  Discovery (the core's ``mapper``) is the only read
made with the controller's identity (or, on a remote cluster, the kubeconfig's).

Invariants:
- A stage the tenant may not fully write changes nothing: all objects whose kinds
  are served are server-side dry-run first (or access-reviewed, below); any denial or
  validation error a dry-run finds fails the stage before the first real write.
- An object whose dry-run result equals the live object costs no write, so a warm
  no-op reconcile writes nothing.
- A warm pass costs no dry-run for an object nobody changed (:mod:`stageset.apply.warm`):
  one object per kind and namespace is still dry-run, so rights taken away fail the pass with
  RBACDenied as before — except in a periodic pass (``recheck_rights`` false) when the identity
  showed those rights within ``--rights-recheck-interval`` (:mod:`stageset.apply.rights`).
  Any other object takes the dry-run path, so drift is still found and corrected.
- With ``preflight: AccessReview`` (opt-in per stage) objects new to the inventory are not dry-run:
  their rights are asked of RBAC, one access review per verb, kind and namespace
  (:mod:`stageset.apply.access`), before the first write, and each is then written create-only as
  the pilot below is (one that exists already takes the dry-run path then).  A denial still fails
  the stage before any write; a schema or admission refusal is found by that object's write, after
  its siblings may have been written (the trade-off the stage opts into).  Objects in the
  inventory, and those in a Namespace or of a kind the stage itself creates, are dry-run as before.
- On a stage's first apply one object is not dry-run: the first object the stage writes (new to
  the inventory, in the first phase), written only after every other object's dry-run passed.
  Its own write is its check: when it fails, nothing else has been written (and its dry-run
  then says why, or resolves an immutable-field conflict, as for any other object).
- A changed object whose manifest is the one we applied last time was changed by
  someone else: that is drift, corrected and reported.  A new manifest is not drift.  With
  ``warn_drift`` (``driftDetection.mode: Warn``) drift is not written at all — no patch, no
  re-creation, no recreate of an immutable change —: the object is left as it is (``SKIPPED``,
  ``drifted``) with the field paths that differ (:mod:`stageset.apply.differ`), and forgotten by
  the warm check, so every pass looks at it again.
- A change the apiserver refuses as immutable gets the stage's conflict policy
  (:mod:`stageset.apply.conflicts`): fail, recreate, or keep the live object untouched.
- A denial anywhere in the stage forgets the identity's shown rights for every kind and
  namespace of the stage: the next pass asks again.
- An object another live StageSet holds is never written (:mod:`stageset.apply.claims`): the stage
  fails with OwnershipConflict before its first write (the pilot is create-only, so it cannot
  write an existing object unseen); one whose holder let it go is adopted in place.

The result is a :class:`~stageset.apply.core.StageResult`: one action per object.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from stageset.api import InventoryEntry
from stageset.api.stageset import MAX_DRIFT_FIELDS, Preflight
from stageset.api.vocabulary import Reason
from stageset.apply import access, warm
from stageset.apply.changeset import Action
from stageset.apply.claims import Claims, create_only, read_existing, refuse_claimed
from stageset.apply.conflicts import ConflictResolver
from stageset.apply.core import (
    AppliedObject,
    ApplyCore,
    StageResult,
    apply_error,
    comparable,
    created_namespaces,
    namespace_of,
)
from stageset.apply.delete import delete_for_recreation
from stageset.apply.differ import differing_paths
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId, describe
from stageset.apply.ownership import FIELD_MANAGER, StageOwner, label_object
from stageset.apply.plan import phases
from stageset.apply.preview import dry_run
from stageset.apply.readiness import Status
from stageset.apply.wait import wait_ready
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject


def apply(core: ApplyCore, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
          default_namespace: str, claims: Claims, force: bool = False,
          conflicts: ConflictResolver | None = None,
          previous: Mapping[ObjectId, InventoryEntry] | None = None,
          recheck_rights: bool = True, preflight: Preflight = Preflight.DRY_RUN,
          warn_drift: bool = False) -> StageResult:
    """Apply ``objects`` as ``client``'s identity; raise :class:`StageError` on failure.

    ``claims`` says whether another StageSet still holds an object the stage renders (required:
    no path may write without asking).
    ``conflicts`` answers immutable-field conflicts (default: fail, or recreate with ``force``).
    ``recheck_rights=False`` (a periodic pass): unchanged objects of a kind and namespace where
    the identity showed its rights within ``rights_max_age`` are not dry-run.
    ``preflight=ACCESS_REVIEW``: objects new to the inventory are access-reviewed, not dry-run.
    ``warn_drift``: objects someone else changed since we applied this very manifest are left as
    they are and reported (``driftDetection.mode: Warn``)."""
    previous = previous or {}
    conflicts = conflicts or ConflictResolver.forcing(force)
    labelled = [label_object(obj, owner) for obj in objects]
    bound = [core.bind_object(obj, default_namespace) for obj in labelled]
    served = [b for b in bound if b is not None]
    try:
        return _phases(core, client=client, labelled=labelled, bound=bound, served=served,
                       created=created_namespaces(labelled), default_namespace=default_namespace,
                       conflicts=conflicts, previous=previous, owner=owner, recheck_rights=recheck_rights,
                       claims=claims, preflight=preflight, warn_drift=warn_drift)
    except StageError as error:
        if error.reason is Reason.RBAC_DENIED:
            warm.rights_denied(core, client=client, items=served)
        raise


def _phases(core: ApplyCore, *, client: KubeClient, labelled: list[KubeObject],
            bound: list[AppliedObject | None], served: list[AppliedObject], created: frozenset[str],
            default_namespace: str, conflicts: ConflictResolver, previous: Mapping[ObjectId, InventoryEntry],
            owner: StageOwner, recheck_rights: bool, claims: Claims, preflight: Preflight,
            warn_drift: bool = False) -> StageResult:
    """The warm check, one dry-run of everything it did not settle (and whether another StageSet
    holds any of it) or, with ``AccessReview``, the access reviews of its new objects and a dry-run
    of the rest, then phase by phase: the late dry-runs (kinds or namespaces an earlier phase
    made), the pilot (or the reviewed objects, create-only), the writes, the CRD wait."""
    settled = warm.unchanged(core, client=client, owner=owner, items=served, previous=previous,
                             recheck_rights=recheck_rights)
    bound_by_object = {id(obj): item for obj, item in zip(labelled, bound, strict=True)}
    staged = phases(labelled)
    reviewed: set[int] = set()
    pilot: AppliedObject | None = None
    if preflight is Preflight.ACCESS_REVIEW:
        fresh = [b for b in served if id(b) not in settled and b.id not in previous
                 and (namespace_of(b) or "") not in created]
        reviewed = {id(item) for item in access.reviewed(core, client=client, items=fresh, previous=previous)}
    else:
        pilot = _pilot(staged[0] if staged else [], bound_by_object, previous, created, settled)
    unsettled = [b for b in served if id(b) not in settled and b is not pilot and id(b) not in reviewed]
    deferred = {id(item) for item in dry_run(core, client=client, items=unsettled, conflicts=conflicts,
                                             previous=previous, created=created)}
    _held(core, client=client, items=[i for i in unsettled if id(i) not in deferred], previous=previous,
          owner=owner, claims=claims)
    if pilot is not None and any(i.id not in previous and i.live is not None for i in unsettled):
        # Objects new to the inventory exist already (an adoption): the pilot likely does too, so
        # it is dry-run like the others rather than written create-only and refused.
        dry_run(core, client=client, items=[pilot], conflicts=conflicts, previous=previous)
        _held(core, client=client, items=[pilot], previous=previous, owner=owner, claims=claims)
        pilot = None
    result = StageResult()
    for phase in staged:
        items: list[AppliedObject] = []
        late: list[AppliedObject] = []
        for obj in phase:
            item = bound_by_object[id(obj)]
            if item is None:
                # Its kind appeared in an earlier phase of this stage (a CRD): preview it now.
                item = core.bind_object(obj, default_namespace)
                if item is None:
                    raise StageError(Reason.STAGE_FAILED, f"{describe(obj)}: the cluster serves no "
                                     f"kind {obj.get('kind')} in {obj.get('apiVersion')}")
                late.append(item)
            elif id(item) in deferred:
                late.append(item)  # its namespace is written by an earlier phase of this stage
            items.append(item)
        dry_run(core, client=client, items=late, conflicts=conflicts, previous=previous)
        _held(core, client=client, items=late, previous=previous, owner=owner, claims=claims)
        if pilot is not None and pilot in items:
            _write_pilot(core, client=client, item=pilot, conflicts=conflicts, previous=previous,
                         owner=owner, claims=claims)
        core.each([i for i in items if id(i) in reviewed], lambda item: _write_pilot(
            core, client=client, item=item, conflicts=conflicts, previous=previous, owner=owner,
            claims=claims))
        write(core, client=client, items=[i for i in items if i is not pilot and id(i) not in settled
                                          and id(i) not in reviewed], previous=previous,
              warn_drift=warn_drift)
        _wait_established(core, client=client, items=items)
        result.objects.extend(items)
    warm.remember(core, client=client, items=result.objects)
    warm.rights_shown(core, client=client, items=result.objects, settled=settled)
    return result


def _pilot(first_phase: list[KubeObject], bound: Mapping[int, AppliedObject | None],
           previous: Mapping[ObjectId, InventoryEntry], created: frozenset[str], settled: set[int]
           ) -> AppliedObject | None:
    """The object a stage writes first without a dry-run: the first of its first phase that is new
    to the inventory (a known one's dry-run also tells whether it needs a write at all), of a
    served kind, not in a Namespace this stage creates, and sharing its kind and namespace with
    another new object of the stage — whose dry-run, made first, shows the identity may create
    and patch such objects there, so a denial of the write itself is all but ruled out."""
    fresh = [item for obj in first_phase if (item := bound.get(id(obj))) is not None
             and item.id not in previous and id(item) not in settled]
    for item in fresh:
        namespace = item.manifest["metadata"].get("namespace")
        if str(namespace or "") in created:
            continue
        if any(other is not item and other.resource == item.resource
               and other.manifest["metadata"].get("namespace") == namespace for other in fresh):
            return item
    return None


def _held(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject],
          previous: Mapping[ObjectId, InventoryEntry], owner: StageOwner, claims: Claims) -> None:
    """After a dry-run, before any write: read what exists but is new to the inventory, and fail
    with OwnershipConflict if another live StageSet holds any of it."""
    read_existing(core, client=client, items=items, previous=previous)
    refuse_claimed(items, owner=owner, claims=claims, previous=previous)


def _write_pilot(core: ApplyCore, *, client: KubeClient, item: AppliedObject, conflicts: ConflictResolver,
                 previous: Mapping[ObjectId, InventoryEntry], owner: StageOwner, claims: Claims) -> None:
    """The stage's first write (or, with ``AccessReview``, each reviewed object's write), made
    without a dry-run once every other object's passed, and create-only: when it fails (the
    object exists — perhaps another StageSet's —, or anything else) nothing else has been written
    (with ``AccessReview``: nothing of what a dry-run would have checked), and its dry-run says why
    (or resolves an immutable-field conflict, or finds its holder) before it is written as any
    other object would be."""
    status: list[int] = []
    try:
        item.live = client.apply(item.path, create_only(item.manifest), field_manager=FIELD_MANAGER,
                                 status=status)
    except ApiError:
        dry_run(core, client=client, items=[item], conflicts=conflicts, previous=previous)
        _held(core, client=client, items=[item], previous=previous, owner=owner, claims=claims)
        write(core, client=client, items=[item], previous=previous)
        return
    item.action = Action.CREATED if status == [201] else Action.CONFIGURED


def write(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject],
          previous: Mapping[ObjectId, InventoryEntry], warn_drift: bool = False) -> None:
    """Write each dry-run object whose dry-run differs from the live one (recreating what the
    conflict policy recreates, leaving what it keeps); set its final action and drift.  With
    ``warn_drift``, drift is left as it is and described instead of written."""
    def one(item: AppliedObject) -> None:
        if item.action is Action.SKIPPED:
            return  # conflictPolicy KeepExisting: the live object stays as it is
        recreate = item.action is Action.RECREATED
        if not recreate and item.id in previous and item.dry_run is not None and \
                comparable(item.dry_run) == comparable(item.live):
            item.action = Action.UNCHANGED  # already as wanted: no write
            return
        before = previous.get(item.id)
        if warn_drift and before is not None and before.h == item.digest:
            # Changed by someone else since we applied this manifest: reported, never written.
            item.action, item.drifted = Action.SKIPPED, True
            wanted = item.dry_run if item.dry_run is not None else item.manifest
            item.differs = tuple(differing_paths(item.live, wanted, limit=MAX_DRIFT_FIELDS,
                                                 only_wanted=item.dry_run is None))
            return
        if recreate:
            delete_for_recreation(core, client=client, item=item)
        existed = item.live is not None
        try:
            item.live = client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER)
        except ApiError as error:
            raise apply_error(item, error, client.identity.describe()) from error
        if not recreate:
            # Not read first (new to the inventory): a dry-run of an existing object carries
            # its resourceVersion, one of a create does not.
            existed = existed or bool(((item.dry_run or {}).get("metadata") or {}).get("resourceVersion"))
            item.action = Action.CONFIGURED if existed else Action.CREATED
        item.drifted = before is not None and before.h == item.digest and not recreate

    core.each(items, one)


def _wait_established(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject]) -> None:
    """CRDs of this phase must serve before the next phase creates their objects."""
    crds = [i for i in items if i.manifest.get("kind") == "CustomResourceDefinition"]
    if not crds:
        return
    verdict = wait_ready(core, client=client, applied=crds, timeout=core.settings.crd_timeout,
                         stop=threading.Event())
    if verdict.status is not Status.CURRENT:
        raise StageError(Reason.STAGE_FAILED,
                         f"CustomResourceDefinitions not established: {verdict.message}")
