"""FleetRollout on a real apiserver with the controller process (issue 35's "done when").

- six members in three waves receive a new commit wave by wave: the audit log shows every
  member's first write of the new content after the controller released it to that member, and
  no member of a later wave released before every member of the wave before had written it;
- a failing canary halts the rollout: no later member ever applies that revision, and a fix goes
  out wave by wave to everyone (the later waves straight to the fix);
- an unassigned member and a contested one apply no new revision, and the rollouts say why;
- the reference's version fields are refused at admission, each by name.

Members are tenants in their own namespaces, each with its own GitRepository of one shared
repository (one product for many tenants).  No timed assertions: states are polled, order is
read from the audit log.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from tests.cli.conftest import run_cli
from tests.conftest import Tenant
from tests.e2e.conftest import (
    GITREPOS,
    STAGESETS,
    apply,
    condition,
    get_or_none,
    wait_for,
    writes_by,
)
from tests.e2e.stagesets import cm, poke
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
FLEET = "/apis/stages.metio.wtf/v1/fleetrollouts"
CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"
ANNOTATION = "stages.metio.wtf/fleet-release"


@dataclass
class Fleet:
    admin: KubeClient
    git: GitServer
    repo: str
    members: dict[str, tuple[Tenant, str]]
    """Member name -> (its tenant, its wave label)."""

    def commit(self, value: str) -> str:
        sha = self.git.commit(self.repo, {"app/cm.yaml": cm("app", value)})
        for tenant, _ in self.members.values():
            poke(self.admin, f"{GITREPOS.format(ns=tenant.namespace)}/app")
        return sha

    def get(self, name: str) -> dict[str, Any]:
        tenant, _ = self.members[name]
        return self.admin.get(f"{STAGESETS.format(ns=tenant.namespace)}/{name}")

    def value(self, name: str) -> str | None:
        tenant, _ = self.members[name]
        found = get_or_none(self.admin, f"/api/v1/namespaces/{tenant.namespace}/configmaps/app")
        return None if found is None else str(found["data"]["k"])

    def ready_at(self, name: str, sha: str) -> bool:
        obj = self.get(name)
        ready = condition(obj)
        return bool(ready and ready["status"] == "True"
                    and ready.get("observedGeneration") == obj["metadata"]["generation"]
                    and (obj["status"].get("lastAppliedRevision") or "").endswith(sha)
                    and not obj["status"].get("pendingUpdate"))


def platform_label(app: str) -> str:
    """The namespace label the platform sets on the namespaces a rollout may take members from
    (issue 43: ``namespaceSelector`` is required)."""
    return f"fleet.platform.example/{app}"


def select_namespace(admin: KubeClient, namespace: str, app: str) -> None:
    """The platform labels a tenant's namespace into the fleet (tenants may not label namespaces)."""
    admin.request("PATCH", f"/api/v1/namespaces/{namespace}", content_type="application/merge-patch+json",
                  body={"metadata": {"labels": {platform_label(app): "true"}}})


def make_fleet(admin: KubeClient, git: GitServer, make_tenant: TenantFactory, *, app: str,
               members: dict[str, str | None],
               extra_labels: dict[str, dict[str, str]] | None = None) -> Fleet:
    repo = f"{app}-repo"
    url = git.create_repo(repo, {"app/cm.yaml": cm("app", "v1")})
    made: dict[str, tuple[Tenant, str]] = {}
    for name, ring in members.items():
        tenant = make_tenant(name)
        tenant.bind_cluster_role("edit")
        select_namespace(admin, tenant.namespace, app)
        apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                      "metadata": {"name": "app", "namespace": tenant.namespace},
                      "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"}})
        labels = {"app": app, **({"ring": ring} if ring else {}), **(extra_labels or {}).get(name, {})}
        apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": name, "namespace": tenant.namespace, "labels": labels},
                      "spec": {"serviceAccountName": tenant.service_account,
                               "stages": [{"name": "app", "path": "./app", "sourceRef": {"name": "app"}}]}})
        made[name] = (tenant, ring or "")
    fleet = Fleet(admin=admin, git=git, repo=repo, members=made)
    for name in made:
        wait_for(lambda name=name: (condition(fleet.get(name)) or {}).get("status") == "True",  # type: ignore[misc]
                 what=f"{name} Ready", timeout=90)
    return fleet


def rollout(admin: KubeClient, name: str, *, app: str, waves: list[tuple[str, str | None]]) -> None:
    admin.apply(f"{FLEET}/{name}", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "FleetRollout", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": app}},
                 "namespaceSelector": {"matchLabels": {platform_label(app): "true"}},
                 "waves": [{"name": w, "selector": {"matchLabels": {"ring": w}},
                            **({"soak": soak} if soak else {})} for w, soak in waves]}},
        field_manager="e2e-test")


def rollout_ready(admin: KubeClient, name: str) -> dict[str, Any] | None:
    obj = admin.get(f"{FLEET}/{name}")
    ready = condition(obj)
    if ready and ready.get("observedGeneration") == obj["metadata"]["generation"]:
        return ready
    return None


def wait_rollout(admin: KubeClient, name: str, reason: str, timeout: float = 90) -> dict[str, Any]:
    def check() -> Any:
        ready = rollout_ready(admin, name)
        return ready if ready and ready["reason"] == reason else None
    found: dict[str, Any] = wait_for(check, timeout=timeout, what=f"FleetRollout {name} {reason}")
    return found


def annotated(fleet: Fleet, rollout_name: str) -> bool:
    return all(rollout_name in ((fleet.get(n)["metadata"].get("annotations") or {}).get(ANNOTATION) or "")
               for n in fleet.members)


def stamp(event: dict[str, Any]) -> str:
    return str(event.get("stageTimestamp") or event.get("requestReceivedTimestamp"))


def releases(events: list[dict[str, Any]], fleet: Fleet) -> dict[str, str]:
    """Per member: when the controller first patched its StageSet (not its status) in ``events``."""
    found: dict[str, str] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("verb") != "patch" or event.get("stage") != "ResponseComplete" or \
                ref.get("resource") != "stagesets" or ref.get("subresource") or \
                (event.get("user") or {}).get("username") != CONTROLLER or event.get("impersonatedUser"):
            continue
        name = str(ref.get("name"))
        if name in fleet.members and name not in found:
            found[name] = stamp(event)
    return found


def first_writes(events: list[dict[str, Any]], fleet: Fleet) -> dict[str, str]:
    """Per member: its tenant's first real write of its ConfigMap in ``events``."""
    found: dict[str, str] = {}
    for name, (tenant, _) in fleet.members.items():
        writes = [e for e in writes_by(events, tenant.username)
                  if (e.get("objectRef") or {}).get("resource") == "configmaps"]
        if writes:
            found[name] = min(stamp(e) for e in writes)
    return found


SIX = {"c1": "canary", "c2": "canary", "r1": "ring1", "r2": "ring1", "a1": "all", "a2": "all"}


def test_six_members_in_three_waves_receive_a_new_commit_wave_by_wave(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane, kubeconfig: Path,
) -> None:
    fleet = make_fleet(installed, git_server, make_tenant, app="waves", members=dict(SIX))
    rollout(installed, "waves", app="waves", waves=[("canary", "2s"), ("ring1", "2s"), ("all", None)])
    wait_rollout(installed, "waves", "Completed")
    wait_for(lambda: annotated(fleet, "waves"), what="every member annotated")
    seen = len(control_plane.audit_events())

    sha = fleet.commit("v2")
    for name in SIX:
        wait_for(lambda name=name: fleet.ready_at(name, sha), what=f"{name} Ready at {sha}",  # type: ignore[misc]
                 timeout=120)
    done = wait_rollout(installed, "waves", "Completed")
    assert "every wave is Ready" in done["message"]
    assert {fleet.value(n) for n in SIX} == {"v2"}

    events = control_plane.audit_events()[seen:]
    released, written = releases(events, fleet), first_writes(events, fleet)
    assert set(released) == set(written) == set(SIX), (released, written)
    for name in SIX:
        assert released[name] < written[name], f"{name} wrote the new commit before it was released"
    by_wave = {w: [n for n, r in SIX.items() if r == w] for w in ("canary", "ring1", "all")}
    for before, after in (("canary", "ring1"), ("ring1", "all")):
        assert max(written[n] for n in by_wave[before]) < min(released[n] for n in by_wave[after]), \
            f"wave {after} was released before every member of {before} applied the commit"
    status = installed.get(f"{FLEET}/waves")["status"]
    assert [w["phase"] for w in status["waves"]] == ["Done", "Done", "Done"]
    events_of = installed.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
    opened = {e["note"].split()[1] for e in events_of if e["reason"] == "WaveOpened"
              and e["regarding"].get("name") == "waves"}
    assert opened == {"canary", "ring1", "all"}
    # See it: the list and the tree (waves, members, what each was released).
    listed = run_cli("get", "fleetrollouts", kubeconfig=kubeconfig)
    assert listed.exit_code == 0, listed.output
    assert "canary Done 2/2, ring1 Done 2/2, all Done 2/2" in listed.stdout
    shown = run_cli("tree", "fleetrollout", "waves", kubeconfig=kubeconfig)
    assert shown.exit_code == 0, shown.output
    assert "wave ring1  Done  2/2 Ready" in shown.stdout
    assert f"/r1  Ready  released {fleet.members['r1'][0].namespace}/app main@sha1:{sha[:12]}" in shown.stdout


def test_a_failing_canary_halts_the_rollout_and_no_later_member_sees_that_revision(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    kubeconfig: Path,
) -> None:
    members = {"hc": "canary", "h1": "ring1", "h2": "all"}
    fleet = make_fleet(installed, git_server, make_tenant, app="halts", members=dict(members))
    rollout(installed, "halts", app="halts", waves=[("canary", None), ("ring1", None), ("all", None)])
    wait_rollout(installed, "halts", "Completed")
    wait_for(lambda: annotated(fleet, "halts"), what="every member annotated")

    # A commit no apiserver accepts (an invalid object name): the canary fails on it.
    bad = git_server.commit(fleet.repo, {"app/cm.yaml": cm("Not_A_Valid_Name", "bad")})
    for tenant, _ in fleet.members.values():
        poke(installed, f"{GITREPOS.format(ns=tenant.namespace)}/app")
    halted = wait_rollout(installed, "halts", "Halted")
    assert "hc" in halted["message"]
    # The later members hold it (their status says what waits, for which rollout and wave) and
    # never apply it.
    for name in ("h1", "h2"):
        held = wait_for(lambda name=name: (fleet.get(name)["status"].get("pendingUpdate") or {}).get(  # type: ignore[misc]
            "fleetRollout"), what=f"{name} holding the bad commit")
        assert held == "halts"
        pending = fleet.get(name)["status"]["pendingUpdate"]
        assert pending["wave"] == members[name]
        assert any(r.endswith(bad) for r in pending["revisions"].values())
    status = installed.get(f"{FLEET}/halts")["status"]
    assert status["halted"]["member"].endswith("/hc")
    assert any(r.endswith(bad) for r in status["withdrawn"])
    shown = run_cli("tree", "fleetrollout", "halts", kubeconfig=kubeconfig)
    assert "Ready=False (Halted)" in shown.stdout
    assert f"holds {fleet.members['h2'][0].namespace}/app main@sha1:{bad[:12]}" in shown.stdout

    # The fix: a new round from the canary, the later waves straight to it.
    fix = fleet.commit("v3")
    for name in members:
        wait_for(lambda name=name: fleet.ready_at(name, fix), what=f"{name} Ready at the fix",  # type: ignore[misc]
                 timeout=120)
    wait_rollout(installed, "halts", "Completed")
    for name in ("h1", "h2"):
        snapshot = fleet.get(name)["status"].get("lastAppliedSnapshot") or []
        assert not any(s.get("revision", "").endswith(bad) for s in snapshot)
        assert fleet.value(name) == "v3"


def test_unassigned_and_contested_members_fail_closed(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    fleet = make_fleet(installed, git_server, make_tenant, app="closed",
                       members={"ok": "canary", "lost": None, "both": "canary"},
                       extra_labels={"both": {"shared": "yes"}})
    rollout(installed, "closed", app="closed", waves=[("canary", None)])
    installed.apply(f"{FLEET}/closed-other", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "FleetRollout", "metadata": {"name": "closed-other"},
        "spec": {"selector": {"matchLabels": {"shared": "yes"}},
                 "namespaceSelector": {"matchLabels": {platform_label("closed"): "true"}},
                 "waves": [{"name": "everyone", "selector": {}}]}}, field_manager="e2e-test")
    contested = wait_rollout(installed, "closed", "MembersContested")
    assert "/both" in contested["message"]
    assert "closed-other" in contested["message"]
    other = wait_rollout(installed, "closed-other", "MembersContested")
    assert "also selected by closed" in other["message"]
    wait_for(lambda: annotated(fleet, "closed"), what="every member annotated")

    sha = fleet.commit("v2")
    wait_for(lambda: fleet.ready_at("ok", sha), what="ok Ready at the new commit", timeout=120)
    for name in ("lost", "both"):
        pending = wait_for(lambda name=name: fleet.get(name)["status"].get("pendingUpdate"),  # type: ignore[misc]
                           what=f"{name} holding the commit")
        assert any(r.endswith(sha) for r in pending["revisions"].values())
        assert fleet.value(name) == "v1"
    # One rollout lets go: the contested member is the other's alone (and ships); the unassigned
    # one still holds, named.
    installed.request("DELETE", f"{FLEET}/closed-other")
    wait_for(lambda: fleet.ready_at("both", sha), what="both Ready once uncontested", timeout=120)
    unassigned = wait_rollout(installed, "closed", "MembersUnassigned")
    assert "/lost" in unassigned["message"]
    assert fleet.value("lost") == "v1"
    # Deleting the rollout frees its members: the annotation is taken back and the commit ships.
    installed.request("DELETE", f"{FLEET}/closed")
    wait_for(lambda: fleet.ready_at("lost", sha), what="lost Ready once free", timeout=120)
    assert ANNOTATION not in (fleet.get("lost")["metadata"].get("annotations") or {})


@pytest.mark.parametrize(("field", "where"), [
    ("targetVersion", "spec"), ("previousVersion", "spec"), ("onRegression", "spec"), ("gate", "wave")])
def test_the_reference_version_fields_are_refused_by_name(installed: KubeClient, field: str,
                                                           where: str) -> None:
    value: Any = {"strategy": "Rollback"} if field in ("onRegression", "gate") else "1.2.3"
    wave: dict[str, Any] = {"name": "all", "selector": {}}
    # (issue 43: a rollout names the platform's namespaces, or the schema refuses it before its
    # rules are checked)
    spec: dict[str, Any] = {"selector": {}, "waves": [wave],
                            "namespaceSelector": {"matchLabels": {platform_label("x"): "true"}}}
    (wave if where == "wave" else spec)[field] = value
    with pytest.raises(ApiError) as refused:
        installed.apply(f"{FLEET}/refused", {"apiVersion": "stages.metio.wtf/v1", "kind": "FleetRollout",
                                             "metadata": {"name": "refused"}, "spec": spec},
                        field_manager="e2e-test")
    assert refused.value.status == 422
    assert f"{field} (" in str(refused.value)
    assert "is not supported by this controller" in str(refused.value)


# -- issue 43: the platform's controls stay the platform's ------------------------------------------

def at(text: str) -> datetime.datetime:
    """A timestamp of the audit log (microseconds) or of a status (seconds), comparable."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def tenant_client(kube_pool: ClientPool, tenant: Tenant) -> KubeClient:
    """The tenant's own ServiceAccount (edit in its namespace): what a tenant may do."""
    return kube_pool.client(Identity(user=tenant.username))


def configmap_writes(events: list[dict[str, Any]], tenant: Tenant) -> list[dict[str, Any]]:
    return [e for e in writes_by(events, tenant.username)
            if (e.get("objectRef") or {}).get("resource") == "configmaps"]


def held_by(fleet: Fleet, name: str) -> str:
    """The member's Ready message while it holds something (empty otherwise)."""
    obj = fleet.get(name)
    return str((condition(obj) or {}).get("message", "")) if obj["status"].get("pendingUpdate") else ""


def test_a_forged_edited_or_removed_release_annotation_ships_nothing_early(
    controller: ControllerProcess, installed: KubeClient, kube_pool: ClientPool, git_server: GitServer,
    make_tenant: TenantFactory, control_plane: ControlPlane,
) -> None:
    """Item 1: the canary soaks for an hour; ring1's tenant writes on its own StageSet the release its
    wave would get — the revision the canary runs — then edits it, then removes it.  Nothing of the
    new commit is written by ring1's tenant, and the controller writes its own annotation back."""
    fleet = make_fleet(installed, git_server, make_tenant, app="forge",
                       members={"fc": "canary", "fr": "ring1"})
    rollout(installed, "forge", app="forge", waves=[("canary", "1h"), ("ring1", None)])
    wait_rollout(installed, "forge", "Completed")
    wait_for(lambda: annotated(fleet, "forge"), what="every member annotated")
    sha = fleet.commit("v2")
    wait_for(lambda: fleet.ready_at("fc", sha), what="the canary at the new commit", timeout=120)
    wait_for(lambda: "until wave ring1 opens" in held_by(fleet, "fr"), what="ring1 holding it")
    pending = fleet.get("fr")["status"]["pendingUpdate"]["revisions"]
    tenant, _ = fleet.members["fr"]
    seen = len(control_plane.audit_events())
    path = f"{STAGESETS.format(ns=tenant.namespace)}/fr"

    def forge(value: str | None) -> None:
        tenant_client(kube_pool, tenant).request(
            "PATCH", path, content_type="application/merge-patch+json",
            body={"metadata": {"annotations": {ANNOTATION: value}}})

    forged = json.dumps({"rollout": "forge", "wave": "ring1", "revisions": pending}, separators=(",", ":"))
    for value in (forged, json.dumps({"rollout": "forge", "wave": "canary", "revisions": pending}), None):
        forge(value)

        def restored(value: str | None = value) -> bool:
            now = (fleet.get("fr")["metadata"].get("annotations") or {}).get(ANNOTATION) or ""
            return "forge" in now and now != value
        # Held, and the controller's own annotation is written back (what its status records).
        wait_for(restored, what="the controller's annotation back")
        poke(installed, path)
        wait_for(lambda: "until wave ring1 opens" in held_by(fleet, "fr"), what="ring1 still holding it")
    time.sleep(3)  # several passes of ring1 (each poked, each woken by the annotation's changes)
    assert fleet.value("fr") == "v1", "a forged release shipped the new commit early"
    events = control_plane.audit_events()[seen:]
    assert [e for e in events if e.get("verb") == "patch" and (e.get("objectRef") or {}).get("name") == "fr"
            and (e.get("impersonatedUser") or {}).get("username") == tenant.username], \
        "the audit log shows the tenant's forgeries"
    assert configmap_writes(events, tenant) == [], "ring1's tenant wrote nothing while its wave was closed"
    status = installed.get(f"{FLEET}/forge")["status"]
    record = next(r for r in status["releases"] if r["name"] == "fr")
    assert record["wave"] == "ring1"
    assert not record.get("revisions"), "the rollout's own record never took the forged release"


def test_a_foreign_relabelled_or_late_member_neither_halts_the_round_nor_jumps_a_wave(
    controller: ControllerProcess, installed: KubeClient, kube_pool: ClientPool, git_server: GitServer,
    make_tenant: TenantFactory, control_plane: ControlPlane,
) -> None:
    """Item 2.  A tenant whose namespace the platform did not select labels a failing StageSet into the
    canary wave: it is no member.  A member of ring1 relabels itself into the open canary wave: it
    keeps ring1 for the round.  A StageSet created in a selected namespace mid-round, labelled into
    the canary wave with a failing stage, joins: it neither halts the round nor holds it back."""
    fleet = make_fleet(installed, git_server, make_tenant, app="members",
                       members={"mc": "canary", "mr": "ring1", "mlate": None})
    rollout(installed, "members", app="members", waves=[("canary", "2s"), ("ring1", "1h"), ("all", None)])
    wait_rollout(installed, "members", "MembersUnassigned")  # mlate has no ring label yet
    # The foreign tenant: same labels, an unselected namespace, a stage that fails on every commit.
    outsider = make_tenant("outsider")
    outsider.bind_cluster_role("edit")
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                      "metadata": {"name": "app", "namespace": outsider.namespace},
                      "spec": {"url": git_server.url(fleet.repo), "ref": {"branch": "main"},
                               "interval": "1h"}})
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": "intruder", "namespace": outsider.namespace,
                                   "labels": {"app": "members", "ring": "canary"}},
                      "spec": {"serviceAccountName": "no-such-account",
                               "stages": [{"name": "app", "path": "./app", "sourceRef": {"name": "app"}}]}})
    intruder = f"{STAGESETS.format(ns=outsider.namespace)}/intruder"
    wait_for(lambda: (condition(installed.get(intruder)) or {}).get("status") == "False",
             what="the intruder failing")
    status = installed.get(f"{FLEET}/members")["status"]
    assert "intruder" not in {m["name"] for m in status["members"]}, "an unselected namespace holds no member"
    # mlate gets its wave label now (platform-selected namespace): a member before the round begins.
    late, _ = fleet.members["mlate"]
    installed.request("PATCH", f"{STAGESETS.format(ns=late.namespace)}/mlate",
                      content_type="application/merge-patch+json",
                      body={"metadata": {"labels": {"ring": "all"}}})
    wait_rollout(installed, "members", "Completed")
    seen = len(control_plane.audit_events())

    sha = fleet.commit("v2")
    wait_for(lambda: fleet.ready_at("mc", sha), what="the canary at the new commit", timeout=120)
    wait_for(lambda: "until wave ring1 opens" in held_by(fleet, "mr"), what="ring1 holding it")
    # ring1's tenant relabels its StageSet into the open canary wave.
    relabel, _ = fleet.members["mr"]
    tenant_client(kube_pool, relabel).request(
        "PATCH", f"{STAGESETS.format(ns=relabel.namespace)}/mr", content_type="application/merge-patch+json",
        body={"metadata": {"labels": {"ring": "canary"}}})
    # A new StageSet of a selected namespace joins the open canary wave mid-round, and fails.
    joiner, _ = fleet.members["mc"]
    tenant_client(kube_pool, joiner).request(
        "POST", STAGESETS.format(ns=joiner.namespace), body={
            "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": "joiner", "labels": {"app": "members", "ring": "canary"}},
            "spec": {"serviceAccountName": joiner.service_account,
                     "stages": [{"name": "app", "path": "./missing-path",
                                 "sourceRef": {"name": "no-source"}}]}})

    def decided() -> Any:
        status = installed.get(f"{FLEET}/members")["status"]
        members = {m["name"]: m for m in status["members"]}
        return status if "joiner" in members and members["mr"].get("wave") == "ring1" else None
    status = wait_for(decided, what="the rollout deciding on the relabelled member and the joiner")
    members = {m["name"]: m for m in status["members"]}
    assert members["joiner"]["joined"] is True
    assert members["mr"]["wave"] == "ring1", "the relabelled member keeps its wave for the round"
    waves = {w["name"]: w for w in status["waves"]}
    def ring1_open() -> bool:
        # Opened: Open, or already past it (its one member may turn Ready and start the soak within
        # milliseconds of the opening, so Open alone can be missed between two polls).
        return {w["name"]: w["phase"] for w in installed.get(f"{FLEET}/members")["status"]["waves"]}.get(
            "ring1") in {"Open", "Soaking", "Done"}
    wait_for(ring1_open, what="ring1 open after the canary's soak, whatever the joiner does", timeout=60)
    ready = rollout_ready(installed, "members")
    assert ready is not None
    assert ready["reason"] != "Halted", ready
    assert waves["canary"]["members"] == 1, "the joiner does not count in its wave"
    time.sleep(2)
    assert fleet.value("mr") == "v1" or fleet.ready_at("mr", sha), "mr applies only once ring1 opens"
    ring1 = installed.get(f"{FLEET}/members")["status"]["waves"][1]
    events = control_plane.audit_events()[seen:]
    first = [e for e in configmap_writes(events, relabel)]
    opened = ring1.get("openedAt")
    assert opened is not None
    assert all(at(stamp(e)) >= at(opened) for e in first), "the relabelled member wrote before ring1 opened"
    assert "intruder" not in {m["name"] for m in installed.get(f"{FLEET}/members")["status"]["members"]}


def test_a_halt_then_a_fix_opens_every_wave_in_order(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane,
) -> None:
    """Item 3: a commit breaks the canary and halts the rollout; the fix reaches the later waves'
    sources first (the round starts there, the canary still failing at the withdrawn commit), then
    the canary's.  The canary turns Ready, soaks, and every wave opens in order with its soak."""
    members = {"xc": "canary", "x1": "ring1", "x2": "broad"}
    fleet = make_fleet(installed, git_server, make_tenant, app="recover", members=dict(members))
    rollout(installed, "recover", app="recover", waves=[("canary", "3s"), ("ring1", "3s"), ("broad", None)])
    wait_rollout(installed, "recover", "Completed")
    bad = git_server.commit(fleet.repo, {"app/cm.yaml": cm("Not_A_Valid_Name", "bad")})
    for tenant, _ in fleet.members.values():
        poke(installed, f"{GITREPOS.format(ns=tenant.namespace)}/app")
    halted = wait_rollout(installed, "recover", "Halted", timeout=120)
    assert "xc" in halted["message"]
    # The fix: fetched by ring1's and broad's sources first; the canary's only once they hold it.
    fix = git_server.commit(fleet.repo, {"app/cm.yaml": cm("app", "v3")})
    for name in ("x1", "x2"):
        tenant, _ = fleet.members[name]
        poke(installed, f"{GITREPOS.format(ns=tenant.namespace)}/app")
    for name in ("x1", "x2"):
        wait_for(lambda name=name: any(r.endswith(fix) for r in (  # type: ignore[misc]
            fleet.get(name)["status"].get("pendingUpdate") or {}).get("revisions", {}).values()),
            what=f"{name} holding the fix", timeout=60)
    seen = len(control_plane.audit_events())
    canary, _ = fleet.members["xc"]
    poke(installed, f"{GITREPOS.format(ns=canary.namespace)}/app")
    for name in members:
        wait_for(lambda name=name: fleet.ready_at(name, fix), what=f"{name} Ready at the fix",  # type: ignore[misc]
                 timeout=180)
    done = wait_rollout(installed, "recover", "Completed", timeout=60)
    assert "every wave is Ready" in done["message"]
    status = installed.get(f"{FLEET}/recover")["status"]
    assert [w["phase"] for w in status["waves"]] == ["Done", "Done", "Done"]
    assert status.get("halted") is None
    # In order: each wave's first write of the fix after the wave before was Ready and soaked.
    events = control_plane.audit_events()[seen:]
    written = first_writes(events, fleet)
    assert set(written) == set(members), written
    opened = {w["name"]: w["openedAt"] for w in status["waves"]}
    assert at(written["xc"]) < at(opened["ring1"]) <= at(written["x1"]) < at(opened["broad"]) \
        <= at(written["x2"]), (written, opened)
    for name in ("x1", "x2"):
        snapshot = fleet.get(name)["status"].get("lastAppliedSnapshot") or []
        assert not any(s.get("revision", "").endswith(bad) for s in snapshot), "the withdrawn commit"


@pytest.mark.parametrize(("selector", "said"), [
    (None, "spec.namespaceSelector: Required value"),
    ({}, "namespaceSelector must name at least one namespace label"),
    ({"matchLabels": {}}, "namespaceSelector must name at least one namespace label"),
])
def test_a_rollout_without_a_platform_namespace_selector_is_refused_at_admission(
        installed: KubeClient, selector: dict[str, Any] | None, said: str) -> None:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "x"}},
                            "waves": [{"name": "all", "selector": {}}]}
    if selector is not None:
        spec["namespaceSelector"] = selector
    with pytest.raises(ApiError) as refused:
        installed.apply(f"{FLEET}/unscoped", {"apiVersion": "stages.metio.wtf/v1", "kind": "FleetRollout",
                                              "metadata": {"name": "unscoped"}, "spec": spec},
                        field_manager="e2e-test")
    assert refused.value.status == 422
    assert said in str(refused.value), str(refused.value)
