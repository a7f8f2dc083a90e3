"""Apply, prune, drift and teardown through the controller process against the real apiserver."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, get_or_none, wait_for, writes_by
from tests.e2e.stagesets import cm, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]

CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def test_crd_namespace_and_custom_resource_in_one_stage_in_any_file_order(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("crd")
    installed.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
        "metadata": {"name": f"{tenant.namespace}-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": tenant.service_account,
                      "namespace": tenant.namespace}]})
    widget_ns = f"{tenant.namespace}-widgets"
    s = scenario(installed, git_server, tenant, {
        # File order puts the custom resource first and its CRD last.
        "all/a-widget.yaml": f"apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n"
                             f"  namespace: {widget_ns}\nspec: {{size: 3}}\n",
        "all/b-namespace.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {widget_ns}\n",
        "all/c-crd.yaml": CRD,
    })
    s.stageset("crd", [{"name": "all", "path": "./all"}])
    ready = s.wait_ready("crd")
    assert ready["status"]["stages"][0]["objects"] == 3
    widget = installed.get(f"/apis/example.com/v1/namespaces/{widget_ns}/widgets/w")
    assert widget["spec"] == {"size": 3}


def test_prune_keeps_opt_outs_and_moved_objects(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("prune"), {
        "a/keep.yaml": cm("keep"),
        "a/gone.yaml": cm("gone"),
        "a/optout.yaml": cm("optout", annotations={"stages.metio.wtf/prune": "disabled"}),
        "b/mover.yaml": cm("mover"),
        "c/stay.yaml": cm("stay"),
    })
    s.stageset("prune", [{"name": "a", "path": "./a"}, {"name": "b", "path": "./b"},
                         {"name": "c", "path": "./c", "prune": False}])
    s.wait_ready("prune")
    inventory = {i["name"]: len(i["entries"]) for i in s.get("prune")["status"]["inventory"]}
    assert inventory == {"a": 3, "b": 1, "c": 1}

    second = s.commit({"a/gone.yaml": None, "a/optout.yaml": None, "b/mover.yaml": None,
                       "a/mover.yaml": cm("mover"), "b/other.yaml": cm("other"),
                       "c/stay.yaml": None, "c/new.yaml": cm("new")})
    s.wait_ready("prune", revision=second)
    assert s.configmap("gone") is None
    assert s.configmap("optout") is not None, "stages.metio.wtf/prune: disabled must keep the object"
    assert s.configmap("stay") is not None, "prune: false must keep the object"
    mover = s.configmap("mover")
    assert mover is not None, "an object moved between stages must never be deleted"
    assert mover["metadata"]["labels"]["stages.metio.wtf/stage"] == "a"
    assert s.configmap("keep") is not None
    inventory = {i["name"]: sorted(e["id"].split("_")[1] for e in i["entries"])
                 for i in s.get("prune")["status"]["inventory"]}
    assert inventory == {"a": ["keep", "mover"], "b": ["other"], "c": ["new"]}


def test_an_empty_path_fails_the_stage_and_prunes_nothing(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("empty"), {"app/cm.yaml": cm("precious")})
    s.stageset("empty", [{"name": "app", "path": "./app"}])
    s.wait_ready("empty")
    s.commit({"app/cm.yaml": None, "app/README.md": "moved elsewhere"})
    failed = s.wait_reason("empty", "StageFailed")
    assert "holds no manifests" in failed["message"]
    assert s.configmap("precious") is not None


def test_two_stages_rendering_one_object_is_invalid_and_nothing_is_applied(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("dup"), {
        "a/cm.yaml": cm("twice", "a"), "a/only.yaml": cm("only-a"), "b/cm.yaml": cm("twice", "b")})
    s.stageset("dup", [{"name": "a", "path": "./a"}, {"name": "b", "path": "./b"}])
    invalid = s.wait_reason("dup", "InvalidSpec")
    assert "ConfigMap" in invalid["message"]
    assert "twice" in invalid["message"]
    assert s.configmap("only-a") is None


def test_a_removed_stage_is_torn_down(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("rmstage"), {
        "a/cm.yaml": cm("in-a"), "b/cm.yaml": cm("in-b")})
    s.stageset("rm", [{"name": "a", "path": "./a"}, {"name": "b", "path": "./b"}])
    s.wait_ready("rm")
    s.stageset("rm", [{"name": "a", "path": "./a"}])
    s.wait_ready("rm")
    wait_for(lambda: s.configmap("in-b") is None, what="stage b's object deleted")
    assert s.configmap("in-a") is not None
    assert [i["name"] for i in s.get("rm")["status"]["inventory"]] == ["a"]


def events_for(admin: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = admin.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def test_drift_is_corrected_and_reported_but_a_new_revision_is_not_drift(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("drift"), {
        "app/edited.yaml": cm("edited", "git"), "app/deleted.yaml": cm("deleted")})
    s.stageset("drift", [{"name": "app", "path": "./app"}])
    s.wait_ready("drift")
    base = f"/api/v1/namespaces/{s.ns}/configmaps"
    installed.request("PATCH", f"{base}/edited", content_type="application/merge-patch+json",
                      body={"data": {"k": "hand-edited"}})
    installed.request("DELETE", f"{base}/deleted")
    poke(installed, s.path("drift"))
    wait_for(lambda: (s.configmap("edited") or {}).get("data") == {"k": "git"}, what="edit reverted")
    wait_for(lambda: s.configmap("deleted") is not None, what="deleted object recreated")
    # The edit's watch event may start a pass before the delete is made: one pass may restore both
    # objects, or two passes one each; every restored object is named by a DriftCorrected event.
    def corrected() -> list[dict[str, Any]] | None:
        found = [e for e in events_for(installed, s.ns, "drift") if e["reason"] == "DriftCorrected"]
        said = " ".join(e["message"] for e in found)
        return found if "edited" in said and "deleted" in said else None
    drift = wait_for(corrected, what="DriftCorrected events naming both objects")
    assert all(e["type"] == "Warning" for e in drift)

    second = s.commit({"app/edited.yaml": cm("edited", "new-revision")})
    s.wait_ready("drift", revision=second)
    assert (s.configmap("edited") or {}).get("data") == {"k": "new-revision"}
    # A new revision is not drift: no DriftCorrected event beyond those above.
    assert len([e for e in events_for(installed, s.ns, "drift") if e["reason"] == "DriftCorrected"]) \
        == len(drift)


def test_a_warm_reconcile_of_an_unchanged_stageset_writes_nothing(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane,
) -> None:
    tenant = make_tenant("noop")
    s = scenario(installed, git_server, tenant, {"app/a.yaml": cm("a"), "app/b.yaml": cm("b")})
    s.stageset("noop", [{"name": "app", "path": "./app"}])
    s.wait_ready("noop")
    assert len(writes_by(control_plane.audit_events(), tenant.username)) >= 2, "the audit log sees writes"
    seen = len(control_plane.audit_events())
    stamp = poke(installed, s.path("noop"))
    wait_for(lambda: s.get("noop")["status"].get("lastHandledReconcileAt") == stamp,
             what="the requested reconcile")
    s.wait_ready("noop")
    time.sleep(1)  # let the audit log catch up with the last requests
    later = control_plane.audit_events()[seen:]
    # Evidence the pass ran: the tenant listed its objects by their owner labels; nothing had
    # changed their resourceVersions since they were applied, so only one of the two was dry-run
    # (may the tenant still write ConfigMaps there?).
    mine = [e for e in later if (e.get("impersonatedUser") or {}).get("username") == tenant.username]
    assert any(e.get("verb") == "list" and "labelSelector=" in e.get("requestURI", "") for e in mine), \
        "the reconcile did list its objects"
    assert len([e for e in mine if "dryRun=All" in e.get("requestURI", "")]) == 1
    assert writes_by(later, tenant.username) == []
    # The StageSet itself: one status write, for lastHandledReconcileAt; Ready never flapped.
    controller_writes = writes_by(later, "system:serviceaccount:stageset-system:stageset-controller")
    assert [w["objectRef"].get("subresource") for w in controller_writes] == ["status"]


def test_delete_tears_stages_down_in_reverse_order(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("teardown"), {
        "first/cm.yaml": cm("first"), "second/cm.yaml": cm("second", finalizers=["example.com/hold"])})
    s.stageset("td", [{"name": "first", "path": "./first"}, {"name": "second", "path": "./second"}])
    s.wait_ready("td")
    assert "stages.metio.wtf/teardown" in s.get("td")["metadata"]["finalizers"]
    installed.request("DELETE", s.path("td"))
    wait_for(lambda: (s.configmap("second") or {}).get("metadata", {}).get("deletionTimestamp"),
             what="the last stage deleted first")
    time.sleep(2)
    first = s.configmap("first")
    assert first is not None
    assert not first["metadata"].get("deletionTimestamp"), "first stage torn down before its dependent"
    installed.request("PATCH", f"/api/v1/namespaces/{s.ns}/configmaps/second",
                      content_type="application/merge-patch+json", body={"metadata": {"finalizers": None}})
    wait_for(lambda: s.configmap("first") is None, what="the first stage torn down")
    wait_for(lambda: get_or_none(installed, s.path("td")) is None, what="the StageSet released")


def test_substitution_from_configmaps_and_secrets_read_as_the_tenant_and_kustomize(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("subst")
    s = scenario(installed, git_server, tenant, {
        "plain/cm.yaml": 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain}\n'
                         'data: {region: "${region}", tier: "${tier:=gold}", token: "${token}"}\n',
        "overlay/kustomization.yaml": "resources: [cm.yaml]\nnamePrefix: prod-\n",
        "overlay/cm.yaml": 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kustomized}\n'
                           'data: {region: "${region}"}\n',
    })
    base = f"/api/v1/namespaces/{s.ns}"
    installed.request("POST", f"{base}/configmaps", body={
        "metadata": {"name": "vars"}, "data": {"region": "eu-west"}})
    installed.request("POST", f"{base}/secrets", body={
        "metadata": {"name": "secret-vars"}, "stringData": {"token": "from-secret"}})
    post_build = {"substituteFrom": [{"kind": "ConfigMap", "name": "vars"},
                                     {"kind": "Secret", "name": "secret-vars"},
                                     {"kind": "ConfigMap", "name": "absent", "optional": True}]}
    s.stageset("subst", [{"name": "plain", "path": "./plain", "postBuild": post_build},
                         {"name": "overlay", "path": "./overlay", "postBuild": post_build}])
    s.wait_ready("subst")
    assert (s.configmap("plain") or {})["data"] == {"region": "eu-west", "tier": "gold",
                                                     "token": "from-secret"}
    assert (s.configmap("prod-kustomized") or {})["data"] == {"region": "eu-west"}
    assert "from-secret" not in controller.output()

    s.stageset("subst", [{"name": "plain", "path": "./plain",
                          "postBuild": {"substituteFrom": [{"kind": "ConfigMap", "name": "missing"}]}}])
    failed = s.wait_reason("subst", "StageFailed")
    assert "missing" in failed["message"]


def test_an_object_the_tenant_may_not_delete_stays_tracked_until_prune_succeeds(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("noprune")
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenant.namespace}"
    rule = {"apiGroups": [""], "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "create", "update", "patch"]}
    installed.request("POST", f"{rbac}/roles", body={"metadata": {"name": "no-delete"}, "rules": [rule]})
    installed.request("POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": "no-delete"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-delete"},
        "subjects": [{"kind": "ServiceAccount", "name": tenant.service_account,
                      "namespace": tenant.namespace}]})
    s = scenario(installed, git_server, tenant, {"app/keep.yaml": cm("keep"), "app/old.yaml": cm("old")},
                 role="view")  # view: read GitRepositories; the Role above: write ConfigMaps
    s.stageset("np", [{"name": "app", "path": "./app"}])
    s.wait_ready("np")

    second = s.commit({"app/old.yaml": None})
    s.wait_ready("np", revision=second)
    wait_for(lambda: [e for e in events_for(installed, s.ns, "np") if e["reason"] == "PruneFailed"],
             what="PruneFailed event")
    assert s.configmap("old") is not None
    tracked = [e["id"] for i in s.get("np")["status"]["inventory"] for e in i["entries"]]
    assert any("_old_" in t for t in tracked), "an object that could not be pruned must stay tracked"

    installed.request("PATCH", f"{rbac}/roles/no-delete", content_type="application/merge-patch+json",
                      body={"rules": [{**rule, "verbs": [*rule["verbs"], "delete"]}]})
    poke(installed, s.path("np"))
    wait_for(lambda: s.configmap("old") is None, what="pruned once allowed")
    wait_for(lambda: not any("_old_" in e["id"] for i in s.get("np")["status"]["inventory"]
                             for e in i["entries"]), what="inventory cleaned")


def test_a_source_in_another_namespace_needs_the_tenants_own_read_right(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    owner = scenario(installed, git_server, make_tenant("src-owner"), {"app/cm.yaml": cm("theirs")})
    s = scenario(installed, git_server, make_tenant("src-user"), {"app/cm.yaml": cm("mine")})
    s.stageset("borrow", [{"name": "app", "path": "./app",
                           "sourceRef": {"name": "app", "namespace": owner.ns}}])
    denied = s.wait_reason("borrow", "RBACDenied")
    assert f"GitRepository {owner.ns}/app" in denied["message"]
    assert s.configmap("theirs") is None

    # The owner lets this tenant's ServiceAccount view its namespace: now it may use the source.
    installed.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{owner.ns}/rolebindings", body={
        "metadata": {"name": "share-source"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": s.tenant.service_account, "namespace": s.ns}]})
    poke(installed, s.path("borrow"))
    s.wait_ready("borrow")
    assert s.configmap("theirs") is not None
