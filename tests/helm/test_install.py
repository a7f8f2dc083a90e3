"""``helm install`` into a real apiserver, then the controller run as each release would run it.

One control plane of its own for this module (the releases own cluster-wide objects such as
the CRDs and the aggregate ClusterRoles, which the other suites install without Helm), shared by:

(a) ``stageset`` in ``stageset-system``: the defaults -- multi-tenant, every namespace; installed
    as the previous chart version (``tests/fixtures/chart/stageset-0.2.0.tgz``, whose CRDs live in
    Helm's ``crds/`` folder) and upgraded to this one, as a platform team would;
(b) ``shard-a`` / ``shard-b`` in ``shards-a`` / ``shards-b``: disjoint ``controller.watchNamespaces`` and
    nothing else (no release owns anything another needs: the CRDs are applied by each release's
    hook, the aggregate roles are named after the release);
(c) ``platform`` in ``platform``: ``rbac.clusterAdmin=true``.

After the controllers' tests, the platform commands run against these releases (``check``,
``version``, ``trace``, ``kubectl stageset``), ``shard-b`` is uninstalled through its
``cleanupOnDelete`` hook, and (a) is uninstalled, keeping the CRDs.

Each release's ServiceAccount is checked with SubjectAccessReviews (verb x resource x
namespace); the table is published in docs/install.md and must match what the apiserver
answers (``STAGESET_UPDATE_DOCS=1`` rewrites it).  Then the controller runs as that
ServiceAccount (a token from the TokenRequest API) with exactly the flags of the installed
Deployment, read back with ``helm get manifest``; only what the pod's environment provides is
mapped to this machine: the mirror volume's path, and loopback ports for probes and metrics.
There is no kubelet here, so the Deployments themselves never run a pod.

Identity: helm and the test set-up act as ``system:masters`` (a platform engineer); the
controllers as the releases' ServiceAccounts; Git sources are read as the tenants' accounts.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from stageset.api.crd import KINDS, VERSION_ANNOTATION, custom_resource_definition
from stageset.api.rbac import tenant_cluster_roles
from stageset.cli.check import client_version
from stageset.cli.main import main as cli_main
from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.build import KUBERNETES_VERSION
from stageset.envtest.image import containerfile_settings
from stageset.envtest.install import create_tenant
from stageset.envtest.kubectl import ensure_kubectl
from stageset.envtest.server import ControlPlane, free_port
from stageset.kube.client import ApiError, ClientPool, KubeClient
from tests.helm.chart import CHART, Helm, controller_args, documents, find
from tests.helm.hooks import HookedRun, Plane, helm_with_hooks

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "install.md"
PREVIOUS_CHART = Path(__file__).resolve().parents[1] / "fixtures" / "chart" / "stageset-0.2.0.tgz"
"""Release N-1: the chart as main shipped it before its CRDs became templates (``helm package``)."""
CM = "/api/v1/namespaces/{ns}/configmaps/{name}"
STAGESETS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets"
GITREPOS = "/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories"


@dataclass(frozen=True)
class Release:
    label: str
    name: str
    namespace: str
    values: tuple[str, ...] = ()
    watched: tuple[str, ...] = ()  # empty: every namespace

    @property
    def account(self) -> str:
        return self.name if "stageset" in self.name else f"{self.name}-stageset"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"


DEFAULT = Release("(a) default", "stageset", "stageset-system", watched=())
SHARD_A = Release("(b) shard-a", "shard-a", "shards-a",
                  ("--set", "controller.watchNamespaces={team-a1,team-a2}"),
                  watched=("team-a1", "team-a2"))
SHARD_B = Release("(b) shard-b", "shard-b", "shards-b",
                  ("--set", "controller.watchNamespaces={team-b}"), watched=("team-b",))
PLATFORM = Release("(c) cluster-admin", "platform", "platform", ("--set", "rbac.clusterAdmin=true"))
RELEASES = [DEFAULT, SHARD_A, SHARD_B, PLATFORM]
TENANTS = ["tenant-x", "team-a1", "team-a2", "team-b"]


@dataclass
class Cluster:
    plane: ControlPlane
    admin: KubeClient
    helm: Helm
    git_url: str
    git_ca: bytes
    workdir: Path
    manifests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    upgrade: dict[str, Any] = field(default_factory=dict)
    """What installing release N-1 and upgrading it showed (for the upgrade test)."""

    @property
    def hooks(self) -> Plane:
        return Plane(admin=self.admin, server=self.plane.url, ca_cert=self.plane.pki.ca_cert,
                     workdir=self.workdir)

    def hooked(self, *args: str, namespace: str) -> HookedRun:
        """``helm ARGS`` with its hook Jobs played (the CRDs before install/upgrade: tests/helm/hooks.py)."""
        run = helm_with_hooks(self.helm, self.hooks, *args, namespace=namespace)
        assert run.result.returncode == 0, run.result.stderr + "\n".join(p.output for p in run.played)
        return run


def wait_for(check: Any, *, timeout: float = 60.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def get_or_none(admin: KubeClient, path: str) -> dict[str, Any] | None:
    try:
        return admin.get(path)
    except ApiError as error:
        if error.not_found:
            return None
        raise


def crds_served(admin: KubeClient) -> bool:
    try:
        served = {r["name"] for r in admin.get("/apis/stages.metio.wtf/v1").get("resources", [])}
    except ApiError:
        return False
    return {"stagesets", "gitrepositories"} <= served


@pytest.fixture(scope="module")
def cluster(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from tests.gitserver import GitServer

    workdir = tmp_path_factory.mktemp("helm-install")
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
            yield Cluster(plane=plane, admin=pool.client(),
                          helm=Helm(binary=helm_binary, home=workdir / "helm", kubeconfig=plane.kubeconfig),
                          git_url=url, git_ca=git.ca_pem, workdir=workdir)
    finally:
        pool.close()
        plane.stop()


def crd(admin: KubeClient, name: str) -> dict[str, Any]:
    return admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")


def crd_or_none(admin: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        return crd(admin, name)
    except ApiError as error:
        if error.not_found:
            return None
        raise


def install_previous_then_upgrade(cluster: Cluster) -> None:
    """Release (a) as a platform team has it: chart N-1 installed, then upgraded to this chart.

    N-1 installed its CRDs from Helm's ``crds/`` folder (created by Helm, owned by no release); a plain
    ``helm upgrade`` takes them over in its pre-upgrade hook (docs/upgrading.md#the-crds).
    """
    helm, release = cluster.helm, DEFAULT
    helm.run("install", release.name, str(PREVIOUS_CHART), "--namespace", release.namespace,
             "--create-namespace")
    wait_for(lambda: crds_served(cluster.admin), what="chart N-1's CRDs served")
    # N-1 had only StageSet and GitRepository; the kinds added since are created by the upgrade's hook.
    cluster.upgrade["previous"] = {kind.crd_name: found for kind in KINDS
                                   if (found := crd_or_none(cluster.admin, kind.crd_name)) is not None}
    assert {"stagesets.stages.metio.wtf", "gitrepositories.stages.metio.wtf"} <= \
        set(cluster.upgrade["previous"])
    cluster.upgrade["plain"] = cluster.hooked("upgrade", release.name, str(CHART), "--namespace",
                                              release.namespace, namespace=release.namespace)


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """Tenants with a Git CA each, then all releases (order matters: (a) owns the CRDs and the
    aggregate roles).

    A shard's namespaces must exist before its release: its RoleBindings live in them.
    """
    for namespace in [*TENANTS, "platform-apps"]:
        create_tenant(cluster.admin, namespace=namespace, service_account="deployer")
        cluster.admin.apply(f"/api/v1/namespaces/{namespace}/secrets/git-ca",
                            {"apiVersion": "v1", "kind": "Secret",
                             "metadata": {"name": "git-ca", "namespace": namespace},
                             "stringData": {"caFile": cluster.git_ca.decode()}}, field_manager="test")
    install_previous_then_upgrade(cluster)
    for release in RELEASES:
        if release is not DEFAULT:
            cluster.hooked("install", release.name, str(CHART), "--namespace", release.namespace,
                           "--create-namespace", *release.values, namespace=release.namespace)
        manifest = cluster.helm.run("get", "manifest", release.name, "--namespace", release.namespace).stdout
        cluster.manifests[release.name] = documents(manifest)
    wait_for(lambda: crds_served(cluster.admin), what="the chart's CRDs served")
    # No kube-controller-manager here: fill admin/edit/view the way its aggregation would.
    aggregate_cluster_roles(cluster.admin)
    return cluster


def test_the_previous_chart_upgrades_to_crds_that_serve_this_version_s_schema(installed: Cluster) -> None:
    """Release N-1 -> N with a plain ``helm upgrade``: the pre-upgrade hook takes over the CRDs that N-1's
    ``crds/`` folder created, and the apiserver serves exactly the schema generated from this
    version's models (so every field added since N-1 is served)."""
    plain = installed.upgrade["plain"]
    assert [p.command for p in plain.played] == [["stageset", "crds", "--apply", "--tenant-roles"]]
    for kind in KINDS:
        live = crd(installed.admin, kind.crd_name)
        # A kind new since N-1 had no CRD then: every path of it is added.
        previous = installed.upgrade["previous"].get(kind.crd_name, {"spec": {"versions": []}})
        assert "meta.helm.sh/release-name" not in (live["metadata"].get("annotations") or {})
        assert live["metadata"]["annotations"][VERSION_ANNOTATION] == client_version()
        assert live["spec"]["versions"] == custom_resource_definition(kind)["spec"]["versions"]
        # Fields added since N-1 (none until a schema change lands after it) are served now.
        added = property_paths(live) - property_paths(previous)
        sys.stderr.write(f"\n{kind.crd_name}: {len(added)} schema paths added since chart 0.2.0\n")


def property_paths(obj: dict[str, Any]) -> set[str]:
    def walk(node: dict[str, Any], path: str) -> set[str]:
        found = {path}
        for key, child in (node.get("properties") or {}).items():
            found |= walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            found |= walk(node["items"], f"{path}[]")
        return found

    return {p for version in obj["spec"]["versions"] for p in walk(version["schema"]["openAPIV3Schema"],
                                                                    version["name"])}


def test_helm_template_piped_to_kubectl_apply_server_side(installed: Cluster) -> None:
    """The third way to install (docs/install.md): ``stageset crds --apply``, then the chart rendered
    without its hooks applied by kubectl with server-side apply, here as a server-side dry run over
    release (a)'s objects.  Without ``--no-hooks`` the rendering would carry the hook Jobs as plain
    Jobs (which the test refuses to apply: the cleanup hook's would delete StageSets at once)."""
    rendered = installed.helm.run("template", DEFAULT.name, str(CHART), "--namespace",
                                  DEFAULT.namespace, "--no-hooks").stdout
    assert not [d for d in documents(rendered) if d["kind"] in ("Job", "CustomResourceDefinition")]

    def apply(text: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ensure_kubectl(log=False)), "apply", "--server-side", "--dry-run=server",
                               "--field-manager=platform", *extra, "-f", "-"], input=text,
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "KUBECONFIG": str(installed.plane.kubeconfig)})

    applied = apply(rendered)
    assert applied.returncode == 0, applied.stderr
    assert "deployment.apps/stageset serverside-applied" in applied.stdout
    # Label shards: one Deployment more per shard, each valid as the apiserver sees it (the main one's
    # args differ from what helm installed: taken over, in this dry run).
    sharded = apply(installed.helm.run("template", DEFAULT.name, str(CHART), "--namespace", DEFAULT.namespace,
                                       "--no-hooks", "--set", "controller.shards={shard1,shard2}").stdout,
                    "--force-conflicts")
    assert sharded.returncode == 0, sharded.stderr
    for name in ("stageset", "stageset-shard1", "stageset-shard2"):
        assert f"deployment.apps/{name} serverside-applied" in sharded.stdout


def test_every_release_is_deployed_with_its_own_objects(installed: Cluster) -> None:
    listed = installed.helm.run("list", "--all-namespaces", "--output", "yaml").stdout
    releases = {(r["name"], r["namespace"], r["status"]) for r in yaml.safe_load(listed)}
    assert {(r.name, r.namespace, "deployed") for r in RELEASES} <= releases
    for release in RELEASES:
        deployment = installed.admin.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/"
                                         f"{release.account}")
        assert deployment["metadata"]["labels"]["app.kubernetes.io/instance"] == release.name
        # Installed with only their own values: each release's aggregate roles are its own.
        for suffix in ("edit", "view"):
            role = installed.admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/"
                                       f"{release.namespace}-{release.account}-{suffix}")
            assert role["metadata"]["annotations"]["meta.helm.sh/release-name"] == release.name
    # Tenants bound to edit manage StageSets through any of them (aggregation unites the rules).
    edit = installed.admin.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/edit")
    assert any("stagesets" in rule.get("resources", []) for rule in edit.get("rules") or [])


# --------------------------------------------------------------------------- SubjectAccessReviews

# (verb, group, resource, subresource); each checked in the namespaces of NAMESPACES.
CHECKS = [
    ("impersonate", "", "serviceaccounts", ""),
    ("list", "stages.metio.wtf", "stagesets", ""),
    ("watch", "stages.metio.wtf", "gitrepositories", ""),
    ("patch", "stages.metio.wtf", "stagesets", "status"),
    ("update", "stages.metio.wtf", "stagesets", "finalizers"),
    ("create", "stages.metio.wtf", "stagesets", ""),
    ("create", "", "events", ""),
    ("watch", "", "namespaces", ""),
    ("update", "coordination.k8s.io", "leases", ""),
    ("get", "", "secrets", ""),
    ("get", "", "configmaps", ""),
    ("create", "apps", "deployments", ""),
    ("delete", "", "namespaces", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
]
NAMESPACES = {"own": "release namespace", "team-a1": "team-a1", "team-b": "team-b", "": "cluster-wide"}


def allowed(admin: KubeClient, release: Release, verb: str, group: str, resource: str, subresource: str,
            namespace: str) -> bool:
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
    if namespace:
        attributes["namespace"] = release.namespace if namespace == "own" else namespace
    review = admin.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": release.user, "resourceAttributes": attributes,
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{release.namespace}",
                            "system:authenticated"]}})
    return bool(review["status"].get("allowed"))


def sar_table(admin: KubeClient) -> str:
    columns = [(r, ns) for r in (DEFAULT, SHARD_A, PLATFORM) for ns in NAMESPACES]
    lines = ["| verb | resource | " + " | ".join(
        f"{r.label.split(' ', 1)[1]}: {NAMESPACES[ns]}" for r, ns in columns) + " |",
        "|---|---|" + "---|" * len(columns)]
    for verb, group, resource, sub in CHECKS:
        name = (f"{resource}/{sub}" if sub else resource) + (f".{group}" if group else "")
        cells = ["yes" if allowed(admin, r, verb, group, resource, sub, ns) else "no" for r, ns in columns]
        lines.append(f"| {verb} | `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def test_subject_access_reviews_of_each_release_s_service_account(installed: Cluster) -> None:
    admin = installed.admin

    def can(release: Release, verb: str, resource: str, namespace: str, *, group: str = "",
            sub: str = "") -> bool:
        return allowed(admin, release, verb, group, resource, sub, namespace)

    tenant_writes = [("create", "deployments", "apps"), ("create", "configmaps", ""),
                     ("get", "secrets", ""), ("get", "configmaps", ""), ("delete", "namespaces", "")]
    for release in RELEASES:
        reachable = ["team-a1", "team-b", "tenant-x"] if not release.watched else list(release.watched)
        unreachable = [] if not release.watched else [n for n in TENANTS if n not in release.watched]
        for namespace in reachable:
            assert can(release, "impersonate", "serviceaccounts", namespace), (release.label, namespace)
            for verb in ("get", "list", "watch", "patch", "update"):
                assert can(release, verb, "stagesets", namespace, group="stages.metio.wtf")
            assert can(release, "patch", "stagesets", namespace, group="stages.metio.wtf", sub="status")
            assert can(release, "update", "stagesets", namespace, group="stages.metio.wtf", sub="finalizers")
            assert can(release, "create", "events", namespace)
        for namespace in unreachable:
            for verb, resource, group in [("impersonate", "serviceaccounts", ""), ("list", "stagesets",
                                          "stages.metio.wtf"), ("create", "events", "")]:
                assert not can(release, verb, resource, namespace, group=group), (release.label, namespace)
        admin_mode = release is PLATFORM
        # Its own Lease, in its own namespace, and nowhere else (but as cluster-admin).
        assert can(release, "update", "leases", release.namespace, group="coordination.k8s.io")
        assert can(release, "update", "leases", "kube-system", group="coordination.k8s.io") is admin_mode
        for verb, resource, group in tenant_writes:
            for namespace in [*reachable, release.namespace]:
                assert can(release, verb, resource, namespace, group=group) is admin_mode, \
                    (release.label, verb, resource, namespace)
        assert can(release, "create", "clusterrolebindings", "",
                   group="rbac.authorization.k8s.io") is admin_mode
        # A shard lists only namespace by namespace, never cluster-wide.
        assert can(release, "list", "stagesets", "", group="stages.metio.wtf") is (not release.watched)
        # Never a create/delete of StageSets themselves (tenants own them) outside cluster-admin.
        assert can(release, "create", "stagesets", reachable[0], group="stages.metio.wtf") is admin_mode

    table = sar_table(admin)
    sys.stderr.write(f"\nSubjectAccessReview table:\n{table}\n")
    begin, end = "<!-- sar-table:begin -->\n", "<!-- sar-table:end -->"
    text = DOCS.read_text()
    if os.environ.get("STAGESET_UPDATE_DOCS") == "1":
        text = re.sub(f"{re.escape(begin)}.*?{re.escape(end)}", lambda _: begin + table + end, text,
                      flags=re.DOTALL)
        DOCS.write_text(text)
    published = text[text.index(begin) + len(begin):text.index(end)]
    assert published == table, "docs/install.md's table is not what the apiserver answers; " \
                               "rerun with STAGESET_UPDATE_DOCS=1"


# --------------------------------------------------------------------------- the controllers


@dataclass
class Running:
    release: Release
    process: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)

    @property
    def metrics_url(self) -> str:
        address = next(a.partition("=")[2] for a in self.args if a.startswith("--metrics-address="))
        return f"http://{address}/metrics"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def token_kubeconfig(cluster: Cluster, release: Release) -> Path:
    return account_kubeconfig(cluster, release.namespace, release.account)


def account_kubeconfig(cluster: Cluster, namespace: str, account: str) -> Path:
    """A kubeconfig with a token of ServiceAccount ``namespace/account`` (the TokenRequest API)."""
    token = cluster.admin.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={"spec": {"expirationSeconds": 3600}})["status"]["token"]
    path = cluster.workdir / f"{namespace}-{account}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": cluster.plane.url,
                                               "certificate-authority": str(cluster.plane.pki.ca_cert)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
    path.chmod(0o600)
    return path


def pod_args(cluster: Cluster, release: Release) -> list[str]:
    """The installed Deployment's flags, with the pod's volume path and ports mapped to this machine."""
    args = controller_args(cluster.manifests[release.name])
    mirrors = cluster.workdir / f"{release.name}-mirrors"
    mapped = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag == "--mirror-dir":
            assert value == "/var/cache/stageset"  # the emptyDir's mount path
            arg = f"--mirror-dir={mirrors}"
        elif flag == "--artifact-dir":
            assert value == "/var/cache/stageset-artifacts"  # the artifacts emptyDir's mount path
            arg = f"--artifact-dir={cluster.workdir / f'{release.name}-artifacts'}"
        elif flag in ("--probe-address", "--metrics-address"):
            assert re.fullmatch(r":\d+", value), arg  # the pod's ports
            arg = f"{flag}=127.0.0.1:{free_port()}"
        mapped.append(arg)
    return mapped


def start(cluster: Cluster, release: Release) -> Running:
    # The image's entrypoint is `stageset controller`; the Deployment's args follow it.
    assert containerfile_settings().entrypoint[-1] == "controller"
    log = cluster.workdir / f"{release.name}.log"
    args = pod_args(cluster, release)
    command = [sys.executable, "-m", "stageset.cli", "controller",
               "--kubeconfig", str(token_kubeconfig(cluster, release)), *args]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(cluster.workdir)})
    return Running(release=release, process=process, log=log, args=args)


def stop(running: Running) -> None:
    if running.process.poll() is None:
        running.process.send_signal(signal.SIGTERM)
        try:
            code = running.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            running.process.kill()
            running.process.wait()
            code = -9
        sys.stderr.write(f"\n--- {running.release.label} log (tail) ---\n{running.output()[-3000:]}\n")
        assert code == 0, f"{running.release.label} did not stop cleanly ({code})"


def stageset_for(cluster: Cluster, namespace: str, *, service_account: str | None = "deployer") -> None:
    repo: dict[str, Any] = {"url": cluster.git_url, "ref": {"branch": "main"},
                            "secretRef": {"name": "git-ca"}}
    spec: dict[str, Any] = {"stages": [{"name": "app", "sourceRef": {"name": "apps"}, "path": "./app"}]}
    if service_account:
        repo["serviceAccountName"] = service_account
        spec["serviceAccountName"] = service_account
    cluster.admin.apply(f"{GITREPOS.format(ns=namespace)}/apps", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": "apps", "namespace": namespace}, "spec": repo}, field_manager="test")
    cluster.admin.apply(f"{STAGESETS.format(ns=namespace)}/apps", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "apps", "namespace": namespace}, "spec": spec}, field_manager="test")


def ready(cluster: Cluster, namespace: str) -> bool:
    obj = get_or_none(cluster.admin, f"{STAGESETS.format(ns=namespace)}/apps") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def touched_namespaces(cluster: Cluster, release: Release) -> set[str]:
    return {str((e.get("objectRef") or {}).get("namespace", "")) for e in cluster.plane.audit_events()
            if (e.get("user") or {}).get("username") == release.user}


def lease_holder(cluster: Cluster, release: Release) -> str:
    lease = get_or_none(cluster.admin, f"/apis/coordination.k8s.io/v1/namespaces/{release.namespace}/leases/"
                                       f"{release.account}") or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def test_the_default_release_reconciles_as_its_service_account(installed: Cluster) -> None:
    stageset_for(installed, "tenant-x")
    running = start(installed, DEFAULT)
    try:
        wait_for(lambda: ready(installed, "tenant-x"), timeout=90, what="tenant-x Ready under release (a)")
        assert get_or_none(installed.admin, CM.format(ns="tenant-x", name="from-git")) is not None
        assert lease_holder(installed, DEFAULT)
    finally:
        stop(running)
    assert lease_holder(installed, DEFAULT) == ""  # released on SIGTERM


def test_two_shards_reconcile_their_namespaces_only(installed: Cluster) -> None:
    for namespace in ("team-a1", "team-a2", "team-b"):
        stageset_for(installed, namespace)
    shards = [start(installed, SHARD_A), start(installed, SHARD_B)]
    try:
        for namespace in ("team-a1", "team-a2", "team-b"):
            wait_for(lambda ns=namespace: ready(installed, ns), timeout=90, what=f"{namespace} Ready")
            assert get_or_none(installed.admin, CM.format(ns=namespace, name="from-git")) is not None
        for shard in (SHARD_A, SHARD_B):
            assert lease_holder(installed, shard)
    finally:
        for running in shards:
            stop(running)
    for shard in (SHARD_A, SHARD_B):
        touched = touched_namespaces(installed, shard)
        assert set(shard.watched) <= touched, "the audit log lacks the shard's own requests"
        # Its watched namespaces, its own Lease, and cluster-scoped discovery: nothing else.
        assert touched <= {*shard.watched, shard.namespace, ""}, (shard.label, touched)


def test_the_cluster_admin_release_applies_as_itself_without_a_service_account(installed: Cluster) -> None:
    stageset_for(installed, "platform-apps", service_account=None)
    running = start(installed, PLATFORM)
    try:
        wait_for(lambda: ready(installed, "platform-apps"), timeout=90, what="platform-apps Ready under (c)")
        assert get_or_none(installed.admin, CM.format(ns="platform-apps", name="from-git")) is not None
    finally:
        stop(running)
    writes = [e for e in installed.plane.audit_events()
              if (e.get("user") or {}).get("username") == PLATFORM.user and not e.get("impersonatedUser")
              and (e.get("objectRef") or {}).get("resource") == "configmaps"
              and (e.get("objectRef") or {}).get("namespace") == "platform-apps"
              and e.get("verb") in ("create", "patch", "update")]
    assert writes, "the ConfigMap was not written by the controller's own identity"


def test_the_pod_passes_the_restricted_pod_security_standard(installed: Cluster) -> None:
    """The apiserver's own PodSecurity admission judges the installed Deployment's pod template."""
    namespace = "pss-restricted"
    installed.admin.apply(f"/api/v1/namespaces/{namespace}", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest"}}}, field_manager="test")
    deployment = next(d for d in installed.manifests[DEFAULT.name] if d["kind"] == "Deployment")
    template = deployment["spec"]["template"]

    def create(spec: dict[str, Any]) -> None:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "controller", "labels": template["metadata"]["labels"]},
               "spec": {**spec, "serviceAccountName": "default"}}
        installed.admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", query={"dryRun": "All"},
                                body=pod)

    create(template["spec"])
    # OpenShift's rendering (the SCC assigns the ids) and the cleanup hook's pod pass it too.
    openshift = documents(installed.helm.run(
        "template", "stageset", str(CHART), "--namespace", "stageset-system",
        "--set", "cleanupOnDelete.enabled=true",
        "--set", "podSecurityContext.runAsUser=null", "--set", "podSecurityContext.runAsGroup=null",
        "--set", "podSecurityContext.fsGroup=null").stdout)
    for kind in ("Deployment", "Job"):
        spec = next(d for d in openshift if d["kind"] == kind)["spec"]["template"]["spec"]
        assert "runAsUser" not in spec["securityContext"]
        create(spec)
    # The check can fail: the same pod allowed to escalate privileges is refused.
    loose = yaml.safe_load(yaml.safe_dump(template["spec"]))
    loose["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(ApiError, match="restricted"):
        create(loose)


# --------------------------------------------------------------------------- platform commands


def cli(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """``stageset ARGS`` in-process as a user's shell would run it (exit code, stdout and stderr apart;
    tests/cli runs the real processes), with ``KUBECONFIG`` set."""
    result = CliRunner().invoke(cli_main, list(args), env={"KUBECONFIG": str(kubeconfig)},
                                catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def mark_deployment_ready(admin: KubeClient, release: Release) -> None:
    """What the deployment controller writes once the pod is ready (no kube-controller-manager here)."""
    path = f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{release.account}"
    generation = admin.get(path)["metadata"]["generation"]
    admin.request("PATCH", f"{path}/status", content_type="application/merge-patch+json", body={"status": {
        "observedGeneration": generation, "replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
        "updatedReplicas": 1}})


def metrics_answer(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback, the test's own
            return bool(response.status == 200)
    except OSError:
        return False


def test_check_version_trace_and_kubectl_stageset_against_the_releases(installed: Cluster) -> None:
    admin, kubeconfig = installed.admin, installed.plane.kubeconfig
    tenant = account_kubeconfig(installed, "tenant-x", "deployer")
    mark_deployment_ready(admin, DEFAULT)
    running = start(installed, DEFAULT)
    try:
        wait_for(lambda: lease_holder(installed, DEFAULT), what="release (a) holding its Lease")
        wait_for(lambda: ready(installed, "tenant-x"), timeout=90, what="tenant-x Ready")
        wait_for(lambda: metrics_answer(running.metrics_url), what="the controller's /metrics")

        healthy = cli("check", "-n", DEFAULT.namespace, "--metrics-url", running.metrics_url,
                      kubeconfig=kubeconfig)
        sys.stderr.write(f"\nstageset check:\n{healthy.stdout}{healthy.stderr}\n")
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        for line in ("✔ Kubernetes 1.35", "✔ you may create customresourcedefinitions",
                     "✔ stagesets.stages.metio.wtf (established, schema of stageset",
                     f"; applied by stageset {client_version()})", "✔ deployment: 1/1 replicas ready",
                     "✔ RBAC: ServiceAccount stageset-system/stageset has all",
                     f"✔ leader {lease_holder(installed, DEFAULT)}", "✔ metrics: ", "✔ all checks passed"):
            assert line in healthy.stdout, line
        # Through the apiserver's service proxy: no pod behind the Service here, and check says so.
        proxied = cli("check", "-n", DEFAULT.namespace, kubeconfig=kubeconfig)
        assert proxied.returncode == 3
        assert "✗ metrics: the apiserver could not reach them through the Service" in proxied.stdout
        assert "1 check(s) failed" in proxied.stderr

        versions = json.loads(cli("version", "-o", "json", kubeconfig=kubeconfig).stdout)
        project = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())["project"]["version"]
        assert versions["client"]["version"] == project
        assert versions["kubernetes"] == KUBERNETES_VERSION
        listed = {(c["namespace"], c["name"]): c for c in versions["controllers"]}
        assert set(listed) == {(r.namespace, r.account) for r in RELEASES}
        assert {c["version"] for c in listed.values()} == {project}

        traced = cli("trace", "configmap", "from-git", "-n", "tenant-x", kubeconfig=tenant)
        sys.stderr.write(f"\nstageset trace:\n{traced.stdout}{traced.stderr}\n")
        assert traced.returncode == 0, traced.stderr
        revision = admin.get(f"{GITREPOS.format(ns='tenant-x')}/apps")["status"]["artifact"]["revision"]
        for line in ("Object:     ConfigMap tenant-x/from-git (v1)", "StageSet:   tenant-x/apps  Ready=True",
                     "Stage:      app  phase Ready  path ./app", f"revision {revision}",
                     "Inventory:  listed in stage app (applied as ServiceAccount tenant-x/deployer)",
                     "Source:     GitRepository tenant-x/apps (stages.metio.wtf/v1)",
                     f"url {installed.git_url}"):
            assert line in traced.stdout, line
        as_yaml = yaml.safe_load(cli("trace", "cm/from-git", "-n", "tenant-x", "-o", "yaml",
                                     kubeconfig=tenant).stdout)
        assert as_yaml["source"]["revision"] == revision
        # Labels are only a claim: an object the inventory does not list is not owned.
        claim = {"stages.metio.wtf/name": "apps", "stages.metio.wtf/namespace": "tenant-x",
                 "stages.metio.wtf/stage": "app"}
        for name, labels in (("forged", claim), ("plain", {})):
            meta = {"name": name, "namespace": "tenant-x", "labels": labels}
            admin.apply(CM.format(ns="tenant-x", name=name), {"apiVersion": "v1", "kind": "ConfigMap",
                                                              "metadata": meta}, field_manager="test")
        assert "Inventory:  NOT listed in stage app" in cli("trace", "configmap", "forged", "-n", "tenant-x",
                                                            kubeconfig=tenant).stdout
        plain = cli("trace", "configmap", "plain", "-n", "tenant-x", kubeconfig=tenant)
        assert plain.returncode == 3
        assert "is not managed by a StageSet" in plain.stderr

        # kubectl's own plugin mechanism finds kubectl-stageset on PATH.
        kubectl = ensure_kubectl(log=False)
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # .venv/bin: kubectl-stageset
        plugin = subprocess.run([str(kubectl), "stageset", "get", "apps", "-n", "tenant-x"],
                                capture_output=True, text=True, timeout=120, check=False,
                                env={**os.environ, "KUBECONFIG": str(tenant), "PATH": path})
        assert plugin.returncode == 0, plugin.stderr
        assert "StageSet tenant-x/apps: Ready=True" in plugin.stdout
    finally:
        stop(running)
    stopped = cli("check", "-n", DEFAULT.namespace, "--metrics-url", running.metrics_url,
                  kubeconfig=kubeconfig)
    assert stopped.returncode == 3
    assert "✗ no leader holds Lease stageset-system/stageset" in stopped.stdout
    assert "✗ metrics: cannot reach" in stopped.stdout


def test_check_names_missing_rights_and_pre_names_missing_install_rights(installed: Cluster) -> None:
    admin, kubeconfig = installed.admin, installed.plane.kubeconfig
    tenant = account_kubeconfig(installed, "tenant-x", "deployer")
    pre = cli("check", "--pre", kubeconfig=kubeconfig)
    assert pre.returncode == 0, pre.stdout
    assert "✔ Kubernetes" in pre.stdout
    assert "checking CRDs" not in pre.stdout
    as_tenant = cli("check", "--pre", kubeconfig=tenant)
    assert as_tenant.returncode == 3
    assert "✗ you may not create customresourcedefinitions: installing the chart needs a cluster admin" in \
        as_tenant.stdout
    # Shard (b) loses its RoleBinding in team-a2 (the shard tests are done with it).
    binding = ("/apis/rbac.authorization.k8s.io/v1/namespaces/team-a2/rolebindings/"
               f"shards-a-{SHARD_A.account}-controller")
    admin.request("DELETE", binding)
    broken = cli("check", "-n", SHARD_A.namespace, kubeconfig=kubeconfig)
    assert broken.returncode == 3
    assert ("✗ RBAC: ServiceAccount shards-a/shard-a-stageset may not: impersonate serviceaccounts in "
            "team-a2") in broken.stdout
    assert "in team-a1" not in broken.stdout
    assert "✗ deployment: 0/1 replicas ready" in broken.stdout
    assert "✗ no leader" in broken.stdout


def test_cleanup_without_a_running_controller_times_out_naming_what_is_left(installed: Cluster) -> None:
    result = cli("cleanup", "-n", "team-a2", "--timeout", "1s", kubeconfig=installed.plane.kubeconfig)
    assert result.returncode == 3
    assert "deleted StageSet team-a2/apps" in result.stdout
    assert "timed out after 1s: 1 StageSet(s) still being torn down (is the controller running?)" in \
        result.stderr
    assert "team-a2/apps" in result.stderr


# --------------------------------------------------------------------------- uninstalling


def complete_job(admin: KubeClient, namespace: str, name: str) -> None:
    """What the job controller writes when the pod succeeded (no kube-controller-manager here)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = {"status": "True", "reason": "CompletionsReached",
            "message": "Reached expected number of succeeded pods", "lastProbeTime": now,
            "lastTransitionTime": now}
    admin.request("PATCH", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status",
                  content_type="application/merge-patch+json", body={"status": {
                      "startTime": now, "completionTime": now, "succeeded": 1, "active": 0, "ready": 0,
                      "terminating": 0, "uncountedTerminatedPods": {},
                      "conditions": [{"type": "SuccessCriteriaMet", **done}, {"type": "Complete", **done}]}})


def test_uninstall_with_cleanup_on_delete_leaves_no_stageset_behind(installed: Cluster) -> None:
    """``helm uninstall`` of shard (b) with ``cleanupOnDelete``: Helm creates the pre-delete hook (its
    ServiceAccount, RBAC and Job) and waits for the Job.  There is no kubelet, so the test plays it:
    it runs the Job's own command, as the Job's ServiceAccount (a token of it), with the shard's
    controller running as the Deployment would run it, then writes the Job's status as the job
    controller would.  What this proves: Helm runs the hook before deleting anything and waits for
    it; the hook's RBAC lets its command delete the shard's StageSets and nothing outside the shard;
    the command returns once the controller tore them down (their objects deleted as the tenant);
    the uninstall then completes and removes the hook objects.  It does not prove a kubelet can
    pull the image or start the pod (tests/image runs the image's entrypoint)."""
    admin, release = installed.admin, SHARD_B
    job_name = f"{release.account}-cleanup"
    installed.hooked("upgrade", release.name, str(CHART), "--namespace", release.namespace,
                     "--reuse-values", "--set", "cleanupOnDelete.enabled=true", namespace=release.namespace)
    installed.manifests[release.name] = documents(installed.helm.run(
        "get", "manifest", release.name, "--namespace", release.namespace).stdout)
    assert admin.get(f"{STAGESETS.format(ns='team-b')}/apps")
    assert get_or_none(admin, CM.format(ns="team-b", name="from-git")) is not None
    running = start(installed, release)
    uninstall = installed.helm.start("uninstall", release.name, "--namespace", release.namespace,
                                     "--timeout", "5m")
    try:
        job_path = f"/apis/batch/v1/namespaces/{release.namespace}/jobs/{job_name}"
        job = wait_for(lambda: get_or_none(admin, job_path), what="helm creating the hook Job")
        assert admin.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{release.account}")
        pod = job["spec"]["template"]["spec"]
        account, command = pod["serviceAccountName"], pod["containers"][0]["command"]
        assert command[:2] == ["stageset", "cleanup"]
        hook_user = Release("hook", account, release.namespace)
        assert allowed(admin, hook_user, "delete", "stages.metio.wtf", "stagesets", "", "team-b")
        for elsewhere in ("team-a1", "tenant-x", ""):
            assert not allowed(admin, hook_user, "delete", "stages.metio.wtf", "stagesets", "", elsewhere)
        ran = cli(*command[1:], kubeconfig=account_kubeconfig(installed, release.namespace, account))
        sys.stderr.write(f"\nthe hook's command:\n{ran.stdout}{ran.stderr}\n")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "every StageSet in team-b is gone" in ran.stdout
        assert get_or_none(admin, f"{STAGESETS.format(ns='team-b')}/apps") is None
        assert get_or_none(admin, CM.format(ns="team-b", name="from-git")) is None  # torn down
    finally:
        stop(running)
    assert uninstall.poll() is None, "helm uninstall did not wait for its hook"
    complete_job(admin, release.namespace, job_name)
    _, err = uninstall.communicate(timeout=120)
    assert uninstall.returncode == 0, err
    user = f"system:serviceaccount:{release.namespace}:{account}"
    deletes = [e for e in installed.plane.audit_events() if (e.get("user") or {}).get("username") == user
               and e.get("verb") == "delete" and (e.get("objectRef") or {}).get("resource") == "stagesets"]
    assert {(e["objectRef"].get("namespace"), e["objectRef"].get("name")) for e in deletes} == {
        ("team-b", "apps")}
    tenant = "system:serviceaccount:team-b:deployer"
    teardown = [e for e in installed.plane.audit_events()
                if (e.get("user") or {}).get("username") == release.user
                and (e.get("impersonatedUser") or {}).get("username") == tenant
                and e.get("verb") == "delete" and (e.get("objectRef") or {}).get("resource") == "configmaps"]
    assert teardown, "the ConfigMap was not deleted as the tenant"
    for path in (f"/apis/batch/v1/namespaces/{release.namespace}/jobs/{job_name}",
                 f"/api/v1/namespaces/{release.namespace}/serviceaccounts/{account}",
                 f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{release.account}"):
        assert get_or_none(admin, path) is None, path


def test_uninstall_keeps_the_crds_and_the_stagesets(installed: Cluster) -> None:
    installed.helm.run("uninstall", DEFAULT.name, "--namespace", DEFAULT.namespace)
    deployment = f"/apis/apps/v1/namespaces/{DEFAULT.namespace}/deployments/stageset"
    assert get_or_none(installed.admin, deployment) is None
    for kind in KINDS:  # no release's objects: the hook applied them
        assert crd(installed.admin, kind.crd_name)["metadata"]["annotations"][VERSION_ANNOTATION]
    assert crds_served(installed.admin)
    # The tenants' roles too: applied by the hooks (as their accounts, by escalate on the two names),
    # the cluster's rather than a release's, so every tenant's RoleBindings still name them.
    for role in tenant_cluster_roles():
        name = role["metadata"]["name"]
        live = installed.admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}")
        assert live["rules"] == role["rules"]
        assert "stageset" in {m["manager"] for m in live["metadata"]["managedFields"]}
        assert "meta.helm.sh/release-name" not in (live["metadata"].get("annotations") or {})
    assert installed.admin.get(f"{STAGESETS.format(ns='tenant-x')}/apps")
    assert not find(documents(installed.helm.run("get", "manifest", PLATFORM.name, "--namespace",
                                                 PLATFORM.namespace).stdout), "CustomResourceDefinition")

