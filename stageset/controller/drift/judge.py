"""Is a watch event about an applied object drift?  Pure: fingerprints and the one rule.

A :class:`Fingerprint` is an object as a pass left it, reduced to what tells a change that is not
ours: its uid, its ``resourceVersion``, and a digest of the fields our field manager owns by
server-side apply (``managedFields``: manager ``stageset-controller``, operation ``Apply``, no
subresource).  Server-side apply moves a field out of our set whenever someone else changes its
value — an update, a patch, ``kubectl edit``, another applier forcing it — and leaves the set
alone for everything else: status written by a controller, fields the apiserver defaults, fields
another manager owns, metadata nobody applied.  So :func:`judge` answers, for one event:

- ``DELETED`` (the object is gone, or a label selector no longer matches it: an owner label was
  removed) — drift, unless it is about an earlier incarnation (another uid): a stale event;
- the same ``resourceVersion`` as we left it, or an older one — nothing (our own write, or an event
  we outran);
- another uid — drift (someone deleted and re-created it);
- our field set as we left it — a change of what we do not manage: nothing;
- anything else — drift.

An object known without a fingerprint (a ``Warn`` pass left it deleted, or its state is unknown)
takes any event as drift: the caller then keeps the event's state as the fingerprint, so one drift
triggers one pass, not one per status update that follows.

Identity: none (no I/O).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

import orjson

from stageset.apply.ownership import FIELD_MANAGER
from stageset.kube.types import KubeObject


class Verdict(StrEnum):
    DRIFT = "drift"
    """Someone else changed (or deleted, or unlabelled) what we applied: a pass corrects or reports it."""
    OURS = "ours"
    """As we left it, or older: our own write, or an event the pass already outran."""
    UNMANAGED = "unmanaged"
    """A change to what we do not manage (status, defaults, another manager's fields)."""
    STALE = "stale"
    """About an earlier incarnation of the object."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    uid: str
    version: str
    fields: bytes
    """A digest of our field manager's applied field sets (8 bytes)."""


def owned_fields(obj: KubeObject) -> bytes:
    """A digest of the field sets our field manager applied (empty sets: a digest too)."""
    entries = [(str(entry.get("apiVersion") or ""), entry.get("fieldsV1") or {})
               for entry in (obj.get("metadata") or {}).get("managedFields") or []
               if isinstance(entry, dict) and entry.get("manager") == FIELD_MANAGER
               and entry.get("operation") == "Apply" and not entry.get("subresource")]
    return hashlib.blake2b(orjson.dumps(sorted(entries, key=lambda e: e[0]), option=orjson.OPT_SORT_KEYS),
                           digest_size=8).digest()


def fingerprint(obj: KubeObject | None) -> Fingerprint | None:
    """``obj`` as a pass left it (``None``: not there)."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    return Fingerprint(uid=str(meta.get("uid") or ""), version=str(meta.get("resourceVersion") or ""),
                       fields=owned_fields(obj))


def _older(version: str, than: str) -> bool:
    return version.isdigit() and than.isdigit() and int(version) < int(than)


def judge(event: str, obj: KubeObject, known: Fingerprint | None) -> Verdict:
    """What the watch event ``event`` (``ADDED``, ``MODIFIED``, ``DELETED``) about ``obj`` means for
    an object a pass left as ``known`` (see the module docstring)."""
    if known is None:
        return Verdict.DRIFT
    meta = obj.get("metadata") or {}
    uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    if event == "DELETED":
        return Verdict.STALE if uid and known.uid and uid != known.uid else Verdict.DRIFT
    if known.uid and uid and uid != known.uid:
        return Verdict.STALE if _older(version, known.version) else Verdict.DRIFT
    if version and (version == known.version or _older(version, known.version)):
        return Verdict.OURS
    if owned_fields(obj) == known.fields:
        return Verdict.UNMANAGED
    return Verdict.DRIFT
