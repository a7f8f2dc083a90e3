"""``trace``: which StageSet, stage, revision and source own an object in the cluster.

The controller labels every object it applies with its StageSet and stage
(:mod:`stageset.apply.ownership`); the StageSet's inventory (``status.inventory``) lists what each
stage applied and as which ServiceAccount; the stage names its source, whose status carries the
revision.  ``trace`` reads those, as ``flux trace`` does for Flux's objects: the object, then its
StageSet, stage and source.  Labels are a claim anyone who may edit the object can make, so the
inventory decides: an object the labels name but the inventory does not list is reported as such.

Identity: every request is the user's own (the kubeconfig's credentials): an object, StageSet or
source the user may not read is shown as such, never guessed at.  Discovery (which kinds exist) is
readable by every authenticated user.
"""

from __future__ import annotations

from typing import Any

import click

from stageset.api import API_VERSION
from stageset.api.vocabulary import ConditionType
from stageset.apply.inventory import ObjectId
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.cli.session import CliError, Session, cluster_options, dump, echo
from stageset.controller.conditions import find_condition
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource, RestMapper, UnknownKindError, split_api_version
from stageset.kube.types import KubeObject

FLUX_SOURCES = "source.toolkit.fluxcd.io/v1"


def _matches(entry: dict[str, Any], wanted: str) -> bool:
    names = {entry.get("kind", "").lower(), entry.get("name", ""), entry.get("singularName", ""),
             *entry.get("shortNames", [])}
    return wanted.lower() in names


def resolve_kind(client: KubeClient, text: str) -> Resource:
    """``configmap``, ``deploy``, ``Deployment``, ``deployments.apps`` or ``StageSet.stages.metio.wtf``:
    the resource, found in discovery (core first, then each group's preferred version)."""
    wanted, _, group = text.partition(".")
    versions: list[str] = []
    if not group:
        versions += [f"{v}" for v in client.get("/api").get("versions", ["v1"])]
    for entry in client.get("/apis").get("groups", []):
        if not group or entry.get("name") == group:
            preferred = (entry.get("preferredVersion") or {}).get("groupVersion")
            if preferred:
                versions.append(preferred)
    for api_version in versions:
        g, v = split_api_version(api_version)
        try:
            document = client.get(f"/apis/{g}/{v}" if g else f"/api/{v}")
        except ApiError as error:
            if error.not_found or error.status == 503:  # a group being removed, or an unavailable API service
                continue
            raise
        for entry in document.get("resources", []):
            if "/" not in entry.get("name", "/") and _matches(entry, wanted):
                return Resource(group=g, version=v, kind=entry["kind"], plural=entry["name"],
                                namespaced=bool(entry.get("namespaced")))
    raise CliError(f"the cluster serves no kind {text!r}")


def _read(client: KubeClient, path: str, what: str) -> KubeObject | str:
    """The object, or why it cannot be shown."""
    try:
        return client.get(path)
    except ApiError as error:
        if error.not_found:
            return f"{what} not found"
        if error.forbidden:
            return f"you may not read {what}"
        raise


def _ready(obj: KubeObject) -> str:
    ready = find_condition((obj.get("status") or {}).get("conditions"), ConditionType.READY)
    text = f"Ready={ready.get('status', 'Unknown')}"
    if ready.get("reason"):
        text += f" ({ready['reason']})"
    return text


def _source(client: KubeClient, ref: dict[str, Any], namespace: str) -> dict[str, Any]:
    kind = ref.get("kind") or "GitRepository"
    api_version = ref.get("apiVersion") or (API_VERSION if kind == "GitRepository" else FLUX_SOURCES)
    source_ns = ref.get("namespace") or namespace
    name = str(ref.get("name", ""))
    view: dict[str, Any] = {"kind": kind, "apiVersion": api_version, "namespace": source_ns, "name": name}
    try:
        resource = RestMapper(client).resolve(api_version, kind)
    except UnknownKindError:
        view["problem"] = f"the cluster serves no {kind} in {api_version}"
        return view
    found = _read(client, resource.object_path(name=name, namespace=source_ns), f"{kind} {source_ns}/{name}")
    if isinstance(found, str):
        view["problem"] = found
        return view
    status = found.get("status") or {}
    view.update({"url": (found.get("spec") or {}).get("url"), "ready": _ready(found),
                 "revision": (status.get("artifact") or {}).get("revision")})
    return view


def trace_object(client: KubeClient, resource: Resource, name: str, namespace: str | None) -> dict[str, Any]:
    """What owns the object, as far as the user may read: a dict for -o yaml/json and the table."""
    namespace = namespace if resource.namespaced else None
    where = f"{namespace}/{name}" if namespace else name
    found = _read(client, resource.object_path(name=name, namespace=namespace), f"{resource.kind} {where}")
    if isinstance(found, str):
        raise CliError(found)
    labels = (found.get("metadata") or {}).get("labels") or {}
    view: dict[str, Any] = {"object": {"apiVersion": resource.api_version, "kind": resource.kind,
                                       "namespace": namespace, "name": name}}
    owner_name, owner_ns = labels.get(LABEL_NAME), labels.get(LABEL_NAMESPACE)
    stage_name = labels.get(LABEL_STAGE)
    if not owner_name or not owner_ns:
        raise CliError(f"{resource.kind} {where} is not managed by a StageSet (no {LABEL_NAME} label)")
    view["stageset"] = {"namespace": owner_ns, "name": owner_name}
    view["stage"] = {"name": stage_name}
    stageset = _read(client, STAGESETS.object_path(name=owner_name, namespace=owner_ns),
                     f"StageSet {owner_ns}/{owner_name}")
    if isinstance(stageset, str):
        view["stageset"]["problem"] = stageset
        return view
    status = stageset.get("status") or {}
    view["stageset"].update({"ready": _ready(stageset), "revision": status.get("lastAppliedRevision"),
                             "deleting": bool(stageset["metadata"].get("deletionTimestamp"))})
    stages = (stageset.get("spec") or {}).get("stages", [])
    spec_stage = next((s for s in stages if s.get("name") == stage_name), None)
    stage_status: dict[str, Any] = next(
        (s for s in status.get("stages", []) if s.get("name") == stage_name), {})
    view["stage"].update({"inSpec": spec_stage is not None, "phase": stage_status.get("phase"),
                          "revision": stage_status.get("revision"),
                          "path": (spec_stage or {}).get("path", "./") if spec_stage else None})
    wanted = ObjectId(namespace=namespace or "", name=name, group=resource.group, kind=resource.kind).encode()
    inventory = next((i for i in status.get("inventory", []) if i.get("name") == stage_name), None)
    listed = bool(inventory) and any(e.get("id") == wanted for e in (inventory or {}).get("entries", []))
    account = (inventory or {}).get("serviceAccountName") if listed else None
    view["inventory"] = {"listed": listed, "serviceAccountName": account}
    if spec_stage is not None:
        view["source"] = _source(client, spec_stage.get("sourceRef") or {}, owner_ns)
    return view


def _lines(view: dict[str, Any]) -> list[str]:
    obj, stageset, stage = view["object"], view["stageset"], view["stage"]
    where = f"{obj['namespace']}/{obj['name']}" if obj["namespace"] else obj["name"]
    lines = [f"Object:     {obj['kind']} {where} ({obj['apiVersion']})",
             f"StageSet:   {stageset['namespace']}/{stageset['name']}"
             + (f"  {stageset['ready']}" if "ready" in stageset else "")
             + ("  [being deleted]" if stageset.get("deleting") else "")]
    if "problem" in stageset:
        lines.append(f"            {stageset['problem']}")
        lines.append(f"Stage:      {stage['name']} (from the object's labels)")
        return lines
    lines.append(f"Revision:   {stageset.get('revision') or '-'} (last complete apply)")
    if not stage.get("inSpec"):
        lines.append(f"Stage:      {stage['name']} (no longer in the StageSet's spec: pruned on the next "
                     "pass)")
    else:
        phase = stage.get("phase") or "Pending"
        lines.append(f"Stage:      {stage['name']}  phase {phase}  path {stage['path']}")
        lines.append(f"            revision {stage.get('revision') or '-'}")
    inventory = view["inventory"]
    if inventory["listed"]:
        account = inventory["serviceAccountName"]
        lines.append(f"Inventory:  listed in stage {stage['name']}"
                     + (f" (applied as ServiceAccount {stageset['namespace']}/{account})" if account else
                        " (applied as the controller)"))
    else:
        lines.append(f"Inventory:  NOT listed in stage {stage['name']}: the labels claim it, the StageSet "
                     "does not own it (never pruned or torn down by it)")
    source = view.get("source")
    if source:
        named = f"{source['kind']} {source['namespace']}/{source['name']}"
        lines.append(f"Source:     {named} ({source['apiVersion']})")
        if "problem" in source:
            lines.append(f"            {source['problem']}")
        else:
            lines.append(f"            {source['ready']}  revision {source.get('revision') or '-'}")
            if source.get("url"):
                lines.append(f"            url {source['url']}")
    return lines


@click.command("trace")
@click.argument("kind")
@click.argument("name", required=False)
@cluster_options(outputs=("table", "yaml", "json"))
def trace(session: Session, kind: str, name: str | None) -> None:
    """Show which StageSet, stage, revision and source own an object (KIND NAME or KIND/NAME).

    KIND is what kubectl accepts: `configmap`, `deploy`, `deployments.apps`.  An object whose labels
    name a StageSet that does not list it in its inventory is reported as not owned.
    """
    if name is None:
        kind, sep, name = kind.partition("/")
        if not sep or not name:
            raise click.UsageError("name the object: KIND NAME or KIND/NAME")
    client = session.client()
    resource = resolve_kind(client, kind)
    view = trace_object(client, resource, name, session.namespace)
    if session.output != "table":
        echo(dump(view, session.output))
        return
    echo("\n".join(_lines(view)) + "\n")
