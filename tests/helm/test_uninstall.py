"""Uninstalling never strands a finalizer: ``stageset uninstall`` (dry run, ``--keep-objects``,
``--teardown``), the cleanup hook's ``--release-remaining``, and the one command that releases a
StageSet deleted after its controller is gone -- with releases installed by the real ``helm`` into a
real apiserver, and the controllers run as the installed Deployments would run them.

One control plane of its own; each test installs its own release for its own tenant namespace:
``keep`` (``--keep-objects``), ``tear`` (``--teardown``), ``gone`` (``helm uninstall`` first, then
a StageSet deleted).  There is no kubelet here: the CRD hook is played (tests/helm/hooks.py) and
the controller runs as a process with a token of the release's ServiceAccount and exactly the
Deployment's flags (as tests/helm/test_install.py does).

Identity: helm, ``stageset uninstall`` and the set-up act as ``system:masters`` (a platform
engineer); the controllers as their releases' ServiceAccounts; the StageSets apply as the tenant's
``deployer``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.apply.ownership import FINALIZER
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.install import create_tenant
from stageset.envtest.kubectl import ensure_kubectl
from stageset.envtest.server import free_port
from stageset.kube.client import ApiError, ClientPool, KubeClient
from tests.helm.chart import CHART, Helm, controller_args, documents
from tests.helm.hooks import Plane, account_kubeconfig, helm_with_hooks, run_cli

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

STAGESET = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/apps"
GITREPO = "/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories/apps"
CONFIGMAP = "/api/v1/namespaces/{ns}/configmaps/from-git"


@dataclass
class Cluster:
    plane: envtest.ControlPlane
    admin: KubeClient
    helm: Helm
    hooks: Plane
    git_url: str
    git_ca: bytes
    workdir: Path


@pytest.fixture(scope="module")
def cluster(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from tests.gitserver import GitServer

    workdir = tmp_path_factory.mktemp("uninstall")
    try:
        plane = envtest.start()
    except Exception as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the control plane could not start under CI: {error}", pytrace=False)
        pytest.skip(f"control plane unavailable: {error}")
    pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
    try:
        with GitServer(tls=True) as git:
            url = git.create_repo("apps", {
                "app/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-git}\ndata: {k: v}\n"})
            assert git.ca_pem is not None
            admin = pool.client()
            yield Cluster(plane=plane, admin=admin,
                          helm=Helm(binary=helm_binary, home=workdir / "helm", kubeconfig=plane.kubeconfig),
                          hooks=Plane(admin=admin, server=plane.url, ca_cert=plane.pki.ca_cert,
                                      workdir=workdir),
                          git_url=url, git_ca=git.ca_pem, workdir=workdir)
    finally:
        pool.close()
        plane.stop()


def get_or_none(admin: KubeClient, path: str) -> dict[str, Any] | None:
    try:
        return admin.get(path)
    except ApiError as error:
        if error.not_found:
            return None
        raise


def wait_for(check: Any, *, timeout: float = 90.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


@dataclass
class Installed:
    release: str
    namespace: str
    tenant: str
    manifest: list[dict[str, Any]]

    @property
    def account(self) -> str:
        return f"{self.release}-stageset"


def install(cluster: Cluster, release: str, *values: str) -> Installed:
    """Release ``release`` in ``<release>-system`` watching the tenant namespace ``<release>-team``, with
    a StageSet there (a GitRepository with the Git server's CA, applied as ``deployer``)."""
    namespace, tenant = f"{release}-system", f"{release}-team"
    create_tenant(cluster.admin, namespace=tenant, service_account="deployer")
    cluster.admin.apply(f"/api/v1/namespaces/{tenant}/secrets/git-ca", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-ca", "namespace": tenant},
        "stringData": {"caFile": cluster.git_ca.decode()}}, field_manager="test")
    run = helm_with_hooks(cluster.helm, cluster.hooks, "install", release, str(CHART),
                          "--namespace", namespace, "--create-namespace",
                          "--set", f"controller.watchNamespaces={{{tenant}}}", *values, namespace=namespace)
    assert run.result.returncode == 0, run.result.stderr
    aggregate_cluster_roles(cluster.admin)
    cluster.admin.apply(GITREPO.format(ns=tenant), {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": "apps", "namespace": tenant},
        "spec": {"url": cluster.git_url, "ref": {"branch": "main"}, "secretRef": {"name": "git-ca"},
                 "serviceAccountName": "deployer"}}, field_manager="test")
    cluster.admin.apply(STAGESET.format(ns=tenant), {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "apps", "namespace": tenant},
        "spec": {"serviceAccountName": "deployer",
                 "stages": [{"name": "app", "sourceRef": {"name": "apps"}, "path": "./app"}]}},
        field_manager="test")
    manifest = documents(cluster.helm.run("get", "manifest", release, "--namespace", namespace).stdout)
    return Installed(release=release, namespace=namespace, tenant=tenant, manifest=manifest)


class Controller:
    """The release's controller, run as its Deployment would run it (see the module docstring)."""

    def __init__(self, cluster: Cluster, installed: Installed):
        args = []
        for arg in controller_args(installed.manifest):
            flag, _, _ = arg.partition("=")
            if flag == "--mirror-dir":
                arg = f"--mirror-dir={cluster.workdir / (installed.release + '-mirrors')}"
            elif flag in ("--probe-address", "--metrics-address"):
                arg = f"{flag}=127.0.0.1:{free_port()}"
            args.append(arg)
        kubeconfig = account_kubeconfig(cluster.hooks, installed.namespace, installed.account)
        self.log = cluster.workdir / f"{installed.release}.log"
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stageset.cli", "controller", "--kubeconfig", str(kubeconfig), *args],
                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(cluster.workdir)})

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        sys.stderr.write(f"\n--- controller log (tail) ---\n{self.log.read_text(errors='replace')[-2000:]}\n")


def ready(cluster: Cluster, tenant: str) -> bool:
    obj = get_or_none(cluster.admin, STAGESET.format(ns=tenant)) or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def reconciled(cluster: Cluster, installed: Installed) -> None:
    """The release's controller makes the StageSet Ready (finalizer on, ConfigMap applied), then stops."""
    controller = Controller(cluster, installed)
    try:
        wait_for(lambda: ready(cluster, installed.tenant), what=f"{installed.tenant}/apps Ready")
    finally:
        controller.stop()
    assert FINALIZER in cluster.admin.get(STAGESET.format(ns=installed.tenant))["metadata"]["finalizers"]
    assert get_or_none(cluster.admin, CONFIGMAP.format(ns=installed.tenant)) is not None


def uninstall(cluster: Cluster, installed: Installed, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli("uninstall", "--release", installed.release, "-n", installed.namespace,
                   "--helm-binary", str(cluster.helm.binary), *flags, kubeconfig=cluster.plane.kubeconfig)


def helm_knows(cluster: Cluster, installed: Installed) -> bool:
    statuses = ("--deployed", "--failed", "--pending", "--uninstalling", "--uninstalled")  # any state
    listed = yaml.safe_load(cluster.helm.run("list", "--all-namespaces", *statuses, "-o", "yaml").stdout)
    return any(r["name"] == installed.release and r["namespace"] == installed.namespace for r in listed or [])


def release_objects_gone(cluster: Cluster, installed: Installed) -> None:
    assert not helm_knows(cluster, installed)
    for path in (f"/apis/apps/v1/namespaces/{installed.namespace}/deployments/{installed.account}",
                 f"/api/v1/namespaces/{installed.namespace}/serviceaccounts/{installed.account}",
                 f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{installed.namespace}-{installed.account}-controller",
                 f"/apis/rbac.authorization.k8s.io/v1/namespaces/{installed.tenant}/rolebindings/"
                 f"{installed.namespace}-{installed.account}-controller",
                 f"/apis/coordination.k8s.io/v1/namespaces/{installed.namespace}/leases/{installed.account}"):
        assert get_or_none(cluster.admin, path) is None, path
    secrets = cluster.admin.request("GET", f"/api/v1/namespaces/{installed.namespace}/secrets",
                                    query={"labelSelector": f"owner=helm,name={installed.release}"})
    assert not secrets["items"]


def test_keep_objects_releases_every_stageset_and_keeps_what_it_applied(cluster: Cluster) -> None:
    installed = install(cluster, "keep")
    reconciled(cluster, installed)
    manifest_before = [d["kind"] for d in installed.manifest]

    dry = uninstall(cluster, installed, "--keep-objects")
    assert dry.returncode == 0, dry.stderr
    assert f"would suspend, then drop the finalizer of StageSet {installed.tenant}/apps" in dry.stdout
    assert f"would delete Deployment {installed.namespace}/{installed.account}" in dry.stdout
    assert "dry run: nothing changed; pass --yes to uninstall" in dry.stdout
    assert helm_knows(cluster, installed)  # a dry run changes nothing
    assert FINALIZER in cluster.admin.get(STAGESET.format(ns=installed.tenant))["metadata"]["finalizers"]

    undecided = uninstall(cluster, installed, "--yes")
    assert undecided.returncode == 3
    assert "1 StageSet(s) would be left with a finalizer no controller removes: choose --keep-objects" in \
        undecided.stderr
    assert helm_knows(cluster, installed)

    done = uninstall(cluster, installed, "--keep-objects", "--yes")
    sys.stderr.write(f"\nstageset uninstall --keep-objects:\n{done.stdout}{done.stderr}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"released StageSet {installed.tenant}/apps (suspended; what it applied stays)" in done.stdout
    stageset = cluster.admin.get(STAGESET.format(ns=installed.tenant))
    assert stageset["spec"]["suspend"] is True
    assert FINALIZER not in (stageset["metadata"].get("finalizers") or [])
    release_objects_gone(cluster, installed)
    assert "Deployment" in manifest_before
    # Deleted later, it goes at once, and what it applied stays.
    cluster.admin.request("DELETE", STAGESET.format(ns=installed.tenant))
    assert get_or_none(cluster.admin, STAGESET.format(ns=installed.tenant)) is None
    assert get_or_none(cluster.admin, CONFIGMAP.format(ns=installed.tenant)) is not None
    # The CRDs stay (no release owns them).
    assert cluster.admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                             "stagesets.stages.metio.wtf")


def test_teardown_deletes_what_the_stagesets_applied_then_the_release(cluster: Cluster) -> None:
    installed = install(cluster, "tear")
    reconciled(cluster, installed)
    # Without a running controller the teardown cannot finish: it says so and removes nothing.
    stalled = uninstall(cluster, installed, "--teardown", "--yes", "--timeout", "1s")
    assert stalled.returncode == 3
    assert "1 StageSet(s) still being torn down (tear-team/apps); the release is left in place" in \
        stalled.stderr
    assert helm_knows(cluster, installed)
    controller = Controller(cluster, installed)
    try:
        done = uninstall(cluster, installed, "--teardown", "--yes", "--timeout", "90s")
    finally:
        controller.stop()
    sys.stderr.write(f"\nstageset uninstall --teardown:\n{done.stdout}{done.stderr}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every StageSet is gone" in done.stdout
    assert get_or_none(cluster.admin, STAGESET.format(ns=installed.tenant)) is None
    assert get_or_none(cluster.admin, CONFIGMAP.format(ns=installed.tenant)) is None  # torn down
    release_objects_gone(cluster, installed)


def test_a_stageset_deleted_after_its_controller_is_gone_is_released_by_one_command(cluster: Cluster) -> None:
    """The trap: ``helm uninstall`` without the hook, then a StageSet deleted -- it sticks in
    Terminating.  docs/install.md's one command releases it (what it applied stays)."""
    installed = install(cluster, "gone")
    reconciled(cluster, installed)
    cluster.helm.run("uninstall", installed.release, "--namespace", installed.namespace)
    cluster.admin.request("DELETE", STAGESET.format(ns=installed.tenant))
    stuck = cluster.admin.get(STAGESET.format(ns=installed.tenant))
    assert stuck["metadata"]["deletionTimestamp"]
    # The command as docs/install.md prints it.
    page = (CHART.parents[1] / "docs" / "install.md").read_text()
    command = re.search(r"^kubectl patch stageset (.+)$", page, re.MULTILINE)
    assert command, "docs/install.md lost the one command"
    args = command.group(0).split(" ", 1)[1].replace("<name>", "apps").replace("<namespace>",
                                                                                 installed.tenant)
    ran = subprocess.run([str(ensure_kubectl(log=False)), *split(args)], capture_output=True, text=True,
                         timeout=120, check=False,
                         env={**os.environ, "KUBECONFIG": str(cluster.plane.kubeconfig)})
    assert ran.returncode == 0, ran.stderr
    assert get_or_none(cluster.admin, STAGESET.format(ns=installed.tenant)) is None
    assert get_or_none(cluster.admin, CONFIGMAP.format(ns=installed.tenant)) is not None


def split(command: str) -> list[str]:
    import shlex

    return shlex.split(command)


def test_the_cleanup_hook_releases_what_is_left_at_its_timeout(cluster: Cluster) -> None:
    """The hook's command never fails ``helm uninstall`` (which would leave the release
    ``uninstalling``): with no controller to tear down, at its timeout it drops the finalizer and
    exits 0, naming the StageSet."""
    installed = install(cluster, "hook")
    reconciled(cluster, installed)
    ran = run_cli("cleanup", "--namespaces", installed.tenant, "--timeout", "1s", "--release-remaining",
                  kubeconfig=cluster.plane.kubeconfig)
    assert ran.returncode == 0, ran.stderr
    assert f"released StageSet {installed.tenant}/apps after 1s: what it applied stays" in ran.stdout
    assert get_or_none(cluster.admin, STAGESET.format(ns=installed.tenant)) is None
    assert get_or_none(cluster.admin, CONFIGMAP.format(ns=installed.tenant)) is not None


def test_an_interrupted_install_kept_in_configmaps_is_uninstalled_without_phantoms_or_leftover_hooks(
        cluster: Cluster) -> None:
    """``helm install`` killed while it waits for the CRD hook (a pod that never starts): the release
    stays ``pending-install`` in Helm's ConfigMap driver, none of its own objects exists, and the
    hook's Job, ServiceAccount and rights are left.  ``stageset uninstall`` finds the release in
    ConfigMaps, plans and reports no delete of an object that never existed, has ``helm uninstall``
    forget it, and deletes the leftover hook objects."""
    release, namespace, tenant = "halted", "halted-system", "halted-team"
    create_tenant(cluster.admin, namespace=tenant, service_account="deployer")
    env = {**cluster.helm.env(), "HELM_DRIVER": "configmap"}
    values = ["--set", f"controller.watchNamespaces={{{tenant}}}"]
    helm = subprocess.Popen([str(cluster.helm.binary), "install", release, str(CHART), "--namespace",
                             namespace, "--create-namespace", *values], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    job = f"/apis/batch/v1/namespaces/{namespace}/jobs/{release}-stageset-crds"
    try:
        wait_for(lambda: get_or_none(cluster.admin, job), what="the CRD hook Job")
    finally:
        helm.kill()
        helm.communicate(timeout=30)
    hook_objects = [job, f"/api/v1/namespaces/{namespace}/serviceaccounts/{release}-stageset-crds",
                    f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{namespace}-{release}-stageset-crds",
                    f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{namespace}-{release}-stageset-crds"]
    for path in hook_objects:
        assert get_or_none(cluster.admin, path) is not None, path
    records = cluster.admin.request("GET", f"/api/v1/namespaces/{namespace}/configmaps",
                                    query={"labelSelector": f"owner=helm,name={release}"})["items"]
    assert [r["metadata"]["labels"]["status"] for r in records] == ["pending-install"]
    installed = Installed(release=release, namespace=namespace, tenant=tenant, manifest=[])
    deployment = f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}-stageset"
    assert get_or_none(cluster.admin, deployment) is None  # the release's own objects were never made

    dry = uninstall(cluster, installed)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would run helm uninstall {release} --namespace {namespace} (driver configmap)" in dry.stdout
    assert f"would delete leftover hook Job {namespace}/{release}-stageset-crds" in dry.stdout
    assert f"would delete leftover hook ClusterRole {namespace}-{release}-stageset-crds" in dry.stdout
    assert "would delete Deployment" not in dry.stdout  # never created: no phantom
    assert f"would delete ServiceAccount {namespace}/{release}-stageset\n" not in dry.stdout

    done = uninstall(cluster, installed, "--yes")
    sys.stderr.write(f"\nstageset uninstall (interrupted install):\n{done.stdout}{done.stderr}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"deleted leftover hook Job {namespace}/{release}-stageset-crds" in done.stdout
    assert "deleted Deployment" not in done.stdout
    for path in hook_objects:
        assert get_or_none(cluster.admin, path) is None, path
    assert not cluster.admin.request("GET", f"/api/v1/namespaces/{namespace}/configmaps",
                                     query={"labelSelector": f"owner=helm,name={release}"})["items"]
