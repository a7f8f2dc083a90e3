"""The artifact address guard, on, end to end: a controller started without ``--allow-insecure-sources``.

The test's artifact server listens on loopback — exactly what this controller must refuse — so
every case names an address the guard refuses and asserts a clear condition, that the server
was never asked, and that nothing was applied.  (A redirect that leads to loopback after a
first hop the guard allows, and a rebinding resolver, need an address the guard allows, which
a test on one machine cannot have: ``tests/sources/test_artifact_fetch.py`` tests them with the
real guard at connect time.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.envtest.sourcecontroller import install_flux_crds
from stageset.kube.client import KubeClient
from tests.artifactserver import ArtifactServer, digest_of, tarball
from tests.conftest import Tenant
from tests.e2e.conftest import apply, condition, controller_kubeconfig, get_or_none, stop_controller, wait_for
from tests.e2e.flux import ensure, now, set_status
from tests.e2e.stagesets import cm

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


@pytest.fixture(scope="module")
def guarded(installed: KubeClient, control_plane: ControlPlane,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    install_flux_crds(installed)
    workdir = tmp_path_factory.mktemp("guarded")
    kubeconfig = controller_kubeconfig(installed, control_plane=control_plane, path=workdir / "kubeconfig")
    handle = ControllerProcess(kubeconfig=kubeconfig, workdir=workdir, insecure=False)
    try:
        yield handle
    finally:
        stop_controller(handle)


@pytest.fixture(scope="module")
def artifacts() -> Iterator[ArtifactServer]:
    with ArtifactServer() as server:
        yield server


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:{port}/{file}", "loopback"),
    ("http://localhost:{port}/{file}", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/{file}", "loopback"),
    ("http://2130706433:{port}/{file}", "loopback"),
    ("http://0.0.0.0:{port}/{file}", "unspecified"),
    ("http://169.254.169.254/latest/meta-data/iam/", "cloud metadata"),
    ("http://[fe80::1]:{port}/{file}", "link-local"),
    ("http://224.0.0.1:{port}/{file}", "multicast"),
])
def test_refused_addresses_end_in_a_clear_condition(installed: KubeClient, guarded: ControllerProcess,
                                                    artifacts: ArtifactServer, make_tenant: TenantFactory,
                                                    url: str, says: str) -> None:
    tenant = make_tenant("guard")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    body = tarball({"cm.yaml": cm("stolen")})
    file = f"guard/{ns}.tar.gz"
    artifacts.publish(file, body)
    where = ensure(installed, "ExternalArtifact", ns, "app")
    set_status(installed, where, ready={"status": "True", "reason": "Succeeded", "message": "ok"},
               artifact={"url": url.format(port=artifacts.port, file=file), "digest": digest_of(body),
                         "revision": "latest@sha256:1", "path": file, "size": len(body),
                         "lastUpdateTime": now()})
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": "app", "namespace": ns},
                      "spec": {"serviceAccountName": tenant.service_account,
                               "stages": [{"name": "app", "sourceRef": {"kind": "ExternalArtifact",
                                                                        "name": "app"}}]}})

    def refused() -> Any:
        found = condition(installed.get(f"/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/app"))
        return found if found and found["reason"] == "StageFailed" else None

    message = wait_for(refused, what="the guard's refusal")["message"]
    assert says in message, message
    assert "--allow-insecure-sources" in message
    assert artifacts.requests[f"/{file}"] == 0
    assert get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/stolen") is None
    guarded.check_alive()
