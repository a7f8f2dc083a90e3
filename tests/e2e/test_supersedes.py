"""A tenant graduates to its control-plane namespace in one Git commit (issue 46): ``spec.supersedes``.

A platform StageSet renders the tenants' StageSets from the platform's Git repository, as platforms
do.  One commit replaces ``team-a/app`` by ``team-a-system/app`` (``targetNamespace: team-a``,
``supersedes: [team-a/app]``); on the real apiserver, with the chart's RBAC and the audit log as
evidence:

- the platform StageSet is not Ready before the child it created says Ready at its generation
  (item 0: while the child's ``pre`` action holds it, the platform waits);
- another tenant's StageSet naming ``team-a/app`` is refused (``SupersedeDenied``, naming
  ``spec.supersedes`` and the predecessor) and ``team-a/app`` loses nothing;
- the move: the platform Ready at the new commit, ``team-a/app`` gone, no DELETE and no CREATE of the
  moved objects (same UIDs, the Deployment's generation unchanged), the ``pre`` action not run again,
  the object only the old StageSet rendered deleted and its ``prune: false`` stage's released;
- the move back (a commit restoring ``team-a/app`` naming ``team-a-system/app``), the same way.

There is no kube-controller-manager: the Deployment has no replicas (current as applied), and
nothing but the controller deletes anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.actionserver import ActionServer
from tests.conftest import Tenant
from tests.e2e.conftest import GITREPOS, STAGESETS, apply, condition, get_or_none, wait_for
from tests.e2e.stagesets import cm, poke
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

HANDED_OVER = "stages.metio.wtf/handed-over"
OWNER = ("stages.metio.wtf/namespace", "stages.metio.wtf/name")

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 0
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: registry.invalid/web:1}]
"""


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--allowed-action-hosts=127.0.0.1"]


@pytest.fixture(scope="module")
def server() -> Iterator[ActionServer]:
    with ActionServer() as running:
        yield running


def bind(admin: KubeClient, namespace: str, who: Tenant, role: str, *, kind: str = "ClusterRole") -> None:
    """Grant ``who``'s ServiceAccount ``role`` in ``namespace``."""
    admin.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", body={
        "metadata": {"name": f"{who.namespace}-{role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": who.service_account, "namespace": who.namespace}]})


def may_supersede(admin: KubeClient, namespace: str, who: Tenant) -> None:
    """``who`` may read and patch the StageSets of ``namespace`` (and nothing else there)."""
    admin.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", body={
        "metadata": {"name": "supersede"},
        "rules": [{"apiGroups": ["stages.metio.wtf"], "resources": ["stagesets"],
                   "verbs": ["get", "patch"]}]})
    bind(admin, namespace, who, "supersede", kind="Role")


def gitrepository(admin: KubeClient, namespace: str, url: str) -> None:
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                  "metadata": {"name": "app", "namespace": namespace},
                  "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m"}})


def app_stage(hook: str) -> dict[str, Any]:
    return {"name": "app", "sourceRef": {"name": "app"}, "path": "./app",
            "actions": {"pre": [{"name": "migrate", "retries": 20,
                                 "http": {"url": hook, "method": "GET", "expectedStatus": [200]}}]}}


def child(namespace: str, stages: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"serviceAccountName": "deployer", "retryInterval": "2s", "stages": stages, **spec}}


def get(admin: KubeClient, namespace: str, name: str = "app") -> dict[str, Any] | None:
    return get_or_none(admin, f"{STAGESETS.format(ns=namespace)}/{name}")


def ready_at(admin: KubeClient, namespace: str, name: str = "app", *, revision: str | None = None
             ) -> dict[str, Any] | None:
    obj = get(admin, namespace, name)
    ready = condition(obj or {})
    if obj is None or ready is None or ready["status"] != "True" or \
            ready.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    if revision and not (obj["status"].get("lastAppliedRevision") or "").endswith(revision):
        return None
    return obj


def live(admin: KubeClient, path: str) -> dict[str, Any] | None:
    return get_or_none(admin, path)


def writes_to(events: list[dict[str, Any]], *, namespace: str, objects: set[tuple[str, str]]
              ) -> list[tuple[str, str, str]]:
    """Every write (not a dry-run) that reached ``objects`` ((resource, name)) in ``namespace``; a
    status write (the controller reporting) is not a write to the object."""
    found = []
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or ref.get("namespace") != namespace \
                or (ref.get("resource"), ref.get("name")) not in objects or ref.get("subresource"):
            continue
        if event.get("verb") in ("get", "list", "watch") or "dryRun=All" in event.get("requestURI", ""):
            continue
        found.append((str(event["verb"]), str(ref["resource"]), str(ref["name"])))
    return found


def owner_of(obj: dict[str, Any] | None) -> tuple[str, str] | None:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return (labels[OWNER[0]], labels[OWNER[1]]) if OWNER[0] in labels and OWNER[1] in labels else None


def listed(obj: dict[str, Any]) -> list[str]:
    return sorted(e["id"] for inv in obj["status"]["inventory"] for e in inv["entries"])


MOVED = {("configmaps", "a"), ("deployments", "web")}


@pytest.fixture
def world(installed: KubeClient, git_server: GitServer, server: ActionServer,
          make_tenant: Callable[..., Tenant]) -> dict[str, Any]:
    """The tenants, their rights, the tenant's repository and the platform's, and the paths of the
    tenant's objects."""
    admin = installed
    team_a, system, team_b, platform = (make_tenant("team-a"), make_tenant("team-a-system"),
                                        make_tenant("team-b"), make_tenant("platform"))
    a, sys_ns = team_a.namespace, system.namespace
    for tenant in (team_a, system, team_b, platform):
        tenant.bind_cluster_role("edit")
    bind(admin, a, system, "edit")        # the control-plane account writes the tenant's workloads
    bind(admin, a, team_b, "view")        # another tenant may read team-a, not patch it
    may_supersede(admin, sys_ns, team_a)  # for the move back
    for where in (a, sys_ns):
        bind(admin, where, platform, "edit")  # the platform writes the tenants' StageSets
    # The tenant's release: its app (a pre action, a ConfigMap, a Deployment), an object only the old
    # StageSet renders, and a prune: false stage.
    app_url = git_server.create_repo(f"{a}-app", {
        "app/a.yaml": cm("a"), "app/web.yaml": DEPLOYMENT, "extra/only-old.yaml": cm("only-old"),
        "keep/kept.yaml": cm("kept")})
    for where in (a, sys_ns, team_b.namespace, platform.namespace):
        gitrepository(admin, where, app_url)
    migrate = f"/{a}/migrate"
    hook = server.answer(migrate, 503, body=b"not yet")
    old_spec = child(a, [app_stage(hook), {"name": "extra", "sourceRef": {"name": "app"}, "path": "./extra"},
                         {"name": "keep", "sourceRef": {"name": "app"}, "path": "./keep", "prune": False}])
    # The platform renders the tenants' StageSets from its own repository (its GitRepository "app").
    repo = f"{platform.namespace}-repo"
    gitrepository(admin, platform.namespace, git_server.create_repo(repo, {
        "tenants/team-a.yaml": yaml.safe_dump(old_spec)}))
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                  "metadata": {"name": "platform", "namespace": platform.namespace},
                  "spec": {"serviceAccountName": "deployer", "retryInterval": "2s", "stages": [
                      {"name": "tenants", "sourceRef": {"name": "app"}, "path": "./tenants"}]}})
    objects = {"a": f"/api/v1/namespaces/{a}/configmaps/a",
               "web": f"/apis/apps/v1/namespaces/{a}/deployments/web",
               "only-old": f"/api/v1/namespaces/{a}/configmaps/only-old",
               "kept": f"/api/v1/namespaces/{a}/configmaps/kept"}
    return {"a": a, "system": sys_ns, "team_b": team_b.namespace, "platform": platform.namespace,
            "repo": repo, "migrate": migrate, "hook": hook, "objects": objects}


def test_a_tenant_graduates_to_its_control_plane_namespace_in_one_commit_and_back(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, server: ActionServer,
    control_plane: ControlPlane, world: dict[str, Any],
) -> None:
    admin = installed
    a, sys_ns, team_b, platform = world["a"], world["system"], world["team_b"], world["platform"]
    migrate, hook, objects = world["migrate"], world["hook"], world["objects"]

    def commit(files: dict[str, str | None]) -> str:
        sha = git_server.commit(world["repo"], files)
        poke(admin, f"{GITREPOS.format(ns=platform)}/app")
        return sha

    def platform_stage() -> dict[str, Any]:
        status = (get(admin, platform, "platform") or {}).get("status") or {}
        return next((s for s in status.get("stages") or [] if s["name"] == "tenants"), {})

    # -- item 0: the platform is not Ready before its child says Ready at its generation ---------------
    wait_for(lambda: get(admin, a), what="the platform created team-a/app")
    wait_for(lambda: len(server.received(migrate)) >= 2, timeout=90, what="team-a/app's pre action failing")
    waiting = wait_for(lambda: (st := platform_stage()).get("phase") == "Waiting" and st,
                       what="the platform waiting for its child")
    assert f"StageSet {a}/app" in waiting.get("message", ""), waiting
    assert (condition(get(admin, platform, "platform") or {}) or {}).get("status") != "True"
    assert ready_at(admin, a) is None
    server.answer(migrate, 200)
    wait_for(lambda: ready_at(admin, a), timeout=120, what="team-a/app Ready")
    wait_for(lambda: ready_at(admin, platform, "platform"), timeout=120, what="the platform Ready")
    calls = len(server.received(migrate))
    before = {name: live(admin, path) for name, path in objects.items()}
    uids = {name: obj["metadata"]["uid"] for name, obj in before.items() if obj}
    assert set(uids) == set(objects), before
    generation = before["web"]["metadata"]["generation"]  # type: ignore[index]
    old = get(admin, a)
    assert old is not None

    # -- another tenant naming team-a/app is refused, and team-a/app loses nothing -------------------
    seen = len(control_plane.audit_events())
    taking = [{"namespace": a, "name": "app"}]
    apply(admin, child(team_b, [app_stage(hook)], targetNamespace=a, supersedes=taking))
    refused = wait_for(lambda: (r := condition(get(admin, team_b) or {})) and r["reason"] == "SupersedeDenied"
                       and r, what="team-b/app refused")
    assert refused["status"] == "False"
    assert "spec.supersedes[0]" in refused["message"], refused
    who = f"system:serviceaccount:{team_b}:deployer"
    assert f"{who} may not patch StageSet {a}/app" in refused["message"], refused
    time.sleep(3)  # a few of its retries (every 2 s)
    unchanged = get(admin, a)
    assert unchanged is not None
    assert HANDED_OVER not in (unchanged["metadata"].get("annotations") or {})
    assert listed(unchanged) == listed(old)
    assert {owner_of(live(admin, path)) for path in objects.values()} == {(a, "app")}
    touched = writes_to(control_plane.audit_events()[seen:], namespace=a, objects={
        *MOVED, ("configmaps", "only-old"), ("configmaps", "kept"), ("stagesets", "app")})
    assert touched == [], touched
    admin.request("DELETE", f"{STAGESETS.format(ns=team_b)}/app")

    # -- the move: one commit -------------------------------------------------------------------------
    new_spec = child(sys_ns, [app_stage(hook)], targetNamespace=a, supersedes=taking)
    time.sleep(1)
    seen = len(control_plane.audit_events())
    moved_at = commit({"tenants/team-a.yaml": None, "tenants/team-a-system.yaml": yaml.safe_dump(new_spec)})
    wait_for(lambda: ready_at(admin, platform, "platform", revision=moved_at), timeout=120,
             what="the platform Ready at the moving commit")
    wait_for(lambda: get(admin, a) is None, timeout=60, what="team-a/app gone")
    successor = ready_at(admin, sys_ns)
    assert successor is not None
    assert listed(successor) == [f"{a}_a__ConfigMap", f"{a}_web_apps_Deployment"]
    after = {name: live(admin, path) for name, path in objects.items()}
    assert after["only-old"] is None, "only the old StageSet rendered it: deleted with it"
    assert (after["kept"] or {}).get("metadata", {}).get("uid") == uids["kept"]
    assert owner_of(after["kept"]) is None, "prune: false: released, kept"
    for name in ("a", "web"):
        assert (after[name] or {}).get("metadata", {}).get("uid") == uids[name], f"{name}: the same object"
        assert owner_of(after[name]) == (sys_ns, "app")
    assert after["web"]["metadata"]["generation"] == generation, "not rolled"  # type: ignore[index]
    time.sleep(1)
    events = control_plane.audit_events()[seen:]
    writes = writes_to(events, namespace=a, objects=MOVED)
    assert writes, "the adoption is in the audit log"
    assert [w for w in writes if w[0] in ("create", "delete")] == [], writes
    gone = writes_to(events, namespace=a, objects={("configmaps", "only-old")})
    assert gone, "only-old was deleted by the controller"
    assert {verb for verb, _, _ in gone} == {"delete"}, gone
    assert len(server.received(migrate)) == calls, "the pre action did not run again for the same revision"
    stage = next(s for s in successor["status"]["stages"] if s["name"] == "app")
    assert stage["actions"]["executed"] == ["migrate"]
    took = [e["message"] for e in admin.get(f"/api/v1/namespaces/{sys_ns}/events")["items"]
            if e.get("reason") == "TakenOver"]
    assert any(f"took over 2 object(s) of StageSet {a}/app in place" in m for m in took), took

    # -- and back: a commit restoring team-a/app, naming team-a-system/app -----------------------------
    back_spec = child(a, [app_stage(hook)], supersedes=[{"namespace": sys_ns, "name": "app"}])
    time.sleep(1)
    seen = len(control_plane.audit_events())
    back_at = commit({"tenants/team-a-system.yaml": None, "tenants/team-a.yaml": yaml.safe_dump(back_spec)})
    wait_for(lambda: ready_at(admin, platform, "platform", revision=back_at), timeout=120,
             what="the platform Ready at the commit moving back")
    wait_for(lambda: get(admin, sys_ns) is None, timeout=60, what="team-a-system/app gone")
    restored = ready_at(admin, a)
    assert restored is not None
    assert listed(restored) == [f"{a}_a__ConfigMap", f"{a}_web_apps_Deployment"]
    for name in ("a", "web"):
        back = live(admin, objects[name])
        assert (back or {}).get("metadata", {}).get("uid") == uids[name], f"{name}: still the same object"
        assert owner_of(back) == (a, "app")
    assert live(admin, objects["web"])["metadata"]["generation"] == generation  # type: ignore[index]
    time.sleep(1)
    writes = writes_to(control_plane.audit_events()[seen:], namespace=a, objects=MOVED)
    assert writes, "the adoption back is in the audit log"
    assert [w for w in writes if w[0] in ("create", "delete")] == [], writes
    assert len(server.received(migrate)) == calls, "nor when moving back"
    stage = next(s for s in restored["status"]["stages"] if s["name"] == "app")
    assert stage["actions"]["executed"] == ["migrate"]
