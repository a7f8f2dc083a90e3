"""What the dashboard's pages show, as plain values computed from what the watches hold.  Pure.

Nothing here reads the cluster: the hub (:mod:`stageset.cli.dashboard.hub`) hands in the stored
StageSet and a ``lookup`` that answers from its watches what it knows of any other object (its
kstatus, or that it is not found, or that the user may not read it).  Templates render these
values; every string in them is tenant-written text that the template engine escapes.

Which stage holds the release (:func:`holding`): when the StageSet is not Ready, the first stage
(in the order the user listed them) that failed, else one held at its timeout, else those being
applied or waited for, else the pending stages whose dependencies are all Ready (they wait for
something outside the graph: a source, the cluster); a StageSet waiting for other StageSets is
held by those that are not Ready.  The StageSet's own Ready reason and message say why.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import networkx as nx

from stageset.api import API_VERSION, parse_time
from stageset.api.target import target_text
from stageset.api.vocabulary import ConditionStatus, ConditionType, Reason, StagePhase
from stageset.apply.inventory import ObjectId
from stageset.cli.dashboard import layout
from stageset.cli.dashboard.diffs import EventRow, StageChange, last_changes
from stageset.cli.dashboard.links import split_runbook
from stageset.cli.releases import HistoryRow, history_rows
from stageset.controller.conditions import find_condition
from stageset.controller.ordering import OrderingError, StageNode, stage_graph
from stageset.kube.types import KubeObject

STAGESET_KIND = "StageSet"
EVENTS_SHOWN = 60
RECENT = 8.0  # seconds a stage that just moved stays marked in the picture
MAX_FIELD = 2000  # characters of an unknown status field shown
_KNOWN_STAGE_FIELDS = {"name", "phase", "revision", "message", "lastAppliedTime", "objects", "waitingSince"}
_PHASES = {phase.value for phase in StagePhase}


@dataclass(frozen=True)
class Ref:
    """Any object, by API version, kind, namespace ("" when cluster-scoped) and name."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"


@dataclass(frozen=True)
class ObjectState:
    """What the watches know of one object."""

    status: str
    """kstatus (``Current``, ``InProgress``, ``Failed``), or ``NotFound``, or ``Unknown``."""
    message: str = ""
    revision: str | None = None
    """``status.artifact.revision``, for sources."""


Lookup = Callable[[Ref], ObjectState]


@dataclass(frozen=True)
class Transition:
    """A change of a stage's phase or revision (or of the StageSet's Ready, ``stage=""``) that the
    dashboard saw through its watch."""

    when: str
    stage: str
    before: str | None
    after: str
    revision: str | None = None


def phase_class(phase: str) -> str:
    """A CSS class for a phase (a phase this dashboard does not know is ``unknown``)."""
    return f"phase-{phase.lower()}" if phase in _PHASES else "phase-unknown"


def status_class(status: str) -> str:
    return {"Current": "ok", "InProgress": "progress", "Failed": "bad", "NotFound": "bad",
            "True": "ok", "False": "bad"}.get(status, "unknown")


def dependency_class(status: str) -> str:
    """A StageSet dependency's node: red only when it failed; one not found (yet) is waited for."""
    return {"Current": "ok", "Failed": "bad", "InProgress": "progress", "NotFound": "progress"}.get(
        status, "unknown")


def stageset_href(namespace: str, name: str) -> str:
    return f"/stagesets/{quote(namespace, safe='')}/{quote(name, safe='')}"


def object_href(namespace: str, name: str, stage: str, oid: ObjectId) -> str:
    """An inventory object's page (by stage and inventory id)."""
    return f"{stageset_href(namespace, name)}/object?{urlencode({'stage': stage, 'id': oid.encode()})}"


# -- reading a StageSet -----------------------------------------------------------------------------

def _spec(obj: KubeObject) -> dict[str, Any]:
    spec: dict[str, Any] = obj.get("spec") or {}
    return spec


def _status(obj: KubeObject) -> dict[str, Any]:
    status: dict[str, Any] = obj.get("status") or {}
    return status


def _namespace(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def stage_nodes(obj: KubeObject) -> list[StageNode]:
    return [StageNode(str(s.get("name")), None if s.get("dependsOn") is None else tuple(s["dependsOn"]))
            for s in _spec(obj).get("stages") or []]


def stage_sources(obj: KubeObject) -> dict[str, Ref]:
    """Each stage's source, as its spec names it (any kind: ours, Flux's, ...)."""
    namespace = _namespace(obj)
    found: dict[str, Ref] = {}
    for stage in _spec(obj).get("stages") or []:
        ref = stage.get("sourceRef") or {}
        found[str(stage.get("name"))] = Ref(
            api_version=str(ref.get("apiVersion") or API_VERSION),
            kind=str(ref.get("kind") or "GitRepository"),
            namespace=str(ref.get("namespace") or namespace), name=str(ref.get("name") or ""))
    return found


def dependency_refs(obj: KubeObject) -> list[Ref]:
    """What ``spec.dependsOn`` names: StageSets (no ``kind``) and objects of other kinds."""
    namespace = _namespace(obj)
    return [Ref(str(d.get("apiVersion") or API_VERSION), str(d.get("kind") or STAGESET_KIND),
                str(d.get("namespace") or namespace), str(d.get("name")))
            for d in _spec(obj).get("dependsOn") or [] if isinstance(d, dict)]


def ready_exprs(obj: KubeObject) -> dict[Ref, str]:
    """The ``readyExpr`` of each ``spec.dependsOn`` entry that has one (it, not kstatus, says Ready)."""
    found: dict[Ref, str] = {}
    for ref, entry in zip(dependency_refs(obj), [d for d in _spec(obj).get("dependsOn") or []
                                                  if isinstance(d, dict)], strict=True):
        if entry.get("readyExpr"):
            found[ref] = str(entry["readyExpr"])
    return found


def inventory(obj: KubeObject) -> dict[str, list[tuple[Ref, ObjectId]]]:
    """The objects each stage applied (from ``status.inventory``), with the version applied."""
    found: dict[str, list[tuple[Ref, ObjectId]]] = {}
    for stage in _status(obj).get("inventory") or []:
        entries = found.setdefault(str(stage.get("name")), [])
        for item in stage.get("entries") or []:
            try:
                oid = ObjectId.decode(str(item.get("id")))
            except ValueError:
                continue  # not an id this controller writes: nothing to look up
            entries.append((Ref(str(item.get("v") or ""), oid.kind, oid.namespace, oid.name), oid))
    return found


def refs_to_watch(obj: KubeObject) -> set[Ref]:
    """Every object a StageSet's page shows the state of."""
    refs = set(stage_sources(obj).values()) | set(dependency_refs(obj))
    for entries in inventory(obj).values():
        refs.update(ref for ref, _ in entries)
    return refs


def event_scopes(obj: KubeObject) -> set[tuple[str, str]]:
    """(API version, namespace) of the Events a StageSet's page shows: its own and its sources'."""
    scopes = {(API_VERSION, _namespace(obj))}
    scopes.update((ref.api_version, ref.namespace) for ref in stage_sources(obj).values())
    return scopes


# -- who holds the release --------------------------------------------------------------------------

@dataclass(frozen=True)
class Holding:
    """What holds a StageSet that is not Ready: graph node ids (stage names, or
    :func:`dependency_id` of StageSets), and why."""

    nodes: list[str]
    reason: str
    message: str
    phase: str | None = None
    """The held stages' phase; ``None`` when StageSets (or nothing in the graph) hold it."""

    def text(self) -> str:
        """One line for the list page's "waits for" column."""
        first = first_line(self.message)
        if self.nodes and self.phase is not None:
            what = f"stage {', '.join(self.nodes)} ({self.phase})"
        elif self.nodes:
            what = ", ".join(dependency_label(node) for node in self.nodes)
        elif self.reason:
            what = self.reason
        else:
            return first
        return f"{what}: {first}" if first else what


_DEPENDENCY = "stageset:"
_OBJECT = "object:"


def _is_stageset(ref: Ref) -> bool:
    return ref.api_version == API_VERSION and ref.kind == STAGESET_KIND


def dependency_id(ref: Ref) -> str:
    """The graph node id of a dependency (cannot clash with a stage name, a DNS label): a StageSet's
    ``stageset:<ns>/<name>``, another kind's ``object:<Kind>/<ns>/<name>``."""
    if _is_stageset(ref):
        return f"{_DEPENDENCY}{ref.namespace}/{ref.name}"
    return f"{_OBJECT}{ref.kind}/{ref.namespace}/{ref.name}"


def dependency_label(node: str) -> str:
    """``StageSet shop/db``, ``Database shop/db``: a dependency's node id as text."""
    if node.startswith(_OBJECT):
        kind, _, rest = node.removeprefix(_OBJECT).partition("/")
        return f"{kind} {rest}"
    return "StageSet " + node.removeprefix(_DEPENDENCY)


def first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _without_runbook(message: str) -> str:
    return split_runbook(message)[0]


def holding(obj: KubeObject, *, dependencies: Mapping[str, ObjectState] | None = None) -> Holding | None:
    status = _status(obj)
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    if ready.get("status") == ConditionStatus.TRUE:
        return None
    reason, message = str(ready.get("reason", "")), _without_runbook(str(ready.get("message", "")))
    if _spec(obj).get("suspend"):
        return Holding(nodes=[], reason=Reason.SUSPENDED.value, message="suspended: nothing is applied "
                       "until it is resumed (stageset resume)")
    if reason == Reason.DEPENDENCY_NOT_READY:
        deps = [dependency_id(ref) for ref in dependency_refs(obj)]
        known = dependencies or {}
        waiting = [d for d in deps if known.get(d, ObjectState("Unknown")).status != "Current"]
        return Holding(nodes=waiting or deps, reason=reason, message=message)
    phases = {str(s.get("name")): str(s.get("phase", StagePhase.PENDING.value))
              for s in status.get("stages") or []}
    messages = {str(s.get("name")): str(s.get("message") or "") for s in status.get("stages") or []}
    nodes = stage_nodes(obj)
    names = [n.name for n in nodes]
    for wanted in ([StagePhase.FAILED], [StagePhase.PROGRESSING], [StagePhase.APPLYING, StagePhase.WAITING]):
        found = [n for n in names if phases.get(n) in wanted]
        if found:
            first = found[0]
            held = found[:1] if wanted[0] is StagePhase.FAILED else found
            return Holding(nodes=held, reason=reason or phases[first], message=messages.get(first) or message,
                           phase=phases[first])
    try:
        graph = stage_graph(nodes)
    except OrderingError as error:
        return Holding(nodes=[], reason=reason or Reason.INVALID_SPEC.value, message=message or str(error))
    pending = [n for n in names if phases.get(n, StagePhase.PENDING.value) != StagePhase.READY
               and all(phases.get(p) == StagePhase.READY for p in graph.predecessors(n))]
    if pending and reason:
        return Holding(nodes=pending, reason=reason, message=message, phase=phases.get(pending[0], "Pending"))
    if reason or message:
        return Holding(nodes=[], reason=reason, message=message)
    return Holding(nodes=[], reason="",
                   message="not reconciled yet (is a controller watching this namespace?)")


# -- the list ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    namespace: str
    name: str
    href: str
    ready: str
    reason: str
    message: str
    done: int
    total: int
    revision: str | None
    created: str | None
    suspended: bool
    waits_for: str
    drifted: int = 0
    """Objects a ``Warn`` StageSet left as someone else changed them (``status.drifted``)."""


def list_row(obj: KubeObject) -> Row:
    meta, status = obj.get("metadata") or {}, _status(obj)
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    phases = {s.get("name"): s.get("phase") for s in status.get("stages") or []}
    names = [n.name for n in stage_nodes(obj)]
    held = holding(obj)
    revision = status.get("lastAppliedRevision")
    return Row(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
        href=stageset_href(str(meta.get("namespace", "")), str(meta.get("name", ""))),
        ready=str(ready.get("status", "Unknown")), reason=str(ready.get("reason", "")),
        message=_without_runbook(str(ready.get("message", ""))),
        done=sum(1 for n in names if phases.get(n) == StagePhase.READY), total=len(names),
        revision=revision, created=meta.get("creationTimestamp"),
        suspended=bool(_spec(obj).get("suspend", False)), waits_for="" if held is None else held.text(),
        drifted=len(status.get("drifted") or []))


def list_rows(objs: Iterable[KubeObject]) -> list[Row]:
    return sorted((list_row(o) for o in objs), key=lambda r: (r.namespace, r.name))


# -- one StageSet -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """A node of the picture: a stage or a dependency (a StageSet or an object of another kind)."""

    id: str
    label: str
    title: str
    phase: str
    """A stage's phase; a dependency's kstatus."""
    detail: str
    css: str
    href: str | None
    holding: bool
    changed: bool = False
    """Its phase or revision changed in the last :data:`RECENT` seconds (the picture marks it)."""


@dataclass(frozen=True)
class ObjectView:
    ref: Ref
    status: str
    message: str
    css: str
    href: str | None = None
    """Its page (live YAML, diff)."""
    drifted: str | None = None
    """Left as someone else changed it (``Warn``): the fields that differ, or ``deleted``."""


@dataclass(frozen=True)
class SourceView:
    ref: Ref
    status: str
    message: str
    revision: str | None
    css: str


@dataclass
class StageView:
    name: str
    phase: str
    css: str
    revision: str | None
    message: str
    last_applied: str | None
    waiting_since: str | None
    object_count: int | None
    after: list[str]
    source: SourceView | None
    service_account: str | None
    objects: list[ObjectView]
    change: StageChange | None
    extra: list[tuple[str, str]] = field(default_factory=list)
    holding: bool = False
    removed: bool = False
    gate: str | None = None
    """``promotionState.phase`` (``Soaking``, ``AwaitingManual``, ...): the gate it waits at, if any."""

    @property
    def anchor(self) -> str:
        return f"stage-{self.name}"


@dataclass
class Detail:
    namespace: str
    name: str
    ready: str
    reason: str
    message: str
    runbook: str | None
    """The runbook the Ready message ends with (an http(s) URL), shown as a link."""
    revision: str | None
    suspended: bool
    created: str | None
    target: str | None
    """The cluster it applies to, by name (``StageTarget <namespace>/<name>``); ``None``: this one."""
    generation: int | None
    observed_generation: int | None
    holding: Holding | None
    graph_error: str | None
    wide: layout.Picture
    tall: layout.Picture
    nodes: dict[str, Node]
    stages: list[StageView]
    dependencies: list[tuple[Ref, ObjectState, str | None]]
    """What ``spec.dependsOn`` names (StageSets and other kinds), each with its state and a link."""
    events: list[EventRow]
    activity: list[Transition]
    history: list[HistoryRow] = field(default_factory=list)
    """``status.history``: the releases the controller recorded, newest first (durable)."""
    pending_update: bool = False
    """An update window holds new revisions back (``status.pendingUpdate``): update-now can ship them."""
    ready_exprs: dict[Ref, str] = field(default_factory=dict)
    """The ``readyExpr`` of each dependency that has one (it, not kstatus, decides that one)."""
    drift: str = ""
    """The ``Drifted`` condition's message (``driftDetection.mode: Warn``): what was left as found."""


def _drifted(status: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(stage, inventory id) -> what a Warn StageSet left drifted there (fields, or ``deleted``)."""
    return {(str(d.get("stage")), str(d.get("id"))): "deleted" if d.get("deleted")
            else ", ".join(str(f) for f in d.get("fields") or []) or "changed"
            for d in status.get("drifted") or [] if isinstance(d, Mapping)}


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= MAX_FIELD else text[:MAX_FIELD - 1] + "…"


def _label(name: str, limit: int = 20) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _graph(obj: KubeObject, deps: Sequence[Ref]) -> tuple[nx.DiGraph, str | None]:
    nodes = stage_nodes(obj)
    try:
        graph = stage_graph(nodes)
        problem = None
    except OrderingError as error:
        # Drawn anyway (one layer per stage): the picture shows the cycle the condition names.
        graph = nx.DiGraph()
        graph.add_nodes_from(n.name for n in nodes)
        for node in nodes:
            graph.add_edges_from((d, node.name) for d in node.depends_on or () if d in graph)
        problem = str(error)
    roots = [n for n in graph.nodes if graph.in_degree(n) == 0]
    for ref in deps:
        graph.add_node(dependency_id(ref))
        graph.add_edges_from((dependency_id(ref), root) for root in roots)
    return graph, problem


def detail(obj: KubeObject, *, lookup: Lookup, events: Sequence[EventRow], activity: Sequence[Transition],
           linkable: Callable[[str], bool], now: datetime.datetime) -> Detail:
    """The StageSet page.  ``linkable(namespace)``: whether this dashboard shows StageSets there."""
    meta, status = obj.get("metadata") or {}, _status(obj)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    deps = dependency_refs(obj)
    exprs = ready_exprs(obj)
    dep_states = {dependency_id(ref): lookup(ref) for ref in deps}
    held = holding(obj, dependencies=dep_states)
    held_nodes = set(held.nodes if held else [])
    graph, problem = _graph(obj, deps)
    order = [*(dependency_id(r) for r in deps), *(n.name for n in stage_nodes(obj))]

    stage_status = {str(s.get("name")): s for s in status.get("stages") or []}
    sources = stage_sources(obj)
    inventories = inventory(obj)
    accounts = {str(s.get("name")): s.get("serviceAccountName") for s in status.get("inventory") or []}
    own_events = [e for e in events
                  if e.kind == STAGESET_KIND and e.name == name and e.namespace == namespace]
    changes = last_changes(own_events, {stage: [oid for _, oid in entries]
                                        for stage, entries in inventories.items()})
    drifted = _drifted(status)
    spec_names = [n.name for n in stage_nodes(obj)]
    stages: list[StageView] = []
    for stage in [*spec_names, *sorted(n for n in inventories if n not in spec_names)]:
        removed = stage not in spec_names
        raw = stage_status.get(stage) or {}
        phase = "Removed" if removed else str(raw.get("phase") or StagePhase.PENDING.value)
        source_ref = sources.get(stage)
        source = None
        if source_ref is not None:
            state = lookup(source_ref)
            source = SourceView(ref=source_ref, status=state.status, message=state.message,
                                revision=state.revision, css=status_class(state.status))
        objects = []
        for ref, oid in inventories.get(stage, []):
            state = lookup(ref)
            objects.append(ObjectView(ref=ref, status=state.status, message=state.message,
                                      css=status_class(state.status),
                                      href=object_href(namespace, name, stage, oid),
                                      drifted=drifted.get((stage, oid.encode()))))
        stages.append(StageView(
            name=stage, phase=phase, css=phase_class(phase), revision=raw.get("revision"),
            message=str(raw.get("message") or ("no longer in the spec: its objects stay until pruned"
                                               if removed else "")),
            last_applied=raw.get("lastAppliedTime"), waiting_since=raw.get("waitingSince"),
            object_count=raw.get("objects"),
            after=sorted(graph.predecessors(stage)) if stage in graph else [],
            source=source, service_account=accounts.get(stage), objects=objects, change=changes.get(stage),
            extra=[(key, _shown(value)) for key, value in sorted(raw.items())
                   if key not in _KNOWN_STAGE_FIELDS],
            holding=stage in held_nodes, removed=removed,
            gate=str((raw.get("promotionState") or {}).get("phase") or "") or None))

    recent = {t.stage for t in activity
              if (when := parse_time(t.when)) is not None and (now - when).total_seconds() < RECENT}
    views: dict[str, Node] = {}
    for stage_view in stages:
        if stage_view.removed:
            continue
        detail_line = stage_view.phase + (f" · {stage_view.object_count} obj"
                                          if stage_view.object_count is not None else "")
        views[stage_view.name] = Node(
            id=stage_view.name, label=_label(stage_view.name),
            title=f"stage {stage_view.name}: {stage_view.phase}",
            phase=stage_view.phase, detail=detail_line, css=stage_view.css, href=f"#{stage_view.anchor}",
            holding=stage_view.holding, changed=stage_view.name in recent)
    dependencies = []
    for ref in deps:
        node_id = dependency_id(ref)
        state = dep_states[node_id]
        href = stageset_href(ref.namespace, ref.name) \
            if _is_stageset(ref) and linkable(ref.namespace) else None
        dependencies.append((ref, state, href))
        kind = "StageSet" if _is_stageset(ref) else _label(ref.kind, 14)
        where = kind if ref.namespace == namespace else _label(ref.namespace, 12)
        views[node_id] = Node(id=node_id, label=_label(ref.name),
                              title=f"{dependency_label(node_id)}"
                              + (f" (ready when {exprs[ref]})" if ref in exprs else ""),
                              phase=state.status, detail=f"{where} · {state.status}",
                              css=f"dependency {dependency_class(state.status)}",
                              href=href, holding=node_id in held_nodes)

    shown_events = sorted(events, key=lambda e: e.last_seen or "", reverse=True)[:EVENTS_SHOWN]
    message, runbook = split_runbook(str(ready.get("message", "")))
    return Detail(
        namespace=namespace, name=name, ready=str(ready.get("status", "Unknown")),
        reason=str(ready.get("reason", "")), message=message, runbook=runbook,
        revision=status.get("lastAppliedRevision"), suspended=bool(_spec(obj).get("suspend", False)),
        created=meta.get("creationTimestamp"), target=target_text(_spec(obj)),
        generation=meta.get("generation"),
        observed_generation=status.get("observedGeneration"), holding=held, graph_error=problem,
        wide=layout.picture(graph, order=order), tall=layout.picture(graph, order=order, vertical=True),
        nodes=views, stages=stages, dependencies=dependencies, events=shown_events, activity=list(activity),
        history=history_rows(obj), pending_update=bool(status.get("pendingUpdate")), ready_exprs=exprs,
        drift=str(find_condition(status.get("conditions"), ConditionType.DRIFTED).get("message", "")))


# -- what the watch saw change ----------------------------------------------------------------------

def transitions(before: KubeObject | None, after: KubeObject, *, when: str) -> list[Transition]:
    """The stage phases and revisions (and the StageSet's Ready) that changed between two versions."""
    def stages(obj: KubeObject | None) -> dict[str, tuple[str, str | None]]:
        return {str(s.get("name")): (str(s.get("phase", "")), s.get("revision"))
                for s in _status(obj or {}).get("stages") or []}

    def ready(obj: KubeObject | None) -> str | None:
        if obj is None:
            return None
        found = find_condition(_status(obj).get("conditions"), ConditionType.READY)
        return f"Ready={found['status']} {found.get('reason', '')}".rstrip() if found else None

    found: list[Transition] = []
    old, new = stages(before), stages(after)
    for name, (phase, revision) in new.items():
        was = old.get(name)
        if was is None or was[0] != phase or (was[1] != revision and revision):
            moved = was is None or was[1] != revision
            found.append(Transition(when=when, stage=name, before=None if was is None else was[0],
                                    after=phase, revision=revision if moved else None))
    now_ready, was_ready = ready(after), ready(before)
    if now_ready is not None and now_ready != was_ready:
        found.append(Transition(when=when, stage="", before=was_ready, after=now_ready,
                                revision=_status(after).get("lastAppliedRevision")))
    return found
