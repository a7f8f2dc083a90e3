"""Ownership is explicit (issue 32): an object another live StageSet holds is never written, and is
adopted in place once its holder lets it go — on a real apiserver, with its audit log as evidence.

Each test watches the contested ConfigMaps in the audit log from the moment the second StageSet
appears: no write but dry-runs while the conflict stands, then one apply per object (the adoption)
and never a DELETE or a CREATE; the objects keep their UIDs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import get_or_none, wait_for
from tests.e2e.stagesets import Scenario, cm, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

NAMES = ("a", "b")


def writes_to(events: list[dict[str, Any]], *, namespace: str, names: tuple[str, ...] = NAMES
              ) -> list[tuple[str, str, str]]:
    """Every write (not dry-run) that reached the ConfigMaps ``names`` of ``namespace``:
    (verb, name, who)."""
    found = []
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or ref.get("resource") != "configmaps" \
                or ref.get("namespace") != namespace or ref.get("name") not in names:
            continue
        if event.get("verb") in ("get", "list", "watch") or "dryRun=All" in event.get("requestURI", ""):
            continue
        who = (event.get("impersonatedUser") or {}).get("username") or event["user"]["username"]
        found.append((str(event["verb"]), str(ref["name"]), str(who)))
    return found


def uids(s: Scenario, namespace: str | None = None) -> dict[str, str]:
    where = namespace or s.ns
    return {n: s.admin.get(f"/api/v1/namespaces/{where}/configmaps/{n}")["metadata"]["uid"] for n in NAMES}


def owner(s: Scenario, name: str, namespace: str | None = None) -> tuple[str, str]:
    labels = s.admin.get(f"/api/v1/namespaces/{namespace or s.ns}/configmaps/{name}")["metadata"]["labels"]
    return labels["stages.metio.wtf/namespace"], labels["stages.metio.wtf/name"]


def test_a_conflict_is_reported_not_fought_and_a_released_object_is_adopted_in_place(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], control_plane: ControlPlane,
) -> None:
    tenant = make_tenant("own")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b"),
                                                 "other/c.yaml": cm("c")})
    s.stageset("old", [{"name": "app", "path": "./app"}])
    s.wait_ready("old")
    before = uids(s)
    time.sleep(1)
    seen = len(control_plane.audit_events())

    s.stageset("new", [{"name": "app", "path": "./app"}], retryInterval="2s")
    ready = s.wait_reason("new", "OwnershipConflict")
    assert ready["status"] == "False"
    assert f"is held by StageSet {s.ns}/old" in ready["message"], ready["message"]
    # The holder goes on as before: a requested pass over it stays Ready.
    stamp = poke(installed, s.path("old"))
    wait_for(lambda: s.get("old")["status"].get("lastHandledReconcileAt") == stamp, what="old's pass")
    s.wait_ready("old")
    # Several of new's retries (every 2 s) have run meanwhile.
    time.sleep(5)
    assert writes_to(control_plane.audit_events()[seen:], namespace=s.ns) == [], \
        "nobody wrote the contested objects while the conflict stood"
    assert owner(s, "a") == (s.ns, "old")

    # The holder lets go: its stage stops rendering the objects and has prune: false, so they
    # leave its inventory without being deleted.
    s.stageset("old", [{"name": "app", "path": "./other", "prune": False}])
    wait_for(lambda: all(not e["id"].endswith(("_a__ConfigMap", "_b__ConfigMap"))
                         for inv in s.get("old")["status"].get("inventory", []) for e in inv["entries"]),
             what="old no longer lists a and b")
    adopted = s.wait_ready("new")
    assert [e["id"] for e in adopted["status"]["inventory"][0]["entries"]] == [
        f"{s.ns}_a__ConfigMap", f"{s.ns}_b__ConfigMap"]
    assert uids(s) == before, "adopted in place: the same objects"
    assert owner(s, "a") == owner(s, "b") == (s.ns, "new")
    time.sleep(1)
    writes = writes_to(control_plane.audit_events()[seen:], namespace=s.ns)
    # Each object patched twice and never created or deleted: old's prune: false stage releases
    # what it no longer renders (its owner labels removed), then new adopts it in place.
    assert sorted(writes) == [("patch", "a", tenant.username)] * 2 + [("patch", "b", tenant.username)] * 2, \
        writes


def test_moving_a_release_into_a_control_plane_namespace_deletes_and_creates_nothing(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant], control_plane: ControlPlane,
) -> None:
    """Issue 32's namespace move: a new StageSet in ``<tenant>-system`` renders the release into the
    tenant's namespace (``targetNamespace``) and reports the conflict; the old one is set to
    ``deletionPolicy: Orphan`` and deleted; the new one adopts every object in place."""
    tenant = make_tenant("move")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    s.stageset("web", [{"name": "app", "path": "./app"}])
    s.wait_ready("web")
    before = uids(s)

    # The control-plane namespace: its own ServiceAccount, allowed to write (and read StageSets)
    # in the tenant's namespace; its own GitRepository on the same repository.
    system = make_tenant("move-system")
    system.bind_cluster_role("edit")
    subject = {"kind": "ServiceAccount", "name": system.service_account, "namespace": system.namespace}
    s.admin.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{s.ns}/rolebindings", body={
        "metadata": {"name": "system-deployer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [subject]})
    source = s.admin.get(f"/apis/stages.metio.wtf/v1/namespaces/{s.ns}/gitrepositories/app")
    s.admin.apply(f"/apis/stages.metio.wtf/v1/namespaces/{system.namespace}/gitrepositories/app", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": system.namespace}, "spec": source["spec"]},
        field_manager="e2e-test")
    time.sleep(1)
    seen = len(control_plane.audit_events())
    new = Scenario(admin=installed, git=git_server, tenant=system, repo=s.repo)
    new.stageset("web", [{"name": "app", "path": "./app"}], targetNamespace=s.ns, retryInterval="2s")
    conflict = new.wait_reason("web", "OwnershipConflict")
    assert f"is held by StageSet {s.ns}/web" in conflict["message"], conflict["message"]
    assert new.configmap("a") is None, "targetNamespace: nothing lands in the StageSet's own namespace"

    s.admin.apply(s.path("web"), {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                                  "metadata": {"name": "web", "namespace": s.ns},
                                  "spec": {"deletionPolicy": "Orphan"}}, field_manager="e2e-orphan")
    wait_for(lambda: s.get("web")["spec"].get("deletionPolicy") == "Orphan", what="the policy set")
    s.admin.request("DELETE", s.path("web"))
    wait_for(lambda: get_or_none(installed, s.path("web")) is None, what="the old StageSet gone")
    orphaned = [e for e in installed.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
                if e.get("reason") == "Orphaned"]
    assert orphaned, "an Orphaned event"
    assert "(deletionPolicy: Orphan): left 2 object(s) in place without owner labels: " \
           f"ConfigMap {s.ns}/a, ConfigMap {s.ns}/b" in orphaned[0]["message"], orphaned[0]["message"]

    adopted = new.wait_ready("web")
    assert [e["id"] for e in adopted["status"]["inventory"][0]["entries"]] == [
        f"{s.ns}_a__ConfigMap", f"{s.ns}_b__ConfigMap"]
    assert uids(s) == before, "the same objects: nothing deleted or recreated"
    assert owner(s, "a") == owner(s, "b") == (system.namespace, "web")
    time.sleep(1)
    writes = writes_to(control_plane.audit_events()[seen:], namespace=s.ns)
    assert [w for w in writes if w[0] in ("delete", "create")] == [], writes
    # Released by the old identity, adopted by the new one: one patch each per object.
    identities = (tenant.username, f"system:serviceaccount:{system.namespace}:deployer")
    assert sorted(writes) == sorted([("patch", n, who) for n in NAMES for who in identities]), writes
