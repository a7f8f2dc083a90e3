"""``stageset get tenant NAME``: a tenant at a glance — its namespaces, each one's quota use, its
StageSets and whether they are Ready.

Identity: the user's own (the kubeconfig's credentials); read-only.  The tenant's namespaces are
those labelled ``stages.metio.wtf/tenant=NAME`` (listed cluster-wide, so the user must be allowed to
list Namespaces: a platform engineer); each namespace's ResourceQuotas and StageSets are read in
that namespace, so a namespace the user may not read shows as "not readable" rather than failing
the whole view.  :func:`tenant_view` (pure) turns what was read into what is shown.
"""

from __future__ import annotations

from typing import Any

import click

from stageset.api.tenancy import TENANT_LABEL
from stageset.cli.session import CliError, Session, dump, echo, table
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.quantity import parse_quantity
from stageset.kube.types import KubeObject

KIND_WORDS = frozenset({"tenant", "tenants"})
"""``get tenant NAME``: the words that name this view."""
_NAMESPACES = "/api/v1/namespaces"


def _quota(items: list[KubeObject]) -> list[dict[str, Any]]:
    """Every ResourceQuota's resources: used of hard, and the fraction (None when unknown)."""
    rows: list[dict[str, Any]] = []
    for quota in sorted(items, key=lambda q: str(q["metadata"]["name"])):
        status = quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for resource in sorted(hard):
            fraction = None
            try:
                limit = parse_quantity(str(hard[resource]))
                if resource in used and limit > 0:
                    fraction = float(parse_quantity(str(used[resource])) / limit)
            except ValueError:
                fraction = None
            rows.append({"quota": quota["metadata"]["name"], "resource": resource,
                         "used": used.get(resource), "hard": hard[resource], "fraction": fraction})
    return rows


def _ready(obj: KubeObject) -> dict[str, str]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return {"status": str(ready.get("status", "Unknown")), "reason": str(ready.get("reason", "")),
            "message": str(ready.get("message", ""))}


def tenant_view(name: str, namespaces: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What ``get tenant`` shows (also its -o yaml/json form), from what was read per namespace:
    ``{"quotas": [...], "stagesets": [...]}`` or ``{"error": "..."}``."""
    shown: list[dict[str, Any]] = []
    for namespace in sorted(namespaces):
        read = namespaces[namespace]
        if "error" in read:
            shown.append({"name": namespace, "error": read["error"]})
            continue
        stagesets = [{"name": obj["metadata"]["name"], **_ready(obj),
                      "suspended": bool((obj.get("spec") or {}).get("suspend", False))}
                     for obj in sorted(read["stagesets"], key=lambda o: str(o["metadata"]["name"]))]
        shown.append({"name": namespace, "quota": _quota(read["quotas"]), "stagesets": stagesets})
    every = [s for ns in shown for s in ns.get("stagesets", [])]
    return {"tenant": name, "namespaces": shown,
            "stagesets": {"total": len(every), "ready": sum(s["status"] == "True" for s in every)}}


def _read_namespace(client: KubeClient, namespace: str) -> dict[str, Any]:
    try:
        quotas = client.request("GET", f"{_NAMESPACES}/{namespace}/resourcequotas").get("items", [])
        stagesets = client.request("GET", STAGESETS.collection_path(namespace)).get("items", [])
    except ApiError as error:
        if error.forbidden:
            return {"error": "not readable with your credentials"}
        raise
    return {"quotas": quotas, "stagesets": stagesets}


def read_tenant(session: Session, name: str) -> dict[str, Any]:
    """The tenant's view, read as the user."""
    client = session.client()
    try:
        found = client.request("GET", _NAMESPACES, query={"labelSelector": f"{TENANT_LABEL}={name}"})
    except ApiError as error:
        if error.forbidden:
            raise CliError("you may not list namespaces (needed to find the tenant's): "
                           f"{error.message}") from None
        raise
    namespaces = sorted(str(ns["metadata"]["name"]) for ns in found.get("items", []))
    if not namespaces:
        raise CliError(f"no namespace is labelled {TENANT_LABEL}={name}")
    return tenant_view(name, {namespace: _read_namespace(client, namespace) for namespace in namespaces})


def _quota_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "-"
    return ", ".join(f"{r['resource']} {r['used'] if r['used'] is not None else '?'}/{r['hard']}"
                     for r in rows)


def show(session: Session, name: str) -> None:
    """Print the tenant's view in the session's output format."""
    view = read_tenant(session, name)
    if session.output in ("yaml", "json"):
        echo(dump(view, session.output))
        return
    if session.output == "name":
        echo("".join(f"namespace/{ns['name']}\n" for ns in view["namespaces"]))
        return
    counts = view["stagesets"]
    echo(f"Tenant {name}: {len(view['namespaces'])} namespace(s), {counts['ready']}/{counts['total']} "
         "StageSet(s) Ready\n\n")
    echo(table(["NAMESPACE", "QUOTA (USED/HARD)", "STAGESETS", "READY"], [
        [ns["name"], ns["error"], "-", "-"] if "error" in ns else
        [ns["name"], _quota_text(ns["quota"]), str(len(ns["stagesets"])),
         str(sum(s["status"] == "True" for s in ns["stagesets"]))]
        for ns in view["namespaces"]]))
    rows = [[f"{ns['name']}/{s['name']}", s["status"] + (" (suspended)" if s["suspended"] else ""),
             s["reason"], s["message"].splitlines()[0][:100] if s["message"] else ""]
            for ns in view["namespaces"] for s in ns.get("stagesets", [])]
    if rows:
        echo("\n" + table(["STAGESET", "READY", "REASON", "MESSAGE"], rows))
    full = [f"{ns['name']}: {r['resource']} at {r['fraction']:.0%} of {r['hard']}"
            for ns in view["namespaces"] for r in ns.get("quota", []) if (r["fraction"] or 0) >= 0.9]
    for line in full:
        click.echo(f"warning: quota nearly used up in {line}", err=True)
