"""``get fleetrollouts`` and ``tree fleetrollout NAME``: a FleetRollout's waves, members, revisions
and what holds them, from its status.

Identity: the user's own (FleetRollouts are cluster-scoped: reading one needs a ClusterRole that
grants it, the platform's).  Only the rollout is read: its status already names every member,
what each was released and what each holds, so no tenant's StageSet is read on the user's behalf.
"""

from __future__ import annotations

from typing import Any

from stageset.api.vocabulary import ConditionType
from stageset.cli.session import CliError, Session, age, short_revision, table
from stageset.controller.conditions import find_condition
from stageset.controller.kinds import FLEETROLLOUTS
from stageset.kube.client import ApiError
from stageset.kube.types import KubeObject

KIND_WORDS = frozenset({"fleetrollout", "fleetrollouts", "ssfleet", "fleetrollouts.stages.metio.wtf"})
"""How ``get`` and ``tree`` are told to show FleetRollouts instead of StageSets."""
STAGESET_WORDS = frozenset({"stageset", "stagesets", "ss", "stagesets.stages.metio.wtf"})


def read(session: Session, name: str | None) -> list[KubeObject]:
    """The FleetRollout ``name`` (``None``: every one), read as the user."""
    client = session.client()
    try:
        if name is not None:
            return [client.get(FLEETROLLOUTS.object_path(name=name, namespace=None))]
        listed: list[KubeObject] = client.get(FLEETROLLOUTS.collection_path(None)).get("items", [])
        return listed
    except ApiError as error:
        what = f"FleetRollout {name}" if name else "FleetRollouts"
        if error.not_found and name:
            raise CliError(f"{what} not found") from None
        if error.forbidden:
            raise CliError(f"you may not read {what}: {error.message}") from None
        raise


def summary(obj: KubeObject) -> dict[str, Any]:
    """What ``get fleetrollouts`` shows of one (also its -o yaml/json form)."""
    status = obj.get("status") or {}
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    waves = status.get("waves") or []
    return {
        "name": obj["metadata"]["name"],
        "ready": ready.get("status", "Unknown"),
        "reason": ready.get("reason", ""),
        "message": ready.get("message", ""),
        "revisions": (status.get("round") or {}).get("revisions") or [],
        "waves": [{"name": w.get("name"), "phase": w.get("phase"), "members": w.get("members", 0),
                   "ready": w.get("ready", 0), "openedAt": w.get("openedAt"), "readyAt": w.get("readyAt")}
                  for w in waves],
        "members": [{"namespace": m.get("namespace"), "name": m.get("name"), "wave": m.get("wave"),
                     "ready": bool(m.get("ready")), "released": m.get("released") or {},
                     "pending": m.get("pending") or {}, "hold": m.get("hold")}
                    for m in status.get("members") or []],
        "halted": status.get("halted"),
        "withdrawn": status.get("withdrawn") or [],
        "created": obj["metadata"].get("creationTimestamp"),
    }


def _waves_text(view: dict[str, Any]) -> str:
    return ", ".join(f"{w['name']} {w['phase']} {w['ready']}/{w['members']}" for w in view["waves"]) or "-"


def list_table(views: list[dict[str, Any]]) -> str:
    rows = [[v["name"], v["ready"], v["reason"] or "-", _waves_text(v),
             ", ".join(short_revision(r) for r in v["revisions"]) or "-", age(v["created"])] for v in views]
    return table(["NAME", "READY", "REASON", "WAVES", "REVISIONS", "AGE"], rows)


def _revisions(revisions: dict[str, str]) -> str:
    return ", ".join(f"{source} {short_revision(rev)}" for source, rev in sorted(revisions.items())) or "-"


def render_tree(view: dict[str, Any]) -> str:
    """Waves -> members, each with what it was released, what it holds and why."""
    reason = f" ({view['reason']})" if view["reason"] else ""
    lines = [f"FleetRollout/{view['name']}  Ready={view['ready']}{reason}"]
    if view["message"]:
        lines.append(f"  {view['message']}")
    if view["revisions"]:
        lines.append(f"  rolling out: {', '.join(view['revisions'])}")
    if view["withdrawn"]:
        lines.append(f"  withdrawn (never released again): {', '.join(view['withdrawn'])}")
    groups: list[tuple[str, list[dict[str, Any]]]] = [
        (f"wave {w['name']}  {w['phase']}  {w['ready']}/{w['members']} Ready"
         + (f"  opened {w['openedAt']}" if w["openedAt"] else ""),
         [m for m in view["members"] if m.get("wave") == w["name"]]) for w in view["waves"]]
    held = [m for m in view["members"] if not m.get("wave")]
    if held:
        groups.append(("not in a wave (apply no new revision)", held))
    for i, (title, members) in enumerate(groups):
        last = i == len(groups) - 1
        branch, indent = ("└── ", "    ") if last else ("├── ", "│   ")
        lines.append(f"{branch}{title}")
        if not members:
            lines.append(f"{indent}└── (no members)")
        for j, member in enumerate(members):
            leaf = "└── " if j == len(members) - 1 else "├── "
            state = "Ready" if member.get("ready") else "not Ready"
            parts = [f"released {_revisions(member.get('released') or {})}"]
            if member.get("pending"):
                parts.append(f"holds {_revisions(member['pending'])}")
            if member.get("hold"):
                parts.append(str(member["hold"]))
            lines.append(f"{indent}{leaf}StageSet/{member['namespace']}/{member['name']}  {state}  "
                         + "; ".join(parts))
    return "\n".join(lines) + "\n"
