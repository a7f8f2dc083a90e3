"""The CRDs upgrade whoever applied them: ``helm install`` and ``helm upgrade`` with no extra flags after
every way the CRDs reach a cluster, with the real ``helm`` and a real apiserver.

The chart applies the CRDs in a pre-install/pre-upgrade hook Job (``stageset crds --apply``: field
manager ``stageset``, forced); :mod:`tests.helm.hooks` plays that Job as its own ServiceAccount (no
kubelet here).  Each path first applies a *different* schema (this version's plus one property, as
an older or newer binary would), so that a plain server-side apply of this version's schema would
conflict on ``.spec.versions`` -- the failure the hook exists to prevent.

One control plane of its own (each path deletes the CRDs first, which would delete every StageSet of
a shared one).  Identity: helm and the set-up act as ``system:masters``; the hook as its ServiceAccount.
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.api.common import GROUP
from stageset.api.crd import KINDS, VERSION_ANNOTATION, custom_resource_definition
from stageset.api.rbac import aggregated_cluster_roles
from stageset.cli.crds import FIELD_MANAGER, apply_crds, newer
from stageset.cli.demo import ensure_crds
from stageset.envtest import server as envtest
from stageset.envtest.kubectl import ensure_kubectl
from stageset.kube.client import ApiError, ClientPool, KubeClient
from tests.helm.chart import CHART, Helm
from tests.helm.hooks import HookedRun, Plane, helm_with_hooks

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
EXTRA = "retiredField"


@dataclass
class Cluster:
    plane: envtest.ControlPlane
    admin: KubeClient
    helm: Helm
    hooks: Plane

    def kubectl(self, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ensure_kubectl(log=False)), *args], input=stdin, capture_output=True,
                              text=True, timeout=120, check=False,
                              env={**os.environ, "KUBECONFIG": str(self.plane.kubeconfig)})


@pytest.fixture(scope="module")
def cluster(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("crd-paths")
    try:
        plane = envtest.start()
    except Exception as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the control plane could not start under CI: {error}", pytrace=False)
        pytest.skip(f"control plane unavailable: {error}")
    pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
    try:
        admin = pool.client()
        yield Cluster(plane=plane, admin=admin,
                      helm=Helm(binary=helm_binary, home=workdir / "helm", kubeconfig=plane.kubeconfig),
                      hooks=Plane(admin=admin, server=plane.url, ca_cert=plane.pki.ca_cert, workdir=workdir))
    finally:
        pool.close()
        plane.stop()


def other_schema() -> list[dict[str, Any]]:
    """This version's CRDs with one more property in the StageSet spec (a different ``.spec.versions``)."""
    crds = [custom_resource_definition(kind) for kind in KINDS]
    for crd in crds:
        for version in crd["spec"]["versions"]:
            spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
            spec["properties"][EXTRA] = {"type": "string", "description": "in another version's schema"}
    return crds


def live_crd(admin: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return admin.get(f"{CRDS}/{name}")
    except ApiError as error:
        if error.not_found:
            return None
        raise


def wait_served(admin: KubeClient) -> None:
    """Wait until every live CRD's objects can be listed from the watch cache.

    A CRD deleted while its watch cache is still (re)initializing -- as it is for a moment after each
    create or schema change -- makes the apiserver's finalizer fail to list its instances ("storage
    is (re)initializing") and back off for minutes (operator-framework/operator-controller#1437).
    """
    deadline = time.monotonic() + 120
    for kind in KINDS:
        if live_crd(admin, kind.crd_name) is None:
            continue
        while (refused := list_error(admin, kind.plural)) is not None:
            assert time.monotonic() < deadline, f"{kind.plural} never served: {refused}"
            time.sleep(0.2)


def list_error(admin: KubeClient, plural: str) -> ApiError | None:
    try:
        admin.get(f"/apis/{GROUP}/v1/{plural}?resourceVersion=0&limit=1")
    except ApiError as error:
        return error
    return None


def delete_crds(admin: KubeClient) -> None:
    wait_served(admin)
    for kind in KINDS:
        try:
            admin.request("DELETE", f"{CRDS}/{kind.crd_name}")
        except ApiError as error:
            if not error.not_found:
                raise
    # The apiextensions controller empties each CRD first: slow at the suite's loaded end.
    deadline = time.monotonic() + 180
    while any(live_crd(admin, kind.crd_name) for kind in KINDS):
        assert time.monotonic() < deadline, "the CRDs were not deleted"
        time.sleep(0.2)


def as_yaml(crds: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(crd) for crd in crds)


def by_kubectl_server_side(cluster: Cluster) -> str:
    """As docs/install.md advised: ``stageset crds | kubectl apply --server-side -f -`` (kubectl)."""
    applied = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                              stdin=as_yaml(other_schema()))
    assert applied.returncode == 0, applied.stderr
    return "kubectl"


def by_kubectl_client_side(cluster: Cluster) -> str:
    """By hand: ``kubectl apply -f crds/`` (client-side: manager kubectl-client-side-apply, an Update)."""
    applied = cluster.kubectl("apply", "-f", "-", stdin=as_yaml(other_schema()))
    assert applied.returncode == 0, applied.stderr
    return "kubectl-client-side-apply"


def by_kubectl_replace(cluster: Cluster) -> str:
    """By hand: ``kubectl create`` first, ``kubectl replace`` later (manager kubectl-create / -replace)."""
    present = all(live_crd(cluster.admin, kind.crd_name) for kind in KINDS)
    verb = "replace" if present else "create"
    if present:  # replace needs the live resourceVersion-free object: kubectl takes it as is
        applied = cluster.kubectl("replace", "-f", "-", stdin=as_yaml(other_schema()))
    else:
        applied = cluster.kubectl("create", "-f", "-", stdin=as_yaml(other_schema()))
    assert applied.returncode == 0, applied.stderr
    return f"kubectl-{verb}"


def by_make_run(cluster: Cluster) -> str:
    """``make run --kubeconfig`` (stageset.cli.demo.ensure_crds: what is missing, this version's schema)
    -- then an older ``make run`` that applied as ``stageset-run``.  Beside them the aggregate roles
    ``stageset-edit`` / ``-view`` as the local harness creates them (owned by no release: the chart
    once refused to install over them)."""
    ensure_crds(cluster.admin)
    for role in aggregated_cluster_roles():
        cluster.admin.apply(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}",
                            role, field_manager="stageset-install")
    for crd in other_schema():
        cluster.admin.apply(f"{CRDS}/{crd['metadata']['name']}", crd, field_manager="stageset-run")
    return "stageset-run"


PATHS: dict[str, Callable[[Cluster], str]] = {
    "kubectl-server-side": by_kubectl_server_side,
    "kubectl-client-side": by_kubectl_client_side,
    "kubectl-create-replace": by_kubectl_replace,
    "make-run": by_make_run,
}


def hooked(cluster: Cluster, *args: str, namespace: str) -> HookedRun:
    run = helm_with_hooks(cluster.helm, cluster.hooks, *args, namespace=namespace)
    assert run.result.returncode == 0, run.result.stderr + "\n".join(p.output for p in run.played)
    return run


def assert_chart_schema(admin: KubeClient) -> None:
    """The apiserver serves exactly this version's schema, applied (and owned) by the one manager."""
    for kind in KINDS:
        live = live_crd(admin, kind.crd_name)
        assert live is not None
        assert live["spec"]["versions"] == custom_resource_definition(kind)["spec"]["versions"]
        assert VERSION_ANNOTATION in live["metadata"]["annotations"]
        owners = [m for m in live["metadata"]["managedFields"]
                  if "f:versions" in (m.get("fieldsV1") or {}).get("f:spec", {})]
        assert [(m["manager"], m["operation"]) for m in owners] == [(FIELD_MANAGER, "Apply")], owners


@pytest.mark.parametrize("path", list(PATHS))
def test_install_and_upgrade_take_over_the_crds_from_whoever_applied_them(cluster: Cluster,
                                                                          path: str) -> None:
    """A trial ``helm install`` with no extra flags on a cluster whose CRDs another path applied (with
    another schema), then the path applies again and ``helm upgrade`` succeeds: both times the
    hook brings this version's schema and leaves one owner of ``.spec.versions``."""
    delete_crds(cluster.admin)
    apply = PATHS[path]
    manager = apply(cluster)
    stagesets = live_crd(cluster.admin, "stagesets.stages.metio.wtf")
    assert stagesets is not None
    assert any(m["manager"] == manager for m in stagesets["metadata"]["managedFields"])
    # What the hook prevents: this version's schema applied without force conflicts with that manager
    # (a client-side apply and kubectl create/replace are Updates, which SSA treats the same).
    with pytest.raises(ApiError) as conflict:
        cluster.admin.apply(f"{CRDS}/stagesets.stages.metio.wtf", custom_resource_definition(KINDS[0]),
                            field_manager="helm", force=False)
    assert conflict.value.status == 409, conflict.value
    release, namespace = f"crds-{path}"[:40], f"crds-{path}"[:40]
    installed = hooked(cluster, "install", release, str(CHART), "--namespace", namespace,
                       "--create-namespace", namespace=namespace)
    assert [p.job for p in installed.played] == [f"{release}-stageset-crds"]
    assert installed.played[0].command == ["stageset", "crds", "--apply", "--tenant-roles"]
    assert_chart_schema(cluster.admin)
    # The hook objects are gone once it succeeded (its rights last only as long as it runs).
    for hook_path in (f"/api/v1/namespaces/{namespace}/serviceaccounts/{release}-stageset-crds",
                      f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{namespace}-{release}-stageset-crds"):
        with pytest.raises(ApiError, match="not found"):
            cluster.admin.get(hook_path)

    apply(cluster)
    assert EXTRA in str(live_crd(cluster.admin, "stagesets.stages.metio.wtf"))
    upgraded = hooked(cluster, "upgrade", release, str(CHART), "--namespace", namespace, namespace=namespace)
    assert len(upgraded.played) == 1
    assert_chart_schema(cluster.admin)
    cluster.helm.run("uninstall", release, "--namespace", namespace)
    assert all(live_crd(cluster.admin, kind.crd_name) for kind in KINDS)  # never deleted by Helm


def test_a_fresh_cluster_gets_the_crds_from_the_hook_with_its_narrow_rights(cluster: Cluster) -> None:
    """No CRDs at all: the hook creates them (server-side apply authorizes a create by the CRD's name,
    so the hook's role names exactly our CRDs); the same rights refuse every other CRD."""
    delete_crds(cluster.admin)
    release = namespace = "fresh"
    run = hooked(cluster, "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
                 namespace=namespace)
    assert "created stagesets.stages.metio.wtf" in run.played[0].output
    assert_chart_schema(cluster.admin)
    cluster.helm.run("uninstall", release, "--namespace", namespace)


def test_the_hook_role_names_only_our_crds(helm: Helm) -> None:
    from tests.helm.chart import find

    docs = helm.render()
    role = next(d for d in find(docs, "ClusterRole") if d["metadata"]["name"].endswith("-crds"))
    # By default (rbac.tenantRoles) also the tenants' two shared ClusterRoles, by name
    # (test_values.py: test_the_tenant_roles_are_applied_by_the_crd_hook_with_escalate_on_their_names_only).
    assert role["rules"][0] == {
        "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
        "resourceNames": [kind.crd_name for kind in KINDS],
        "verbs": ["get", "create", "patch"]}
    assert [r["resourceNames"] for r in role["rules"][1:]] == [
        ["stageset-tenant-deployer", "stageset-tenant-admin"]]
    without = helm.render("--set", "rbac.tenantRoles=false")
    role = next(d for d in find(without, "ClusterRole") if d["metadata"]["name"].endswith("-crds"))
    assert role["rules"] == [{
        "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
        "resourceNames": [kind.crd_name for kind in KINDS],
        "verbs": ["get", "create", "patch"]}]
    assert role["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert not find(docs, "CustomResourceDefinition")  # never an object of the release
    assert not find(helm.render("--set", "crds.install=false"), "Job")


def test_a_newer_version_s_crds_are_kept(cluster: Cluster) -> None:
    """Two releases of different versions on one cluster: the older one's hook never downgrades."""
    apply_crds(cluster.admin, version="0.3.0")
    newest = copy.deepcopy(other_schema()[0])
    newest["metadata"]["annotations"] = {VERSION_ANNOTATION: "99.0.0"}
    cluster.admin.apply(f"{CRDS}/{newest['metadata']['name']}", newest, field_manager=FIELD_MANAGER)
    said = apply_crds(cluster.admin, version="0.3.0")
    assert said[0] == ("kept stagesets.stages.metio.wtf: its schema is of stageset 99.0.0, newer than 0.3.0")
    assert EXTRA in str(live_crd(cluster.admin, "stagesets.stages.metio.wtf"))
    assert said[1].startswith("applied gitrepositories")
    assert apply_crds(cluster.admin, version="100.0")[0].startswith("upgraded stagesets")
    assert EXTRA not in str(live_crd(cluster.admin, "stagesets.stages.metio.wtf"))


@pytest.mark.parametrize(("live", "ours", "kept"), [
    ("0.4.0", "0.3.0", True), ("0.3.0", "0.3.0", False), ("0.2.9", "0.3.0", False),
    ("1.0", "0.9.9", True), ("", "0.3.0", False), ("0.4.0rc1", "0.3.0", False),
    ("0.4.0", "unknown", False), ("v0.10.0", "0.9.0", True),
])
def test_which_version_wins(live: str, ours: str, kept: bool) -> None:
    assert newer(live, ours) is kept
