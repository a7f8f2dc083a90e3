"""``get``, ``tree``, ``graph``, ``events``: what a StageSet is doing, read as the user.

Identity: every request is the user's own (the kubeconfig's credentials, or whom ``--as``
names): these commands never impersonate anyone else, so they show exactly what the user may
read.  ``-w``/``--watch`` lists and watches (:mod:`stageset.cli.watching`), nothing more.  An
object the user may not read is shown as such, never guessed at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from stageset.api import API_VERSION
from stageset.api.target import target_text
from stageset.api.vocabulary import ConditionType, StagePhase
from stageset.apply.inventory import ObjectId
from stageset.apply.readiness import readiness
from stageset.cli import fleet, tenantview, waits
from stageset.cli.params import LABEL_SELECTOR
from stageset.cli.session import (
    CliError,
    Session,
    age,
    as_printed,
    cluster_options,
    dump,
    dump_objects,
    echo,
    short_revision,
    table,
)
from stageset.cli.watching import EVENTS, Scope, follow
from stageset.controller.conditions import find_condition
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.ordering import OrderingError, StageNode, stage_graph
from stageset.controller.sharding import SHARD_LABEL, LabelSelector
from stageset.kube.client import ApiError, KubeClient, QueryValue
from stageset.kube.mapping import RestMapper, UnknownKindError
from stageset.kube.types import KubeObject
from stageset.kube.watch import object_key


def read_stageset(session: Session, name: str) -> KubeObject:
    """The StageSet ``name`` in the session's namespace, read as the user."""
    namespace = session.namespace
    try:
        return session.client().get(STAGESETS.object_path(name=name, namespace=namespace))
    except ApiError as error:
        if error.not_found:
            raise CliError(f"StageSet {namespace}/{name} not found") from None
        if error.forbidden:
            raise CliError(f"you may not read StageSet {namespace}/{name}: {error.message}") from None
        raise


def summary(obj: KubeObject) -> dict[str, Any]:
    """What ``get`` shows of one StageSet (also its -o yaml/json form)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    stages = {s.get("name"): s for s in status.get("stages") or []}
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "ready": ready.get("status", "Unknown"),
        "reason": ready.get("reason", ""),
        "message": ready.get("message", ""),
        "observedGeneration": status.get("observedGeneration"),
        "generation": meta.get("generation"),
        "revision": status.get("lastAppliedRevision"),
        "suspended": bool(spec.get("suspend", False)),
        "created": meta.get("creationTimestamp"),
        "shard": (meta.get("labels") or {}).get(SHARD_LABEL),
        "stages": [{
            "name": stage.get("name"),
            "phase": (stages.get(stage.get("name")) or {}).get("phase", StagePhase.PENDING.value),
            "revision": (stages.get(stage.get("name")) or {}).get("revision"),
            "objects": (stages.get(stage.get("name")) or {}).get("objects"),
            "message": (stages.get(stage.get("name")) or {}).get("message", ""),
            "promotionState": (stages.get(stage.get("name")) or {}).get("promotionState"),
            "lastAppliedTime": (stages.get(stage.get("name")) or {}).get("lastAppliedTime"),
        } for stage in spec.get("stages") or []],
        "sources": _sources_text(obj),
        "dependsOn": waits.spec_text(obj),
        "target": target_text(spec),
        "pendingUpdate": status.get("pendingUpdate"),
        "rollback": status.get("rollback"),
        "driftMode": str((spec.get("driftDetection") or {}).get("mode") or "Correct"),
        "drifted": status.get("drifted") or [],
        "drift": find_condition(status.get("conditions"), ConditionType.DRIFTED).get("message", ""),
    }


def gate_text(state: dict[str, Any] | None) -> str:
    """A stage's promotion gate in a few words: ``Soaking until …``, ``AwaitingManual``, ``Promoted``."""
    if not state:
        return "-"
    phase = str(state.get("phase") or "-")
    if phase == "Soaking":
        return f"Soaking until {state['soakUntil']}" if state.get("soakUntil") else "Soaking (not Ready)"
    if phase == "AwaitingManual":
        return "AwaitingManual (stageset promote)"
    return phase


def steering_lines(view: dict[str, Any]) -> list[str]:
    """What holds the release back, beyond the stages: held updates, a rollback."""
    lines: list[str] = []
    pending = view.get("pendingUpdate") or {}
    if pending:
        revisions = sorted((pending.get("revisions") or {}).items())
        held = ", ".join(f"{s}: {r}" for s, r in revisions) or "everything"
        if pending.get("fleetRollout"):
            wave = f"until wave {pending['wave']} opens" if pending.get("wave") \
                else "(not in exactly one wave)"
            lines.append(f"held by FleetRollout {pending['fleetRollout']} {wave}: {held}")
        if not pending.get("fleetRollout") or pending.get("nextWindowOpens"):
            lines.append(f"held by update windows until {pending.get('nextWindowOpens') or 'they open'}: "
                         f"{held}")
    rollback = view.get("rollback") or {}
    if rollback:
        lines.append(f"rollback {rollback.get('phase')}: {rollback.get('message', '')}")
    if view.get("drift"):
        lines.append(f"drifted: {view['drift']}")
    return lines


def drifted_fields(view: dict[str, Any]) -> dict[tuple[str, str], list[str] | None]:
    """(stage, inventory id) -> the field paths a Warn StageSet left drifted (``None``: deleted)."""
    return {(str(d.get("stage")), str(d.get("id"))): None if d.get("deleted") else list(d.get("fields") or [])
            for d in view.get("drifted") or []}


def _stages_ready(view: dict[str, Any]) -> str:
    stages = view["stages"]
    return f"{sum(1 for s in stages if s['phase'] == StagePhase.READY.value)}/{len(stages)}"


def _first_line(text: str, limit: int = 100) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _sources_text(obj: KubeObject) -> str:
    """The sources its stages name (``GitRepository/shop``), each once, in stage order."""
    found: list[str] = []
    for stage in (obj.get("spec") or {}).get("stages") or []:
        ref = stage.get("sourceRef") or {}
        where = f"{ref['namespace']}/" if ref.get("namespace") else ""
        text = f"{ref.get('kind', 'GitRepository')}/{where}{ref.get('name')}"
        if text not in found:
            found.append(text)
    return ",".join(found) or "-"


def object_name(view: dict[str, Any]) -> str:
    """``-o name``: as kubectl names objects (``stageset.stages.metio.wtf/shop``)."""
    return f"{STAGESETS.kind.lower()}.{STAGESETS.group}/{view['name']}"


def list_table(views: list[dict[str, Any]], *, every: bool, wide: bool) -> tuple[list[str], list[list[str]]]:
    """The header and rows of ``get`` without NAME (``wide``: generation, phases, sources, what it waits
    for, the whole message)."""
    headers = ["NAME", "READY", "REASON", "STAGES", "REVISION", "SUSPENDED", "AGE", "MESSAGE"]
    rows = [[v["name"], v["ready"], v["reason"] or "-", _stages_ready(v), short_revision(v["revision"]),
             str(v["suspended"]).lower(), age(v["created"]),
             _first_line(v["message"], 1000 if wide else 80)] for v in views]
    if any(v["drifted"] or v["driftMode"] != "Correct" for v in views):  # Warn in use: what each left drifted
        headers = [*headers[:4], "DRIFTED", *headers[4:]]
        rows = [[*row[:4], str(len(v["drifted"])) if v["driftMode"] != "Correct" or v["drifted"] else "-",
                 *row[4:]] for v, row in zip(views, rows, strict=True)]
    if wide:
        headers = [*headers[:-1], "GENERATION", "PHASES", "SOURCES", "WAITS FOR", "TARGET", headers[-1]]
        rows = [[*row[:-1], f"{v['observedGeneration'] or '-'}/{v['generation'] or '-'}",
                 ",".join(f"{s['name']}={s['phase']}" for s in v["stages"]) or "-", v["sources"],
                 v["dependsOn"], v["target"] or "-", row[-1]]
                for v, row in zip(views, rows, strict=True)]
    if any(v["shard"] for v in views):  # label shards in use: which shard each one is for
        headers = [headers[0], "SHARD", *headers[1:]]
        rows = [[row[0], v["shard"] or "-", *row[1:]] for v, row in zip(views, rows, strict=True)]
    if every:
        headers = ["NAMESPACE", *headers]
        rows = [[v["namespace"], *row] for v, row in zip(views, rows, strict=True)]
    return headers, rows


def _one(session: Session, view: dict[str, Any]) -> None:
    """``get NAME`` as a table: a few lines about the StageSet, then a line per stage."""
    wide = session.output == "wide"
    echo(f"StageSet {view['namespace']}/{view['name']}: Ready={view['ready']}"
         + (f" ({view['reason']})" if view["reason"] else "")
         + (" [suspended]" if view["suspended"] else "")
         + (f" [shard {view['shard']}]" if view["shard"] else "") + "\n")
    if view["message"]:
        echo(f"  {view['message']}\n")
    echo(f"  revision: {view['revision'] or '-'}\n")
    if view["target"]:
        echo(f"  target: {view['target']}\n")
    if wide:
        echo(f"  generation: {view['generation'] or '-'} (observed {view['observedGeneration'] or '-'}); "
             f"sources: {view['sources']}\n")
        for line in waits_lines(view.get("waitsFor") or []):
            echo(f"  {line}\n")
    for line in steering_lines(view):
        echo(f"  {line}\n")
    echo("\n")
    headers = ["STAGE", "PHASE", "GATE", "REVISION", "OBJECTS", "MESSAGE"]
    limit = 1000 if wide else 100
    rows = [[s["name"], s["phase"], gate_text(s["promotionState"]), short_revision(s["revision"]),
             "-" if s["objects"] is None else str(s["objects"]), _first_line(s["message"], limit)]
            for s in view["stages"]]
    if wide:
        headers = [*headers[:-1], "LAST APPLIED", headers[-1]]
        rows = [[*row[:-1], age(s["lastAppliedTime"]) if s["lastAppliedTime"] else "-", row[-1]]
                for s, row in zip(view["stages"], rows, strict=True)]
    echo(table(headers, rows))


def waits_lines(found: list[dict[str, Any]]) -> list[str]:
    """``waits for Database db: NotReady (is not Ready: provisioning)``, one per ``spec.dependsOn`` entry."""
    return [f"waits for {d['what']}: {d['state']}" + (f" ({d['message']})" if d["message"] else "")
            + (f" [readyExpr: {d['readyExpr']}]" if d.get("readyExpr") else "") for d in found]


def _print_views(session: Session, views: list[dict[str, Any]], *, name: str | None, every: bool,
                 objects: list[KubeObject]) -> None:
    if session.output == "name":
        echo("".join(object_name(v) + "\n" for v in views))
    elif session.output in ("yaml", "json"):
        # The objects themselves, as kubectl prints them (a List without NAME).
        echo(dump_objects(objects, session.output, one=name is not None))
    elif name is not None:
        _one(session, views[0])
    elif views:
        echo(table(*list_table(views, every=every, wide=session.output == "wide")))


class _Columns:
    """Rows printed after the first table (``-w``), padded to that table's columns."""

    def __init__(self) -> None:
        self.widths: list[int] = []

    def first(self, headers: list[str], rows: list[list[str]]) -> str:
        text = table(headers, rows)
        self.widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
        return text

    def more(self, rows: list[list[str]]) -> str:
        return "".join("   ".join(str(cell).ljust(width)
                                   for cell, width in zip(row, self.widths, strict=False)).rstrip() + "\n"
                       for row in rows)


def _watch(session: Session, *, name: str | None, selector: str | None) -> None:
    """``get -w``: the list, then a line (or document) per change, until Ctrl-C."""
    namespace = None if session.all_namespaces else session.namespace
    scope = Scope(namespace=namespace, label_selector=selector,
                  field_selector=f"metadata.name={name}" if name else None)
    columns = _Columns()
    every = namespace is None
    first = True
    try:
        for batch in follow(session.client(), STAGESETS, [scope]):
            changes = sorted(batch, key=lambda c: object_key(c.obj)) if first else batch
            views = [summary(c.obj) for c in changes]
            if session.output in ("table", "wide") and name is None:
                headers, rows = list_table(views, every=every, wide=session.output == "wide")
                if first and views:
                    echo(columns.first(headers, rows))
                elif first:
                    echo(table(headers, []))
                    columns.first(headers, [])
                else:
                    echo(columns.more([[*row[:-1], f"{row[-1]} [deleted]" if c.type == "DELETED" else row[-1]]
                                       for c, row in zip(changes, rows, strict=True)]))
            elif session.output in ("yaml", "json"):
                for change in changes:
                    echo(("---\n" if session.output == "yaml" else "")
                         + dump(as_printed(change.obj), session.output))
            elif session.output == "name":
                echo("".join(object_name(v) + "\n" for v in views))
            else:
                for change, view in zip(changes, views, strict=True):
                    if change.type == "DELETED":
                        echo(f"StageSet {view['namespace']}/{view['name']} deleted\n")
                    else:
                        _one(session, view)
            first = False
    except KeyboardInterrupt:
        return


@click.command("get")
@click.argument("name", required=False)
@click.argument("named", required=False, metavar="[NAME]")
@click.option("-l", "--selector", type=LABEL_SELECTOR, default=None,
              help="Only StageSets with these labels (Kubernetes' selector syntax, e.g. team=shop,tier!=db), "
              "selected by the apiserver.")
@click.option("-w", "--watch", is_flag=True, default=False,
              help="After listing, print each change as it happens (a watch), until Ctrl-C.")
@cluster_options(all_namespaces=True, outputs=("table", "wide", "name", "yaml", "json"))
def get(session: Session, name: str | None, named: str | None, selector: LabelSelector | None,
        watch: bool) -> None:
    """Show StageSets: ready state, each stage's phase and revision.

    Without NAME, every StageSet of the namespace (-A: of every namespace; -l: with these
    labels); with NAME, that StageSet and a line per stage.  -o wide adds the generation, every
    stage's phase, the sources, what it waits for (spec.dependsOn; with NAME, each one's state, read
    as you) and the whole message; -o name prints stageset.stages.metio.wtf/NAME.

    `get fleetrollouts [NAME]` shows FleetRollouts (cluster-scoped): each wave's phase and Ready
    members, and the revisions being rolled out; `get tenant NAME` a tenant at a glance (the
    namespaces labelled stages.metio.wtf/tenant=NAME, their quota use, their StageSets and
    whether they are Ready); `get stageset NAME` names a StageSet whose name is one of those words.
    """
    if name in fleet.KIND_WORDS:
        _get_fleet(session, named)
        return
    if name in tenantview.KIND_WORDS:
        if named is None:
            raise click.UsageError("get tenant NAME: which tenant?")
        tenantview.show(session, named)
        return
    if name in fleet.STAGESET_WORDS and named is not None:
        name, named = named, None
    if named is not None:
        raise click.UsageError("one NAME only (or: get fleetrollouts NAME)")
    if name is not None and session.all_namespaces:
        raise click.UsageError("NAME and --all-namespaces cannot be combined")
    if name is not None and selector is not None:
        raise click.UsageError("NAME and --selector cannot be combined")
    labels = None if selector is None else str(selector)
    if watch:
        _watch(session, name=name, selector=labels)
        return
    if name is not None:
        obj = read_stageset(session, name)
        view = summary(obj)
        if session.output == "wide":
            view["waitsFor"] = waits.states(session.client(), obj)  # read as the user
        _print_views(session, [view], name=name, every=False, objects=[obj])
        return
    namespace = None if session.all_namespaces else session.namespace
    query: dict[str, QueryValue] = {"labelSelector": labels} if labels else {}
    path = STAGESETS.collection_path(namespace)
    listed = session.client().request("GET", path, query=query).get("items", [])
    listed = sorted(listed, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
    views = [summary(obj) for obj in listed]
    if not views and session.output in ("table", "wide"):
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        click.echo(f"No StageSets found in {where}" + (f" with labels {labels}" if labels else "") + ".",
                   err=True)
        return
    _print_views(session, views, name=None, every=namespace is None, objects=listed)
    if session.output in ("table", "wide"):
        _warn_unreconciled(views)


def _get_fleet(session: Session, name: str | None) -> None:
    objects = sorted(fleet.read(session, name), key=lambda o: str(o["metadata"]["name"]))
    views = [fleet.summary(obj) for obj in objects]
    if session.output in ("yaml", "json"):
        echo(dump_objects(objects, session.output, one=name is not None))
    elif session.output == "name":
        echo("".join(f"fleetrollout.stages.metio.wtf/{v['name']}\n" for v in views))
    elif not views:
        click.echo("No FleetRollouts found.", err=True)
    else:
        echo(fleet.list_table(sorted(views, key=lambda v: v["name"])))


def _warn_unreconciled(views: list[dict[str, Any]]) -> None:
    """A StageSet labelled for a shard that has not been reconciled at its generation: perhaps no
    shard serves its key (when the main shard knows the shards, it says so itself: NoShard)."""
    waiting = [v for v in views if v["shard"] and v["observedGeneration"] != v["generation"]]
    if waiting:
        names = ", ".join(f"{v['namespace']}/{v['name']} ({SHARD_LABEL}={v['shard']})" for v in waiting[:5])
        click.echo(f"Warning: {len(waiting)} StageSet(s) carry a shard key and were not reconciled at their "
                   f"generation yet: {names}{' ...' if len(waiting) > 5 else ''}; is a controller running "
                   f"with --watch-label-selector {SHARD_LABEL}=<key> for each key?", err=True)


# -- tree -----------------------------------------------------------------------------------------

def object_state(client: KubeClient, mapper: RestMapper, oid: ObjectId, api_version: str) -> tuple[str, str]:
    """(state, message) of one inventoried object, read as ``client``'s identity."""
    try:
        resource = mapper.resolve(api_version, oid.kind)
    except UnknownKindError:
        return "Gone", f"the cluster serves no {oid.kind} in {api_version}"
    try:
        live = client.get(resource.object_path(name=oid.name, namespace=oid.namespace or None))
    except ApiError as error:
        if error.not_found:
            return "NotFound", ""
        if error.forbidden:
            return "Unknown", "you may not read it"
        raise
    verdict = readiness(live)
    return verdict.status.value, verdict.message


def _object_name(oid: ObjectId) -> str:
    return f"{oid.kind}/{oid.namespace}/{oid.name}" if oid.namespace else f"{oid.kind}/{oid.name}"


def tree_view(session: Session, obj: KubeObject) -> dict[str, Any]:
    """Stages -> objects from the inventory, each with its readiness (read as the user)."""
    client = session.client()
    mapper = RestMapper(client)
    view = summary(obj)
    drifted = drifted_fields(view)
    inventories = {inv.get("name"): inv for inv in (obj.get("status") or {}).get("inventory") or []}
    stages: list[dict[str, Any]] = []
    names = [s["name"] for s in view["stages"]]
    # A stage removed from the spec keeps its inventory until prune or teardown ran.
    for name in [*names, *sorted(n for n in inventories if n not in names)]:
        stage = next((s for s in view["stages"] if s["name"] == name),
                     {"name": name, "phase": "Removed", "revision": None, "message": "no longer in the spec",
                      "promotionState": None})
        objects = []
        inventory = inventories.get(name) or {}
        for entry in inventory.get("entries") or []:
            oid = ObjectId.decode(str(entry["id"]))
            state, message = object_state(client, mapper, oid, str(entry["v"]))
            found = {"apiVersion": entry["v"], "kind": oid.kind, "namespace": oid.namespace or None,
                     "name": oid.name, "status": state, "message": message}
            if (name, str(entry["id"])) in drifted:
                fields = drifted[(name, str(entry["id"]))]
                found["drifted"] = {"deleted": True} if fields is None else {"fields": fields}
            objects.append(found)
        stages.append({**stage, "serviceAccountName": inventory.get("serviceAccountName"),
                       "objects": objects})
    return {"namespace": view["namespace"], "name": view["name"], "ready": view["ready"],
            "reason": view["reason"], "revision": view["revision"], "target": view["target"],
            "waitsFor": waits.states(client, obj), "stages": stages, "pendingUpdate": view["pendingUpdate"],
            "rollback": view["rollback"], "drift": view["drift"]}


def render_tree(view: dict[str, Any]) -> str:
    lines = [f"StageSet/{view['namespace']}/{view['name']}  Ready={view['ready']}"
             + (f" ({view['reason']})" if view["reason"] else "")
             + (f"  on {view['target']}" if view.get("target") else "")]
    lines.extend(f"  {line}" for line in steering_lines(view))
    lines.extend(f"  {line}" for line in waits_lines(view.get("waitsFor") or []))
    stages = view["stages"]
    for i, stage in enumerate(stages):
        last_stage = i == len(stages) - 1
        branch, indent = ("└── ", "    ") if last_stage else ("├── ", "│   ")
        revision = f"  {short_revision(stage.get('revision'))}" if stage.get("revision") else ""
        gate = f"  [{gate_text(stage['promotionState'])}]" if stage.get("promotionState") else ""
        lines.append(f"{branch}stage {stage['name']}  {stage['phase']}{revision}{gate}")
        objects = stage["objects"]
        if not objects:
            lines.append(f"{indent}└── (no objects applied yet)")
        for j, item in enumerate(objects):
            leaf = "└── " if j == len(objects) - 1 else "├── "
            where = f"{item['namespace']}/" if item["namespace"] else ""
            note = f"  {item['message']}" if item["message"] else ""
            drift = item.get("drifted")
            if drift is not None:  # left as someone else changed it (driftDetection.mode Warn)
                note += "  [drifted: deleted]" if drift.get("deleted") else \
                    f"  [drifted: {', '.join(drift.get('fields') or []) or 'changed'}]"
            lines.append(f"{indent}{leaf}{item['kind']}/{where}{item['name']}  {item['status']}{note}")
    return "\n".join(lines) + "\n"


@click.command("tree")
@click.argument("name")
@click.argument("named", required=False, metavar="[NAME]")
@cluster_options()
def tree(session: Session, name: str, named: str | None) -> None:
    """Show a StageSet's stages and the objects each one applied, with their readiness.

    First what it waits for (spec.dependsOn: StageSets and objects of other kinds, each Ready or
    not by the controller's rules, readyExpr included).  Objects come from the StageSet's inventory
    and are read as you, so an object you may not read shows as Unknown.  One a StageSet in
    `driftDetection.mode: Warn` left as someone else changed it is marked `[drifted: <fields>]` (or
    `[drifted: deleted]`).  `tree fleetrollout NAME` shows a FleetRollout's waves, each member with
    the revisions released to it and what it holds.
    """
    if name in fleet.KIND_WORDS:
        if named is None:
            raise click.UsageError("tree fleetrollout NAME")
        view = fleet.summary(fleet.read(session, named)[0])
        echo(fleet.render_tree(view) if session.output == "table" else dump(view, session.output))
        return
    if name in fleet.STAGESET_WORDS and named is not None:
        name, named = named, None
    if named is not None:
        raise click.UsageError("one NAME only (or: tree fleetrollout NAME)")
    view = tree_view(session, read_stageset(session, name))
    echo(render_tree(view) if session.output == "table" else dump(view, session.output))


# -- graph ----------------------------------------------------------------------------------------

def _dependency_state(client: KubeClient, namespace: str, name: str) -> str:
    try:
        other = client.get(STAGESETS.object_path(name=name, namespace=namespace))
    except ApiError as error:
        if error.not_found:
            return "NotFound"
        if error.forbidden:
            return "Unknown"
        raise
    ready = find_condition((other.get("status") or {}).get("conditions"), ConditionType.READY)
    return f"Ready={ready.get('status', 'Unknown')}"


def graph_view(session: Session, obj: KubeObject) -> dict[str, Any]:
    view = summary(obj)
    spec = obj.get("spec") or {}
    nodes = [StageNode(str(s["name"]), None if s.get("dependsOn") is None else tuple(s["dependsOn"]))
             for s in spec.get("stages") or []]
    try:
        graph = stage_graph(nodes)
    except OrderingError as error:
        raise CliError(f"StageSet {view['namespace']}/{view['name']}: {error}") from None
    phases = {s["name"]: s["phase"] for s in view["stages"]}
    namespace = str(view["namespace"])
    client = session.client()
    stagesets = [d for d in waits.entries(obj) if waits.is_stageset(d)]
    dependencies = [{"namespace": d.get("namespace") or namespace, "name": d["name"]} for d in stagesets]
    for dependency in dependencies:
        dependency["state"] = _dependency_state(client, dependency["namespace"], dependency["name"])
    others = waits.states(client, obj, stagesets=False)
    return {
        "namespace": namespace, "name": view["name"],
        "stages": [{"name": n.name, "phase": phases.get(n.name, "Pending"),
                    "after": sorted(graph.predecessors(n.name))} for n in nodes],
        "dependsOn": dependencies,
        "waitsFor": others,
    }


def _dot_id(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def render_dot(view: dict[str, Any]) -> str:
    """Graphviz: stage edges point from a dependency to its dependent; StageSet dependencies
    point at the stages that start first."""
    me = f"{view['namespace']}/{view['name']}"
    lines = [f"digraph {_dot_id(me)} {{", "  rankdir=LR;", "  node [shape=box, style=rounded];",
             f"  subgraph {_dot_id('cluster_' + me)} {{", f"    label={_dot_id('StageSet ' + me)};"]
    for stage in view["stages"]:
        lines.append(f"    {_dot_id('stage/' + stage['name'])} "
                     f"[label={_dot_id(stage['name'] + chr(10) + stage['phase'])}];")
    lines.append("  }")
    for stage in view["stages"]:
        for before in stage["after"]:
            lines.append(f"  {_dot_id('stage/' + before)} -> {_dot_id('stage/' + stage['name'])};")
    roots = [s["name"] for s in view["stages"] if not s["after"]]
    for dependency in view["dependsOn"]:
        node = f"stageset/{dependency['namespace']}/{dependency['name']}"
        label = f"StageSet {dependency['namespace']}/{dependency['name']}\n{dependency['state']}"
        lines.append(f"  {_dot_id(node)} [label={_dot_id(label)}, style=dashed];")
        lines.extend(f"  {_dot_id(node)} -> {_dot_id('stage/' + root)} [style=dashed];" for root in roots)
    for other in view.get("waitsFor") or []:
        node = f"object/{other['kind']}/{other['namespace']}/{other['name']}"
        label = f"{other['what']}\n{other['state']}"
        lines.append(f"  {_dot_id(node)} [label={_dot_id(label)}, style=dashed];")
        lines.extend(f"  {_dot_id(node)} -> {_dot_id('stage/' + root)} [style=dashed];" for root in roots)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_graph_table(view: dict[str, Any]) -> str:
    text = table(["STAGE", "PHASE", "AFTER"],
                 [[s["name"], s["phase"], ", ".join(s["after"]) or "-"] for s in view["stages"]])
    if view["dependsOn"]:
        text += "\n" + table(["DEPENDS ON STAGESET", "STATE"],
                             [[f"{d['namespace']}/{d['name']}", d["state"]] for d in view["dependsOn"]])
    if view.get("waitsFor"):
        text += "\n" + table(["DEPENDS ON", "STATE", "MESSAGE"],
                             [[d["what"], d["state"], _first_line(d["message"], 100) or "-"]
                              for d in view["waitsFor"]])
    return text


@click.command("graph")
@click.argument("name")
@cluster_options(outputs=("table", "dot", "yaml", "json"))
def graph(session: Session, name: str) -> None:
    """Show the stage graph (which stage runs after which) and what this one waits for: the StageSets
    and objects of other kinds in spec.dependsOn, each with its state as you read it.

    ``-o dot`` prints Graphviz: ``stageset graph shop -o dot | dot -Tsvg > shop.svg``.
    """
    view = graph_view(session, read_stageset(session, name))
    if session.output == "dot":
        echo(render_dot(view))
    elif session.output == "table":
        echo(render_graph_table(view))
    else:
        echo(dump(view, session.output))


# -- events ---------------------------------------------------------------------------------------

def _events_for(client: KubeClient, namespace: str, kind: str, name: str) -> list[KubeObject]:
    # apiVersion too: Flux's GitRepository of the same name is not ours.
    selector = (f"involvedObject.apiVersion={API_VERSION},involvedObject.kind={kind},"
                f"involvedObject.name={name}")
    try:
        found: list[KubeObject] = client.request(
            "GET", f"/api/v1/namespaces/{namespace}/events", query={"fieldSelector": selector}
        ).get("items", [])
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not list events in namespace {namespace}: {error.message}") from None
        raise
    return found


def event_row(event: KubeObject) -> dict[str, Any]:
    involved = event.get("involvedObject") or {}
    series = event.get("series") or {}
    last = (series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
            or (event.get("metadata") or {}).get("creationTimestamp"))
    return {"lastSeen": last, "type": event.get("type", ""), "reason": event.get("reason", ""),
            "namespace": (event.get("metadata") or {}).get("namespace") or involved.get("namespace", ""),
            "object": f"{involved.get('kind')}/{involved.get('name')}",
            "count": series.get("count") or event.get("count") or 1, "message": event.get("message", "")}


def sources_of(obj: KubeObject) -> list[tuple[str, str]]:
    """The GitRepositories the StageSet's stages name (namespace, name), in stage order."""
    namespace = str(obj["metadata"]["namespace"])
    found: list[tuple[str, str]] = []
    for stage in (obj.get("spec") or {}).get("stages") or []:
        ref = stage.get("sourceRef") or {}
        key = (str(ref.get("namespace") or namespace), str(ref.get("name")))
        if ref.get("kind", "GitRepository") == "GitRepository" and key not in found:
            found.append(key)
    return found


def _involved(obj: KubeObject, *, with_sources: bool) -> dict[str, set[tuple[str, str]]]:
    """{namespace: {(kind, name)}}: the objects whose events ``events NAME`` shows."""
    namespace, name = str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"])
    wanted: dict[str, set[tuple[str, str]]] = {namespace: {("StageSet", name)}}
    if with_sources:
        for source_ns, source in sources_of(obj):
            wanted.setdefault(source_ns, set()).add((GITREPOSITORIES.kind, source))
    return wanted


def collect_events(session: Session, obj: KubeObject, *, with_sources: bool) -> list[dict[str, Any]]:
    client = session.client()
    namespace, name = str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"])
    events = _events_for(client, namespace, "StageSet", name)
    if with_sources:
        for source_ns, source in sources_of(obj):
            try:
                events += _events_for(client, source_ns, GITREPOSITORIES.kind, source)
            except CliError:
                continue  # another namespace's events the user may not list: leave them out
    rows = [event_row(e) for e in events]
    return sorted(rows, key=lambda r: str(r["lastSeen"] or ""))


def _all_events(session: Session, namespace: str | None) -> list[dict[str, Any]]:
    """Every event about our kinds in ``namespace`` (``None``: every namespace)."""
    path = f"/api/v1/namespaces/{namespace}/events" if namespace else "/api/v1/events"
    try:
        found = session.client().request("GET", path, query={"fieldSelector": OUR_EVENTS}).get("items", [])
    except ApiError as error:
        if error.forbidden:
            where = f"in namespace {namespace}" if namespace else "in every namespace (-A)"
            raise CliError(f"you may not list events {where}: {error.message}") from None
        raise
    return sorted((event_row(e) for e in found), key=lambda r: str(r["lastSeen"] or ""))


OUR_EVENTS = f"involvedObject.apiVersion={API_VERSION}"


def event_table(rows: Iterable[dict[str, Any]], *, every: bool) -> tuple[list[str], list[list[str]]]:
    headers = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "COUNT", "MESSAGE"]
    cells = [[age(r["lastSeen"]), r["type"], r["reason"], r["object"], str(r["count"]), r["message"]]
             for r in rows]
    if every:
        return ["NAMESPACE", *headers], [[r["namespace"], *c] for r, c in zip(rows, cells, strict=True)]
    return headers, cells


def render_events(rows: Iterable[dict[str, Any]], *, every: bool = False) -> str:
    return table(*event_table(list(rows), every=every))


def _watch_events(session: Session, scopes: dict[str | None, set[tuple[str, str]] | None], *,
                  every: bool) -> None:
    """``events --watch``: the events kept now, then each new one (or one counted again), until
    Ctrl-C.  ``scopes``: {namespace: the (kind, name) shown there, ``None``: all of our kinds}."""
    def shown(event: KubeObject) -> bool:
        involved = event.get("involvedObject") or {}
        namespace = (event.get("metadata") or {}).get("namespace")
        wanted = scopes.get(namespace, scopes.get(None))
        return wanted is None or (involved.get("kind"), involved.get("name")) in wanted

    columns = _Columns()
    first = True
    try:
        for batch in follow(session.client(), EVENTS,
                            [Scope(namespace=ns, field_selector=OUR_EVENTS) for ns in scopes]):
            rows = [event_row(c.obj) for c in batch if c.type != "DELETED" and shown(c.obj)]
            if first:
                rows.sort(key=lambda r: str(r["lastSeen"] or ""))
            if session.output != "table":
                for row in rows:
                    echo(("---\n" if session.output == "yaml" else "") + dump(row, session.output))
            elif first:
                echo(columns.first(*event_table(rows, every=every)))
            elif rows:
                echo(columns.more(event_table(rows, every=every)[1]))
            first = False
    except KeyboardInterrupt:
        return


@click.command("events")
@click.argument("name", required=False)
@click.option("--with-sources/--no-sources", default=True, show_default=True,
              help="Also show the events of the GitRepositories its stages use.")
@click.option("-w", "--watch", is_flag=True, default=False,
              help="After the events kept now, print each new one as it happens (a watch), until Ctrl-C.")
@cluster_options(all_namespaces=True)
def events(session: Session, name: str | None, with_sources: bool, watch: bool) -> None:
    """Show the events of a StageSet (and of its sources), oldest first.

    Without NAME, the events of every StageSet and GitRepository in the namespace (-A: in every
    namespace you may list events in).
    """
    if name is not None and session.all_namespaces:
        raise click.UsageError("NAME and --all-namespaces cannot be combined")
    every = name is None and session.all_namespaces
    if watch:
        if name is None:
            _watch_events(session, {None if every else session.namespace: None}, every=every)
        else:
            involved = _involved(read_stageset(session, name), with_sources=with_sources)
            _watch_events(session, dict(involved.items()), every=len(involved) > 1)
        return
    if name is None:
        rows = _all_events(session, None if every else session.namespace)
    else:
        rows = collect_events(session, read_stageset(session, name), with_sources=with_sources)
    if session.output != "table":
        echo(dump(rows, session.output))
    elif not rows:
        what = f"StageSet {session.namespace}/{name}" if name else \
            ("any namespace" if every else f"namespace {session.namespace}")
        click.echo(f"No events for {what}.", err=True)
    else:
        echo(render_events(rows, every=every))
