"""The chart as ``helm`` renders it: lint, RBAC rule by rule per mode, names, pod spec, bad values.

Everything here runs the real ``helm`` binary (built from the Go module proxy) without a
cluster; ``test_install.py`` installs the chart into a real apiserver.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import yaml

from stageset.api.rbac import (
    CONTROLLER_RULES,
    LEADER_ELECTION_RULES,
    NOTIFICATION_RULES,
    TARGET_RULES,
    TENANT_NOTIFICATION_RULES,
    TOKEN_REQUEST_RULES,
    WORKLOAD_TARGET_RULES,
    aggregated_cluster_roles,
)
from stageset.build import BuildLimits
from stageset.cli.check import parse_flags, rights_needed
from stageset.cli.main import main as cli
from tests.helm.chart import CHART, Helm, controller_args, controller_container, find, one

# The controller's own rights, written out: a change to them must change this table too.
CONTROLLER_RULE_TABLE = [
    ([""], ["serviceaccounts"], ["impersonate"]),
    (["stages.metio.wtf"], ["stagesets", "gitrepositories"], ["get", "list", "watch", "patch", "update"]),
    (["stages.metio.wtf"], ["stagesets/status", "gitrepositories/status", "stagesets/finalizers"],
     ["get", "patch", "update"]),
    # FleetRollouts (the platform's): read them, write their status only.
    (["stages.metio.wtf"], ["fleetrollouts"], ["get", "list", "watch"]),
    (["stages.metio.wtf"], ["fleetrollouts/status"], ["get", "patch", "update"]),
    (["", "events.k8s.io"], ["events"], ["create", "patch"]),
    # Flux's source kinds, watched for triggers only (read as the tenant when used).
    (["source.toolkit.fluxcd.io"], ["externalartifacts", "gitrepositories", "ocirepositories", "buckets"],
     ["get", "list", "watch"]),
    # Namespaces' labels, metadata only: the metrics' tenant label.
    ([""], ["namespaces"], ["get", "list", "watch"]),
]
LEASE_RULE_TABLE = [(["coordination.k8s.io"], ["leases"], ["get", "create", "update", "delete"])]
# Platform targets: a Role in each target namespace only.
TARGET_RULE_TABLE = [
    (["stages.metio.wtf"], ["stagetargets"], ["get", "list", "watch"]),
    (["stages.metio.wtf"], ["stagetargets/status"], ["get", "patch", "update"]),
    ([""], ["secrets"], ["get", "list", "watch"]),
]
# Workload identity (targets.workloadIdentity): token requests where the controller's role is bound, and
# in each target namespace the ConfigMaps and the platform accounts' tokens.
TOKEN_RULE_TABLE = [([""], ["serviceaccounts/token"], ["create"])]
WORKLOAD_TARGET_RULE_TABLE = [([""], ["configmaps"], ["get", "list", "watch"]), *TOKEN_RULE_TABLE]


def rules(role: dict[str, Any]) -> list[tuple[list[str], list[str], list[str]]]:
    return [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]]


def rbac_objects(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs
            if d["kind"] in kinds}


def binding(docs: list[dict[str, Any]], kind: str, name: str,
            namespace: str = "") -> tuple[str, str, list[Any]]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
             and d["metadata"].get("namespace", "") == namespace]
    assert len(found) == 1, f"{kind} {namespace}/{name}"
    return found[0]["roleRef"]["kind"], found[0]["roleRef"]["name"], found[0]["subjects"]


SA = [{"kind": "ServiceAccount", "name": "stageset", "namespace": "stageset-system"}]


def test_lint_strict_in_every_mode(helm: Helm) -> None:
    for values in ([], ["--set", "rbac.clusterAdmin=true"], ["--set", "controller.watchNamespaces={a,b}"],
                   ["--set", "replicaCount=3", "--set", "metrics.serviceMonitor.enabled=true"]):
        result = helm.run("lint", "--strict", str(CHART), *values)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


def test_rules_in_the_chart_are_the_code_s() -> None:
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in CONTROLLER_RULES] == CONTROLLER_RULE_TABLE
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in LEADER_ELECTION_RULES] == LEASE_RULE_TABLE
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in TARGET_RULES] == TARGET_RULE_TABLE
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in TOKEN_REQUEST_RULES] == TOKEN_RULE_TABLE
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in WORKLOAD_TARGET_RULES] == \
        WORKLOAD_TARGET_RULE_TABLE


def test_multi_tenant_default_rbac_rule_by_rule(helm: Helm) -> None:
    docs = helm.render()
    assert rbac_objects(docs) == {
        ("ServiceAccount", "stageset-system", "stageset"),
        ("ClusterRole", "", "stageset-system-stageset-controller"),
        ("ClusterRoleBinding", "", "stageset-system-stageset-controller"),
        ("Role", "stageset-system", "stageset-leader-election"),
        ("RoleBinding", "stageset-system", "stageset-leader-election"),
        ("ClusterRole", "", "stageset-system-stageset-edit"),
        ("ClusterRole", "", "stageset-system-stageset-view"),
        # The CRD hook's (pre-install/pre-upgrade only: tests/helm/test_crd_paths.py).
        ("ServiceAccount", "stageset-system", "stageset-crds"),
        ("ClusterRole", "", "stageset-system-stageset-crds"),
        ("ClusterRoleBinding", "", "stageset-system-stageset-crds"),
    }
    assert rules(one(docs, "ClusterRole", "stageset-system-stageset-controller")) == CONTROLLER_RULE_TABLE
    assert binding(docs, "ClusterRoleBinding", "stageset-system-stageset-controller") == (
        "ClusterRole", "stageset-system-stageset-controller", SA)
    assert rules(one(docs, "Role", "stageset-leader-election")) == LEASE_RULE_TABLE
    assert binding(docs, "RoleBinding", "stageset-leader-election", "stageset-system") == (
        "Role", "stageset-leader-election", SA)
    for role in aggregated_cluster_roles():  # named after the release in the chart
        rendered = one(docs, "ClusterRole", f"stageset-system-{role['metadata']['name']}")
        assert rendered["rules"] == role["rules"]
        assert role["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()
    args = controller_args(docs)
    assert "--cluster-admin" not in args
    assert not any(a.startswith("--watch-namespaces") for a in args)


def test_sharded_rbac_binds_only_the_watched_namespaces(helm: Helm) -> None:
    docs = helm.render("--set", "controller.watchNamespaces={team-a,team-b}", "--set",
                       "rbac.aggregateToDefaultRoles=false", release="shard-1", namespace="shards")
    full, cluster = "shard-1-stageset", "shards-shard-1-stageset"
    assert rbac_objects(docs) == {
        ("ServiceAccount", "shards", full),
        ("ClusterRole", "", f"{cluster}-controller"),
        ("RoleBinding", "team-a", f"{cluster}-controller"),
        ("RoleBinding", "team-b", f"{cluster}-controller"),
        ("Role", "shards", f"{full}-leader-election"),
        ("RoleBinding", "shards", f"{full}-leader-election"),
        ("ServiceAccount", "shards", f"{full}-crds"),
        ("ClusterRole", "", f"{cluster}-crds"),
        ("ClusterRoleBinding", "", f"{cluster}-crds"),
    }
    subject = [{"kind": "ServiceAccount", "name": full, "namespace": "shards"}]
    for namespace in ("team-a", "team-b"):
        assert binding(docs, "RoleBinding", f"{cluster}-controller", namespace) == (
            "ClusterRole", f"{cluster}-controller", subject)
    assert rules(one(docs, "ClusterRole", f"{cluster}-controller")) == CONTROLLER_RULE_TABLE
    assert "--watch-namespaces=team-a,team-b" in controller_args(docs)
    assert f"--leader-election-id={full}" in controller_args(docs)
    assert "--leader-election-namespace=shards" in controller_args(docs)


def test_targets_add_a_role_in_each_target_namespace_and_nothing_for_tenants(helm: Helm) -> None:
    default = helm.render()
    assert "--max-remote-targets=64" in controller_args(default)
    assert not any(a.startswith("--target-namespaces") for a in controller_args(default))
    docs = helm.render("--set", "targets.namespaces={platform-a,platform-b}",
                       "--set", "targets.maxRemoteTargets=200")
    assert rbac_objects(docs) - rbac_objects(default) == {
        ("Role", "platform-a", "stageset-targets"), ("RoleBinding", "platform-a", "stageset-targets"),
        ("Role", "platform-b", "stageset-targets"), ("RoleBinding", "platform-b", "stageset-targets")}
    for namespace in ("platform-a", "platform-b"):
        (role,) = [d for d in find(docs, "Role", "stageset-targets")
                   if d["metadata"]["namespace"] == namespace]
        assert rules(role) == TARGET_RULE_TABLE
        assert binding(docs, "RoleBinding", "stageset-targets", namespace) == ("Role", "stageset-targets", SA)
    # Never cluster-wide, never a tenant's: no ClusterRole names StageTargets or Secrets.
    for role in (d for d in docs if d["kind"] == "ClusterRole" and "crds" not in d["metadata"]["name"]):
        assert not {"stagetargets", "secrets"} & {r for rule in role["rules"] for r in rule["resources"]}
    args = controller_args(docs)
    assert "--target-namespaces=platform-a,platform-b" in args
    controller = cli.commands["controller"]  # type: ignore[attr-defined]
    params = controller.make_context("controller", list(args)).params
    assert (params["target_namespaces"], params["max_remote_targets"]) == (("platform-a", "platform-b"), 200)


def test_workload_identity_grants_token_requests_only_where_the_controller_is_bound(helm: Helm) -> None:
    """Off by default: no token right, no flag.  On: create serviceaccounts/token by a ClusterRole bound
    where the controller's own is (cluster-wide, or one RoleBinding per watched namespace), the
    targets Role gains ConfigMap reads and token requests, cluster-admin mode adds nothing (it has
    them), and the controller command accepts the flag."""
    default = helm.render()
    assert "--workload-identity" not in controller_args(default)
    assert not any("token" in name for _, _, name in rbac_objects(default))
    for role in (d for d in default if d["kind"] in ("ClusterRole", "Role")):
        assert "serviceaccounts/token" not in {r for rule in role["rules"] for r in rule["resources"]}

    docs = helm.render("--set", "targets.workloadIdentity=true")
    assert rbac_objects(docs) - rbac_objects(default) == {
        ("ClusterRole", "", "stageset-system-stageset-token-requests"),
        ("ClusterRoleBinding", "", "stageset-system-stageset-token-requests")}
    assert rules(one(docs, "ClusterRole", "stageset-system-stageset-token-requests")) == TOKEN_RULE_TABLE
    assert binding(docs, "ClusterRoleBinding", "stageset-system-stageset-token-requests") == (
        "ClusterRole", "stageset-system-stageset-token-requests", SA)
    args = controller_args(docs)
    assert "--workload-identity" in args
    controller = cli.commands["controller"]  # type: ignore[attr-defined]
    assert controller.make_context("controller", list(args)).params["workload_identity"] is True

    sharded = helm.render("--set", "targets.workloadIdentity=true",
                          "--set", "controller.watchNamespaces={team-a,team-b}",
                          "--set", "targets.namespaces={platform}")
    token_objects = {o for o in rbac_objects(sharded) if "token" in o[2]}
    assert token_objects == {("ClusterRole", "", "stageset-system-stageset-token-requests"),
                             ("RoleBinding", "team-a", "stageset-system-stageset-token-requests"),
                             ("RoleBinding", "team-b", "stageset-system-stageset-token-requests")}
    (targets,) = find(sharded, "Role", "stageset-targets")
    assert rules(targets) == TARGET_RULE_TABLE + WORKLOAD_TARGET_RULE_TABLE

    # `stageset check` asks for exactly what the chart grants: tokens where the controller watches, and
    # ConfigMaps and tokens in each target namespace.
    asked = rights_needed(parse_flags(controller_args(sharded)), namespace="stageset-system")
    assert {(a["verb"], a["resource"], a.get("subresource"), a.get("namespace")) for a in asked
            if a["resource"] in ("configmaps", "serviceaccounts") and a["verb"] != "impersonate"} == {
        ("create", "serviceaccounts", "token", "team-a"), ("create", "serviceaccounts", "token", "team-b"),
        ("create", "serviceaccounts", "token", "platform"),
        *((verb, "configmaps", "", "platform") for verb in ("get", "list", "watch"))}

    admin = helm.render("--set", "targets.workloadIdentity=true", "--set", "rbac.clusterAdmin=true")
    assert not any("token" in name for _, _, name in rbac_objects(admin))
    assert "--workload-identity" in controller_args(admin)


def test_cluster_admin_mode_adds_exactly_a_cluster_admin_binding(helm: Helm) -> None:
    default = rbac_objects(helm.render())
    docs = helm.render("--set", "rbac.clusterAdmin=true")
    added = rbac_objects(docs) - default
    assert added == {("ClusterRoleBinding", "", "stageset-system-stageset-cluster-admin")}
    assert binding(docs, "ClusterRoleBinding", "stageset-system-stageset-cluster-admin") == (
        "ClusterRole", "cluster-admin", SA)
    assert "--cluster-admin" in controller_args(docs)


def test_names_derive_from_the_release_and_releases_never_collide(helm: Helm) -> None:
    # Nothing is shared: the CRDs are applied by a hook, never rendered.
    shared: tuple[str, ...] = ()

    def cluster_scoped(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in docs if "namespace" not in d["metadata"]
                and d["metadata"]["name"] not in shared}

    plain = helm.render(release="stageset")
    assert one(plain, "Deployment")["metadata"]["name"] == "stageset"  # never stageset-stageset
    prod = helm.render(release="prod", namespace="ops")
    for doc in prod:
        assert "prod-stageset" in doc["metadata"]["name"] or doc["metadata"]["name"] in shared, \
            doc["metadata"]["name"]
    # The same release name in another namespace: no cluster-scoped name is shared.
    other = helm.render(release="prod", namespace="ops-2")
    assert cluster_scoped(prod)
    assert not cluster_scoped(prod) & cluster_scoped(other)
    override = helm.render("--set", "fullnameOverride=gitops", release="x")
    assert one(override, "Deployment")["metadata"]["name"] == "gitops"


def test_standard_labels_on_every_object(helm: Helm) -> None:
    docs = helm.render("--set", "replicaCount=2", "--set", "metrics.serviceMonitor.enabled=true",
                       release="prod", namespace="ops")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["helm.sh/chart"] == f"stageset-{chart['version']}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "prod"
        assert labels["app.kubernetes.io/name"] == "stageset"
        assert labels["app.kubernetes.io/version"] == chart["appVersion"]
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "stageset", "app.kubernetes.io/instance": "prod"}
    assert one(docs, "Service")["spec"]["selector"] == selector
    assert one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector


def test_restricted_pod_security_probes_and_ports(helm: Helm) -> None:
    docs = helm.render()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = controller_container(docs)
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"probes": 8081, "metrics": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    args = controller_args(docs)
    assert "--probe-address=:8081" in args
    assert "--metrics-address=:8080" in args
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics",
                                         "protocol": "TCP"}]
    # Everything written goes to the three emptyDirs: the mirrors, the artifacts and /tmp.
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/var/cache/stageset", "/var/cache/stageset-artifacts", "/tmp"}
    assert "--mirror-dir=/var/cache/stageset" in args
    assert "--artifact-dir=/var/cache/stageset-artifacts" in args


def test_notifications_are_off_by_default_and_read_only_in_their_namespace(helm: Helm) -> None:
    docs = helm.render()
    assert not any(a.startswith("--notification") for a in controller_args(docs))
    assert not find(docs, "Role", "stageset-notifications")
    docs = helm.render("--set", "controller.notifications.namespace=platform-alerts",
                       "--set-json", "controller.notifications.rate=0.5")
    args = controller_args(docs)
    assert "--notification-namespace=platform-alerts" in args
    assert "--notification-rate=0.5" in args
    assert "--notification-burst=10" in args
    role = one(docs, "Role", "stageset-notifications")
    assert role["metadata"]["namespace"] == "platform-alerts"
    assert rules(role) == [(r["apiGroups"], r["resources"], r["verbs"]) for r in NOTIFICATION_RULES]
    assert binding(docs, "RoleBinding", "stageset-notifications", "platform-alerts") == \
        ("Role", "stageset-notifications", SA)
    # The ClusterRole still reads no Secret anywhere.
    assert not any("secrets" in r["resources"] for d in find(docs, "ClusterRole") for r in d["rules"])


def test_tenant_owned_alerts_grant_the_two_kinds_where_the_controller_watches_and_no_secret(
        helm: Helm) -> None:
    assert not find(helm.render(), "ClusterRole", "stageset-system-stageset-tenant-notifications")
    docs = helm.render("--set", "controller.notifications.tenants=true")
    args = controller_args(docs)
    assert "--tenant-notifications" in args
    assert not any(a.startswith("--notification-namespace") for a in args)
    assert "--notification-burst=10" in args  # the same limits as the platform's providers
    role = one(docs, "ClusterRole", "stageset-system-stageset-tenant-notifications")
    assert rules(role) == [(r["apiGroups"], r["resources"], r["verbs"]) for r in TENANT_NOTIFICATION_RULES]
    assert binding(docs, "ClusterRoleBinding", "stageset-system-stageset-tenant-notifications") == \
        ("ClusterRole", "stageset-system-stageset-tenant-notifications", SA)
    assert not any("secrets" in r["resources"] for d in find(docs, "ClusterRole") for r in d["rules"])
    sharded = helm.render("--set", "controller.notifications.tenants=true",
                          "--set", "controller.watchNamespaces={a,b}")
    assert not find(sharded, "ClusterRoleBinding", "stageset-system-stageset-tenant-notifications")
    name = "stageset-system-stageset-tenant-notifications"
    for namespace in ("a", "b"):
        assert binding(sharded, "RoleBinding", name, namespace)[:2] == ("ClusterRole", name)


def test_leader_election_strategy_pdb_and_service_monitor(helm: Helm) -> None:
    docs = helm.render()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--leader-elect" in controller_args(docs)
    assert not find(docs, "PodDisruptionBudget")
    assert not find(docs, "ServiceMonitor")

    docs = helm.render("--set", "replicaCount=3", "--set", "metrics.serviceMonitor.enabled=true",
                       "--set", "metrics.serviceMonitor.labels.release=prom")
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"

    docs = helm.render("--set", "controller.leaderElection.enabled=false")
    assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not any(a.startswith("--leader-elect") for a in controller_args(docs))
    assert not find(docs, "Role")

    docs = helm.render("--set", "metrics.enabled=false")
    assert not find(docs, "Service")
    assert not any(a.startswith("--metrics-address") for a in controller_args(docs))


def test_rendered_args_are_accepted_by_the_controller_command(helm: Helm) -> None:
    controller = cli.commands["controller"]  # type: ignore[attr-defined]
    for values in ([], ["--set", "rbac.clusterAdmin=true", "--set", "controller.watchNamespaces={a,b}",
                        "--set", "controller.noCrossNamespaceRefs=true",
                        "--set", "controller.defaultServiceAccount=stageset-deployer",
                        "--set", "controller.logFormat=json"]):
        args = controller_args(helm.render(*values))
        context = controller.make_context("controller", list(args))
        assert context.params["default_service_account"] == (
            "stageset-deployer" if values else None)
        assert context.params["workers"] == 4
        assert context.params["leader_elect"] is True
        assert context.params["probe_address"] == ":8081"
    # Every build limit the schema knows reaches the controller under the name it takes.
    limits = {"maxDepth": "50", "maxDocumentNodes": "1000", "maxAliases": "10", "maxDocumentsPerFile": "5",
              "maxFileBytes": "1Mi", "maxStageNodes": "5000", "maxStageObjects": "50000",
              "maxStageBytes": "64Mi", "kustomizeTimeout": "2m", "kustomizeMemory": "512Mi",
              "maxEncryptedValues": "2000"}
    values = [item for key, value in limits.items() for item in ("--set", f"controller.build.{key}={value}")]
    args = controller_args(helm.render(*values, "--set", "controller.sourceWorkers=2",
                                       "--set", "controller.git.maxFiles=50",
                                       "--set", "controller.resources.limits.memory=4Gi"))
    params = controller.make_context("controller", list(args)).params
    built = BuildLimits.with_overrides(params["build_limits"])
    assert (built.max_depth, built.max_stage_objects, built.kustomize_timeout) == (50, 50000, 120.0)
    assert built.kustomize_memory_bytes == 512 * 2**20
    assert len(params["build_limits"]) == len(dataclasses.fields(BuildLimits))
    assert (params["source_workers"], params["git_max_files"]) == (2, 50)
    # Readiness watches: the flag's default unless set; 0 (always poll) is a value, not "unset".
    assert controller.make_context("controller", list(controller_args(helm.render()))).params[
        "max_readiness_watches"] == 100
    args = controller_args(helm.render("--set", "controller.maxReadinessWatches=0"))
    assert controller.make_context("controller", list(args)).params["max_readiness_watches"] == 0
    # Rights re-checked by routine passes once an hour unless set; 0s (every pass) is a value.
    assert controller.make_context("controller", list(controller_args(helm.render()))).params[
        "rights_recheck_interval"] == 3600.0
    args = controller_args(helm.render("--set", "controller.rightsRecheckInterval=0s"))
    assert controller.make_context("controller", list(args)).params["rights_recheck_interval"] == 0.0
    # What an omitted sourceRef.kind means: ours by default, the reference's on request.
    assert controller.make_context("controller", list(controller_args(helm.render()))).params[
        "default_source_kind"] == "GitRepository"
    args = controller_args(helm.render("--set", "controller.defaultSourceKind=ExternalArtifact"))
    params = controller.make_context("controller", list(args)).params
    assert params["default_source_kind"] == "ExternalArtifact"
    # The hosts http actions may call: none unless listed.
    assert not any(a.startswith("--allowed-action-hosts") for a in controller_args(helm.render()))
    args = controller_args(helm.render("--set",
                                       "controller.allowedActionHosts={hooks.example.com,*.internal,10.0.0.7}"))
    assert controller.make_context("controller", list(args)).params["allowed_action_hosts"] == (
        "hooks.example.com", "*.internal", "10.0.0.7")


def test_notes_name_the_mode(helm: Helm) -> None:
    def notes(*values: str) -> str:
        out = helm.run("install", "--dry-run=client", "stageset", str(CHART), "-n", "stageset-system",
                       *values).stdout
        return out[out.index("NOTES:"):]

    assert "Mode: multi-tenant" in notes()
    single = notes("--set", "rbac.clusterAdmin=true", "--set", "controller.watchNamespaces={platform}")
    assert "Mode: single-tenant" in single
    assert "only the namespaces platform" in single
    assert "kubectl -n stageset-system get lease stageset" in single


# (how it is set, the value, the path helm must name in its refusal)
INVALID = [
    ("--set-string", "rbac.clusterAdmin=false", "/rbac/clusterAdmin"),
    ("--set", "rbac.clusterAdmin=yes", "/rbac/clusterAdmin"),
    ("--set", "controller.workers=abc", "/controller/workers"),
    ("--set", "controller.workers=0", "/controller/workers"),
    ("--set", "controller.logLevel=loud", "/controller/logLevel"),
    ("--set", "controller.logFormat=xml", "/controller/logFormat"),
    ("--set", "controller.defaultSourceKind=OCIRepository", "/controller/defaultSourceKind"),
    ("--set", "controller.allowedActionHosts={https://hooks.example.com/}",
     "/controller/allowedActionHosts/0"),
    ("--set", "controller.allowedActionHosts={hooks.example.com:8443}", "/controller/allowedActionHosts/0"),
    ("--set", "controller.maxTeardownWait=5", "/controller/maxTeardownWait"),
    ("--set-string", "controller.maxTeardownWait=5", "/controller/maxTeardownWait"),
    ("--set-string", "controller.maxTeardownWait=5 minutes", "/controller/maxTeardownWait"),
    ("--set", "controller.mirrors.maxSize=2GB", "/controller/mirrors/maxSize"),
    ("--set", "controller.git.maxFetchSize=500m", "/controller/git/maxFetchSize"),
    ("--set", "controller.build.maxStageObjects=many", "/controller/build/maxStageObjects"),
    ("--set", "controller.build.maxObjects=5", "'maxObjects'"),
    ("--set", "controller.sourceWorkers=0", "/controller/sourceWorkers"),
    ("--set", "controller.maxReadinessWatches=-1", "/controller/maxReadinessWatches"),
    ("--set-string", "controller.rightsRecheckInterval=1 hour", "/controller/rightsRecheckInterval"),
    ("--set", "controller.watchNamespaces={Team_A}", "/controller/watchNamespaces/0"),
    ("--set", "controller.watchNamespaces={a,a}", "/controller/watchNamespaces"),
    ("--set", "controller.leaderElection.enabled=maybe", "/controller/leaderElection/enabled"),
    ("--set-string", "controller.leaderElection.leaseDuration=15",
     "/controller/leaderElection/leaseDuration"),
    ("--set", "controller.probePort=70000", "/controller/probePort"),
    ("--set", "controller.resources.limits.memory=lots", "/controller/resources/limits/memory"),
    ("--set", "image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("--set", "image.digest=latest", "/image/digest"),
    ("--set", "replicaCount=two", "/replicaCount"),
    ("--set", "metrics.port=-1", "/metrics/port"),
    # Unknown keys, including the old top-level paths that used to be ignored silently.
    ("--set", "watchNamespaces={a}", "'watchNamespaces'"),
    ("--set", "workers=8", "'workers'"),
    ("--set", "controller.watchNamespace=a", "'watchNamespace'"),
    ("--set", "rbac.create=true", "'create'"),
]


@pytest.mark.parametrize(("how", "value", "named"), INVALID, ids=[v for _, v, _ in INVALID])
def test_invalid_values_are_refused_naming_them(helm: Helm, how: str, value: str, named: str) -> None:
    result = helm.template(how, value, check=False)
    assert result.returncode != 0, f"{value} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr, result.stderr


@pytest.mark.parametrize(("values", "message"), [
    (["--set", "replicaCount=2", "--set", "controller.leaderElection.enabled=false"],
     "replicaCount > 1 needs controller.leaderElection.enabled=true"),
    (["--set", "controller.leaderElection.renewDeadline=20s"],
     "retryPeriod < renewDeadline < leaseDuration"),
    (["--set", "metrics.enabled=false", "--set", "metrics.serviceMonitor.enabled=true"],
     "metrics.serviceMonitor.enabled=true needs metrics.enabled=true"),
    (["--set", "metrics.port=8081"], "metrics.port and controller.probePort must differ"),
])
def test_inconsistent_values_are_refused_with_what_to_do(helm: Helm, values: list[str], message: str) -> None:
    result = helm.template(*values, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def _leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(value, dict) and value:
        return [leaf for key, child in value.items() for leaf in _leaves(child, (*path, key))]
    return [path]


def test_the_schema_types_every_value_and_closes_every_object() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def node(path: tuple[str, ...]) -> dict[str, Any]:
        current = schema
        for key in path:
            if key in current.get("properties", {}):
                current = current["properties"][key]
            else:  # a free-form map (resources.requests.cpu, nodeSelector...): typed by its values
                current = current["additionalProperties"]
        return current

    for leaf in _leaves(values):
        typed = node(leaf)
        assert "type" in typed or "anyOf" in typed or "enum" in typed, f"{'.'.join(leaf)} is not typed"

    def closed(current: dict[str, Any], where: str) -> None:
        if current.get("type") == "object" and "properties" in current:
            assert current.get("additionalProperties") is False, f"{where or 'the root'} accepts unknown keys"
            for key, child in current["properties"].items():
                closed(child, f"{where}.{key}".lstrip("."))

    closed(schema, "")
