"""The chart on a real node, installed from a registry: what ``make release`` makes (the image archive
and the chart package) pushed to a real OCI registry on loopback (CNCF distribution,
:mod:`stageset.envtest.registry`) by the release workflow's own step (:mod:`stageset.envtest.publish`),
the chart installed with one ``helm install oci://...`` whose only image value is the registry
override, the image pulled by the node's containerd when the kubelet asks for it (the CRD hook Job
first), the controller pods Running and Ready by
their own probes, a StageSet reconciled from a Git server reached from the pod network, leader
election between two replicas (the leader killed: the other takes over), ``helm upgrade`` rolling
the pods, and ``stageset uninstall --teardown``.

The scenarios run in order against one release (each builds on the one before, as an operator's
day would); every one re-checks what it relies on, so a failure names the step that broke.

Identity: helm, ``stageset uninstall`` and the set-up act as the control plane's ``system:masters``
admin (a platform engineer); the controller pods as the release's ServiceAccount (a projected token
the kubelet mounts); the StageSet applies as the tenant's ``deployer``; the CRD hook Job as its own
ServiceAccount.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from stageset.envtest import registry as registry_server
from stageset.envtest import release
from stageset.envtest.helm import ensure_helm
from stageset.envtest.image import ensure_image
from stageset.envtest.install import create_tenant
from stageset.envtest.nodeplane import Node
from stageset.envtest.publish import Published, publish
from stageset.envtest.registry import Registry
from stageset.envtest.release import current_version
from stageset.kube.client import ApiError, KubeClient
from tests.helm.chart import Helm
from tests.helm.hooks import run_cli

pytestmark = [pytest.mark.node, pytest.mark.e2e]

RELEASE = "stageset"
NAMESPACE = "stageset-system"
TENANT = "team-node"
ACCOUNT = f"{RELEASE}"  # fullname when the release is named like the chart
STAGESET = f"/apis/stages.metio.wtf/v1/namespaces/{TENANT}/stagesets/apps"
GITREPO = f"/apis/stages.metio.wtf/v1/namespaces/{TENANT}/gitrepositories/apps"
CONFIGMAP = f"/api/v1/namespaces/{TENANT}/configmaps/from-git"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}"
_WAIT = 240.0
T = TypeVar("T")


def configmap_file(value: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: from-git}}\ndata: {{k: {value}}}\n"


@dataclass
class Day:
    node: Node
    admin: KubeClient
    helm: Helm
    registry: Registry
    published: Published
    git: Any  # tests.gitserver.GitServer
    git_url: str
    seen: dict[str, Any] = field(default_factory=dict)

    def until(self, what: str, check: Callable[[], T | None], *, timeout: float = _WAIT) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.5)
        sys.stderr.write(self.diagnosis())
        pytest.fail(f"{what}: not reached in {timeout:.0f}s (node logs in {self.node.workdir})")

    def pods(self) -> list[dict[str, Any]]:
        found = self.admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                   query={"labelSelector": f"app.kubernetes.io/instance={RELEASE}"})
        return [p for p in found["items"] if "deletionTimestamp" not in p["metadata"]
                and p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "stageset"
                and "job-name" not in p["metadata"].get("labels", {})]

    def ready_pods(self, count: int) -> list[dict[str, Any]] | None:
        pods = self.pods()
        ready = [p for p in pods if p["status"].get("phase") == "Running" and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
        return ready if len(ready) == count == len(pods) else None

    def holder(self) -> str:
        return str((get_or_none(self.admin, LEASE) or {}).get("spec", {}).get("holderIdentity") or "")

    def diagnosis(self) -> str:
        lines = ["\n--- the release's pods ---"]
        for pod in self.pods():
            statuses = pod["status"].get("containerStatuses", [])
            lines.append(f"{pod['metadata']['name']}: {pod['status'].get('phase')} {statuses}")
        for log in sorted(self.node.pod_logs.glob(f"{NAMESPACE}_*/*/*.log")):
            lines.append(f"--- {log.relative_to(self.node.pod_logs)} (tail) ---\n"
                         f"{log.read_text(errors='replace')[-3000:]}")
        kubelet = self.node.log("kubelet").read_text(errors="replace")
        lines.append(f"--- kubelet (tail) ---\n{kubelet[-3000:]}")
        return "\n".join(lines) + "\n"


def get_or_none(admin: KubeClient, path: str) -> dict[str, Any] | None:
    try:
        return admin.get(path)
    except ApiError as error:
        if error.not_found:
            return None
        raise


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), {})


@pytest.fixture(scope="module")
def day(node: Node, admin: KubeClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Day]:
    from tests.gitserver import GitServer

    if os.geteuid() != 0:  # the node fixture has skipped already; the image build needs root too
        pytest.skip("the image build needs root")
    work = tmp_path_factory.mktemp("chart-on-node")
    helm = Helm(binary=ensure_helm(log=False), home=work / "helm", kubeconfig=node.plane.kubeconfig)
    # What `make release` makes for this version: the chart package and the image archive (tagged
    # with the version, labelled); the SBOM and the wheels are tests/release's.
    version = current_version()
    dist = work / "dist"
    (dist / version).mkdir(parents=True)
    release.package_chart(version, dist / version)
    release.release_image(ensure_image(log=False), version, dist / version)
    with registry_server.running() as registry, \
            GitServer(tls=True, tls_addresses=[node.host_ip]) as git:
        published = publish(version, dist=dist, registry=registry.host, plain_http=True, helm_env=helm.env())
        node.trust_registry(registry.host)
        git.create_repo("apps", {"app/cm.yaml": configmap_file("one")})
        port = int(git.base_url.rsplit(":", 1)[1])
        host, relayed = node.expose(port)
        yield Day(node=node, admin=admin, helm=helm, registry=registry, published=published, git=git,
                  git_url=f"https://{host}:{relayed}/apps.git")


def install_values(day: Day) -> list[str]:
    """The registry override is the only image value: repository path and tag are the chart's."""
    return ["--plain-http", "--version", day.published.version,
            "--set", f"image.registry={day.registry.host}",
            "--set", f"controller.watchNamespaces={{{TENANT}}}", "--set", "replicaCount=2"]


def test_the_release_is_in_the_registry_as_the_workflow_pushes_it(day: Day) -> None:
    version = day.published.version
    assert day.registry.tags("stageset/stageset") == [version]
    assert day.registry.tags("stageset/charts/stageset") == [version]
    assert day.published.image == f"{day.registry.host}/stageset/stageset@{day.published.image.split('@')[1]}"
    assert day.published.chart_url == f"oci://{day.registry.host}/stageset/charts/stageset"
    # Nothing of the image is on the node yet: the install below makes containerd pull it.
    assert day.published.image_tag not in day.node.ctr("images", "list", "--quiet").split()


def test_a_hook_whose_image_cannot_be_pulled_fails_fast_leaves_nothing_and_says_why(day: Day) -> None:
    """An install whose image is not in the registry: the CRD hook Job ends at its deadline (not at
    Helm's timeout), Helm fails naming it, nothing of the hook is left (no Job, no pod, no
    ServiceAccount or rights), and ``stageset check`` says the image could not be pulled."""
    release, namespace = "broken", "stageset-broken"
    job = f"{release}-stageset-crds"
    result = day.helm.run("install", release, day.published.chart_url, "--namespace", namespace,
                          "--create-namespace", "--plain-http", "--version", day.published.version,
                          "--set", f"image.registry={day.registry.host}", "--set", "image.tag=no-such-tag",
                          "--set", "crds.hook.activeDeadlineSeconds=30", "--wait", "--timeout", "4m",
                          check=False)
    sys.stderr.write(f"\nhelm install (image not in the registry):\n{result.stdout}{result.stderr}\n")
    assert result.returncode != 0
    assert job in result.stderr
    assert "context deadline exceeded" not in result.stderr  # the Job's own deadline ended it, not Helm's
    hook_objects = [f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}",
                    f"/api/v1/namespaces/{namespace}/serviceaccounts/{job}",
                    f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{namespace}-{job}",
                    f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{namespace}-{job}"]
    for path in hook_objects:
        assert get_or_none(day.admin, path) is None, path
    day.until("the hook's pod gone", lambda: not day.admin.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"job-name={job}"})["items"])
    check = run_cli("check", "-n", namespace, kubeconfig=day.node.plane.kubeconfig)
    sys.stderr.write(f"\nstageset check:\n{check.stdout}{check.stderr}\n")
    assert check.returncode == 3
    failed = f"release {namespace}/{release} (revision 1, chart {day.published.version}): failed"
    assert failed in check.stdout
    reason = next(line for line in check.stdout.splitlines() if f"hook Job {namespace}/{job}:" in line)
    assert f"{day.registry.host}/stageset/stageset:no-such-tag" in reason, reason
    assert "pull" in reason.lower(), reason
    day.helm.run("uninstall", release, "--namespace", namespace)
    day.seen["failed-hook"] = True


def test_the_chart_installs_and_its_pods_turn_ready_with_the_default_security_context(day: Day) -> None:
    create_tenant(day.admin, namespace=TENANT, service_account="deployer")  # the release binds into it
    result = day.helm.run("install", RELEASE, day.published.chart_url, "--namespace", NAMESPACE,
                          "--create-namespace", *install_values(day), "--wait", "--timeout", "5m",
                          check=False)
    if result.returncode != 0:
        sys.stderr.write(day.diagnosis())
    assert result.returncode == 0, result.stderr
    pods = day.until("two controller pods Running and Ready", lambda: day.ready_pods(2))
    for pod in pods:
        spec = pod["spec"]
        container = next(c for c in spec["containers"] if c["name"] == "controller")
        # The chart's defaults, unchanged, and the kubelet ran the image under them.
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["image"] == day.published.image_tag
        assert spec["nodeName"] == day.node.name
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "controller")
        assert status["ready"] is True, status
        assert status["restartCount"] == 0, status
        # The kubelet ran the very image the release pushed: pulled from the registry by digest.
        assert status["imageID"] == day.published.image, status
    assert day.published.image_tag in day.node.ctr("images", "list", "--quiet").split()
    # The CRDs were applied by the chart's hook Job, which ran the image on the node.
    assert day.admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/stagesets.stages.metio.wtf")
    day.seen["installed"] = [p["metadata"]["name"] for p in pods]


def test_a_stageset_reconciles_from_a_git_server_reached_from_the_pod_network(day: Day) -> None:
    assert day.seen.get("installed"), "the install scenario did not pass"
    day.admin.apply(f"/api/v1/namespaces/{TENANT}/secrets/git-ca", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-ca", "namespace": TENANT},
        "stringData": {"caFile": day.git.ca_pem.decode()}}, field_manager="test")
    day.admin.apply(GITREPO, {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": "apps", "namespace": TENANT},
        "spec": {"url": day.git_url, "ref": {"branch": "main"}, "secretRef": {"name": "git-ca"},
                 "interval": "5s", "serviceAccountName": "deployer"}}, field_manager="test")
    day.admin.apply(STAGESET, {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "apps", "namespace": TENANT},
        "spec": {"serviceAccountName": "deployer",
                 "stages": [{"name": "app", "sourceRef": {"name": "apps"}, "path": "./app"}]}},
        field_manager="test")
    day.until("the StageSet Ready", lambda: condition(get_or_none(day.admin, STAGESET), "Ready")
              .get("status") == "True")
    applied = day.admin.get(CONFIGMAP)
    assert applied["data"] == {"k": "one"}
    # The fetch came through the pod network: the Git server saw it.
    assert day.git.fetch_count() >= 1
    holder = day.holder()
    assert holder.split("_", 1)[0] in day.seen["installed"], holder
    # `stageset logs` reads the running controller pods' logs through pods/log (the kubelet serves
    # them) and keeps the lines about this StageSet only.
    logs = run_cli("logs", "apps", "-n", TENANT, "--controller-namespace", NAMESPACE, "-o", "json",
                   kubeconfig=day.node.plane.kubeconfig)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    lines = [json.loads(line) for line in logs.stdout.splitlines() if line.strip()]
    assert lines, f"no log line about the StageSet: {logs.stderr}"
    assert {line.get("stageset") for line in lines} == {f"{TENANT}/apps"}
    day.seen["reconciled"] = True


def test_killing_the_leader_pod_hands_over_to_the_other_replica(day: Day) -> None:
    assert day.seen.get("reconciled"), "the reconcile scenario did not pass"
    leader = day.holder().split("_", 1)[0]
    day.admin.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{leader}",
                      query={"gracePeriodSeconds": 0})
    # The killed leader releases the Lease on SIGTERM; whichever live replica reads it next takes
    # it: the standby (polling every 2 s) or the pod the Deployment started in its place, whose
    # first attempt may come first. Either is a hand-over; the commit below proves it leads.
    day.until("another replica holds the Lease",
              lambda: (holder := day.holder().split("_", 1)[0]) and holder != leader)
    # The new leader reconciles: a new commit reaches the cluster.
    day.git.commit("apps", {"app/cm.yaml": configmap_file("two")}, message="two")
    day.until("the new leader applies the new commit",
              lambda: (get_or_none(day.admin, CONFIGMAP) or {}).get("data") == {"k": "two"})
    # The Deployment replaced the killed pod.
    replaced = day.until("two Ready pods again", lambda: day.ready_pods(2))
    day.seen["before-upgrade"] = sorted(p["metadata"]["name"] for p in replaced)


def test_helm_upgrade_rolls_the_pods_and_the_lease_moves_to_a_new_one(day: Day) -> None:
    assert day.seen.get("before-upgrade"), "the leader scenario did not pass"
    result = day.helm.run("upgrade", RELEASE, day.published.chart_url, "--namespace", NAMESPACE,
                          "--plain-http", "--version", day.published.version, "--reuse-values",
                          "--set", "podAnnotations.rolled=yes", "--wait", "--timeout", "5m", check=False)
    if result.returncode != 0:
        sys.stderr.write(day.diagnosis())
    assert result.returncode == 0, result.stderr
    old = set(day.seen["before-upgrade"])
    rolled = day.until("two Ready pods of the new template",
                       lambda: (lambda pods: pods if pods and not old & {p["metadata"]["name"] for p in pods}
                                else None)(day.ready_pods(2)))
    assert all(p["metadata"].get("annotations", {}).get("rolled") == "yes" for p in rolled)
    new = {p["metadata"]["name"] for p in rolled}
    day.until("a new pod holds the Lease", lambda: day.holder().split("_", 1)[0] in new)
    day.git.commit("apps", {"app/cm.yaml": configmap_file("three")}, message="three")
    day.until("the upgraded controller applies a new commit",
              lambda: (get_or_none(day.admin, CONFIGMAP) or {}).get("data") == {"k": "three"})
    day.seen["upgraded"] = True


def test_stageset_uninstall_tears_down_and_removes_the_release(day: Day) -> None:
    assert day.seen.get("upgraded"), "the upgrade scenario did not pass"
    result = run_cli("uninstall", "--release", RELEASE, "-n", NAMESPACE, "--teardown", "--yes",
                     "--helm-binary", str(day.helm.binary),
                     kubeconfig=day.node.plane.kubeconfig)
    sys.stderr.write(f"\nstageset uninstall --teardown:\n{result.stdout}{result.stderr}\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert get_or_none(day.admin, STAGESET) is None
    assert get_or_none(day.admin, CONFIGMAP) is None  # the StageSet's objects went with it
    assert get_or_none(day.admin, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{ACCOUNT}") is None
    day.until("the controller pods gone", lambda: not day.pods())
