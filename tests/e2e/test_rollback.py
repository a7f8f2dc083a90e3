"""A failing release rolled back to its last good revision, through the controller process and a
real apiserver: the moved stages are restored dependents first as the tenant, the object the new
revision added is pruned, the failed revision is not retried, and a controller killed in the middle
of the rollback (``SIGKILL``) is replaced by one that finishes it without re-applying what was
already restored.

To stop a rollback half-way deterministically, a ValidatingAdmissionPolicy refuses the restored
content of the second stage to restore until the test removes it; the first controller keeps
failing on it (status ``RollingBack``), is killed, and a new one (same Git mirror directory, as a
restarted pod keeps its volume) resumes."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import WRITE_VERBS, condition, controller_kubeconfig, stop_controller, wait_for
from tests.e2e.stagesets import Scenario, cm, poke, scenario

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAP_BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def web(tag: str) -> str:
    return f"""\
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers: [{{name: app, image: "registry.invalid/web:{tag}"}}]
"""


def deployment_status(s: Scenario, **status: Any) -> bool:
    """Report the Deployment's current generation with ``status`` (as the deployment controller)."""
    path = f"/apis/apps/v1/namespaces/{s.ns}/deployments/web"
    try:
        generation = s.admin.get(path)["metadata"]["generation"]
    except ApiError:
        return False
    s.admin.request("PATCH", f"{path}/status", content_type="application/merge-patch+json",
                    body={"status": {"observedGeneration": generation, **status}})
    return True


def rolled_out(s: Scenario) -> bool:
    return deployment_status(s, replicas=1, updatedReplicas=1, readyReplicas=1, availableReplicas=1,
                             conditions=[{"type": "Progressing", "status": "True",
                                          "reason": "NewReplicaSetAvailable"}])


def image(s: Scenario) -> str:
    found = s.admin.get(f"/apis/apps/v1/namespaces/{s.ns}/deployments/web")
    return str(found["spec"]["template"]["spec"]["containers"][0]["image"])


def value(s: Scenario, name: str) -> str | None:
    found = s.configmap(name)
    return None if found is None else str(found["data"]["k"])


def hold_schema_at_v2(admin: KubeClient, namespace: str) -> None:
    """Refuse the schema ConfigMap going back to v1 in ``namespace`` (until the test lifts it)."""
    name = f"hold-schema-{namespace}"
    admin.apply(f"{VAP}/{name}", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                         "operations": ["CREATE", "UPDATE"],
                                                         "resources": ["configmaps"]}]},
                 "validations": [{"expression": "object.metadata.name != 'schema' || !has(object.data) || "
                                                "!('k' in object.data) || object.data['k'] != 'v1'",
                                  "message": "the test holds the schema at v2"}]}}, field_manager="test")
    admin.apply(f"{VAP_BINDINGS}/{name}", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": namespace}}}}}, field_manager="test")

    def refused() -> bool:
        try:
            admin.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", query={"dryRun": "All"},
                          body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "schema"},
                                "data": {"k": "v1"}})
        except ApiError as error:
            return error.status in (400, 403, 409, 422) and "holds the schema" in error.message
        return False

    wait_for(refused, what="the admission policy in force")


def lift(admin: KubeClient, namespace: str) -> None:
    admin.request("DELETE", f"{VAP_BINDINGS}/hold-schema-{namespace}")
    admin.request("DELETE", f"{VAP}/hold-schema-{namespace}")


def test_a_failed_release_is_rolled_back_and_a_controller_killed_mid_way_is_finished_by_the_next(
    installed: KubeClient, git_server: Any, make_tenant: TenantFactory, control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    tenant = make_tenant("rollback")
    s = scenario(installed, git_server, tenant, {"db/schema.yaml": cm("schema", "v1"),
                                                 "app/web.yaml": web("1"), "app/cfg.yaml": cm("cfg", "v1")})
    kubeconfig = controller_kubeconfig(installed, control_plane=control_plane, path=tmp_path / "kubeconfig")
    mirrors = tmp_path / "mirrors"  # kept across the restart, as a pod's volume is

    def start(name: str) -> ControllerProcess:
        return ControllerProcess(kubeconfig=kubeconfig, workdir=tmp_path / name, mirror_dir=mirrors,
                                 extra=["--watch-namespaces", s.ns])

    first = start("first")
    try:
        s.stageset("shop", [{"name": "db", "path": "./db"}, {"name": "app", "path": "./app"}],
                   rollbackOnFailure=True, retryInterval="2s")
        wait_for(lambda: rolled_out(s), what="the Deployment applied")
        good = s.wait_ready("shop")
        snapshot = {e["stage"]: e["revision"] for e in good["status"]["lastAppliedSnapshot"]}
        assert set(snapshot) == {"db", "app"}

        hold_schema_at_v2(installed, s.ns)
        s.commit({"db/schema.yaml": cm("schema", "v2"), "db/extra.yaml": cm("extra"),
                  "app/web.yaml": web("2"), "app/cfg.yaml": cm("cfg", "v2")})
        wait_for(lambda: image(s).endswith(":2"), what="the new revision applied")
        assert deployment_status(s, conditions=[{"type": "Progressing", "status": "False",
                                                 "reason": "ProgressDeadlineExceeded",
                                                 "message": "web-2 crash-loops"}])

        def stuck() -> Any:
            rollback = (s.get("shop").get("status") or {}).get("rollback") or {}
            return rollback if rollback.get("phase") == "RollingBack" and rollback.get("restored") else None

        record = wait_for(stuck, what="the rollback half done (app restored, db refused)")
        assert record["remaining"] == ["db"]
        assert record["restored"] == {"app": snapshot["app"]}
        assert "stage 'app' failed" in record["message"]
        assert (image(s), value(s, "cfg"), value(s, "schema")) == ("registry.invalid/web:1", "v1", "v2")
        first.process.kill()  # mid-rollback, no clean shutdown
        first.process.wait(timeout=30)
    finally:
        stop_controller(first)

    lift(installed, s.ns)
    restarted_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    second = start("second")
    try:
        def rolled_back() -> Any:
            rolled_out(s)  # the restored Deployment rolls out, as the deployment controller would make it
            obj = s.get("shop")
            ready = condition(obj) or {}
            return obj if ready.get("reason") == "RolledBack" and \
                (obj["status"].get("rollback") or {}).get("phase") == "RolledBack" else None

        done = wait_for(rolled_back, timeout=90, what="the rollback finished by the new controller")
        ready = condition(done) or {}
        assert ready["status"] == "False"
        assert "stage 'app' failed" in ready["message"]
        assert "web-2 crash-loops" in ready["message"]
        assert done["status"]["rollback"]["restored"] == snapshot
        assert (value(s, "schema"), value(s, "cfg")) == ("v1", "v1")
        assert s.configmap("extra") is None  # what the failed revision added is pruned
        stalled = condition(done, "Stalled") or {}
        assert stalled.get("status") == "True"

        # The failed revision is not tried again: another pass leaves everything restored.
        stamp = poke(installed, s.path("shop"))
        wait_for(lambda: s.get("shop")["status"].get("lastHandledReconcileAt") == stamp, what="a pass")
        assert (value(s, "schema"), image(s)) == ("v1", "registry.invalid/web:1")

        events = installed.get(f"/apis/events.k8s.io/v1/namespaces/{s.ns}/events")["items"]
        assert [e["type"] for e in events if e["reason"] == "RolledBack"] == ["Warning"]
        # Only the tenant wrote its objects; the new controller did not re-apply what the first
        # one had already restored (app's ConfigMap), only db's.
        writes = [e for e in control_plane.audit_events() if e.get("verb") in WRITE_VERBS
                  and e.get("objectRef", {}).get("namespace") == s.ns
                  and e.get("objectRef", {}).get("resource") in ("configmaps", "deployments")
                  and not e.get("objectRef", {}).get("subresource")  # the test's own status reports
                  and e.get("stage") == "ResponseComplete" and "dryRun" not in e.get("requestURI", "")
                  and int((e.get("responseStatus") or {}).get("code", 500)) < 300]
        assert writes
        writers = {str((e.get("impersonatedUser") or e.get("user") or {}).get("username")) for e in writes}
        assert writers == {tenant.username}
        after = {e["objectRef"]["name"] for e in writes
                 if e.get("requestReceivedTimestamp", "") >= restarted_at}
        assert "schema" in after
        assert "extra" in after
        assert "cfg" not in after
    finally:
        stop_controller(second)
