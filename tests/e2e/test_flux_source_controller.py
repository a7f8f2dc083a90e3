"""The real Flux source-controller, end to end: a StageSet consumes a Flux GitRepository's artifact.

source-controller (built from the Go module proxy, :mod:`stageset.envtest.sourcecontroller`) runs
out of cluster against this worker's control plane, with Flux's own CRDs from its module, its
artifact storage served on loopback.  It fetches from our loopback Git server; our controller
(the chart's multi-tenant RBAC, ``--allow-insecure-sources`` because the storage is on loopback)
reads the Flux GitRepository as the tenant, downloads and verifies the artifact, and applies it.
A new commit is applied with no change to the StageSet: source-controller publishes a new
artifact, our watch sees it, the StageSet runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.envtest.sourcecontroller import (
    SourceControllerProcess,
    ensure_source_controller,
    install_flux_crds,
)
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import apply, condition, get_or_none, wait_for
from tests.e2e.flux import FLUX
from tests.e2e.stagesets import cm, poke
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


@pytest.fixture(scope="module")
def source_controller(installed: KubeClient, control_plane: ControlPlane,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[SourceControllerProcess]:
    binary = ensure_source_controller()
    install_flux_crds(installed)
    process = SourceControllerProcess(kubeconfig=control_plane.kubeconfig, binary=binary,
                                      workdir=tmp_path_factory.mktemp("source-controller"))
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()
        sys.stderr.write(f"\n--- source-controller log (tail) ---\n{process.output()[-4000:]}\n")


def _stageset_at(admin: KubeClient, where: str, revision: str) -> dict[str, Any]:
    def check() -> Any:
        obj = admin.get(where)
        ready = condition(obj)
        applied = (obj.get("status") or {}).get("lastAppliedRevision") or ""
        return obj if ready and ready["status"] == "True" and applied.endswith(revision) else None
    found: dict[str, Any] = wait_for(check, timeout=90, what=f"{where} Ready at {revision}")
    return found


def test_a_stageset_applies_a_flux_gitrepository_and_follows_new_commits(
        source_controller: SourceControllerProcess, controller: ControllerProcess, git_server: GitServer,
        make_tenant: TenantFactory, installed: KubeClient) -> None:
    tenant = make_tenant("flux-git")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    url = git_server.create_repo(f"{ns}-app", {"deploy/cm.yaml": cm("from-flux", "one"),
                                                "README.md": "not a manifest\n"})
    repo = f"/apis/{FLUX}/v1/namespaces/{ns}/gitrepositories/app"
    installed.apply(repo, {"apiVersion": f"{FLUX}/v1", "kind": "GitRepository",
                           "metadata": {"name": "app", "namespace": ns},
                           "spec": {"url": url, "interval": "10m", "ref": {"branch": "main"}}},
                    field_manager="e2e-test")
    where = f"/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/app"
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": "app", "namespace": ns},
                      "spec": {"serviceAccountName": tenant.service_account,
                               "stages": [{"name": "app", "path": "./deploy",
                                           "sourceRef": {"apiVersion": f"{FLUX}/v1", "kind": "GitRepository",
                                                         "name": "app"}}]}})
    first = git_server.head(f"{ns}-app")
    obj = _stageset_at(installed, where, first)
    assert obj["status"]["stages"][0]["revision"] == f"main@sha1:{first}"
    artifact = installed.get(repo)["status"]["artifact"]
    assert artifact["digest"].startswith("sha256:")
    assert artifact["url"].startswith(f"http://{source_controller.storage_address}/")
    live = get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/from-flux") or {}
    assert live["data"] == {"k": "one"}

    generation = obj["metadata"]["generation"]
    second = git_server.commit(f"{ns}-app", {"deploy/cm.yaml": cm("from-flux", "two")})
    poke(installed, repo)  # as `flux reconcile source git app` does: source-controller fetches now
    obj = _stageset_at(installed, where, second)
    assert obj["metadata"]["generation"] == generation  # no spec change
    live = get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/from-flux") or {}
    assert live["data"] == {"k": "two"}
    controller.check_alive()
