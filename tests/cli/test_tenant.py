"""``stageset create tenant`` / ``delete tenant``: the export is deterministic and contacts no
cluster; applied to the real apiserver it grants exactly the per-namespace rights (asked of the
apiserver's own authorizer with SubjectAccessReviews, and tried with real requests as the
deployer and as a tenant admin): the default deployer and admins may not write the guardrails
(NetworkPolicies, ResourceQuotas, LimitRanges, Roles, RoleBindings), ``--cluster-role edit`` keeps
the old trade-off, its LimitRange fills in a container's resources, and its NetworkPolicies have
the documented shape (the shared-service exceptions included).  That the deployer's role is ``edit``
minus those writes, rule by rule, is compared with the apiserver's own ``edit``.  (Its quota,
counted by the real resourcequota controller, refusing a third StageSet:
``tests/e2e/managed/test_tenant_lifecycle.py``.)
Applying without ``--export`` is server-side as the kubeconfig's user, and ``delete tenant`` is a
dry run until ``--yes``, deleting StageSets before namespaces.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.api.rbac import GUARDRAILS, TENANT_DEPLOYER_RULES
from stageset.api.tenancy import TENANT_LABEL
from stageset.cli.tenantobjects import object_path
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from tests.cli.conftest import run_cli

STAGESETS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets"
SAR = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
QUOTA = "requests.cpu=4,requests.memory=8Gi,stagesets=2"
LIMITS = "default-cpu=500m,default-memory=512Mi,request-cpu=100m,request-memory=128Mi"
ADMINS = "payments-admins"
INGRESS = "kubernetes.io/metadata.name=ingress-nginx"
MONITORING = "platform.example/monitoring=true"
SHARED = "platform.example/shared=true"
WRITES = ("create", "update", "patch", "delete", "deletecollection")


def export(*args: str) -> str:
    # No kubeconfig anywhere: --export must not need (or look for) a cluster.
    result = run_cli("create", "tenant", *args, "--export", env={"HOME": "/nonexistent"})
    assert result.exit_code == 0, result.output + result.stderr
    return result.stdout


# -- the export, without a cluster -----------------------------------------------------------------

def test_export_is_deterministic_and_labels_every_object_with_the_tenant() -> None:
    args = ("payments", "--with-namespace", "payments-web", "--with-namespace", "payments-db",
            "--control-plane-namespace", "payments-cp", "--quota", QUOTA, "--limit-range", LIMITS)
    first = export(*args)
    # The same tenant with the namespaces in another order is the same YAML, byte for byte.
    assert export(*args) == first
    assert export("payments", "--with-namespace", "payments-db", "--with-namespace", "payments-web",
                  "--control-plane-namespace", "payments-cp", "--quota", "stagesets=2,requests.memory=8Gi,"
                  "requests.cpu=4", "--limit-range", LIMITS) == first
    assert "&id" not in first
    assert "*id" not in first
    objects = list(yaml.safe_load_all(first))
    # The tenant's objects carry its label; the deployer's ClusterRole, shared by every tenant, none.
    assert all(o["metadata"]["labels"] == {TENANT_LABEL: "payments"}
               for o in objects if o["kind"] != "ClusterRole")
    kinds = [o["kind"] for o in objects]
    assert kinds[:4] == ["ClusterRole"] + ["Namespace"] * 3
    assert objects[0]["metadata"] == {"name": "stageset-tenant-deployer",
                                      "labels": {"app.kubernetes.io/part-of": "stageset"}}
    # Nothing cluster-scoped but the namespaces and the role the RoleBindings name: no
    # ClusterRoleBinding, so nothing is granted cluster-wide.
    assert set(kinds) == {"ClusterRole", "Namespace", "ServiceAccount", "RoleBinding", "NetworkPolicy",
                          "ResourceQuota", "LimitRange"}
    quota = next(o for o in objects if o["kind"] == "ResourceQuota")
    assert quota["spec"]["hard"] == {"count/stagesets.stages.metio.wtf": "2", "requests.cpu": "4",
                                     "requests.memory": "8Gi"}


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--quota", "requests.cpu", "is not KEY=VALUE"),
    ("--quota", "pods=lots", "not a Kubernetes quantity"),
    ("--quota", "Pods=1", "not a resource name"),
    ("--limit-range", "max-cpu=1", "unknown key 'max-cpu'"),
    ("--limit-range", "default-cpu=1,default-cpu=2", "given twice"),
])
def test_bad_quota_and_limit_range_are_usage_errors(flag: str, value: str, says: str) -> None:
    result = run_cli("create", "tenant", "t", "--with-namespace", "t", flag, value, "--export")
    assert result.exit_code == 2
    assert says in result.stderr


@pytest.mark.parametrize(("flag", "value"), [
    ("--allow-from-namespace-label", "ingress"), ("--allow-from-namespace-label", "Bad Key=x"),
    ("--allow-to-namespace-label", "a/b/c=x"), ("--allow-to-namespace-label", "k=not a value"),
])
def test_a_bad_namespace_label_is_a_usage_error(flag: str, value: str) -> None:
    result = run_cli("create", "tenant", "t", "--with-namespace", "t", flag, value, "--export")
    assert result.exit_code == 2
    assert f"{flag}: {value!r} is not a label KEY=VALUE" in result.stderr


def test_the_export_binds_admins_and_allows_the_labelled_namespaces() -> None:
    objects = list(yaml.safe_load_all(export(
        "shop", "--with-namespace", "shop", "--admin-group", ADMINS, "--admin-user", "alice@example.com",
        "--allow-from-namespace-label", INGRESS, "--allow-from-namespace-label", MONITORING,
        "--allow-to-namespace-label", SHARED)))
    roles = [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"]
    assert roles == ["stageset-tenant-deployer", "stageset-tenant-admin"]
    admins = next(o for o in objects
                  if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "stageset-tenant-admins")
    assert admins["roleRef"]["name"] == "stageset-tenant-admin"
    assert admins["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice@example.com"},
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": ADMINS}]
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["stageset-tenant-allow-from-namespaces"] == {
        "podSelector": {}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}},
            {"namespaceSelector": {"matchLabels": {"platform.example/monitoring": "true"}}}]}]}
    assert policies["stageset-tenant-allow-to-namespaces"] == {
        "podSelector": {}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"platform.example/shared": "true"}}}]}]}


def test_cluster_role_edit_keeps_the_old_binding_and_ships_no_role() -> None:
    objects = list(yaml.safe_load_all(export("old", "--with-namespace", "old", "--cluster-role", "edit")))
    assert "ClusterRole" not in {o["kind"] for o in objects}
    binding = next(o for o in objects if o["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == "edit"


def test_the_control_plane_namespace_is_not_a_workload_namespace() -> None:
    result = run_cli("create", "tenant", "t", "--with-namespace", "t", "--control-plane-namespace", "t",
                     "--export")
    assert result.exit_code == 2
    assert "cannot also be a workload namespace" in result.stderr


# -- the export applied to the real apiserver ------------------------------------------------------

@dataclass
class Applied:
    name: str
    control_plane: str
    workloads: tuple[str, str]
    objects: list[dict[str, Any]]


@pytest.fixture(scope="module")
def applied(installed: KubeClient) -> Iterator[Applied]:
    """A tenant with two workload namespaces and a control-plane namespace, from --export, applied
    server-side by the admin exactly as printed."""
    name = f"tn-{uuid.uuid4().hex[:6]}"
    web, db, cp = f"{name}-web", f"{name}-db", f"{name}-cp"
    objects = list(yaml.safe_load_all(export(name, "--with-namespace", web, "--with-namespace", db,
                                             "--control-plane-namespace", cp, "--quota", QUOTA,
                                             "--limit-range", LIMITS, "--admin-group", ADMINS,
                                             "--allow-from-namespace-label", INGRESS,
                                             "--allow-to-namespace-label", SHARED)))
    for obj in objects:
        installed.apply(object_path(obj), obj, field_manager="platform-git")
    yield Applied(name=name, control_plane=cp, workloads=(web, db), objects=objects)
    for namespace in (web, db, cp):
        installed.delete(f"/api/v1/namespaces/{namespace}")


def allowed(admin: KubeClient, user: str, *, verb: str, resource: str, group: str = "",
            namespace: str | None = None, groups: tuple[str, ...] | None = None) -> bool:
    """The apiserver's own authorizer: may ``user`` (a ServiceAccount, with its groups, unless
    ``groups`` names a person's) do this?"""
    if groups is None:
        sa_namespace = user.split(":")[2]
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}")
    attributes: dict[str, str] = {"verb": verb, "resource": resource, "group": group}
    if namespace is not None:
        attributes["namespace"] = namespace
    review = admin.request("POST", SAR, body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": [*groups, "system:authenticated"],
                 "resourceAttributes": attributes}})
    return bool(review["status"].get("allowed"))


def deployer(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:stageset-deployer"


@pytest.mark.apiserver
def test_each_deployer_may_deploy_in_its_own_namespace_only(installed: KubeClient, applied: Applied,
                                                            make_namespace: Any) -> None:
    web, db = applied.workloads
    elsewhere = make_namespace("other")
    for own, other in ((web, db), (db, web)):
        assert allowed(installed, deployer(own), verb="create", resource="deployments", group="apps",
                       namespace=own)
        assert not allowed(installed, deployer(own), verb="create", resource="deployments", group="apps",
                           namespace=other)
        assert not allowed(installed, deployer(own), verb="create", resource="stagesets",
                           group="stages.metio.wtf", namespace=applied.control_plane)
    for namespace in (web, db, applied.control_plane):
        assert not allowed(installed, deployer(namespace), verb="get", resource="configmaps",
                           namespace=elsewhere)


@pytest.mark.apiserver
def test_the_control_plane_deployer_may_deploy_in_every_workload_namespace(installed: KubeClient,
                                                                           applied: Applied,
                                                                           make_namespace: Any) -> None:
    cp = deployer(applied.control_plane)
    for namespace in applied.workloads:
        assert allowed(installed, cp, verb="create", resource="deployments", group="apps",
                       namespace=namespace)
        assert allowed(installed, cp, verb="delete", resource="secrets", namespace=namespace)
    # Its own namespace: its StageSets' own reads (dependsOn, kubeConfig) run as it there.
    assert allowed(installed, cp, verb="get", resource="stagesets", group="stages.metio.wtf",
                   namespace=applied.control_plane)
    assert not allowed(installed, cp, verb="create", resource="deployments", group="apps",
                       namespace=make_namespace("other"))


@pytest.mark.apiserver
def test_nothing_cluster_wide_is_granted(installed: KubeClient, applied: Applied) -> None:
    for namespace in (*applied.workloads, applied.control_plane):
        user = deployer(namespace)
        for verb, resource, group in (("list", "namespaces", ""), ("create", "namespaces", ""),
                                      ("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
                                      ("list", "deployments", "apps"), ("list", "secrets", ""),
                                      ("create", "customresourcedefinitions", "apiextensions.k8s.io")):
            assert not allowed(installed, user, verb=verb, resource=resource, group=group), \
                (user, verb, resource)
        # Nor its own namespace's quota, limits or bindings: `edit` may not change them.
        for resource, group in (("resourcequotas", ""), ("limitranges", ""),
                                ("rolebindings", "rbac.authorization.k8s.io")):
            assert not allowed(installed, user, verb="patch", resource=resource, group=group,
                               namespace=namespace), (user, resource)
        # Nor its NetworkPolicies: stageset-tenant-deployer may read them, never write them (with
        # `edit` it could: --cluster-role edit, the documented trade-off).
        assert not allowed(installed, user, verb="delete", resource="networkpolicies",
                           group="networking.k8s.io", namespace=namespace)
        assert allowed(installed, user, verb="list", resource="networkpolicies", group="networking.k8s.io",
                       namespace=namespace)


@pytest.mark.apiserver
def test_the_deployer_may_write_no_guardrail_yet_deploy(installed: KubeClient, applied: Applied) -> None:
    """Every write verb on every guardrail, in every namespace of the tenant, for both deployers
    bound there: refused by the apiserver's authorizer; the workloads' kinds allowed."""
    cp = deployer(applied.control_plane)
    for namespace in (*applied.workloads, applied.control_plane):
        for user in {deployer(namespace), cp}:
            for group, resource in GUARDRAILS:
                for verb in WRITES:
                    assert not allowed(installed, user, verb=verb, resource=resource, group=group,
                                       namespace=namespace), (user, verb, resource, namespace)
            for group, resource in (("apps", "deployments"), ("", "services"), ("", "configmaps"),
                                    ("", "secrets"), ("batch", "jobs"), ("networking.k8s.io", "ingresses")):
                for verb in ("create", "patch", "delete"):
                    assert allowed(installed, user, verb=verb, resource=resource, group=group,
                                   namespace=namespace), (user, verb, resource, namespace)


@pytest.mark.apiserver
def test_real_requests_as_the_deployer_are_refused_on_guardrails_and_pass_on_workloads(
        installed: KubeClient, applied: Applied, kube_pool: ClientPool) -> None:
    namespace = applied.workloads[0]
    as_deployer = kube_pool.client(Identity.service_account(namespace=namespace, name="stageset-deployer"))
    policies = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    refused = [
        ("DELETE", f"{policies}/stageset-tenant-deny-all", None),
        ("POST", policies, {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                            "metadata": {"name": "allow-all"},
                            "spec": {"podSelector": {}, "ingress": [{}], "egress": [{}]}}),
        ("DELETE", f"/api/v1/namespaces/{namespace}/resourcequotas/stageset-tenant", None),
        ("DELETE", f"/api/v1/namespaces/{namespace}/limitranges/stageset-tenant", None),
        ("DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/stageset-tenant",
         None),
        ("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
         {"metadata": {"name": "mine"}, "rules": []}),
    ]
    for method, path, body in refused:
        with pytest.raises(ApiError) as error:
            as_deployer.request(method, path, body=body)
        assert error.value.forbidden, (method, path, error.value.message)
    # Evidence the refusals were RBAC's and the objects are whole: the admin still sees the policy.
    assert installed.get(f"{policies}/stageset-tenant-deny-all")["spec"]["podSelector"] == {}

    for path, obj in (
        (f"/api/v1/namespaces/{namespace}/configmaps/app",
         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"k": "v"}}),
        (f"/api/v1/namespaces/{namespace}/services/app",
         {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "app"},
          "spec": {"ports": [{"port": 80}], "selector": {"app": "app"}}}),
        (f"/apis/apps/v1/namespaces/{namespace}/deployments/app",
         {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
          "spec": {"selector": {"matchLabels": {"app": "app"}},
                   "template": {"metadata": {"labels": {"app": "app"}},
                                "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1",
                                                         "resources": {"limits": {"cpu": "100m",
                                                                                  "memory": "64Mi"}}}]}}}}),
    ):
        written = as_deployer.apply(path, obj, field_manager="tenant-git")
        assert written["metadata"]["uid"], path


@pytest.mark.apiserver
def test_an_admin_group_member_administers_the_namespace_but_not_its_guardrails(
        installed: KubeClient, applied: Applied, kube_pool: ClientPool) -> None:
    person, groups = "bob@example.com", (ADMINS,)
    for namespace in (*applied.workloads, applied.control_plane):
        for group, resource in GUARDRAILS:
            for verb in WRITES:
                assert not allowed(installed, person, verb=verb, resource=resource, group=group,
                                   namespace=namespace, groups=groups), (verb, resource, namespace)
        for verb, resource, group in (("create", "deployments", "apps"), ("delete", "secrets", ""),
                                      ("create", "pods/exec", ""),
                                      ("create", "stagesets", "stages.metio.wtf"),
                                      ("list", "rolebindings", "rbac.authorization.k8s.io"),
                                      ("create", "localsubjectaccessreviews", "authorization.k8s.io"),
                                      ("list", "resourcequotas", "")):
            assert allowed(installed, person, verb=verb, resource=resource, group=group, namespace=namespace,
                           groups=groups), (verb, resource, namespace)
        # Someone not in the group: nothing.
        assert not allowed(installed, person, verb="list", resource="pods", namespace=namespace, groups=())
    assert not allowed(installed, person, verb="list", resource="namespaces", groups=groups)
    # And for real, as a person in the group (impersonated user and group).
    namespace = applied.workloads[1]
    bob = kube_pool.client(Identity(user=person, groups=groups))
    bob.apply(f"/api/v1/namespaces/{namespace}/configmaps/by-bob",
              {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "by-bob"}}, field_manager="bob")
    with pytest.raises(ApiError) as error:
        bob.request("DELETE", f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/"
                              "stageset-tenant-allow-dns")
    assert error.value.forbidden, error.value.message
    with pytest.raises(ApiError) as error:
        bob.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", body={
            "metadata": {"name": "escalate"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "User", "name": person}]})
    assert error.value.forbidden, error.value.message


def _triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in rules for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", []) for verb in rule.get("verbs", [])}


@pytest.mark.apiserver
def test_the_deployer_role_is_edit_minus_the_guardrail_writes(installed: KubeClient) -> None:
    """Rule by rule against this apiserver's own bootstrap roles: what `edit` aggregates (its
    system:aggregate-to-edit and -view, and our kinds' role), minus writes to the guardrails."""
    roles = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    edit: set[tuple[str, str, str]] = set()
    for name in ("system:aggregate-to-edit", "system:aggregate-to-view", "stageset-edit"):
        edit |= _triples(installed.get(f"{roles}/{name}")["rules"])
    guardrail_writes = {(g, r, v) for g, r in GUARDRAILS for v in WRITES}
    assert guardrail_writes & edit, "evidence: edit does write some guardrail (networkpolicies)"
    assert _triples(TENANT_DEPLOYER_RULES) == edit - guardrail_writes
    live = installed.get(f"{roles}/stageset-tenant-deployer")
    assert _triples(live["rules"]) == edit - guardrail_writes


def stageset(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"serviceAccountName": "stageset-deployer", "suspend": True,
                     "stages": [{"name": "app", "sourceRef": {"name": "app"}, "path": "app"}]}}


@pytest.mark.apiserver
def test_the_limit_range_fills_in_a_containers_resources(installed: KubeClient, applied: Applied) -> None:
    namespace = applied.workloads[0]
    pod = installed.request("POST", f"/api/v1/namespaces/{namespace}/pods", query={"dryRun": "All"}, body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]}})
    assert pod["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}}


@pytest.mark.apiserver
def test_the_network_policies_deny_by_default_and_allow_the_tenant_and_dns(installed: KubeClient,
                                                                          applied: Applied) -> None:
    selector = {"matchLabels": {TENANT_LABEL: applied.name}}
    for namespace in (*applied.workloads, applied.control_plane):
        live = {p["metadata"]["name"]: p["spec"] for p in installed.get(
            f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies")["items"]}
        assert set(live) == {"stageset-tenant-deny-all", "stageset-tenant-same-tenant",
                             "stageset-tenant-allow-dns", "stageset-tenant-allow-from-namespaces",
                             "stageset-tenant-allow-to-namespaces"}
        deny = live["stageset-tenant-deny-all"]
        assert deny["podSelector"] == {}
        assert deny["policyTypes"] == ["Ingress", "Egress"]
        assert "ingress" not in deny
        assert "egress" not in deny
        same = live["stageset-tenant-same-tenant"]
        assert same["ingress"] == [{"from": [{"namespaceSelector": selector}]}]
        assert same["egress"] == [{"to": [{"namespaceSelector": selector}]}]
        dns = live["stageset-tenant-allow-dns"]
        assert dns["policyTypes"] == ["Egress"]
        assert "ingress" not in dns
        assert dns["egress"][0]["to"] == [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
        ports = sorted((p["protocol"], p["port"]) for p in dns["egress"][0]["ports"])
        assert ports == [("TCP", 53), ("UDP", 53)]
        assert live["stageset-tenant-allow-from-namespaces"]["ingress"] == [{"from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]}]
        assert live["stageset-tenant-allow-to-namespaces"]["egress"] == [{"to": [
            {"namespaceSelector": {"matchLabels": {"platform.example/shared": "true"}}}]}]


# -- applied by the command, and deleted -----------------------------------------------------------

@pytest.mark.apiserver
def test_create_applies_server_side_as_the_user_and_delete_is_a_dry_run_until_yes(
        installed: KubeClient, kubeconfig: Path, control_plane: ControlPlane) -> None:
    name = f"tc-{uuid.uuid4().hex[:6]}"
    web, cp = f"{name}-web", f"{name}-cp"
    args = ("create", "tenant", name, "--with-namespace", web, "--control-plane-namespace", cp,
            "--quota", "stagesets=5")
    created = run_cli(*args, kubeconfig=kubeconfig)
    assert created.exit_code == 0, created.output + created.stderr
    assert f"applied RoleBinding {web}/stageset-tenant" in created.stdout
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    binding = installed.get(f"{rbac}/namespaces/{web}/rolebindings/stageset-tenant")
    assert [m["manager"] for m in binding["metadata"]["managedFields"]] == ["stageset"]
    assert [m["operation"] for m in binding["metadata"]["managedFields"]] == ["Apply"]
    assert run_cli(*args, kubeconfig=kubeconfig).exit_code == 0  # again: nothing to change, no error
    installed.request("POST", STAGESETS.format(ns=cp), body=stageset(cp, "app"))

    dry = run_cli("delete", "tenant", name, kubeconfig=kubeconfig)
    assert dry.exit_code == 0, dry.output + dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[1:4] == [f"  StageSet {cp}/app", f"  Namespace {cp}", f"  Namespace {web}"]
    assert "dry run: nothing deleted" in dry.stdout
    assert installed.get(f"{STAGESETS.format(ns=cp)}/app")  # still there
    assert not installed.get(f"/api/v1/namespaces/{web}")["metadata"].get("deletionTimestamp")

    done = run_cli("delete", "tenant", name, "--yes", "--timeout", "30s", kubeconfig=kubeconfig)
    assert done.exit_code == 0, done.output + done.stderr
    # No controller runs here and the StageSet holds no finalizer: it goes at once.  The namespaces
    # are Terminating (this control plane has no namespace controller to finish them).
    deletes = [e["objectRef"]["resource"] for e in control_plane.audit_events()
               if e.get("verb") == "delete" and e.get("stage") == "ResponseComplete"
               and e["objectRef"].get("name") in ("app", web, cp)
               and e["objectRef"].get("namespace", e["objectRef"].get("name")) in (web, cp)]
    assert deletes == ["stagesets", "namespaces", "namespaces"]
    for namespace in (web, cp):
        assert installed.get(f"/api/v1/namespaces/{namespace}")["metadata"].get("deletionTimestamp")


@pytest.mark.apiserver
def test_delete_of_an_unknown_tenant_fails(installed: KubeClient, kubeconfig: Path) -> None:
    result = run_cli("delete", "tenant", f"none-{uuid.uuid4().hex[:6]}", kubeconfig=kubeconfig)
    assert result.exit_code == 3
    assert "no namespace is labelled stages.metio.wtf/tenant=" in result.stderr


# -- a tenant at a glance --------------------------------------------------------------------------

@pytest.mark.apiserver
def test_get_tenant_shows_its_namespaces_quota_use_and_stagesets(installed: KubeClient, applied: Applied,
                                                                 kubeconfig: Path) -> None:
    web, db = applied.workloads
    # The quota's use as kube-controller-manager's quota controller writes it (none runs here).
    installed.request("PATCH", f"/api/v1/namespaces/{web}/resourcequotas/stageset-tenant/status",
                      content_type="application/merge-patch+json", body={"status": {
                          "hard": {"count/stagesets.stages.metio.wtf": "2", "requests.cpu": "4",
                                   "requests.memory": "8Gi"},
                          "used": {"count/stagesets.stages.metio.wtf": "1", "requests.cpu": "3800m",
                                   "requests.memory": "1Gi"}}})
    collection = STAGESETS.format(ns=applied.control_plane)
    for name, ready in (("web", "True"), ("db", "False")):
        installed.request("POST", collection, body=stageset(applied.control_plane, name))
        installed.request("PATCH", f"{collection}/{name}/status", content_type="application/merge-patch+json",
                          body={"status": {"observedGeneration": 1, "conditions": [{
                              "type": "Ready", "status": ready, "observedGeneration": 1,
                              "reason": "Succeeded" if ready == "True" else "StageFailed",
                              "message": "every stage is Ready" if ready == "True" else "stage 'app' failed",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})

    shown = run_cli("get", "tenant", applied.name, kubeconfig=kubeconfig)
    assert shown.exit_code == 0, shown.output + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"Tenant {applied.name}: 3 namespace(s), 1/2 StageSet(s) Ready"
    row = next(line for line in lines if line.startswith(f"{web} "))
    assert "count/stagesets.stages.metio.wtf 1/2, requests.cpu 3800m/4, requests.memory 1Gi/8Gi" in row
    assert row.split()[-2:] == ["0", "0"]
    cp_row = next(line for line in lines if line.startswith(f"{applied.control_plane} "))
    assert cp_row.split()[-2:] == ["2", "1"]
    assert "?/2" in cp_row  # not counted yet: shown as unknown, not as zero
    # (stageset() makes them suspended: said beside the readiness.)
    stagesets = {line.split()[0]: line.split()[1:4] for line in lines
                 if line.startswith(f"{applied.control_plane}/")}
    assert stagesets == {f"{applied.control_plane}/db": ["False", "(suspended)", "StageFailed"],
                         f"{applied.control_plane}/web": ["True", "(suspended)", "Succeeded"]}, shown.stdout
    assert f"warning: quota nearly used up in {web}: requests.cpu at 95% of 4" in shown.stderr
    assert db not in shown.stderr

    as_yaml = run_cli("get", "tenant", applied.name, "-o", "yaml", kubeconfig=kubeconfig)
    view = yaml.safe_load(as_yaml.stdout)
    assert [ns["name"] for ns in view["namespaces"]] == sorted((web, db, applied.control_plane))
    assert view["stagesets"] == {"total": 2, "ready": 1}

    unknown = run_cli("get", "tenant", f"none-{uuid.uuid4().hex[:6]}", kubeconfig=kubeconfig)
    assert unknown.exit_code == 3
    assert "no namespace is labelled stages.metio.wtf/tenant=" in unknown.stderr
