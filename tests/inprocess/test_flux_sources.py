"""Flux sources in process: which requests, as whom, and what a stage says, for every source state.

The reconciler is the real one, over the fake cluster, with the real artifact fetcher and store
downloading from a loopback artifact server (guard off: the server is on loopback).  Download
jobs, which the manager would queue in the source pool, are run here by hand (:meth:`Flux.run_jobs`),
so each test sees exactly what a StageSet shows before and after a download.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sources.addresses import AddressGuard
from sources.artifacts import ArtifactStore
from stageset.controller.artifacts import ArtifactFetcher
from stageset.controller.sourcekinds import FLUX_GROUP, DefaultSourceKind, SourceObject
from stageset.controller.stageset.reconciler import StageSetReconciler
from tests.artifactserver import ArtifactServer, digest_of, tarball
from tests.inprocess.conftest import NS, TENANT, World, configmap
from tests.inprocess.fakes import CONTROLLER

FLUX = f"/apis/{FLUX_GROUP}/v1"
JAAS = {"apiVersion": "jaas.metio.wtf/v1", "kind": "JsonnetSnippet"}


class Flux:
    """Flux source objects in the fake cluster, their artifacts on a loopback server, and the fetcher."""

    def __init__(self, world: World, server: ArtifactServer, tmp: Path):
        self.world = world
        self.server = server
        self.scheduled: list[tuple[str, str]] = []
        self.woken: list[set[SourceObject]] = []
        self.store = ArtifactStore(root=tmp / "artifacts", guard=AddressGuard(allow_insecure=True))
        self.fetcher = ArtifactFetcher(store=self.store, timeout=5,
                                       schedule=lambda ns, job: self.scheduled.append((ns, job)),
                                       wake=self.woken.append)

    def reconciler(self, **settings: Any) -> StageSetReconciler:
        reconciler = self.world.make_reconciler(artifacts=self.fetcher, **settings)
        self.world.reconciler = reconciler
        return reconciler

    def publish(self, kind: str, name: str, files: dict[str, str], *, namespace: str = NS,
                revision: str = "latest@sha256:1", body: bytes | None = None, digest: str | None = None,
                spec: dict[str, Any] | None = None, ready: dict[str, Any] | None = None) -> str:
        """The source object (created if absent) with a Ready status naming this artifact."""
        data = body if body is not None else tarball(files)
        url = self.server.publish(f"{kind.lower()}/{namespace}/{name}/{digest_of(data)[7:19]}.tar.gz", data)
        plural = {"ExternalArtifact": "externalartifacts", "GitRepository": "gitrepositories",
                  "OCIRepository": "ocirepositories", "Bucket": "buckets"}[kind]
        path = f"{FLUX}/namespaces/{namespace}/{plural}/{name}"
        if self.world.cluster.get(path) is None:
            self.world.cluster.put({"apiVersion": f"{FLUX_GROUP}/v1", "kind": kind,
                                    "metadata": {"name": name, "namespace": namespace}, "spec": spec or {}})
        self.world.cluster.set_status(path, {
            "conditions": [ready or {"type": "Ready", "status": "True", "reason": "Succeeded",
                                     "message": "stored artifact"}],
            "artifact": {"url": url, "digest": digest or digest_of(data), "revision": revision}})
        return path

    def run_jobs(self) -> list[bool]:
        """Run the queued downloads (as the source pool would); ``True`` for each that asked to be retried."""
        jobs, self.scheduled = self.scheduled, []
        return [self.fetcher.run(ns, job).backoff for ns, job in jobs]


@pytest.fixture
def flux(world: World, tmp_path: Path) -> Iterator[Flux]:
    with ArtifactServer() as server:
        helper = Flux(world, server, tmp_path)
        helper.reconciler()
        yield helper


def stage(stage_name: str, /, **ref: Any) -> dict[str, Any]:
    return {"name": stage_name, "sourceRef": ref}


def stage_status(world: World, name: str) -> dict[str, Any]:
    return next(s for s in world.get(name)["status"]["stages"])


def test_an_external_artifact_is_downloaded_once_applied_as_the_tenant_and_woken(world: World,
                                                                                  flux: Flux) -> None:
    flux.publish("ExternalArtifact", "app", {"cm.yaml": configmap("from-artifact")})
    world.stageset("shop", [stage("app", kind="ExternalArtifact", name="app")])
    world.reconcile("shop")
    first = stage_status(world, "shop")
    assert first["phase"] == "Pending"
    assert "downloading artifact latest@sha256:1" in first["message"]
    assert world.ready("shop")["reason"] == "ArtifactNotFound"
    assert world.configmap("from-artifact") is None
    # The source object was read as the tenant; the controller never read it.
    assert any(r.path == f"{FLUX}/namespaces/{NS}/externalartifacts/app" for r in world.cluster.by(TENANT))
    assert not any(FLUX_GROUP in r.path for r in world.cluster.by(CONTROLLER))
    assert flux.run_jobs() == [False]
    assert flux.woken == [{SourceObject(FLUX_GROUP, "ExternalArtifact", NS, "app")}]
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert stage_status(world, "shop")["revision"] == "latest@sha256:1"
    assert world.configmap("from-artifact") is not None
    # Unchanged artifact: neither downloaded nor built again.
    builds = flux.world.reconciler._passes._renderer.cache.builds
    world.clock.advance(600)
    world.reconcile("shop")
    assert flux.store.downloads == 1
    assert flux.scheduled == []
    assert flux.world.reconciler._passes._renderer.cache.builds == builds


def test_a_new_artifact_is_applied_without_a_spec_change(world: World, flux: Flux) -> None:
    flux.publish("OCIRepository", "app", {"cm.yaml": configmap("cm", "one")}, revision="v1@sha256:1")
    world.stageset("shop", [stage("app", kind="OCIRepository", name="app")])
    world.reconcile("shop")
    flux.run_jobs()
    world.reconcile("shop")
    assert (world.configmap("cm") or {})["data"] == {"k": "one"}
    flux.publish("OCIRepository", "app", {"cm.yaml": configmap("cm", "two")}, revision="v2@sha256:2")
    world.reconcile("shop")
    flux.run_jobs()
    world.reconcile("shop")
    assert (world.configmap("cm") or {})["data"] == {"k": "two"}
    assert world.get("shop")["status"]["lastAppliedRevision"] == "v2@sha256:2"


def test_digest_mismatch_fails_the_stage_applies_and_prunes_nothing_and_is_not_retried(world: World,
                                                                                     flux: Flux) -> None:
    flux.publish("Bucket", "app", {"cm.yaml": configmap("kept")}, revision="sha256:1")
    world.stageset("shop", [stage("app", kind="Bucket", name="app")])
    world.reconcile("shop")
    flux.run_jobs()
    world.reconcile("shop")
    assert world.configmap("kept") is not None
    # Republished with a digest that is not the file's: a tampered or broken artifact.
    flux.publish("Bucket", "app", {"evil.yaml": configmap("evil")}, revision="sha256:2",
                 digest=digest_of(b"something else"))
    world.reconcile("shop")
    world.cluster.clear()
    assert flux.run_jobs() == [False]  # terminal: not retried with backoff
    world.reconcile("shop")
    status = stage_status(world, "shop")
    assert status["phase"] == "Failed"
    assert "digest mismatch" in status["message"]
    assert world.ready("shop")["reason"] == "StageFailed"
    assert world.configmap("evil") is None
    assert world.configmap("kept") is not None
    assert not [r for r in world.cluster.writes() if r.user == TENANT]
    # Not downloaded again until the source names another artifact.
    requests = sum(flux.server.requests.values())
    world.clock.advance(3600)
    world.reconcile("shop")
    assert flux.scheduled == []
    assert sum(flux.server.requests.values()) == requests


def test_an_unreachable_artifact_keeps_objects_waits_and_backs_off(world: World, flux: Flux) -> None:
    flux.publish("ExternalArtifact", "app", {"cm.yaml": configmap("kept")})
    world.stageset("shop", [stage("app", kind="ExternalArtifact", name="app")])
    world.reconcile("shop")
    flux.run_jobs()
    world.reconcile("shop")
    path = flux.publish("ExternalArtifact", "app", {"cm.yaml": configmap("new")}, revision="latest@sha256:2")
    url = world.cluster.get(path)["status"]["artifact"]["url"]  # type: ignore[index]
    flux.server.routes.pop("/" + url.split("/", 3)[3])  # the server lost it: 404
    world.reconcile("shop")
    assert flux.run_jobs() == [True]  # retried with the pool's backoff
    world.reconcile("shop")
    status = stage_status(world, "shop")
    assert status["phase"] == "Pending"
    assert "cannot be downloaded yet" in status["message"]
    assert "HTTP 404" in status["message"]
    assert world.ready("shop")["reason"] == "ArtifactNotFound"
    assert world.configmap("kept") is not None  # nothing pruned


@pytest.mark.parametrize("kind", ["ExternalArtifact", "GitRepository", "OCIRepository", "Bucket"])
def test_a_failed_source_says_why_in_the_stagesets_message(world: World, flux: Flux, kind: str) -> None:
    flux.publish(kind, "app", {}, ready={"type": "Ready", "status": "False", "reason": "GitOperationFailed",
                                         "message": "failed to checkout: authentication required"})
    api = {"apiVersion": f"{FLUX_GROUP}/v1"} if kind == "GitRepository" else {}
    world.stageset("shop", [stage("app", kind=kind, name="app", **api)])
    world.reconcile("shop")
    ready = world.ready("shop")
    assert ready["reason"] == "SourceNotReady"
    assert "is not ready: GitOperationFailed: failed to checkout: authentication required" in ready["message"]
    assert flux.scheduled == []


def test_our_failed_gitrepository_says_why_too(world: World) -> None:
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "app", "namespace": NS}, "spec": {"url": "https://git.example/x"}})
    path = f"/apis/stages.metio.wtf/v1/namespaces/{NS}/gitrepositories/app"
    world.cluster.set_status(path, {"conditions": [{
        "type": "Ready", "status": "False", "reason": "LimitExceeded",
        "message": "the remote sent a blob of 11534339 bytes, more than 10485760; runbook: "
                   "https://stages.metio.wtf/runbooks/limitexceeded/"}]})
    world.stageset("shop", [{"name": "app"}])
    world.reconcile("shop")
    message = world.ready("shop")["message"]
    assert message.startswith("stage 'app': GitRepository shop/app is not ready: LimitExceeded: the remote "
                              "sent a blob of 11534339 bytes")
    assert message.count("runbook:") == 1
    assert "runbooks/sourcenotready/" in message


def test_a_source_of_another_namespace_is_scrubbed(world: World, flux: Flux) -> None:
    world.cluster.grant_namespace(TENANT, "infra", "get,list")
    flux.publish("OCIRepository", "app", {}, namespace="infra",
                 ready={"type": "Ready", "status": "False", "reason": "OCIArtifactPullFailed",
                        "message": "secret internal registry registry.infra.svc refused"})
    world.stageset("shop", [stage("app", kind="OCIRepository", name="app", namespace="infra")])
    world.reconcile("shop")
    message = world.ready("shop")["message"]
    assert "OCIRepository infra/app is not ready" in message
    assert "registry" not in message
    assert "OCIArtifactPullFailed" not in message


def test_a_missing_source_and_a_ready_source_without_artifact(world: World, flux: Flux) -> None:
    world.stageset("shop", [stage("app", kind="ExternalArtifact", name="nothing")])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "ArtifactNotFound"
    assert "ExternalArtifact shop/nothing not found" in world.ready("shop")["message"]
    world.cluster.put({"apiVersion": f"{FLUX_GROUP}/v1", "kind": "ExternalArtifact",
                       "metadata": {"name": "empty", "namespace": NS}, "spec": {}})
    world.cluster.set_status(f"{FLUX}/namespaces/{NS}/externalartifacts/empty",
                             {"conditions": [{"type": "Ready", "status": "True"}], "artifact": {"url": "x"}})
    world.stageset("shop", [stage("app", kind="ExternalArtifact", name="empty")])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "ArtifactNotFound"
    assert "has no digest" in world.ready("shop")["message"]


def test_a_kind_the_cluster_does_not_serve_says_so(world: World, flux: Flux) -> None:
    world.cluster.unserved.add(f"{FLUX_GROUP}/v1beta2")
    world.stageset("shop", [stage("app", apiVersion=f"{FLUX_GROUP}/v1beta2", kind="OCIRepository",
                                  name="app")])
    world.reconcile("shop")
    ready = world.ready("shop")
    assert ready["reason"] == "ArtifactNotFound"
    assert f"does not serve {FLUX_GROUP}/v1beta2 (Flux's source CRDs are not installed" in ready["message"]


def test_a_producer_resolves_to_the_external_artifact_pointing_back(world: World, flux: Flux) -> None:
    producer = {"apiVersion": "jaas.metio.wtf/v1", "kind": "JsonnetSnippet", "name": "web"}
    world.stageset("shop", [stage("app", **producer)])
    world.reconcile("shop")
    assert world.ready("shop")["reason"] == "ArtifactNotFound"
    assert "JsonnetSnippet.jaas.metio.wtf shop/web has no artifact: no ExternalArtifact" \
        in world.ready("shop")["message"]
    flux.publish("ExternalArtifact", "web-rendered", {"cm.yaml": configmap("rendered")},
                 spec={"sourceRef": {**JAAS, "name": "web"}})
    flux.publish("ExternalArtifact", "other", {"cm.yaml": configmap("other")},
                 spec={"sourceRef": {**JAAS, "name": "api"}})
    world.reconcile("shop")
    flux.run_jobs()
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("rendered") is not None
    assert world.configmap("other") is None
    # Listed as the tenant, in the producer's namespace.
    assert any(r.verb == "list" and r.path == f"{FLUX}/namespaces/{NS}/externalartifacts"
               for r in world.cluster.by(TENANT))


def test_the_default_kind_switch(world: World, flux: Flux) -> None:
    flux.publish("ExternalArtifact", "app", {"cm.yaml": configmap("from-ea")})
    flux.reconciler(default_source_kind=DefaultSourceKind.EXTERNAL_ARTIFACT)
    world.stageset("shop", [{"name": "app"}])  # sourceRef: {name: app}, as the reference writes it
    world.reconcile("shop")
    flux.run_jobs()
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert world.configmap("from-ea") is not None
    assert not any("/stages.metio.wtf/v1/namespaces/shop/gitrepositories" in r.path
                   for r in world.cluster.by(TENANT))


def test_a_tenant_without_read_access_to_the_source_is_denied(world: World, flux: Flux) -> None:
    flux.publish("OCIRepository", "app", {}, namespace="infra")
    world.stageset("shop", [stage("app", kind="OCIRepository", name="app", namespace="infra")])
    world.reconcile("shop")
    ready = world.ready("shop")
    assert ready["reason"] == "RBACDenied"
    assert "may not read OCIRepository infra/app" in ready["message"]
    assert flux.scheduled == []
