"""The corpus of real layouts (tests/fixtures/layouts), applied end to end as a user would stage them.

Each layout is committed to a real Git server and applied by the controller process
against the real apiserver, as the stages its users would write (infrastructure before
apps, one stage per environment), twice: with the controller in single-tenant
(``--cluster-admin``) mode and StageSets without a ServiceAccount, and in multi-tenant
mode with the chart's RBAC, every write made as a ServiceAccount.  A change to a shared
base re-applies exactly the stages whose builds read it: writes are counted from the
apiserver's audit log, per stage, from the stages' inventories.

No kube-controller-manager runs: a small thread plays the deployment and statefulset
controllers, marking each rollout complete as a kubelet would.

Names: both modes share one control plane, so every namespace and the custom resource
group of a layout get a prefix per mode when committed (``shop-dev`` -> ``ca-shop-dev``).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import (
    GITREPOS,
    STAGESETS,
    WRITE_VERBS,
    ControllerProcess,
    apply,
    condition,
    start_controller,
    stop_controller,
    wait_for,
)
from tests.e2e.stagesets import poke
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

LAYOUTS = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"
CLUSTER_ADMIN, TENANT = "cluster-admin", "tenant"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


# --------------------------------------------------------------------------- fixtures


@dataclass
class Mode:
    name: str
    prefix: str
    controller: ControllerProcess
    controller_user: str

    @property
    def tenants(self) -> bool:
        return self.name == TENANT


def _admin_controller_kubeconfig(admin: KubeClient, control_plane: ControlPlane, path: Path) -> Path:
    """What ``rbac.clusterAdmin: true`` gives the chart's controller: cluster-admin."""
    account = "stageset-admin-controller"
    kubeconfig = install.controller_kubeconfig(admin, url=control_plane.url, ca=control_plane.pki.ca_cert,
                                               path=path, account=account)
    admin.apply(f"{RBAC}/clusterrolebindings/{account}-cluster-admin", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{account}-cluster-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "stageset-system"}]},
        field_manager="e2e-test")
    return kubeconfig


@pytest.fixture(scope="module", params=[CLUSTER_ADMIN, TENANT])
def mode(request: pytest.FixtureRequest, installed: KubeClient, control_plane: ControlPlane,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mode]:
    """One controller process at a time: all tests in cluster-admin mode, then all as tenants."""
    workdir = tmp_path_factory.mktemp(f"layouts-{request.param}")
    if request.param == CLUSTER_ADMIN:
        kubeconfig = _admin_controller_kubeconfig(installed, control_plane, workdir / "kubeconfig")
        handle = start_controller(kubeconfig=kubeconfig, workdir=workdir, extra=["--cluster-admin"])
        user = "system:serviceaccount:stageset-system:stageset-admin-controller"
        prefix = "ca"
    else:
        kubeconfig = install.controller_kubeconfig(installed, url=control_plane.url,
                                                   ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig")
        handle = start_controller(kubeconfig=kubeconfig, workdir=workdir)
        user = "system:serviceaccount:stageset-system:stageset-controller"
        prefix = "tn"
    try:
        yield Mode(request.param, prefix, handle, user)
    finally:
        stop_controller(handle)


@pytest.fixture(scope="module")
def rollouts(installed: KubeClient) -> Iterator[None]:
    """Completes every Deployment and StatefulSet rollout of these tests, as their controllers would."""
    stop = threading.Event()

    def complete(kind: str, obj: dict[str, Any]) -> None:
        metadata, spec = obj["metadata"], obj.get("spec", {})
        if not re.match(r"^(ca|tn)-", metadata["namespace"]) or \
                (obj.get("status") or {}).get("observedGeneration") == metadata["generation"]:
            return
        replicas = spec.get("replicas", 1)
        status: dict[str, Any] = {"observedGeneration": metadata["generation"], "replicas": replicas,
                                  "readyReplicas": replicas, "updatedReplicas": replicas,
                                  "availableReplicas": replicas}
        if kind == "statefulsets":
            revision = f"{metadata['name']}-{metadata['generation']}"
            status.update(currentReplicas=replicas, currentRevision=revision, updateRevision=revision)
        path = f"/apis/apps/v1/namespaces/{metadata['namespace']}/{kind}/{metadata['name']}/status"
        with contextlib.suppress(ApiError):  # deleted meanwhile: the next round sees the new state
            installed.request("PATCH", path, content_type="application/merge-patch+json",
                              body={"status": status})

    def run() -> None:
        while not stop.is_set():
            for kind in ("deployments", "statefulsets"):
                try:
                    items = installed.get(f"/apis/apps/v1/{kind}").get("items", [])
                except ApiError:
                    continue
                for obj in items:
                    complete(kind, obj)
            stop.wait(0.3)

    thread = threading.Thread(target=run, daemon=True, name="rollouts")
    thread.start()
    yield
    stop.set()
    thread.join()


# --------------------------------------------------------------------------- helpers


def layout_files(layout: str, prefix: str) -> dict[str, str]:
    """The layout's files, with namespaces and the custom resource group prefixed for this mode."""
    root = LAYOUTS / layout
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text()
        text = re.sub(r"(\bnamespace:\s*)([a-z][a-z0-9-]*)", rf"\g<1>{prefix}-\g<2>", text)
        if "kind: Namespace" in text:
            text = re.sub(r"(\n  name:\s*)([a-z][a-z0-9-]*)", rf"\g<1>{prefix}-\g<2>", text)
        files[str(path.relative_to(root))] = text.replace("example.com", f"{prefix}.example.com")
    return files


def ensure_namespace(admin: KubeClient, name: str) -> None:
    admin.apply(f"/api/v1/namespaces/{name}", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": name}}, field_manager="e2e-test")


def ensure_account(admin: KubeClient, namespace: str, name: str) -> str:
    ensure_namespace(admin, namespace)
    admin.apply(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}",
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": name, "namespace": namespace}},
                field_manager="e2e-test")
    return f"system:serviceaccount:{namespace}:{name}"


def bind(admin: KubeClient, *, role: str, account: tuple[str, str], namespace: str | None = None) -> None:
    """Grant ClusterRole ``role`` to ``account`` in ``namespace`` (cluster-wide when None)."""
    name = f"{account[0]}-{account[1]}-{role}"
    subject = [{"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    if namespace is None:
        admin.apply(f"{RBAC}/clusterrolebindings/{name}", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name}, "roleRef": ref, "subjects": subject}, field_manager="e2e-test")
    else:
        admin.apply(f"{RBAC}/namespaces/{namespace}/rolebindings/{name}", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace}, "roleRef": ref, "subjects": subject},
            field_manager="e2e-test")


@dataclass
class Deployed:
    """A layout in a Git repository, a GitRepository, and one StageSet applying it."""

    admin: KubeClient
    git: GitServer
    control_plane: ControlPlane
    repo: str
    namespace: str
    name: str
    source: str

    def get(self) -> dict[str, Any]:
        return self.admin.get(f"{STAGESETS.format(ns=self.namespace)}/{self.name}")

    def wait_ready(self, commit: str, timeout: float = 120) -> dict[str, Any]:
        def check() -> Any:
            obj = self.get()
            ready = condition(obj)
            if ready and ready["status"] == "False" and ready["reason"] not in (
                    "DependencyNotReady", "SourceNotReady", "ArtifactNotFound"):
                pytest.fail(f"StageSet {self.name} failed: {ready['reason']}: {ready['message']}")
            if not ready or ready["status"] != "True":
                return None
            return obj if (obj["status"].get("lastAppliedRevision") or "").endswith(commit) else None
        return wait_for(check, timeout=timeout,
                        what=f"StageSet {self.namespace}/{self.name} Ready at {commit}")

    def commit(self, files: dict[str, str | None]) -> str:
        sha = self.git.commit(self.repo, files)
        poke(self.admin, f"{GITREPOS.format(ns=self.namespace)}/{self.source}")
        return sha

    def get_object(self, path: str) -> dict[str, Any]:
        return self.admin.get(path)


def deploy(admin: KubeClient, git: GitServer, control_plane: ControlPlane, *, mode: Mode, layout: str,
           namespace: str, stageset: dict[str, Any], source: str = "app") -> tuple[Deployed, str]:
    files = layout_files(layout, mode.prefix)
    repo = f"{mode.prefix}-{layout}"
    url = git.create_repo(repo, files)
    ensure_namespace(admin, namespace)
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                  "metadata": {"name": source, "namespace": namespace},
                  "spec": {"url": url, "ref": {"branch": "main"}, "interval": "10m"}})
    stageset = {**stageset, "metadata": {**stageset["metadata"], "namespace": namespace}}
    if not mode.tenants:  # single-tenant: StageSets apply as the controller itself
        stageset["spec"].pop("serviceAccountName", None)
        for stage in stageset["spec"]["stages"]:
            stage.pop("serviceAccountName", None)
    apply(admin, stageset)
    deployed = Deployed(admin=admin, git=git, control_plane=control_plane, repo=repo, namespace=namespace,
                        name=stageset["metadata"]["name"], source=source)
    return deployed, git.head(repo)


def stageset_of(name: str, stages: list[dict[str, Any]], *, account: str | None,
                source: str = "app") -> dict[str, Any]:
    spec: dict[str, Any] = {"stages": [{"sourceRef": {"name": source}, **stage} for stage in stages]}
    if account:
        spec["serviceAccountName"] = account
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "metadata": {"name": name}, "spec": spec}


def owners(*stagesets: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """(namespace, name, API group) -> stage, from the inventories in the StageSets' status."""
    found: dict[tuple[str, str, str], str] = {}
    for obj in stagesets:
        for inventory in obj["status"].get("inventory") or []:
            for entry in inventory["entries"]:
                namespace, name, group, _ = entry["id"].split("_", 3)
                found[(namespace, name, group)] = inventory["name"]
    return found


def writes_per_stage(events: list[dict[str, Any]], owned: dict[tuple[str, str, str], str],
                     writers: set[str] | None = None) -> dict[str, int]:
    """Real writes (not dry runs, not status) to each stage's objects; ``writers`` collects who made them."""
    counts: dict[str, int] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("verb") not in WRITE_VERBS or event.get("stage") != "ResponseComplete" or \
                "dryRun=All" in event.get("requestURI", "") or ref.get("subresource"):
            continue
        stage = owned.get((ref.get("namespace", ""), ref.get("name", ""), ref.get("apiGroup", "")))
        if stage is not None:
            counts[stage] = counts.get(stage, 0) + 1
            if writers is not None:
                writers.add(str((event.get("impersonatedUser") or event.get("user") or {}).get("username")))
    return counts


def change_and_count(deployed: Deployed, files: dict[str, str | None], mode: Mode) -> dict[str, int]:
    """Commit ``files``, wait until every stage is applied at the new commit; writes per stage.

    In multi-tenant mode every write must have been made as a ServiceAccount the StageSet
    names, never as the controller itself.
    """
    before = deployed.get()
    assert len(deployed.control_plane.audit_events()) > 0, "the audit log records requests"
    seen = len(deployed.control_plane.audit_events())
    commit = deployed.commit(files)
    after = deployed.wait_ready(commit)
    time.sleep(1)  # let the audit log catch up with the last requests
    later = deployed.control_plane.audit_events()[seen:]
    # Evidence the pass at the new commit looked at its objects: dry-runs of what it would change,
    # or, where nothing it reads changed, the stages' label-selected lists (an unchanged object
    # needs no dry-run once its identity has shown its rights: stageset/apply/rights.py).
    assert any((e.get("verb") == "patch" and "dryRun=All" in e.get("requestURI", "")) or
               (e.get("verb") == "list" and "labelSelector=stages.metio.wtf" in e.get("requestURI", ""))
               for e in later if e.get("stage") == "ResponseComplete"), \
        "the pass at the new commit did look at its objects"
    writers: set[str] = set()
    counts = writes_per_stage(later, owners(before, after), writers)
    if mode.tenants:
        assert mode.controller_user not in writers
        assert all(w.startswith(f"system:serviceaccount:{deployed.namespace}:") for w in writers), writers
    else:
        assert writers <= {mode.controller_user}, writers
    return counts


TenantFactory = Callable[..., Tenant]


# --------------------------------------------------------------------------- the layouts


def test_multitier_app_with_three_overlays_and_a_shared_base(
    mode: Mode, rollouts: None, installed: KubeClient, git_server: GitServer, control_plane: ControlPlane,
) -> None:
    p = mode.prefix
    namespace, account = f"{p}-shop", None
    envs = ("dev", "staging", "production")
    if mode.tenants:  # the shop team's ServiceAccount may edit its three namespaces, nothing more
        ensure_account(installed, namespace, "shop-deployer")
        account = "shop-deployer"
        bind(installed, role="view", account=(namespace, account), namespace=namespace)
    for env in envs:
        ensure_namespace(installed, f"{p}-shop-{env}")
        if account:
            bind(installed, role="edit", account=(namespace, account), namespace=f"{p}-shop-{env}")
    stageset = stageset_of("shop", [{"name": env, "path": f"./deploy/overlays/{env}"} for env in envs],
                           account=account)
    deployed, commit = deploy(installed, git_server, control_plane, mode=mode, layout="multitier",
                              namespace=namespace, stageset=stageset)
    ready = deployed.wait_ready(commit)
    assert [s["phase"] for s in ready["status"]["stages"]] == ["Ready"] * 3
    assert [s["objects"] for s in ready["status"]["stages"]] == [10, 10, 11]
    backend = installed.get(f"/apis/apps/v1/namespaces/{p}-shop-production/deployments/backend")
    assert backend["metadata"]["labels"][f"shop.{p}.example.com/environment"] == "production"
    assert backend["spec"]["replicas"] == 3
    config = backend["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
    generated = installed.get(f"/api/v1/namespaces/{p}-shop-production/configmaps/{config}")
    assert generated["data"]["LOG_FORMAT"] == "json"  # from ../../shared/common.env

    # A base every overlay uses: every stage re-applies.
    base = layout_files("multitier", p)["deploy/bases/backend/deployment.yaml"]
    writes = change_and_count(deployed, {
        "deploy/bases/backend/deployment.yaml": base.replace("value: cache", "value: cache-primary")}, mode)
    assert set(writes) == {"dev", "staging", "production"}, writes
    # A file only the dev overlay reads: only dev re-applies (a new hashed ConfigMap, the
    # Deployment that names it, the old ConfigMap pruned).
    writes = change_and_count(deployed, {"deploy/overlays/dev/config/backend.properties":
                                         "LOG_LEVEL=trace\nFEATURE_RECOMMENDATIONS=true\n"}, mode)
    assert set(writes) == {"dev"}, writes
    assert writes["dev"] >= 3, writes
    # Something no stage reads: nothing is written.
    assert change_and_count(deployed, {"README.md": "# shop, edited\n"}, mode) == {}


def test_flux_style_monorepo_infrastructure_before_apps(
    mode: Mode, rollouts: None, installed: KubeClient, git_server: GitServer, control_plane: ControlPlane,
) -> None:
    p = mode.prefix
    namespace = f"{p}-platform"
    if mode.tenants:
        # The platform's own ServiceAccount installs cluster add-ons; the apps team's gets its
        # rights from infrastructure/configs/tenants (applied by the stage before its own).
        ensure_account(installed, namespace, "infra-deployer")
        bind(installed, role="cluster-admin", account=(namespace, "infra-deployer"))
        ensure_account(installed, namespace, "apps-deployer")
        bind(installed, role="view", account=(namespace, "apps-deployer"), namespace=namespace)
    # The StageSet exactly as the repository's clusters/staging/stageset.yaml writes it.
    documents = list(yaml.safe_load_all(layout_files("monorepo", p)["clusters/staging/stageset.yaml"]))
    (stageset,) = [d for d in documents if d["kind"] == "StageSet"]
    deployed, commit = deploy(installed, git_server, control_plane, mode=mode, layout="monorepo",
                              namespace=namespace, stageset=stageset, source="fleet")
    ready = deployed.wait_ready(commit)
    stages = {s["name"]: s for s in ready["status"]["stages"]}
    assert list(stages) == ["infra-controllers", "infra-configs", "apps"]
    assert all(s["phase"] == "Ready" for s in stages.values())
    widget = installed.get(f"/apis/{p}.example.com/v1/namespaces/{p}-widget-system/widgets/defaults")
    assert widget["spec"] == {"size": 3, "color": "blue"}  # a custom resource after its CRD's stage
    podinfo = installed.get(f"/apis/apps/v1/namespaces/{p}-podinfo/deployments/podinfo")
    assert podinfo["spec"]["template"]["spec"]["containers"][0]["env"] == \
        [{"name": "PODINFO_UI_MESSAGE", "value": "staging build"}]  # apps/staging's patch on ../base

    # The shared app base: only the apps stage re-applies; infrastructure is not touched.
    base = layout_files("monorepo", p)["apps/base/podinfo/deployment.yaml"]
    writes = change_and_count(deployed, {"apps/base/podinfo/deployment.yaml":
                                         base.replace("podinfo:6.7.0", "podinfo:6.7.1")}, mode)
    assert set(writes) == {"apps"}, writes
    podinfo = installed.get(f"/apis/apps/v1/namespaces/{p}-podinfo/deployments/podinfo")
    assert podinfo["spec"]["template"]["spec"]["containers"][0]["image"].endswith("podinfo:6.7.1")
    # Infrastructure configuration: only its stage.
    widget_file = layout_files("monorepo", p)["infrastructure/configs/default-widget.yaml"]
    writes = change_and_count(deployed, {"infrastructure/configs/default-widget.yaml":
                                         widget_file.replace("size: 3", "size: 5")}, mode)
    assert set(writes) == {"infra-configs"}, writes
    # The other cluster's overlay: nothing here reads it.
    assert change_and_count(deployed, {"apps/production/podinfo-patch.yaml": "# moved away\n"}, mode) == {}


def test_plain_manifests_among_readme_scripts_and_ci_files(
    mode: Mode, rollouts: None, installed: KubeClient, git_server: GitServer, control_plane: ControlPlane,
) -> None:
    p = mode.prefix
    namespace, account = f"{p}-guestbook", None
    ensure_namespace(installed, namespace)
    if mode.tenants:
        ensure_account(installed, namespace, "deployer")
        account = "deployer"
        bind(installed, role="edit", account=(namespace, account), namespace=namespace)
    stageset = stageset_of("guestbook", [{"name": "app", "path": "./"}], account=account)
    deployed, commit = deploy(installed, git_server, control_plane, mode=mode, layout="plain",
                              namespace=namespace, stageset=stageset)
    ready = deployed.wait_ready(commit)
    (inventory,) = ready["status"]["inventory"]
    names = sorted(entry["id"].split("_")[1] for entry in inventory["entries"])
    assert names == ["guestbook", "guestbook", "guestbook", "guestbook-api-key", "guestbook-ingress",
                     "guestbook-settings", "redis", "redis"]
    assert installed.get(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/"
                         "guestbook-ingress")["spec"]["policyTypes"] == ["Ingress"]  # from a .json file
    redis = installed.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/redis")
    assert redis["metadata"]["labels"]["app.kubernetes.io/part-of"] == "guestbook"  # addons/ by kustomize


def test_kustomize_components_per_edition(
    mode: Mode, rollouts: None, installed: KubeClient, git_server: GitServer, control_plane: ControlPlane,
) -> None:
    p = mode.prefix
    namespace, account = f"{p}-web", None
    editions = ("community", "enterprise", "dev")
    if mode.tenants:
        ensure_account(installed, namespace, "web-deployer")
        account = "web-deployer"
        bind(installed, role="view", account=(namespace, account), namespace=namespace)
    for edition in editions:
        ensure_namespace(installed, f"{p}-web-{edition}")
        if account:
            bind(installed, role="edit", account=(namespace, account), namespace=f"{p}-web-{edition}")
    # Independent editions: each stage depends on nothing, so they apply concurrently.
    stageset = stageset_of("web", [{"name": e, "path": f"./overlays/{e}", "dependsOn": []} for e in editions],
                           account=account)
    deployed, commit = deploy(installed, git_server, control_plane, mode=mode, layout="components",
                              namespace=namespace, stageset=stageset)
    deployed.wait_ready(commit)
    enterprise = installed.get(f"/apis/networking.k8s.io/v1/namespaces/{p}-web-enterprise/ingresses/web")
    tls_secret = enterprise["spec"]["tls"][0]["secretName"]
    assert installed.get(f"/api/v1/namespaces/{p}-web-enterprise/secrets/{tls_secret}")["type"] == \
        "kubernetes.io/tls"
    with pytest.raises(ApiError) as missing:
        installed.get(f"/apis/networking.k8s.io/v1/namespaces/{p}-web-community/ingresses/web")
    assert missing.value.not_found
    community = installed.get(f"/apis/apps/v1/namespaces/{p}-web-community/deployments/web")
    assert community["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    # A component only one edition uses: only that stage re-applies.
    debug = layout_files("components", p)["components/debug/kustomization.yaml"]
    writes = change_and_count(deployed, {"components/debug/kustomization.yaml":
                                         debug.replace("THEME=dark", "THEME=contrast")}, mode)
    assert set(writes) == {"dev"}, writes
