"""Parity with the reference StageSet controller, end to end (issue 13).

The controller runs as a subprocess with exactly the Helm chart's multi-tenant ClusterRole,
against the real apiserver; every tenant read and write goes through impersonation.

- reasons and messages: a missing ServiceAccount, a denial while applying naming the stage
  (cross-namespace refusals: tests/e2e/test_tenancy.py);
- ``prune: false`` orphans on delete, and a later StageSet adopts what was left;
- ``patches`` on plain paths;
- CEL health checks on a custom resource kstatus would call ready at once;
- conflict policies on a Job's template and a Service's ``clusterIP``;
- ``driftDetectionInterval``, ``readyChecks.timeout`` with ``onTimeout: Hold``, ``disableWait``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE
from stageset.kube.client import ApiError, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import GITREPOS, ControllerProcess, apply, get_or_none, wait_for
from tests.e2e.stagesets import Scenario, cm, deployment, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
OWNER_LABELS = {LABEL_NAME, LABEL_NAMESPACE, LABEL_STAGE}


def events(s: Scenario, reason: str) -> list[dict[str, Any]]:
    found = s.admin.get(f"/api/v1/namespaces/{s.ns}/events")["items"]
    return [e for e in found if e.get("reason") == reason]


def occurrences(s: Scenario, reason: str) -> int:
    """How many times ``reason`` was recorded: repeats are one Event with a ``series`` count."""
    return sum(((e.get("series") or {}).get("count") or 1) for e in events(s, reason))


def stage_phases(s: Scenario, name: str) -> dict[str, str]:
    return {st["name"]: st["phase"] for st in s.get(name)["status"]["stages"]}


# -- 1. reasons and messages ---------------------------------------------------------------------

def test_a_missing_service_account_is_reported_as_such(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("ghost"), {"app/cm.yaml": cm("app")})
    s.stageset("ghostly", [{"name": "app", "path": "./app"}], serviceAccountName="ghost")
    denied = s.wait_reason("ghostly", "RBACDenied")
    message = denied["message"]
    account = f"system:serviceaccount:{s.ns}:ghost"
    assert f"{account} may not read GitRepository {s.ns}/app (stage 'app')" in message
    # The controller may not read ServiceAccounts in multi-tenant mode, and ghost may not read its
    # own: the message asks the user to check both the account and its rights.
    assert f"check that ServiceAccount {s.ns}/ghost exists" in message
    assert "grants it these rights" in message
    assert s.configmap("app") is None


def test_a_denial_while_applying_names_the_stage_the_object_and_the_account(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    # `view` reads GitRepositories and ServiceAccounts but writes nothing.
    s = scenario(installed, git_server, make_tenant("viewer"), {"config/cm.yaml": cm("settings")},
                 role="view")
    s.stageset("viewer", [{"name": "config", "path": "./config"}])
    denied = s.wait_reason("viewer", "RBACDenied")["message"]
    assert denied.startswith(f"stage 'config': system:serviceaccount:{s.ns}:{s.tenant.service_account} "
                             f"may not apply ConfigMap {s.ns}/settings"), denied
    account = f"ServiceAccount {s.ns}/{s.tenant.service_account}"
    assert f"{account} exists but is not granted these rights" in denied
    assert s.configmap("settings") is None


# -- 2. prune: false orphans on delete -------------------------------------------------------------

def test_deleting_a_stageset_leaves_prune_false_objects_behind_for_adoption(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("orphans"), {
        "data/cm.yaml": cm("keep-me"), "app/cm.yaml": cm("delete-me")})
    s.stageset("first", [{"name": "data", "path": "./data", "prune": False},
                         {"name": "app", "path": "./app"}])
    s.wait_ready("first")
    kept = s.configmap("keep-me")
    assert kept is not None
    assert set(kept["metadata"]["labels"]) >= OWNER_LABELS
    uid = kept["metadata"]["uid"]

    s.admin.request("DELETE", s.path("first"))
    wait_for(lambda: get_or_none(s.admin, s.path("first")) is None, what="StageSet first gone")
    assert s.configmap("delete-me") is None
    left = s.configmap("keep-me")
    assert left is not None
    assert left["metadata"]["uid"] == uid, "left in place, not recreated"
    assert not OWNER_LABELS & set(left["metadata"].get("labels") or {}), left["metadata"].get("labels")
    orphaned = wait_for(lambda: events(s, "Orphaned"), what="an Orphaned event")
    assert f"stage 'data' has prune: false: left 1 object(s) in place without owner labels: ConfigMap " \
           f"{s.ns}/keep-me" in orphaned[0]["message"]

    # A later StageSet adopts it.
    s.stageset("second", [{"name": "data", "path": "./data"}])
    s.wait_ready("second")
    adopted = s.configmap("keep-me")
    assert adopted is not None
    assert adopted["metadata"]["uid"] == uid
    assert adopted["metadata"]["labels"][LABEL_NAME] == "second"


# -- 3. patches ------------------------------------------------------------------------------------

def test_patches_change_what_a_plain_path_applies_and_failures_name_the_patch(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("patches"), {
        "app/web.yaml": deployment("web"), "app/settings.yaml": cm("settings", "v1")})
    patches = [
        {"patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 3}\n"},
        {"json6902": [{"op": "add", "path": "/data/region", "value": "${REGION}"}],
         "target": {"kind": "ConfigMap", "name": "sett.*"}},
    ]
    stage = {"name": "app", "path": "./app", "readyChecks": {"disableWait": True}, "patches": patches,
             "postBuild": {"substitute": {"REGION": "eu-west"}}}
    s.stageset("patched", [stage])
    s.wait_ready("patched")
    web = s.admin.get(f"/apis/apps/v1/namespaces/{s.ns}/deployments/web")
    assert web["spec"]["replicas"] == 3
    settings = s.configmap("settings")
    assert settings is not None
    assert settings["data"] == {"k": "v1", "region": "eu-west"}  # patched, then substituted

    missing = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: missing}\ndata: {a: b}\n"
    broken = [*patches, {"patch": missing}]
    s.stageset("patched", [{**stage, "patches": broken}])
    failed = s.wait_reason("patched", "StageFailed")
    assert failed["message"].startswith("stage 'app': patches[2]: "), failed["message"]
    assert "missing" in failed["message"]


# -- 4. CEL health checks --------------------------------------------------------------------------

WIDGETS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.parity.example.com"},
    "spec": {"group": "parity.example.com", "scope": "Namespaced",
             "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}
WIDGET_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "parity-widget-editor"},
    "rules": [{"apiGroups": ["parity.example.com"], "resources": ["widgets"], "verbs": ["*"]}],
}
# A Widget has no conditions: kstatus would call it ready the moment it exists.  Only its
# status.phase tells, and only an expression can read it.
WIDGET_EXPRS = [{"apiVersion": "parity.example.com/v1", "kind": "Widget",
                 "current": "status.?phase.orValue('') == 'Running'",
                 "inProgress": "status.?phase.orValue('') == 'Provisioning'",
                 "failed": "status.?phase.orValue('') == 'Broken'"}]


def widget(name: str) -> str:
    return json.dumps({"apiVersion": "parity.example.com/v1", "kind": "Widget", "metadata": {"name": name},
                       "spec": {"size": 1}})


@pytest.fixture(scope="module")
def widgets(installed: KubeClient) -> None:
    for path, body in (("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGETS_CRD),
                       ("/apis/rbac.authorization.k8s.io/v1/clusterroles", WIDGET_ROLE)):
        try:
            installed.request("POST", path, body=body)
        except ApiError as error:
            if not error.conflict:
                raise

    def established() -> bool:
        crd = installed.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                            "widgets.parity.example.com")
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or [])

    wait_for(established, what="the Widget CRD established")


def set_phase(s: Scenario, name: str, phase: str) -> None:
    s.admin.request("PATCH", f"/apis/parity.example.com/v1/namespaces/{s.ns}/widgets/{name}/status",
                    content_type="application/merge-patch+json", body={"status": {"phase": phase}})


def test_a_custom_resource_only_an_expression_can_judge(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    widgets: None,
) -> None:
    tenant = make_tenant("widgets")
    tenant.bind_cluster_role("parity-widget-editor")
    s = scenario(installed, git_server, tenant, {"infra/w.yaml": widget("db"), "app/cm.yaml": cm("after-db")})
    s.stageset("widgets", [{"name": "infra", "path": "./infra", "readyChecks": {"exprs": WIDGET_EXPRS}},
                           {"name": "app", "path": "./app"}])
    waiting = wait_for(lambda: (st := s.get("widgets").get("status") or {}).get("stages") and
                       {x["name"]: x for x in st["stages"]}["infra"]["phase"] == "Waiting" and st,
                       what="stage infra waiting on the Widget")
    message = {x["name"]: x for x in waiting["stages"]}["infra"].get("message", "")
    assert "readyChecks.exprs[0].current is not true yet" in message
    assert s.configmap("after-db") is None, "the next stage waits for the expression"

    set_phase(s, "db", "Provisioning")
    set_phase(s, "db", "Running")
    s.wait_ready("widgets")
    assert s.configmap("after-db") is not None

    # failed wins: a broken Widget fails the stage at once, long before its timeout.
    s.commit({"infra/w2.yaml": widget("cache")})
    wait_for(lambda: get_or_none(s.admin, f"/apis/parity.example.com/v1/namespaces/{s.ns}/widgets/cache"),
             what="Widget cache applied")
    set_phase(s, "cache", "Broken")
    failed = s.wait_reason("widgets", "StageFailed")
    assert "readyChecks.exprs[0].failed is true" in failed["message"]
    assert f"Widget {s.ns}/cache" in failed["message"]


def test_an_expression_that_is_not_a_bool_is_invalid_spec_before_anything_is_applied(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    widgets: None,
) -> None:
    tenant = make_tenant("badexpr")
    tenant.bind_cluster_role("parity-widget-editor")
    s = scenario(installed, git_server, tenant, {"first/cm.yaml": cm("first"), "infra/w.yaml": widget("db")})
    exprs = [{**WIDGET_EXPRS[0], "current": "size(status)"}]
    s.stageset("bad", [{"name": "first", "path": "./first"},
                       {"name": "infra", "path": "./infra", "readyChecks": {"exprs": exprs}}])
    refused = s.wait_reason("bad", "InvalidSpec")
    assert refused["message"] == "stage 'infra': readyChecks.exprs[0].current returns int, not bool; " \
        "runbook: https://stageset.github.io/stageset/runbooks/invalidspec/"
    stalled = {c["type"]: c["status"] for c in s.get("bad")["status"]["conditions"]}
    assert stalled["Stalled"] == "True"
    assert s.configmap("first") is None, "nothing is applied, not even the stages before"


# -- 5. conflict policies --------------------------------------------------------------------------

def job(image: str) -> str:
    return f"""\
apiVersion: batch/v1
kind: Job
metadata: {{name: migrate}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: migrate, image: "{image}"}}]
"""


def service(cluster_ip: str) -> str:
    return f"""\
apiVersion: v1
kind: Service
metadata: {{name: api}}
spec:
  clusterIP: {cluster_ip}
  ports: [{{port: 80}}]
  selector: {{app: api}}
"""


def test_conflict_policies_fail_recreate_and_keep_existing(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    # Addresses unique per test run within the control plane's 10.0.0.0/24.
    base = 10 + int(time.time()) % 200 // 4 * 4
    ip = [f"10.0.0.{base + i}" for i in range(3)]
    s = scenario(installed, git_server, make_tenant("conflicts"), {
        "app/job.yaml": job("migrate:1"), "app/svc.yaml": service(ip[0])})
    stage: dict[str, Any] = {"name": "app", "path": "./app", "readyChecks": {"disableWait": True}}
    s.stageset("conflicts", [stage])
    s.wait_ready("conflicts")
    job_path = f"/apis/batch/v1/namespaces/{s.ns}/jobs/migrate"
    svc_path = f"/api/v1/namespaces/{s.ns}/services/api"
    job_uid, svc_uid = (s.admin.get(p)["metadata"]["uid"] for p in (job_path, svc_path))

    # Fail (the default): both changes are immutable; nothing is written.
    s.commit({"app/job.yaml": job("migrate:2"), "app/svc.yaml": service(ip[1])})
    failed = s.wait_reason("conflicts", "StageFailed")["message"]
    assert "changed an immutable field" in failed
    assert "(and 1 more)" in failed
    assert s.admin.get(job_path)["metadata"]["uid"] == job_uid
    assert s.admin.get(svc_path)["spec"]["clusterIP"] == ip[0]

    # The Job is recreated, the Service kept exactly as it is.
    s.stageset("conflicts", [{**stage, "conflictPolicy": {"rules": [
        {"target": {"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"}, "action": "Recreate"},
        {"target": {"kind": "Service"}, "action": "KeepExisting"}]}}])
    s.wait_ready("conflicts")
    recreated = s.admin.get(job_path)
    assert recreated["metadata"]["uid"] != job_uid
    assert recreated["spec"]["template"]["spec"]["containers"][0]["image"] == "migrate:2"
    kept = s.admin.get(svc_path)
    assert (kept["metadata"]["uid"], kept["spec"]["clusterIP"]) == (svc_uid, ip[0])
    job_uid = recreated["metadata"]["uid"]

    # And the other way round, with the default: the Job kept, the Service recreated.
    s.commit({"app/job.yaml": job("migrate:3"), "app/svc.yaml": service(ip[2])})
    s.stageset("conflicts", [{**stage, "conflictPolicy": {"default": "KeepExisting", "rules": [
        {"target": {"kind": "Service", "name": "api"}, "action": "Recreate"}]}}])
    # get_or_none: between the delete and the create the Service does not exist.
    wait_for(lambda: ((get_or_none(s.admin, svc_path) or {}).get("spec") or {}).get("clusterIP") == ip[2],
             what="Service recreated")
    s.wait_ready("conflicts")
    assert s.admin.get(svc_path)["metadata"]["uid"] != svc_uid
    kept_job = s.admin.get(job_path)
    assert kept_job["metadata"]["uid"] == job_uid
    assert kept_job["spec"]["template"]["spec"]["containers"][0]["image"] == "migrate:2"


# -- 6. drift detection, timeouts, disableWait -----------------------------------------------------

def test_drift_is_corrected_at_the_drift_detection_interval(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("drift"), {"app/cm.yaml": cm("settings", "wanted")})
    # Nothing else may wake the StageSet: its source polls hourly too, and nothing watches ConfigMaps.
    source = s.admin.get(f"{GITREPOS.format(ns=s.ns)}/app")
    apply(s.admin, {"apiVersion": source["apiVersion"], "kind": "GitRepository",
                    "metadata": {"name": "app", "namespace": s.ns},
                    "spec": {**source["spec"], "interval": "1h"}})
    s.stageset("drift", [{"name": "app", "path": "./app"}], interval="1h", driftDetectionInterval="2s")
    s.wait_ready("drift")
    for attempt in range(2):
        s.admin.request("PATCH", f"/api/v1/namespaces/{s.ns}/configmaps/settings",
                        content_type="application/merge-patch+json",
                        body={"data": {"k": f"by hand {attempt}"}})
        # Measured without driftDetectionInterval: not restored within 40 s.
        wait_for(lambda: (s.configmap("settings") or {}).get("data") == {"k": "wanted"}, timeout=10,
                 what=f"the ConfigMap restored (attempt {attempt})")
    # Both corrections restore the same object: one Event, its series counting both.
    assert wait_for(lambda: occurrences(s, "DriftCorrected") >= 2 and occurrences(s, "DriftCorrected"),
                    what="a DriftCorrected event per correction") >= 2


def test_ready_checks_timeout_holds_and_disable_wait_does_not_wait(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("waits"), {
        "slow/web.yaml": deployment("slow"), "fast/web.yaml": deployment("fast"),
        "next/cm.yaml": cm("next"), "last/cm.yaml": cm("last")})
    # The stage's own timeout is an hour; readyChecks.timeout is what runs out.
    s.stageset("holds", [{"name": "slow", "path": "./slow", "timeout": "1h",
                          "readyChecks": {"timeout": "2s"}},
                         {"name": "next", "path": "./next"}], onTimeout="Hold", retryInterval="2s")
    held = s.wait_reason("holds", "StageProgressing")
    assert held["message"].startswith("not ready after 2s: Deployment"), held["message"]
    assert stage_phases(s, "holds") == {"slow": "Progressing", "next": "Pending"}
    assert s.configmap("next") is None

    s.stageset("skips", [{"name": "fast", "path": "./fast", "readyChecks": {"disableWait": True}},
                         {"name": "last", "path": "./last"}])
    s.wait_ready("skips")
    assert s.configmap("last") is not None
    never = yaml.safe_load(deployment("fast"))
    assert s.admin.get(f"/apis/apps/v1/namespaces/{s.ns}/deployments/fast")["spec"]["replicas"] == \
        never["spec"]["replicas"]
