"""A tenant from ``stageset create tenant --export``, with the real kube-controller-manager running:
its quota counted by the resourcequota controller, and offboarding by ``kubectl delete namespace``.

Offboarding: a Ready StageSet in the tenant's control-plane namespace has written one object there
and one into a workload namespace.  Deleting the control-plane namespace ends — the namespace
controller finishes within the generous wait below, not after the teardown wait (1 h) — with the
object elsewhere deleted by the teardown as the tenant's deployer, and nothing inside the
terminating namespace asked for by the teardown: the audit log says who deleted what.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from stageset.cli.tenantobjects import object_path
from stageset.envtest.kubectl import ensure_kubectl
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, KubeClient
from tests.cli.conftest import run_cli
from tests.e2e.conftest import (
    GITREPOS,
    STAGESETS,
    ControllerProcess,
    apply,
    condition,
    get_or_none,
    stageset,
    wait_for,
)
from tests.e2e.stagesets import cm
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

QUOTA = "/api/v1/namespaces/{ns}/resourcequotas/stageset-tenant"
COUNT = "count/stagesets.stages.metio.wtf"
NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
QUOTA_CONTROLLER = "system:serviceaccount:kube-system:resourcequota-controller"
CONTROLLER = "system:serviceaccount:stageset-system:stageset-controller"


@dataclass
class Tenant:
    control_plane: str
    web: str

    @property
    def deployer(self) -> str:
        return f"system:serviceaccount:{self.control_plane}:stageset-deployer"


@pytest.fixture
def tenant(installed: KubeClient) -> Iterator[Tenant]:
    """A tenant with a control-plane namespace and one workload namespace, exported by the CLI and
    applied by the platform's admin exactly as printed; its namespaces deleted afterwards (the
    namespace controller really removes them here)."""
    name = f"lc-{uuid.uuid4().hex[:6]}"
    made = Tenant(control_plane=f"{name}-cp", web=f"{name}-web")
    exported = run_cli("create", "tenant", name, "--with-namespace", made.web, "--control-plane-namespace",
                       made.control_plane, "--quota", "stagesets=2", "--export", env={"HOME": "/nonexistent"})
    assert exported.exit_code == 0, exported.output + exported.stderr
    for obj in yaml.safe_load_all(exported.stdout):
        installed.apply(object_path(obj), obj, field_manager="platform-git")
    # Quota admission refuses every StageSet until the quota controller has counted them (it picks
    # up a kind installed after its start at its next discovery, within 30s).
    wait_for(lambda: counted(installed, made.control_plane) == "0", timeout=120,
             what="the quota controller to count StageSets")
    yield made
    for namespace in (made.control_plane, made.web):
        try:
            installed.delete(f"/api/v1/namespaces/{namespace}")
        except ApiError as error:
            if not error.not_found:
                raise


def counted(admin: KubeClient, namespace: str) -> str | None:
    """The StageSets the tenant's quota counts as used (``None``: not counted yet)."""
    used = (admin.get(QUOTA.format(ns=namespace)).get("status") or {}).get("used") or {}
    return used.get(COUNT)


def acting(event: dict[str, Any]) -> str:
    return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))


def test_the_quota_controller_counts_stagesets_and_admission_refuses_a_third(
        installed: KubeClient, tenant: Tenant, control_plane: ControlPlane) -> None:
    namespace = tenant.control_plane
    # Counted "0" by the resourcequota controller before the tenant fixture returned.
    collection = STAGESETS.format(ns=namespace)
    for name in ("one", "two"):
        installed.request("POST", collection, body=suspended(namespace, name))
    with pytest.raises(ApiError) as refused:
        installed.request("POST", collection, body=suspended(namespace, "three"))
    assert refused.value.forbidden
    assert "exceeded quota: stageset-tenant" in refused.value.message
    assert f"{COUNT}=2" in refused.value.message
    # Deleting one frees its place once the controller has counted again.
    installed.delete(f"{collection}/one")
    wait_for(lambda: counted(installed, namespace) == "1", timeout=120,
             what="the quota controller to count the deletion")
    installed.request("POST", collection, body=suspended(namespace, "three"))
    # The status was written by the quota controller (counting) and the apiserver's admission
    # (charging each admitted StageSet), by nobody else.
    status_writers = {acting(e) for e in control_plane.audit_events()
                      if e.get("objectRef", {}).get("resource") == "resourcequotas"
                      and e["objectRef"].get("namespace") == namespace
                      and e["objectRef"].get("subresource") == "status"
                      and e.get("verb") in ("update", "patch")}
    assert status_writers == {QUOTA_CONTROLLER, "system:apiserver"}


def suspended(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"serviceAccountName": "stageset-deployer", "suspend": True,
                     "stages": [{"name": "app", "sourceRef": {"name": "app"}, "path": "app"}]}}


def test_deleting_the_namespace_of_a_ready_stageset_ends_and_removes_what_is_elsewhere(
        controller: ControllerProcess, installed: KubeClient, git_server: GitServer, tenant: Tenant,
        control_plane: ControlPlane) -> None:
    cp, web = tenant.control_plane, tenant.web
    url = git_server.create_repo(f"{cp}-repo", {"app/own.yaml": cm("own"),
                                                "app/elsewhere.yaml": cm("elsewhere", namespace=web)})
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                      "metadata": {"name": "app", "namespace": cp},
                      "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m"}})
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": "app", "namespace": cp},
                      "spec": {"serviceAccountName": "stageset-deployer",
                               "stages": [{"name": "app", "path": "./app", "sourceRef": {"name": "app"}}]}})

    def ready() -> dict[str, Any] | None:
        obj = stageset(installed, cp, "app")
        found = condition(obj)
        return obj if found and found["status"] == "True" else None

    wait_for(ready, timeout=90, what="the StageSet Ready")
    own = f"/api/v1/namespaces/{cp}/configmaps/own"
    elsewhere = f"/api/v1/namespaces/{web}/configmaps/elsewhere"
    assert get_or_none(installed, own) is not None
    assert get_or_none(installed, elsewhere) is not None

    kubectl = subprocess.run([str(ensure_kubectl(log=False)), "--kubeconfig", str(control_plane.kubeconfig),
                              "delete", "namespace", cp, "--wait=false"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert kubectl.returncode == 0, kubectl.stderr
    # Generous: it ends in seconds; the point is that it ends long before the teardown wait (1 h).
    wait_for(lambda: get_or_none(installed, f"/api/v1/namespaces/{cp}") is None, timeout=120,
             what=f"namespace {cp} to be gone")
    assert get_or_none(installed, elsewhere) is None, "the object elsewhere was torn down"
    assert get_or_none(installed, f"{GITREPOS.format(ns=cp)}/app") is None

    time.sleep(1)  # let the audit log catch up with the last requests
    events = [e for e in control_plane.audit_events()
              if e.get("stage") == "ResponseComplete" and "objectRef" in e]
    deleted = next(i for i, e in enumerate(events) if e.get("verb") == "delete"
                   and e["objectRef"].get("resource") == "namespaces" and e["objectRef"].get("name") == cp)
    after = events[deleted + 1:]

    def requests(user: str, *, namespace: str, resource: str = "configmaps") -> list[dict[str, Any]]:
        return [e for e in after if acting(e) == user and e["objectRef"].get("namespace") == namespace
                and e["objectRef"].get("resource") == resource]

    # Elsewhere: torn down as before, as the identity that applied it.
    assert [(e["verb"], e["objectRef"].get("name")) for e in requests(tenant.deployer, namespace=web)
            if e["verb"] == "delete"] == [("delete", "elsewhere")]
    # Inside the terminating namespace: not one request of the teardown (its RoleBindings are going)...
    assert requests(tenant.deployer, namespace=cp) == []
    # ...the namespace controller removed what was there, and the controller let the StageSet go.
    assert {e["verb"] for e in requests(NAMESPACE_CONTROLLER, namespace=cp)} & {"delete", "deletecollection"}
    assert any(e["verb"] in ("patch", "update")
               for e in requests(CONTROLLER, namespace=cp, resource="stagesets"))
    assert get_or_none(installed, own) is None
