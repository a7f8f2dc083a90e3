"""Two attacks on Flux artifacts, rerun as a tenant would (issue 30), against the controller as a subprocess.

* **Memory.**  Five tenants publish artifacts at every documented limit at once (ten files of
  9.9 MiB of zeros, 100 KiB compressed: :func:`tests.artifactload.at_the_limits`); each has a
  stage that builds the artifact's small kustomization (Ready) and one that reads three of the zero
  files (the most its build limits allow) and fails.  The controller's peak RSS (``VmHWM``) stays
  under the 256 MiB the chart reserves for the controller process (docs/sizing.md): before, the
  same attack took it to 560-628 MiB.  Disk: each tenant's trees are charged to it.
* **A digest is no capability.**  A tenant that can read nothing of another creates its own
  ExternalArtifact naming the other's digest and a URL that serves nothing: it gets a clear
  condition (``ArtifactNotFound``, "cannot be downloaded yet: ... HTTP 404"), nothing of the other's
  files, and the controller asked its URL (it did not serve the stored tree).  No log line above
  debug names the digest.

Default artifact limits and workers (4 StageSet workers, 4 source workers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.sourcecontroller import install_flux_crds
from stageset.kube.client import KubeClient
from tests.artifactload import at_the_limits
from tests.artifactserver import ArtifactServer
from tests.conftest import Tenant
from tests.e2e.conftest import apply, condition, get_or_none, wait_for
from tests.e2e.flux import ensure, now, path, publish, set_status
from tests.e2e.stagesets import cm

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
TENANTS = 5
CONTROLLER_CEILING_MIB = 256
"""The controller process's reserve in the chart (docs/sizing.md): its peak must stay within it."""


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--log-format", "json"]  # default artifact limits; --log-level debug (ControllerProcess's)


@pytest.fixture(scope="module")
def flux_crds(installed: KubeClient) -> KubeClient:
    install_flux_crds(installed)
    return installed


@pytest.fixture(scope="module")
def artifacts() -> Iterator[ArtifactServer]:
    with ArtifactServer() as server:
        yield server


def _stageset(admin: KubeClient, tenant: Tenant, name: str, *, source: str, stage_path: str) -> str:
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                  "metadata": {"name": name, "namespace": tenant.namespace},
                  "spec": {"serviceAccountName": tenant.service_account, "interval": "1h", "stages": [
                      {"name": "main", "path": stage_path,
                       "sourceRef": {"kind": "ExternalArtifact", "name": source}}]}})
    return f"/apis/stages.metio.wtf/v1/namespaces/{tenant.namespace}/stagesets/{name}"


def _settled(admin: KubeClient, where: str, *, status: str, reason: str | None = None, says: str = "",
             timeout: float = 180) -> dict[str, Any]:
    def check() -> Any:
        obj = admin.get(where)
        found = condition(obj)
        ok = found and found["status"] == status and (reason is None or found["reason"] == reason)
        return obj if ok and says in found["message"] else None
    found: dict[str, Any] = wait_for(check, timeout=timeout, what=f"{where} Ready={status} {reason or ''}")
    return found


def test_five_tenants_at_the_artifact_limits_stay_within_the_controller_reserve(
        flux_crds: KubeClient, controller: ControllerProcess, artifacts: ArtifactServer,
        make_tenant: TenantFactory) -> None:
    tenants = [make_tenant(f"mem{index}") for index in range(TENANTS)]
    waits: list[tuple[str, str, str | None]] = []
    for index, tenant in enumerate(tenants):  # a digest of its own each: five trees unpacked
        tenant.bind_cluster_role("edit")
        publish(flux_crds, artifacts, "ExternalArtifact", tenant.namespace, "big",
                body=at_the_limits(name=f"from-the-artifact-{index}"))
    for tenant in tenants:  # every StageSet at once: downloads and renders overlap
        waits.append((_stageset(flux_crds, tenant, "app", source="big", stage_path="app"), "True", None))
        waits.append((_stageset(flux_crds, tenant, "zeros", source="big", stage_path="zeros"),
                      "False", "StageFailed"))
    for where, status, reason in waits:
        obj = _settled(flux_crds, where, status=status, reason=reason)
        if status == "False":
            assert "not valid YAML" in condition(obj)["message"], condition(obj)  # type: ignore[index]
    for index, tenant in enumerate(tenants):
        assert get_or_none(flux_crds, f"/api/v1/namespaces/{tenant.namespace}/configmaps/"
                                      f"from-the-artifact-{index}") is not None
    controller.check_alive()
    peak = controller.memory_mib()["VmHWM"]
    print(f"controller peak RSS with {TENANTS} tenants at the artifact limits: {peak:.0f} MiB")
    assert peak <= CONTROLLER_CEILING_MIB, f"controller peak RSS {peak:.0f} MiB"
    # Disk: one tree per tenant, charged to it (the store's files: a tree and its proofs each).
    stored = list((controller.log.parent / "artifacts").glob("*.tree"))
    assert len(stored) == TENANTS


def test_another_tenants_digest_with_a_url_that_serves_nothing_gets_nothing(
        flux_crds: KubeClient, controller: ControllerProcess, artifacts: ArtifactServer,
        make_tenant: TenantFactory) -> None:
    victim, attacker = make_tenant("victim"), make_tenant("attacker")
    for each in (victim, attacker):
        each.bind_cluster_role("edit")
    where = publish(flux_crds, artifacts, "ExternalArtifact", victim.namespace, "app",
                    files={"cm.yaml": cm("only-for-the-victim")})
    theirs = _settled(flux_crds, _stageset(flux_crds, victim, "app", source="app", stage_path="./"),
                      status="True")
    assert theirs
    digest = flux_crds.get(where)["status"]["artifact"]["digest"]
    # The attacker's own ExternalArtifact: the victim's digest, a URL on the same server serving nothing.
    nothing = f"externalartifact/{attacker.namespace}/app/nothing.tar.gz"
    mine = ensure(flux_crds, "ExternalArtifact", attacker.namespace, "app")
    set_status(flux_crds, mine, ready={"status": "True", "reason": "Succeeded", "message": "stored artifact"},
               artifact={"url": artifacts.url(nothing), "digest": digest, "revision": "latest@sha256:forged",
                         "path": nothing, "size": 100, "lastUpdateTime": now()})
    # First "downloading artifact ..." (ArtifactNotFound too), then, once its URL answered, why not.
    obj = _settled(flux_crds, _stageset(flux_crds, attacker, "app", source="app", stage_path="./"),
                   status="False", reason="ArtifactNotFound", says="cannot be downloaded yet", timeout=90)
    message = condition(obj)["message"]  # type: ignore[index]
    assert "cannot be downloaded yet" in message, message
    assert "HTTP 404" in message, message
    assert artifacts.requests["/" + nothing] >= 1  # its own URL was asked; the store served nothing
    assert get_or_none(flux_crds, f"/api/v1/namespaces/{attacker.namespace}/configmaps/"
                                  "only-for-the-victim") is None
    assert get_or_none(flux_crds, f"/api/v1/namespaces/{victim.namespace}/configmaps/"
                                  "only-for-the-victim") is not None
    assert path("ExternalArtifact", attacker.namespace, "app") == mine
    # Digests only at debug level: the victim's digest is in no info, warning or error line.
    hex_digest = digest.split(":", 1)[1]
    lines = [json.loads(line) for line in controller.output().splitlines() if line.startswith("{")]
    named = [entry for entry in lines if hex_digest in json.dumps(entry)]
    assert named, "the debug log names the digest (the check below would prove nothing otherwise)"
    assert all(entry["level"] == "debug" for entry in named), [e for e in named if e["level"] != "debug"]
    controller.check_alive()
