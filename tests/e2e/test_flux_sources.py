"""Flux sources end to end: Flux's own CRDs, statuses written as source-controller writes them, artifacts
served on loopback, the controller as a subprocess with the chart's multi-tenant RBAC.

Every attack starts from a tenant whose stage already applied a good artifact (a ConfigMap
``kept``), then republishes a hostile one; it must end in a clear condition with nothing of the
hostile artifact applied and ``kept`` not pruned.  The address guard, on, is
``test_flux_guard.py``'s.

Table in docs/security.md ("Flux artifacts").
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.envtest.sourcecontroller import install_flux_crds
from stageset.kube.client import KubeClient
from tests.artifactserver import ArtifactServer, Entry, digest_of, gzip_bomb, hostile_tarball
from tests.conftest import Tenant
from tests.e2e.conftest import apply, condition, get_or_none, wait_for
from tests.e2e.flux import FLUX, publish
from tests.e2e.stagesets import cm
from tests.gitserver import GitServer, Zeros

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
CONTROLLER_USER = "system:serviceaccount:stageset-system:stageset-controller"
LIMITS = ["--artifact-max-size=256Ki", "--artifact-max-unpacked-size=1Mi", "--artifact-max-file-size=512Ki",
          "--artifact-timeout=10s", "--source-workers=2", "--git-max-file-size=1Mi"]


@pytest.fixture(scope="module")
def flux_crds(installed: KubeClient) -> KubeClient:
    install_flux_crds(installed)
    return installed


@pytest.fixture(scope="module")
def artifacts() -> Iterator[ArtifactServer]:
    with ArtifactServer() as server:
        yield server


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return LIMITS


@pytest.fixture
def tenant(flux_crds: KubeClient, make_tenant: TenantFactory) -> Tenant:
    made = make_tenant("flux")
    made.bind_cluster_role("edit")
    return made


def stageset(admin: KubeClient, tenant: Tenant, stages: list[dict[str, Any]], name: str = "app") -> str:
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                  "metadata": {"name": name, "namespace": tenant.namespace},
                  "spec": {"serviceAccountName": tenant.service_account, "stages": stages}})
    return f"/apis/stages.metio.wtf/v1/namespaces/{tenant.namespace}/stagesets/{name}"


def ready_with(admin: KubeClient, where: str, *, status: str = "True", reason: str | None = None,
               revision: str | None = None, timeout: float = 60) -> dict[str, Any]:
    def check() -> Any:
        obj = admin.get(where)
        found = condition(obj)
        if not found or found["status"] != status or (reason and found["reason"] != reason):
            return None
        if revision and revision not in str((obj.get("status") or {}).get("lastAppliedRevision")):
            return None
        return obj
    found: dict[str, Any] = wait_for(check, timeout=timeout, what=f"{where} Ready={status} {reason or ''}")
    return found


def configmap(admin: KubeClient, tenant: Tenant, name: str) -> dict[str, Any] | None:
    return get_or_none(admin, f"/api/v1/namespaces/{tenant.namespace}/configmaps/{name}")


def test_external_artifact_oci_repository_and_bucket_become_ready_as_the_tenant(
        flux_crds: KubeClient, controller: ControllerProcess, artifacts: ArtifactServer, tenant: Tenant,
        control_plane: ControlPlane) -> None:
    ns = tenant.namespace
    publish(flux_crds, artifacts, "ExternalArtifact", ns, "rendered", files={"cm.yaml": cm("from-ea")})
    publish(flux_crds, artifacts, "OCIRepository", ns, "oci", files={"deploy/cm.yaml": cm("from-oci")},
            revision="1.0.0@sha256:" + "a" * 64)
    publish(flux_crds, artifacts, "Bucket", ns, "bucket", files={"cm.yaml": cm("from-bucket")},
            revision="sha256:" + "b" * 64)
    where = stageset(flux_crds, tenant, [
        {"name": "ea", "sourceRef": {"kind": "ExternalArtifact", "name": "rendered"}},
        {"name": "oci", "path": "./deploy", "sourceRef": {"kind": "OCIRepository", "name": "oci"}},
        {"name": "bucket", "sourceRef": {"apiVersion": f"{FLUX}/v1", "kind": "Bucket", "name": "bucket"}},
    ])
    obj = ready_with(flux_crds, where)
    assert {s["name"]: s["revision"] for s in obj["status"]["stages"]} == {
        "ea": "latest@sha256:1", "oci": "1.0.0@sha256:" + "a" * 64, "bucket": "sha256:" + "b" * 64}
    for name in ("from-ea", "from-oci", "from-bucket"):
        assert configmap(flux_crds, tenant, name) is not None
    # Every read of a Flux source by the controller was made as the tenant (impersonated).
    reads = [e for e in control_plane.audit_events()
             if f"/apis/{FLUX}/v1/namespaces/{ns}/" in e["requestURI"] and e.get("verb") == "get"
             and e["user"]["username"] == CONTROLLER_USER]
    assert reads, "the audit log holds no read of the Flux sources by the controller"
    users = {(e.get("impersonatedUser") or {}).get("username") for e in reads}
    assert users == {tenant.username}


def test_a_republished_artifact_is_applied_without_a_spec_change(
        flux_crds: KubeClient, controller: ControllerProcess, artifacts: ArtifactServer,
        tenant: Tenant) -> None:
    ns = tenant.namespace
    publish(flux_crds, artifacts, "ExternalArtifact", ns, "app", files={"cm.yaml": cm("app", "one")})
    where = stageset(flux_crds, tenant, [{"name": "app", "sourceRef": {"kind": "ExternalArtifact",
                                                                        "name": "app"}}])
    ready_with(flux_crds, where, revision="latest@sha256:1")
    generation = flux_crds.get(where)["metadata"]["generation"]
    publish(flux_crds, artifacts, "ExternalArtifact", ns, "app", files={"cm.yaml": cm("app", "two")},
            revision="latest@sha256:2")
    ready_with(flux_crds, where, revision="latest@sha256:2")
    assert (configmap(flux_crds, tenant, "app") or {})["data"] == {"k": "two"}
    assert flux_crds.get(where)["metadata"]["generation"] == generation


def test_our_gitrepository_that_failed_says_why_in_the_stageset(
        installed: KubeClient, controller: ControllerProcess, git_server: GitServer,
        tenant: Tenant) -> None:
    """A new user's first try: a repository holding a file over the limit.  The StageSet says what
    the GitRepository says, not "has no artifact yet"."""
    ns = tenant.namespace
    url = git_server.create_repo(f"{ns}-big", {"deploy/cm.yaml": cm("app"),
                                                "assets/video.bin": Zeros(2 << 20)})
    git_server.configure(f"{ns}-big", "uploadpack.allowFilter", "false")  # it sends the big blob
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                      "metadata": {"name": "app", "namespace": ns}, "spec": {"url": url, "interval": "10m"}})
    where = stageset(installed, tenant, [{"name": "app", "path": "./deploy",
                                          "sourceRef": {"name": "app"}}])
    expected = f"stage 'app': GitRepository {ns}/app is not ready: LimitExceeded: "

    def says_why() -> Any:
        found = condition(installed.get(where))
        return found if found and found["message"].startswith(expected) else None

    # Woken by the GitRepository's failure (a waiting stage's own retry would take 30 s).
    message = wait_for(says_why, timeout=25, what="the GitRepository's reason in the StageSet")["message"]
    assert message.count("runbook:") == 1
    assert condition(installed.get(where))["reason"] == "SourceNotReady"  # type: ignore[index]


def _good_then(admin: KubeClient, artifacts: ArtifactServer, tenant: Tenant, **hostile: Any) -> str:
    """A stage applies a good artifact (ConfigMap ``kept``), then the source names ``hostile``."""
    publish(admin, artifacts, "ExternalArtifact", tenant.namespace, "app", files={"cm.yaml": cm("kept")})
    where = stageset(admin, tenant, [{"name": "app",
                                      "sourceRef": {"kind": "ExternalArtifact", "name": "app"}}])
    ready_with(admin, where)
    publish(admin, artifacts, "ExternalArtifact", tenant.namespace, "app", revision="latest@sha256:evil",
            **hostile)
    return where


EVIL = cm("evil")
ATTACKS: dict[str, tuple[dict[str, Any], str, str]] = {
    "digest mismatch": ({"files": {"cm.yaml": EVIL}, "digest": digest_of(b"what the producer built")},
                        "StageFailed", "digest mismatch"),
    "tar bomb": ({"body": gzip_bomb(inflated=64 * 1024 * 1024)}, "StageFailed", "--artifact-max-"),
    "oversize": ({"body": bytes(range(256)) * 2048}, "StageFailed", "--artifact-max-size"),
    "traversal": ({"body": hostile_tarball([Entry("cm.yaml", data=EVIL.encode()),
                                            Entry("../../etc/evil.yaml", data=EVIL.encode())])},
                  "StageFailed", "contains '..'"),
    "escaping symlink": ({"body": hostile_tarball([Entry("cm.yaml", type=tarfile.SYMTYPE,
                                                         linkname="../../../var/run/secrets/token")])},
                         "StageFailed", "outside the artifact"),
    "device": ({"body": hostile_tarball([Entry("cm.yaml", data=EVIL.encode()),
                                         Entry("dev", type=tarfile.CHRTYPE)])}, "StageFailed", "is a device"),
    "duplicate entries": ({"body": hostile_tarball([Entry("cm.yaml", data=cm("kept").encode()),
                                                    Entry("cm.yaml", data=EVIL.encode())])},
                          "StageFailed", "more than once"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_hostile_artifacts_end_in_a_clear_condition_with_nothing_applied_or_pruned(
        flux_crds: KubeClient, controller: ControllerProcess, artifacts: ArtifactServer, tenant: Tenant,
        attack: str) -> None:
    hostile, reason, says = ATTACKS[attack]
    where = _good_then(flux_crds, artifacts, tenant, **hostile)
    obj = ready_with(flux_crds, where, status="False", reason=reason)
    message = condition(obj)["message"]  # type: ignore[index]
    assert says in message, message
    assert configmap(flux_crds, tenant, "evil") is None
    assert configmap(flux_crds, tenant, "kept") is not None
    controller.check_alive()


def test_a_tarpit_never_starves_another_tenant(flux_crds: KubeClient, controller: ControllerProcess,
                                               artifacts: ArtifactServer, make_tenant: TenantFactory) -> None:
    """Two source workers, at most one per namespace: the tarpit tenant's three downloads (a byte
    every 0.5 s, cut at the 10 s artifact timeout) take turns on one worker, never both; the healthy
    tenant's download starts beside a tarpit still trickling, and its StageSet becomes Ready."""
    slow, healthy = make_tenant("tarpit"), make_tenant("healthy")
    for each in (slow, healthy):
        each.bind_cluster_role("edit")
    for i in range(3):
        publish(flux_crds, artifacts, "ExternalArtifact", slow.namespace, f"slow-{i}",
                files={"cm.yaml": cm(f"slow-{i}")}, trickle=0.5)
        stageset(flux_crds, slow, [{"name": "app", "sourceRef": {"kind": "ExternalArtifact",
                                                                  "name": f"slow-{i}"}}], name=f"slow-{i}")
    tarpit = f"/externalartifact/{slow.namespace}/"

    def trickling() -> int:
        return sum(n for p, n in artifacts.in_flight.items() if p.startswith(tarpit))

    wait_for(trickling, what="a tarpit download under way")
    publish(flux_crds, artifacts, "ExternalArtifact", healthy.namespace, "app", files={"cm.yaml": cm("ok")})
    where = stageset(flux_crds, healthy, [{"name": "app", "sourceRef": {"kind": "ExternalArtifact",
                                                                         "name": "app"}}])
    ready_with(flux_crds, where)
    assert configmap(flux_crds, healthy, "ok") is not None
    healthy_path = f"/externalartifact/{healthy.namespace}/"
    served = [others for path, others in artifacts.log if path.startswith(healthy_path)]
    assert served, "the healthy artifact was never requested"
    # Its download began while a tarpit was still held: it did not wait for a tarpit to let go.
    assert sum(n for p, n in served[0].items() if p.startswith(tarpit)) == 1
    # The tarpit tenant never held both workers: one of its downloads at a time.
    assert all(sum(n for p, n in others.items() if p.startswith(tarpit)) == 0
               for path, others in artifacts.log if path.startswith(tarpit))
    for i in range(3):
        held = condition(flux_crds.get(f"/apis/stages.metio.wtf/v1/namespaces/{slow.namespace}"
                                       f"/stagesets/slow-{i}"))
        assert held is None or held["status"] != "True"
    controller.check_alive()
