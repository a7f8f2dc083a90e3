"""The durable inventory record: where a StageSet's objects can be found if status is lost.  Pure.

``status.inventory`` is the working inventory, but status is what backups leave out (Velero
restores objects without it) and what a re-creation starts without.  So each StageSet also
carries, in its own metadata, a compact record of *where* its objects live — per stage, the
ServiceAccount that applied them and the kinds (API version + kind) with the namespaces
used — in the annotation :data:`ANNOTATION`.  Never the objects themselves: those are found
on the cluster by their owner labels (:mod:`stageset.apply.ownership`), which are the truth,
so the record only changes when a stage starts or stops using a kind or namespace.

Rules:
- the record is grown (with the kinds a stage renders) *before* anything is applied, and
  shrunk to the kinds still in the inventory only *after* a complete prune, so it always
  covers every object that could carry our labels;
- ``rebuild`` marks a rebuild that could not see everything (a list was denied or failed):
  it is tried again on every pass until it completes, and nothing is pruned meanwhile;
- each stage record names the cluster it was applied on (a target id, :data:`THIS_CLUSTER` when
  absent) and, for a remote, how it was reached: the kubeConfig Secret of the StageSet's namespace
  (``kc``: name and key), its workload-identity ConfigMap (``cm``: name) or the platform's StageTarget
  (``st``: namespace and name) — references only, never a credential;
  when the stages move to another cluster, the records of the cluster they leave go to
  ``previous`` (with ``since``, when the move began) until that cluster is cleaned up, so a
  controller that restarts, or a StageSet whose status was lost, still finds them.

Format history (:data:`FORMAT`; :func:`parse` migrates): 1 — no targets (every stage on this
cluster); 2 — targets, ``previous`` and ``since``; ``st`` was added to format 2 later without a new
number, as an optional key: a record without it reads as before (a remote reached through
``kc`` only), and an older format-2 reader ignores it (so a rollback does not turn every record
into a rebuild); ``cm`` was added the same way (an older reader sees a remote with no way recorded
to reach it again, as it would any record it cannot follow).  A format this controller does not
know reads as "look on the cluster again" (``rebuild``).

The record is written by the controller but sits in the StageSet's own metadata, where its tenant
can edit it: every value is checked where it is parsed (:func:`parse`) — stage names, the
ServiceAccount, kinds and namespaces (they become list paths), targets, the ``kc`` Secret, the ``cm``
ConfigMap and ``st`` StageTarget references, ``since`` — with the rules the API applies to the same
names.  A record of a known format with a value that fails them reads as "look on the cluster
again" *and* names the field (:attr:`Record.problem`): the StageSet's pass stops there with ``InvalidSpec``
(:func:`problem_of`), and the record is never trusted to name a cluster, a Secret or an identity.

Why an annotation and not status, a new kind (the reference's per-stage ``StageInventory``
objects) or labels alone: see docs/concepts.md ("Inventory").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stageset.api import THIS_CLUSTER, StageInventory, parse_time
from stageset.api.common import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN
from stageset.apply.inventory import entry_id
from stageset.kube.types import KubeObject

ANNOTATION = "stages.metio.wtf/inventory-record"
# Format version of the annotation's JSON; a change comes with a migration (see parse).
FORMAT = 2
_TARGETLESS = 1  # the format before targets: every stage was applied on this cluster

Via = tuple[str, str]
"""The kubeConfig Secret (name, key) a remote target was reached through."""
StageTargetName = tuple[str, str]
"""The platform StageTarget (namespace, name) a remote target was reached through."""


@dataclass(frozen=True, order=True)
class KindRef:
    """A kind as applied: ``apiVersion`` and ``kind``."""

    api_version: str
    kind: str

    def encode(self) -> str:
        separator = "/" if "/" in self.api_version else "//"
        return f"{self.api_version}{separator}{self.kind}"

    @classmethod
    def decode(cls, value: str) -> KindRef:
        if "//" in value:  # core group: "v1//ConfigMap"
            version, _, kind = value.partition("//")
            return cls(version, kind)
        api_version, _, kind = value.rpartition("/")
        return cls(api_version, kind)


@dataclass(frozen=True)
class StageRecord:
    service_account: str | None
    kinds: Mapping[KindRef, frozenset[str]] = field(default_factory=dict)
    """Each kind with the namespaces its objects are in (``""``: cluster-scoped)."""
    target: str = THIS_CLUSTER
    """The cluster the objects were applied on (a target id)."""
    via: Via | None = None
    """For a remote target: the kubeConfig Secret it was reached through."""
    stage_target: StageTargetName | None = None
    """For a remote target: the platform StageTarget it was reached through (``spec.targetRef``), so
    a StageSet whose status was lost mid-move still reaches the cluster it leaves."""
    config_map: str | None = None
    """For a remote target: the workload-identity ConfigMap (``kubeConfig.configMapRef``) it was
    reached through."""

    def covers(self, other: StageRecord) -> bool:
        return self.service_account == other.service_account and self.target == other.target and all(
            kind in self.kinds and namespaces <= self.kinds[kind] for kind, namespaces in other.kinds.items())

    def union(self, other: StageRecord) -> StageRecord:
        """Both records' kinds and namespaces, with ``other``'s identity and way to the same target."""
        kinds = {k: frozenset(v) for k, v in self.kinds.items()}
        for kind, namespaces in other.kinds.items():
            kinds[kind] = kinds.get(kind, frozenset()) | namespaces
        # One way to reach the target: the other's Secret or ConfigMap if it names one, else this one's.
        secret_or_map = (other.via, other.config_map) if other.via or other.config_map else \
            (self.via, self.config_map)
        return StageRecord(other.service_account, kinds, other.target, secret_or_map[0],
                           other.stage_target or self.stage_target, secret_or_map[1])

    def body(self) -> dict[str, Any]:
        encoded: dict[str, Any] = {
            "sa": self.service_account,
            "kinds": {kind.encode(): sorted(ns) for kind, ns in sorted(self.kinds.items())}}
        if self.target != THIS_CLUSTER:
            encoded["t"] = self.target
            if self.via is not None:
                encoded["kc"] = list(self.via)
            if self.stage_target is not None:
                encoded["st"] = list(self.stage_target)
            if self.config_map is not None:
                encoded["cm"] = self.config_map
        return encoded

    @classmethod
    def of_body(cls, stage: Mapping[str, Any]) -> StageRecord:
        return cls(service_account=stage.get("sa") or None,
                   kinds={KindRef.decode(str(k)): frozenset(str(n) for n in ns)
                          for k, ns in (stage.get("kinds") or {}).items()},
                   target=str(stage.get("t") or THIS_CLUSTER),
                   via=_pair(stage.get("kc")), stage_target=_pair(stage.get("st")),
                   config_map=str(stage["cm"]) if isinstance(stage.get("cm"), str) and stage["cm"] else None)


class RecordError(ValueError):
    """A value of a known-format record that fails the API's rules; the message names the field."""


_API_VERSION = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[a-z0-9]+$")
_KIND = re.compile(r"^[A-Za-z][-A-Za-z0-9]{0,62}$")
MAX_TARGET = 2100
"""Characters of a target id at most (a server URL of at most 2048, ``#``, a fingerprint)."""


def _label(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and re.fullmatch(DNS_LABEL_PATTERN, value) is not None


def _subdomain(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 253 and \
        re.fullmatch(DNS_SUBDOMAIN_PATTERN, value) is not None


def _printable(value: Any, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and all(33 <= ord(c) < 127 for c in value)


def _check_stage(stage: Any, where: str) -> None:
    """Raise :class:`RecordError` naming the first field of one stage record that fails its rule."""
    if not isinstance(stage, Mapping):
        raise RecordError(f"{where}: not an object")
    account = stage.get("sa")
    if account is not None and not _subdomain(account):
        raise RecordError(f"{where}.sa: not a ServiceAccount name (a DNS subdomain)")
    kinds = stage.get("kinds") or {}
    if not isinstance(kinds, Mapping):
        raise RecordError(f"{where}.kinds: not an object")
    for key, namespaces in kinds.items():
        kind = KindRef.decode(str(key))
        if not _API_VERSION.fullmatch(kind.api_version) or not _KIND.fullmatch(kind.kind):
            raise RecordError(f"{where}.kinds: {str(key)[:100]!r} is not an apiVersion and kind")
        if not isinstance(namespaces, list) or not all(n == "" or _label(n) for n in namespaces):
            raise RecordError(f"{where}.kinds[{str(key)[:100]}]: not a list of namespace names")
    target = stage.get("t")
    if target is not None and not _printable(target, MAX_TARGET):
        raise RecordError(f"{where}.t: not a target id")
    via = stage.get("kc")
    if via is not None and not (isinstance(via, list) and len(via) == 2 and _subdomain(via[0])
                                and isinstance(via[1], str) and 0 < len(via[1]) <= 253):
        raise RecordError(f"{where}.kc: not a kubeConfig Secret reference [name, key] (the name a DNS "
                          "subdomain)")
    platform = stage.get("st")
    if platform is not None and not (isinstance(platform, list) and len(platform) == 2
                                     and _label(platform[0]) and _subdomain(platform[1])):
        raise RecordError(f"{where}.st: not a StageTarget reference [namespace, name]")
    config_map = stage.get("cm")
    if config_map is not None and not _subdomain(config_map):
        raise RecordError(f"{where}.cm: not a workload-identity ConfigMap name (a DNS subdomain)")


def check(body: Mapping[str, Any]) -> None:
    """Every value of a known-format record body against the API's rules; raises :class:`RecordError`."""
    stages = body.get("stages") or {}
    if not isinstance(stages, Mapping):
        raise RecordError("stages: not an object")
    for name, stage in stages.items():
        if not _label(name):
            raise RecordError(f"stages: {str(name)[:100]!r} is not a stage name")
        _check_stage(stage, f"stages[{name}]")
    previous = body.get("prev") or []
    if not isinstance(previous, list):
        raise RecordError("prev: not a list")
    for index, item in enumerate(previous):
        if not isinstance(item, Mapping) or not _label(item.get("stage")):
            raise RecordError(f"prev[{index}].stage: not a stage name")
        _check_stage(item, f"prev[{index}]")
    since = body.get("since")
    if since is not None and (not isinstance(since, str) or parse_time(since) is None):
        raise RecordError("since: not a timestamp")


def problem_of(obj: KubeObject) -> str | None:
    """Why the StageSet's record cannot be used (``InvalidSpec``), naming the field; ``None``: it can."""
    problem = parse(obj).problem
    return None if problem is None else f"metadata.annotations[{ANNOTATION}]: {problem}; remove the " \
        "annotation and the controller writes it again from status and the cluster"


def _pair(value: Any) -> tuple[str, str] | None:
    """A reference written as a two-item list (``kc``, ``st``); anything else is no reference."""
    return (str(value[0]), str(value[1])) if isinstance(value, list) and len(value) == 2 else None


Previous = tuple[tuple[str, StageRecord], ...]
"""Stage records on targets the stages moved away from: ``(stage, record)``, one per stage and target."""


def _gathered(entries: Iterable[tuple[str, StageRecord]]) -> Previous:
    found: dict[tuple[str, str], StageRecord] = {}
    for stage, record in entries:
        key = (stage, record.target)
        found[key] = found[key].union(record) if key in found else record
    return tuple(sorted(((stage, record) for (stage, _), record in found.items()),
                        key=lambda item: (item[0], item[1].target)))


@dataclass(frozen=True)
class Record:
    stages: Mapping[str, StageRecord] = field(default_factory=dict)
    rebuild: bool = False
    """A rebuild from the cluster is pending (the last one could not see everything)."""
    previous: Previous = ()
    """Where the stages were before a move, until that target is cleaned up (or given up)."""
    since: str | None = None
    """When the move began (set while ``previous`` is not empty)."""
    targetless: bool = False
    """Read from a record written before targets were recorded (format 1, or none at all): its
    StageSet's inventories name no target because none was recorded, not because they are here."""
    problem: str | None = None
    """A known-format record with a value that fails the API's rules: which field (the record then
    holds nothing and asks for a rebuild; the StageSet's pass stops with ``InvalidSpec``)."""

    def encode(self) -> str:
        body: dict[str, Any] = {"v": FORMAT, "stages": {
            name: stage.body() for name, stage in sorted(self.stages.items())}}
        if self.rebuild:
            body["rebuild"] = True
        if self.previous:
            body["prev"] = [{"stage": name, **stage.body()} for name, stage in self.previous]
            body["since"] = self.since
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    def rebased(self, target: str, *, now: str) -> Record:
        """The record as seen from ``target``, the cluster the stages are applied on now: a stage
        recorded on another one is a stage to clean up there (``previous``); a previous target
        that is current again is no longer one (its objects are the stages' own again).  A record
        from before targets (``targetless``) was written by a controller that applied where the
        StageSet pointed then, which is taken to be ``target``: an upgrade is never a move."""
        stages: dict[str, StageRecord] = {}
        previous: list[tuple[str, StageRecord]] = []
        for name, stage in self.stages.items():
            if self.targetless:
                stages[name] = replace(stage, target=target)
            elif stage.target == target:
                stages[name] = stage
            else:
                previous.append((name, stage))
        for name, stage in self.previous:
            if stage.target != target:
                previous.append((name, stage))
            else:
                stages[name] = stages[name].union(stage) if name in stages else stage
        gathered = _gathered(previous)
        since = (self.since or now) if gathered else None
        return Record(stages, self.rebuild, gathered, since)

    def grown(self, wanted: Mapping[str, StageRecord]) -> Record:
        """This record plus ``wanted`` (what stages are about to apply, on this record's target)."""
        stages = dict(self.stages)
        previous = list(self.previous)
        for name, stage in wanted.items():
            if name in stages and stages[name].target != stage.target:
                previous.append((name, stages.pop(name)))
            stages[name] = stages[name].union(stage) if name in stages else stage
        return Record(stages, self.rebuild, _gathered(previous), self.since)

    def covers(self, wanted: Mapping[str, StageRecord]) -> bool:
        return all(name in self.stages and self.stages[name].covers(stage) for name, stage in wanted.items())


def parse(obj: KubeObject) -> Record:
    """The record on a live StageSet; an absent or unreadable one is empty (nothing recorded).
    A record of format 1 (before targets) names every stage on this cluster."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION)
    if not raw:
        return Record(targetless=True)
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("v") not in (FORMAT, _TARGETLESS):
            return Record(rebuild=True)  # a format we do not know: look on the cluster again
        check(body)
        stages = {str(name): StageRecord.of_body(stage) for name, stage in (body.get("stages") or {}).items()}
        if body["v"] == _TARGETLESS:  # migration: no target was recorded, so it was this cluster
            stages = {name: replace(stage, target=THIS_CLUSTER, via=None, stage_target=None, config_map=None)
                      for name, stage in stages.items()}
            return Record(stages, bool(body.get("rebuild")), targetless=True)
        previous = _gathered((str(item["stage"]), StageRecord.of_body(item))
                             for item in body.get("prev") or [])
        since = body.get("since")
        return Record(stages, bool(body.get("rebuild")), previous,
                      str(since) if previous and since else None)
    except RecordError as error:
        return Record(rebuild=True, problem=str(error))
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return Record(rebuild=True)


def of_objects(service_account: str | None, objects: Iterable[tuple[str, KubeObject]], *,
               target: str, via: Via | None, stage_target: StageTargetName | None = None,
               config_map: str | None = None) -> StageRecord:
    """A stage record from ``(namespace, manifest)`` pairs (namespace ``""`` when cluster-scoped),
    applied on ``target`` (reached through ``via``, ``config_map`` or ``stage_target``)."""
    kinds: dict[KindRef, set[str]] = {}
    for namespace, obj in objects:
        kind = KindRef(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        kinds.setdefault(kind, set()).add(namespace)
    remote = target != THIS_CLUSTER
    return StageRecord(service_account, {k: frozenset(v) for k, v in kinds.items()}, target,
                       via if remote else None, stage_target if remote else None,
                       config_map if remote else None)


def of_inventory(inv: StageInventory) -> StageRecord:
    """The stage record that covers exactly this inventory, on the target it names."""
    kinds: dict[KindRef, set[str]] = {}
    for item in inv.entries:
        oid = entry_id(item)
        kinds.setdefault(KindRef(item.v, oid.kind), set()).add(oid.namespace)
    ref = inv.target.kube_config if inv.target is not None else None
    platform = inv.target.target_ref if inv.target is not None else None
    config_map = inv.target.config_map_ref if inv.target is not None else None
    return StageRecord(inv.service_account_name, {k: frozenset(v) for k, v in kinds.items()}, inv.target_id,
                       (ref.name, ref.key) if ref is not None else None,
                       (platform.namespace, platform.name) if platform is not None else None,
                       config_map.name if config_map is not None else None)


def of_inventories(inventories: Iterable[StageInventory], *, previous: Iterable[StageInventory],
                   since: str | None) -> Record:
    """The record that covers exactly these inventories (after a complete prune), and the ones
    still to clean up on previous targets (``previous``, a move in flight since ``since``)."""
    stages = {inv.name: of_inventory(inv) for inv in inventories}
    gathered = _gathered((inv.name, of_inventory(inv)) for inv in previous)
    return Record(stages, previous=gathered, since=since if gathered else None)
