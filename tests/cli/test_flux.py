"""The user commands with Flux sources: build, diff, get, tree and graph of StageSets whose stages name an
ExternalArtifact and an OCIRepository (Flux's CRDs, statuses written as source-controller writes them),
and an artifact URL that only resolves inside a cluster, with ``--source-dir NAME=DIR`` as the way out.

The CLI downloads the artifact from where it runs and verifies it as the controller does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.envtest.sourcecontroller import install_flux_crds
from stageset.kube.client import KubeClient
from tests.artifactserver import ArtifactServer, digest_of, tarball
from tests.cli.conftest import run_cli
from tests.e2e.conftest import apply, condition, wait_for
from tests.e2e.flux import ensure, now, publish, set_status
from tests.e2e.stagesets import cm

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]
INTERNAL = "http://source-controller.flux-system.svc.cluster.local./externalartifact/{ns}/internal/a.tar.gz"


@dataclass
class World:
    admin: KubeClient
    namespace: str
    kubeconfig: Path
    artifacts: ArtifactServer

    def cli(self, *args: str) -> Any:
        return run_cli(*args, "-n", self.namespace, kubeconfig=self.kubeconfig)


def _stageset(admin: KubeClient, namespace: str, name: str, stages: list[dict[str, Any]]) -> str:
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                  "metadata": {"name": name, "namespace": namespace},
                  "spec": {"serviceAccountName": "deployer", "stages": stages}})
    return f"/apis/stages.metio.wtf/v1/namespaces/{namespace}/stagesets/{name}"


@pytest.fixture(scope="module")
def world(installed: KubeClient, controller: ControllerProcess,
          control_plane: ControlPlane) -> Iterator[World]:
    install_flux_crds(installed)
    namespace = f"cli-flux-{uuid.uuid4().hex[:6]}"
    install.create_tenant(installed, namespace=namespace, service_account="deployer")
    with ArtifactServer() as server:
        publish(installed, server, "ExternalArtifact", namespace, "rendered",
                files={"cm.yaml": cm("from-ea")})
        publish(installed, server, "OCIRepository", namespace, "oci",
                files={"deploy/cm.yaml": cm("from-oci"),
                       "deploy/kustomization.yaml": "resources: [cm.yaml]\ncommonLabels: {tier: web}\n"},
                revision="1.0@sha256:" + "c" * 64)
        where = _stageset(installed, namespace, "flux", [
            {"name": "ea", "sourceRef": {"kind": "ExternalArtifact", "name": "rendered"}},
            {"name": "oci", "path": "./deploy", "sourceRef": {"kind": "OCIRepository", "name": "oci"}}])
        wait_for(lambda: (c := condition(installed.get(where))) and c["status"] == "True",
                 what="flux Ready")
        yield World(admin=installed, namespace=namespace, kubeconfig=control_plane.kubeconfig,
                    artifacts=server)


def test_build_downloads_verifies_and_renders_flux_artifacts(world: World) -> None:
    result = world.cli("build", "flux")
    assert result.exit_code == 0, result.stderr
    assert "# stage ea: path ./ at latest@sha256:1" in result.stdout
    assert "# stage oci: path ./deploy at 1.0@sha256:" in result.stdout
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {o["metadata"]["name"] for o in objects} == {"from-ea", "from-oci"}
    oci = next(o for o in objects if o["metadata"]["name"] == "from-oci")
    assert oci["metadata"]["labels"] == {"tier": "web"}


def test_diff_of_an_applied_flux_stageset_is_empty(world: World) -> None:
    result = world.cli("diff", "flux")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "stage ea (as system:serviceaccount:" in result.stderr


def test_get_tree_and_graph_show_the_artifact_revisions(world: World) -> None:
    got = world.cli("get", "flux")
    assert got.exit_code == 0
    assert "latest@sha256:1" in got.stdout
    assert "1.0@sha256:cccccccccccc" in got.stdout
    tree = world.cli("tree", "flux")
    assert "ConfigMap/" in tree.stdout
    assert "from-oci" in tree.stdout
    assert world.cli("graph", "flux").exit_code == 0


def test_a_cluster_internal_artifact_url_says_so_and_source_dir_is_the_way_out(world: World,
                                                                               tmp_path: Path) -> None:
    body = tarball({"cm.yaml": cm("internal")})
    where = ensure(world.admin, "ExternalArtifact", world.namespace, "internal")
    set_status(world.admin, where, ready={"status": "True", "reason": "Succeeded", "message": "ok"},
               artifact={"url": INTERNAL.format(ns=world.namespace), "digest": digest_of(body),
                         "revision": "latest@sha256:9", "path": "a.tar.gz", "size": len(body),
                         "lastUpdateTime": now()})
    _stageset(world.admin, world.namespace, "internal",
              [{"name": "app", "sourceRef": {"kind": "ExternalArtifact", "name": "internal"}}])
    failed = world.cli("build", "internal")
    assert failed.exit_code == 3
    assert "reachable only inside the cluster" in failed.stderr
    assert "--source-dir internal=DIR" in failed.stderr
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "cm.yaml").write_text(cm("from-checkout"))
    built = world.cli("build", "internal", "--source-dir", f"internal={checkout}")
    assert built.exit_code == 0, built.stderr
    assert "from-checkout" in built.stdout


def test_a_digest_mismatch_is_refused_by_the_cli_too(world: World) -> None:
    body = tarball({"cm.yaml": cm("tampered")})
    url = world.artifacts.publish(f"tampered/{world.namespace}.tar.gz", body)
    where = ensure(world.admin, "ExternalArtifact", world.namespace, "tampered")
    set_status(world.admin, where, ready={"status": "True", "reason": "Succeeded", "message": "ok"},
               artifact={"url": url, "digest": digest_of(b"something else"), "revision": "latest@sha256:7",
                         "path": "a.tar.gz", "size": len(body), "lastUpdateTime": now()})
    _stageset(world.admin, world.namespace, "tampered",
              [{"name": "app", "sourceRef": {"kind": "ExternalArtifact", "name": "tampered"}}])
    result = world.cli("build", "tampered")
    assert result.exit_code == 3
    assert "digest mismatch" in result.stderr
    assert "tampered" not in result.stdout
