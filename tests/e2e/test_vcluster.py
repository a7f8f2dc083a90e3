"""The vcluster tier as docs/tenancy.md documents it (#a-vcluster-as-a-platform-target), run as
written: a second apiserver plays the vcluster and :class:`tests.e2e.vcluster.VClusterExport` writes
its kubeconfig as vcluster's export does, from the page's own ``vcluster.yaml`` values.

The page's blocks (marked ``<!-- vcluster-… -->``) are read and applied where they say: the
``stageset create tenant`` lines (run with ``--export``, applied as printed) and YAML inside the
vcluster and on the host, the values to the fixture, the StageSet to the host.  The test's own
parts: the Git server and its GitRepository, and the vcluster's host namespace with its account
(which vcluster's chart makes).

What it shows: before the export exists the StageSet waits (``ClusterUnreachable``, the target
"not ready ... retrying", nothing sent to the vcluster) and the StageTarget says ``SecretNotFound``;
the Secret's arrival turns it Ready with no edit, applying as the tenant's deployer through the
export's scoped ServiceAccount; a rotated credential (the old one revoked) is picked up with no
edit, and the next commit lands through it.  A second test does the same rotation with vcluster's
default export, an admin client certificate.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.cli.tenantobjects import object_path
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import ClientPool, KubeClient
from tests.cli.conftest import run_cli
from tests.e2e.conftest import condition, get_or_none, start_controller, stop_controller, wait_for
from tests.e2e.stagesets import cm
from tests.e2e.vcluster import VClusterExport
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tenancy.md"
BLOCK = re.compile(r"<!-- (vcluster-[a-z]+) -->\n[ ]*```(yaml|console)\n(.*?)\n[ ]*```", re.DOTALL)
TARGETS = "stageset-targets"
VCLUSTER_NS = "shop-vcluster"
TENANT_NS = "shop-system"
WORKLOAD_NS = "shop"
DEPLOYER = f"system:serviceaccount:{TENANT_NS}:stageset-deployer"


def blocks() -> dict[str, list[tuple[str, str]]]:
    """The page's marked blocks, dedented (they sit in a numbered list), by marker."""
    found: dict[str, list[tuple[str, str]]] = {}
    for marker, language, body in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        lines = body.splitlines()
        indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
        found.setdefault(marker, []).append((language, "\n".join(line[indent:] for line in lines)))
    return found


def apply_block(admin: KubeClient, language: str, body: str) -> list[dict[str, Any]]:
    """A YAML block applied as written; a console block's ``stageset create tenant`` lines run with
    ``--export`` and applied as printed (the same objects the command applies)."""
    if language == "yaml":
        objects = [o for o in yaml.safe_load_all(body) if o]
    else:
        objects = []
        for line in body.splitlines():
            words = shlex.split(line.removeprefix("$ ")) if line.startswith("$ stageset ") else []
            if words[:3] == ["stageset", "create", "tenant"]:
                result = run_cli(*words[1:], "--export", env={"HOME": "/nonexistent"})
                assert result.exit_code == 0, result.output + result.stderr
                objects += list(yaml.safe_load_all(result.stdout))
    for obj in objects:
        admin.apply(_path(obj), obj, field_manager="platform-team")
    return objects


def _path(obj: dict[str, Any]) -> str:
    if obj["kind"] in ("StageTarget", "StageSet"):
        plural = {"StageTarget": "stagetargets", "StageSet": "stagesets"}[obj["kind"]]
        meta = obj["metadata"]
        return f"/apis/stages.metio.wtf/v1/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
    if obj["kind"] == "Role":
        meta = obj["metadata"]
        return f"/apis/rbac.authorization.k8s.io/v1/namespaces/{meta['namespace']}/roles/{meta['name']}"
    return object_path(obj)


def namespace(admin: KubeClient, name: str) -> None:
    admin.apply(
        f"/api/v1/namespaces/{name}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        field_manager="test",
    )


def vcluster_host_account(admin: KubeClient, *, name: str) -> None:
    """What vcluster's chart makes on the host: its namespace, its account, its rights there."""
    namespace(admin, VCLUSTER_NS)
    admin.apply(
        f"/api/v1/namespaces/{VCLUSTER_NS}/serviceaccounts/vc-{name}",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": f"vc-{name}"}},
        field_manager="vcluster-chart",
    )
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{VCLUSTER_NS}"
    admin.apply(
        f"{rbac}/roles/vc-{name}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"vc-{name}"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}],
        },
        field_manager="vcluster-chart",
    )
    admin.apply(
        f"{rbac}/rolebindings/vc-{name}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"vc-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"vc-{name}"},
            "subjects": [{"kind": "ServiceAccount", "name": f"vc-{name}", "namespace": VCLUSTER_NS}],
        },
        field_manager="vcluster-chart",
    )


@pytest.fixture(scope="module")
def target_controller(
    installed: KubeClient, control_plane: envtest.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    """The controller with the chart's rights and ``--target-namespaces`` as the page says."""
    namespace(installed, TARGETS)
    workdir = tmp_path_factory.mktemp("vcluster-controller")
    kubeconfig = install.controller_kubeconfig(
        installed,
        url=control_plane.url,
        ca=control_plane.pki.ca_cert,
        path=workdir / "kubeconfig",
        target_namespaces=[TARGETS],
    )
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir, extra=["--target-namespaces", TARGETS])
    try:
        yield handle
    finally:
        stop_controller(handle)


@pytest.fixture(scope="module")
def host_pool(kubeconfig: Path) -> Iterator[ClientPool]:
    pool = ClientPool.from_kubeconfig(str(kubeconfig))
    try:
        yield pool
    finally:
        pool.close()


def ready(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    found = condition(obj or {})
    return obj if found and found["status"] == "True" else None


def impersonated_writes(events: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e.get("stage") == "ResponseComplete"
        and (e.get("impersonatedUser") or {}).get("username") == user
        and e.get("verb") in ("create", "update", "patch")
        and "dryRun=All" not in e.get("requestURI", "")
        and 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300
    ]


def test_the_vcluster_recipe_runs_as_written(
    target_controller: ControllerProcess,
    installed: KubeClient,
    host_pool: ClientPool,
    git_server: GitServer,
    remote: envtest.ControlPlane,
    remote_admin: KubeClient,
) -> None:
    page = blocks()
    assert set(page) == {"vcluster-inside", "vcluster-values", "vcluster-host", "vcluster-stageset"}, (
        page.keys()
    )
    # Inside the vcluster: the tenant's namespaces and deployer, and the impersonation role.
    for language, body in page["vcluster-inside"]:
        apply_block(remote_admin, language, body)
    # vcluster itself on the host (its chart's part), and what its values say it exports.
    values = yaml.safe_load(page["vcluster-values"][0][1])
    vcluster_host_account(installed, name="shop")
    export = VClusterExport(
        name="shop",
        namespace=VCLUSTER_NS,
        values=values,
        plane=remote,
        virtual=remote_admin,
        host_pool=host_pool,
    )
    exported = [s for s in export.secrets() if s.namespace == TARGETS]
    assert [(s.name, bool(s.properties.get("server"))) for s in exported] == [("vc-shop", True)]
    # On the host: the tenant, the Role for vcluster's account, the StageTarget (its Secret not yet).
    for language, body in page["vcluster-host"]:
        apply_block(installed, language, body)
    repo = git_server.create_repo("vcluster-shop", {"app/cm.yaml": cm("shop-config", "one")})
    installed.apply(
        f"/apis/stages.metio.wtf/v1/namespaces/{TENANT_NS}/gitrepositories/shop-app",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "shop-app", "namespace": TENANT_NS},
            "spec": {"url": repo, "ref": {"branch": "main"}, "interval": "1m"},
        },
        field_manager="test",
    )
    (stageset,) = apply_block(installed, "yaml", page["vcluster-stageset"][0][1])
    path = _path(stageset)
    target = f"/apis/stages.metio.wtf/v1/namespaces/{TARGETS}/stagetargets/shop-vcluster"

    # Before vcluster exported anything: the StageSet waits, the target says why, the vcluster
    # hears nothing.
    def waiting() -> dict[str, Any] | None:
        found = condition(installed.get(path))
        return found if found and found["reason"] == "ClusterUnreachable" else None

    waits = wait_for(waiting, what="the StageSet waiting for its target")
    assert "StageTarget stageset-targets/shop-vcluster is not ready: its cluster is not available yet" \
        in waits["message"], waits
    assert wait_for(
        lambda: (c := condition(installed.get(target))) and c["reason"] == "SecretNotFound" and c,
        what="the StageTarget saying SecretNotFound",
    )
    before = len(remote.audit_events())
    time.sleep(3)  # vcluster writes its export some seconds after the StageTarget exists
    assert not impersonated_writes(remote.audit_events()[before:], DEPLOYER)

    # vcluster writes the Secret (as its own host account, allowed by the page's Role): Ready with
    # no edit, applied inside the vcluster as the tenant's deployer, through the scoped account.
    generation = installed.get(path)["metadata"]["generation"]
    export.publish()
    wait_for(lambda: ready(installed.get(path)), timeout=60, what="the StageSet Ready once the Secret exists")
    live = remote_admin.get(f"/api/v1/namespaces/{WORKLOAD_NS}/configmaps/shop-config")
    assert live["data"] == {"k": "one"}
    time.sleep(1)  # let the audit log catch up
    writes = impersonated_writes(remote.audit_events(), DEPLOYER)
    assert writes, "the writes inside the vcluster impersonate the tenant's deployer"
    assert {e["user"]["username"] for e in writes} == {"system:serviceaccount:kube-system:stageset-agent"}
    assert get_or_none(installed, f"/api/v1/namespaces/{WORKLOAD_NS}/configmaps/shop-config") is None
    observed = installed.get(target)["status"]["observedSecretVersion"]

    # vcluster re-exports with a new token; the old one is revoked.  No edit anywhere: the next
    # commit reaches the vcluster through the new credential.
    export.rotate()
    wait_for(
        lambda: installed.get(target)["status"].get("observedSecretVersion") != observed or None,
        what="the StageTarget reading the re-exported Secret",
    )
    seen = len(remote.audit_events())
    git_server.commit("vcluster-shop", {"app/cm.yaml": cm("shop-config", "two")})
    installed.request(
        "PATCH",
        f"/apis/stages.metio.wtf/v1/namespaces/{TENANT_NS}/gitrepositories/shop-app",
        content_type="application/merge-patch+json",
        body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": str(time.time())}}},
    )
    wait_for(
        lambda: (
            remote_admin.get(f"/api/v1/namespaces/{WORKLOAD_NS}/configmaps/shop-config")["data"]
            == {"k": "two"}
            or None
        ),
        timeout=90,
        what="the next commit applied after the rotation",
    )
    assert installed.get(path)["metadata"]["generation"] == generation, "the StageSet was not edited"
    time.sleep(1)
    after = impersonated_writes(remote.audit_events()[seen:], DEPLOYER)
    assert after, "writes made after the rotation"
    assert all(e["user"]["username"] == "system:serviceaccount:kube-system:stageset-agent" for e in after)
    # Whatever the controller tried with the revoked token, it did not stay on it: Ready again.
    assert wait_for(lambda: ready(installed.get(path)), what="Ready after the rotation")


def test_a_rotated_client_certificate_reconnects_with_no_edit(
    target_controller: ControllerProcess,
    installed: KubeClient,
    host_pool: ClientPool,
    git_server: GitServer,
    remote: envtest.ControlPlane,
    remote_admin: KubeClient,
    make_tenant: Callable[..., Any],
) -> None:
    """vcluster's default export: its admin client certificate, the Secret in the target namespace.
    After a rotation (the old certificate's user loses its rights) the next commit lands as the new
    certificate's user, with nothing edited."""
    tenant = make_tenant("vc-cert", service_account="stageset-deployer")
    tenant.bind_cluster_role("stageset-tenant-deployer")
    install.create_tenant(
        remote_admin,
        namespace=tenant.namespace,
        service_account=tenant.service_account,
        cluster_role="stageset-tenant-deployer",
    )
    install.install(remote_admin)  # the tenant roles, as on any cluster the chart serves
    vcluster_host_account(installed, name="certs")
    values = {
        "exportKubeConfig": {
            "additionalSecrets": [
                {"name": "vc-certs", "namespace": TARGETS, "server": "https://certs.shop-vcluster.svc:443"}
            ]
        }
    }
    export = VClusterExport(
        name="certs",
        namespace=VCLUSTER_NS,
        values=values,
        plane=remote,
        virtual=remote_admin,
        host_pool=host_pool,
    )
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{TARGETS}"
    installed.apply(
        f"{rbac}/roles/vcluster-certs-export",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "vcluster-certs-export"},
            "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get", "update", "patch"]}
            ],
        },
        field_manager="test",
    )
    installed.apply(
        f"{rbac}/rolebindings/vcluster-certs-export",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "vcluster-certs-export"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "vcluster-certs-export",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "vc-certs", "namespace": VCLUSTER_NS}],
        },
        field_manager="test",
    )
    export.publish()
    installed.apply(
        f"/apis/stages.metio.wtf/v1/namespaces/{TARGETS}/stagetargets/certs",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageTarget",
            "metadata": {"name": "certs", "namespace": TARGETS},
            "spec": {
                "kubeConfig": {"secretRef": {"name": "vc-certs", "key": "config"}},
                "allowedNamespaces": [tenant.namespace],
            },
        },
        field_manager="test",
    )
    repo = git_server.create_repo("vcluster-certs", {"app/cm.yaml": cm("certs-config", "one")})
    ns = tenant.namespace
    installed.apply(
        f"/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories/app",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": ns},
            "spec": {"url": repo, "ref": {"branch": "main"}, "interval": "1m"},
        },
        field_manager="test",
    )
    path = f"/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/certs"
    installed.apply(
        path,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "certs", "namespace": ns},
            "spec": {
                "serviceAccountName": "stageset-deployer",
                "targetRef": {"name": "certs", "namespace": TARGETS},
                "stages": [{"name": "app", "sourceRef": {"name": "app"}, "path": "./app"}],
            },
        },
        field_manager="test",
    )
    wait_for(lambda: ready(installed.get(path)), timeout=60, what="the StageSet Ready on the vcluster")
    assert remote_admin.get(f"/api/v1/namespaces/{ns}/configmaps/certs-config")["data"] == {"k": "one"}
    generation = installed.get(path)["metadata"]["generation"]

    export.rotate()
    seen = len(remote.audit_events())
    git_server.commit("vcluster-certs", {"app/cm.yaml": cm("certs-config", "two")})
    installed.request(
        "PATCH",
        f"/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories/app",
        content_type="application/merge-patch+json",
        body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": str(time.time())}}},
    )
    wait_for(
        lambda: (
            remote_admin.get(f"/api/v1/namespaces/{ns}/configmaps/certs-config")["data"] == {"k": "two"}
            or None
        ),
        timeout=90,
        what="the next commit applied after the rotation",
    )
    time.sleep(1)
    after = impersonated_writes(remote.audit_events()[seen:], tenant.username)
    assert after, "writes made after the rotation"
    assert {e["user"]["username"] for e in after} == {"vcluster-certs-admin-1"}
    assert installed.get(path)["metadata"]["generation"] == generation, "the StageSet was not edited"
