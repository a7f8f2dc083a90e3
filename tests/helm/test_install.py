"""``helm install`` into a real apiserver, then the controller run as each release would run it.

One control plane of its own for this module (the releases own cluster-wide objects such as
the aggregate ClusterRoles, which the other suites install without Helm), shared by:

(a) ``stageset`` in ``stageset-system``: the defaults -- multi-tenant, every namespace;
(b) ``shard-a`` / ``shard-b`` in ``shards-a`` / ``shards-b``: disjoint ``controller.watchNamespaces``,
    ``rbac.aggregateToDefaultRoles=false`` (release (a) owns those roles);
(c) ``platform`` in ``platform``: ``rbac.clusterAdmin=true``.

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

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.envtest import server as envtest
from stageset.envtest.aggregation import aggregate_cluster_roles
from stageset.envtest.image import containerfile_settings
from stageset.envtest.install import create_tenant
from stageset.envtest.server import ControlPlane, free_port
from stageset.kube.client import ApiError, ClientPool, KubeClient
from tests.helm.chart import CHART, Helm, controller_args, documents

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "install.md"
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
                  ("--set", "controller.watchNamespaces={team-a1,team-a2}",
                   "--set", "rbac.aggregateToDefaultRoles=false"), watched=("team-a1", "team-a2"))
SHARD_B = Release("(b) shard-b", "shard-b", "shards-b",
                  ("--set", "controller.watchNamespaces={team-b}",
                   "--set", "rbac.aggregateToDefaultRoles=false"), watched=("team-b",))
PLATFORM = Release("(c) cluster-admin", "platform", "platform",
                   ("--set", "rbac.clusterAdmin=true", "--set", "rbac.aggregateToDefaultRoles=false"))
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


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """Tenants with a Git CA each, then all releases (order matters: (a) owns the aggregate roles).

    A shard's namespaces must exist before its release: its RoleBindings live in them.
    """
    for namespace in [*TENANTS, "platform-apps"]:
        create_tenant(cluster.admin, namespace=namespace, service_account="deployer")
        cluster.admin.apply(f"/api/v1/namespaces/{namespace}/secrets/git-ca",
                            {"apiVersion": "v1", "kind": "Secret",
                             "metadata": {"name": "git-ca", "namespace": namespace},
                             "stringData": {"caFile": cluster.git_ca.decode()}}, field_manager="test")
    for release in RELEASES:
        cluster.helm.run("install", release.name, str(CHART), "--namespace", release.namespace,
                         "--create-namespace", *release.values)
        manifest = cluster.helm.run("get", "manifest", release.name, "--namespace", release.namespace).stdout
        cluster.manifests[release.name] = documents(manifest)
    wait_for(lambda: crds_served(cluster.admin), what="the chart's CRDs served")
    # No kube-controller-manager here: fill admin/edit/view the way its aggregation would.
    aggregate_cluster_roles(cluster.admin)
    return cluster


def test_a_second_owner_of_the_aggregate_roles_is_refused_by_name(installed: Cluster) -> None:
    result = installed.helm.run("install", "shard-c", str(CHART), "--namespace", "shards-c",
                                "--create-namespace", "--set", "controller.watchNamespaces={team-c}",
                                check=False)
    assert result.returncode != 0
    assert ('the ClusterRole stageset-edit is already owned by release "stageset" in namespace '
            '"stageset-system"') in result.stderr
    assert "set rbac.aggregateToDefaultRoles=false" in result.stderr


def test_every_release_is_deployed_with_its_own_objects(installed: Cluster) -> None:
    listed = installed.helm.run("list", "--all-namespaces", "--output", "yaml").stdout
    releases = {(r["name"], r["namespace"], r["status"]) for r in yaml.safe_load(listed)}
    assert {(r.name, r.namespace, "deployed") for r in RELEASES} <= releases
    for release in RELEASES:
        deployment = installed.admin.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/"
                                         f"{release.account}")
        assert deployment["metadata"]["labels"]["app.kubernetes.io/instance"] == release.name
    for name in ("stageset-edit", "stageset-view"):
        role = installed.admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}")
        assert role["metadata"]["annotations"]["meta.helm.sh/release-name"] == "stageset"


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

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def token_kubeconfig(cluster: Cluster, release: Release) -> Path:
    token = cluster.admin.request(
        "POST", f"/api/v1/namespaces/{release.namespace}/serviceaccounts/{release.account}/token",
        body={"spec": {"expirationSeconds": 3600}})["status"]["token"]
    path = cluster.workdir / f"{release.name}.kubeconfig"
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
        elif flag in ("--probe-address", "--metrics-address"):
            assert re.fullmatch(r":\d+", value), arg  # the pod's ports
            arg = f"{flag}=127.0.0.1:{free_port()}"
        mapped.append(arg)
    return mapped


def start(cluster: Cluster, release: Release) -> Running:
    # The image's entrypoint is `stageset controller`; the Deployment's args follow it.
    assert containerfile_settings().entrypoint[-1] == "controller"
    log = cluster.workdir / f"{release.name}.log"
    command = [sys.executable, "-m", "stageset.cli", "controller",
               "--kubeconfig", str(token_kubeconfig(cluster, release)), *pod_args(cluster, release)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", "HOME": str(cluster.workdir)})
    return Running(release=release, process=process, log=log)


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
    # The check can fail: the same pod allowed to escalate privileges is refused.
    loose = yaml.safe_load(yaml.safe_dump(template["spec"]))
    loose["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(ApiError, match="restricted"):
        create(loose)
