"""--watch-namespaces: a shard sees only its namespaces, through namespace-scoped watches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.e2e.conftest import (
    ControllerProcess,
    apply,
    condition,
    get_or_none,
    start_controller,
    stop_controller,
    wait_for,
)
from tests.e2e.stagesets import cm
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

ACCOUNT = "stageset-shard"
WATCHED = ["shard-a", "shard-b"]
OUTSIDE = "shard-c"


@pytest.fixture(scope="module")
def shard(installed: KubeClient, control_plane: ControlPlane,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    for namespace in [*WATCHED, OUTSIDE]:
        install.create_tenant(installed, namespace=namespace, service_account="deployer")
    workdir = tmp_path_factory.mktemp("shard")
    kubeconfig = install.controller_kubeconfig(
        installed, url=control_plane.url, ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig",
        account=ACCOUNT, watch_namespaces=WATCHED)
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir,
                              extra=["--watch-namespaces", ",".join(WATCHED)])
    try:
        yield handle
    finally:
        stop_controller(handle)


def stageset_in(namespace: str, url: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
         "metadata": {"name": "app", "namespace": namespace},
         "spec": {"url": url, "ref": {"branch": "main"}}},
        {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
         "metadata": {"name": "app", "namespace": namespace},
         "spec": {"serviceAccountName": "deployer",
                  "stages": [{"name": "app", "sourceRef": {"name": "app"}}]}},
    ]


def test_a_shard_reconciles_its_namespaces_only_with_namespace_scoped_watches(
    shard: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
) -> None:
    url = git_server.create_repo("sharded", {"cm.yaml": cm("sharded")})
    for namespace in [*WATCHED, OUTSIDE]:
        for obj in stageset_in(namespace, url):
            apply(installed, obj)
    for namespace in WATCHED:
        wait_for(lambda ns=namespace: (c := condition(installed.get(
            f"/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/app"))) and c["status"] == "True",
            what=f"StageSet in {namespace} Ready")
        assert get_or_none(installed, f"/api/v1/namespaces/{namespace}/configmaps/sharded") is not None
    outside = installed.get(f"/apis/stages.metio.wtf/v1/namespaces/{OUTSIDE}/stagesets/app")
    assert not (outside.get("status") or {}).get("conditions"), "a shard touched another namespace"
    assert get_or_none(installed, f"/api/v1/namespaces/{OUTSIDE}/configmaps/sharded") is None

    shard_user = f"system:serviceaccount:stageset-system:{ACCOUNT}"
    lists = [e for e in control_plane.audit_events()
             if (e.get("user") or {}).get("username") == shard_user and e.get("verb") in ("list", "watch")
             and "stages.metio.wtf" in e.get("requestURI", "")]
    assert lists, "the shard listed nothing"
    for event in lists:
        assert any(f"/namespaces/{ns}/" in event["requestURI"] for ns in WATCHED), event["requestURI"]
