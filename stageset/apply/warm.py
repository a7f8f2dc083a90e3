"""The warm check: which of a stage's objects nobody changed since our last write or check.

A warm pass costs no dry-run for an object nobody changed: an object in the inventory whose
manifest is the one applied last time, and whose resourceVersion (from one label-selected list per
kind and namespace) is still the one our last write or check left (:mod:`stageset.apply.versions`),
is unchanged.  This module also keeps the two maps that check trusts: :func:`remember` records
each object as a pass left it, :func:`rights_shown` and :func:`rights_denied` what the identity
showed it may write (:mod:`stageset.apply.rights`).

Identity: every list and dry-run goes through the ``client`` handed in (the stage's identity);
``versions`` and ``rights`` are keyed by cluster and identity, so nothing one identity saw or
showed settles an object for another.

Invariants:
- Rights taken away are still heard: one object per kind and namespace is dry-run before its
  group is settled — except in a periodic pass (``recheck_rights`` false) when the identity showed
  those rights within ``--rights-recheck-interval``; then the list alone decides, and the pass
  writes nothing either way.
- A list or probe that fails settles nothing: its objects take the dry-run path, which says what
  is wrong (a denial there forgets the rights).
- A probe whose dry-run differs from the listed object settles nothing for that object (drift the
  version missed, or what admission changes, is found on the dry-run path).
- An object not left as wanted (failed, skipped, deleted) is forgotten: its next pass dry-runs it.
"""

from __future__ import annotations

from collections.abc import Mapping

from stageset.api import InventoryEntry
from stageset.apply.changeset import Action
from stageset.apply.core import AppliedObject, ApplyCore, comparable, namespace_of
from stageset.apply.inventory import ObjectId
from stageset.apply.ownership import FIELD_MANAGER, StageOwner
from stageset.apply.versions import Seen
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject


def unchanged(core: ApplyCore, *, client: KubeClient, owner: StageOwner, items: list[AppliedObject],
              previous: Mapping[ObjectId, InventoryEntry], recheck_rights: bool = True) -> set[int]:
    """The objects nobody changed since our last write or check (their ``id()``); each gets
    the listed object as ``live`` and ``dry_run`` (readiness is judged from it) and action
    ``UNCHANGED``.  One label-selected list per kind and namespace, as ``client``; a list
    that fails (the identity may not list that kind) leaves its objects to the dry-run path.
    With ``recheck_rights`` (or rights not shown recently) one object per kind and namespace is
    dry-run first."""
    groups: dict[tuple[Resource, str], list[tuple[AppliedObject, Seen]]] = {}
    for item in items:
        before = previous.get(item.id)
        seen = core.versions.get(core.version_key(client, item.path)) if before is not None else None
        if before is None or before.h != item.digest or seen is None or seen.digest != item.digest:
            continue
        namespace = str(item.manifest["metadata"].get("namespace") or "")
        groups.setdefault((item.resource, namespace), []).append((item, seen))
    settled: set[int] = set()
    selector = ",".join(f"{k}={v}" for k, v in sorted(owner.labels().items()))
    for (resource, namespace), members in groups.items():
        # Nothing is written when nothing changed, but a pass still says whether the identity
        # may write what it owns: one object of the group is dry-run (rights taken away are
        # RBACDenied now, not at the next change; what admission says of it is heard too).
        probe: AppliedObject | None = members[0][0]
        rights = core.rights_key(client, resource, namespace or None)
        if not recheck_rights and core.rights.fresh(rights):
            probe = None  # a periodic pass, and the identity showed these rights recently
        try:
            checked = None if probe is None else client.apply(
                probe.path, probe.manifest, field_manager=FIELD_MANAGER, dry_run=True)
            live = list_owned(client, resource=resource, namespace=namespace or None, selector=selector)
        except ApiError:
            continue  # the dry-run path says what is wrong (a denial there forgets the rights)
        if probe is not None:
            core.rights.shown(rights)
        for item, seen in members:
            found = live.get(str(item.manifest["metadata"]["name"]))
            if found is None or str((found.get("metadata") or {}).get("resourceVersion")) != seen.version:
                continue
            found = {"apiVersion": item.manifest.get("apiVersion"), "kind": item.manifest.get("kind"),
                     **found}
            if item is probe and comparable(checked) != comparable(found):
                continue
            item.live = item.dry_run = found
            item.action = Action.UNCHANGED
            settled.add(id(item))
    return settled


def list_owned(client: KubeClient, *, resource: Resource, namespace: str | None, selector: str
               ) -> dict[str, KubeObject]:
    """Objects of ``resource`` in ``namespace`` carrying the stage's owner labels, by name."""
    found: dict[str, KubeObject] = {}
    query: dict[str, str | int | bool] = {"labelSelector": selector, "limit": 500}
    path = resource.collection_path(namespace)
    while True:
        page = client.request("GET", path, query=query)
        for obj in page.get("items") or []:
            found[str((obj.get("metadata") or {}).get("name"))] = obj
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return found
        query = {**query, "continue": str(token)}


def remember(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject]) -> None:
    """Each object as this pass left it: written, or found as wanted."""
    for item in items:
        version = str(((item.live or {}).get("metadata") or {}).get("resourceVersion") or "")
        key = core.version_key(client, item.path)
        if item.action in (Action.CREATED, Action.CONFIGURED, Action.RECREATED, Action.UNCHANGED) \
                and version:
            core.versions.put(key, Seen(version=version, digest=item.digest))
        else:
            core.versions.drop(key)


def rights_shown(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject], settled: set[int]
                 ) -> None:
    """Every object not settled by the list was dry-run or written, successfully: its identity
    has shown it may write that kind there."""
    for item in items:
        if id(item) not in settled and item.action is not Action.SKIPPED:
            core.rights.shown(core.rights_key(client, item.resource, namespace_of(item)))


def rights_denied(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject]) -> None:
    """Refused somewhere in the stage: every kind and namespace it writes is asked again by the
    next pass of any stage of this identity."""
    for item in items:
        core.rights.denied(core.rights_key(client, item.resource, namespace_of(item)))
