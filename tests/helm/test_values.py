"""Every value of issue 17 rendered by the real ``helm``: the CRDs' hook, sizing derived from the
flags, the escape hatches (still schema-checked), the cleanupOnDelete hook, NetworkPolicy,
topology spread, the ServiceAccount, common labels and annotations, and the OpenShift rendering.

No cluster here (``test_install.py`` installs, upgrades and uninstalls into a real apiserver).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sources.artifacts import MAX_TREE_OVERHEAD_BYTES
from sources.limits import ArtifactLimits
from stageset.api.crd import MIN_KUBERNETES
from stageset.apply.cel import CelLimits
from stageset.build import BuildLimits
from stageset.build.kustomize import _GO_RUNTIME_DATA
from stageset.cli.main import artifact_settings
from stageset.cli.main import main as cli
from stageset.controller.settings import ArtifactSettings
from tests.helm.chart import CHART, Helm, controller_args, controller_container, find, one, without_hooks

MiB = 2**20
CONTROLLER_BASE = 256 * MiB
"""What the chart reserves for the controller process itself (docs/sizing.md: 77 MiB + ~24 KiB per
StageSet measured, so good for thousands of StageSets)."""


def needed(workers: int, kustomize: int = BuildLimits().kustomize_memory_bytes) -> int:
    """The sizing rule from the code's own limits: one build per worker (RLIMIT_DATA = heap + Go
    runtime), every CEL worker at its RLIMIT_DATA, and the controller."""
    cel = CelLimits()
    return CONTROLLER_BASE + workers * (kustomize + _GO_RUNTIME_DATA) + cel.workers * cel.memory_bytes


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(docs, "Deployment")["spec"]["template"]["spec"])


# --------------------------------------------------------------------------- CRDs


def test_the_crds_are_applied_by_a_hook_never_rendered(helm: Helm) -> None:
    """The CRDs are no objects of the release (so no release owns them, and uninstalling never deletes
    them): a pre-install/pre-upgrade hook Job applies the image's (`stageset crds --apply`), before
    anything else of the release, with the controller pod's image, security context and placement."""
    docs = helm.render("--set", "nodeSelector.pool=system", "--set", "imagePullSecrets[0].name=pull")
    assert not find(docs, "CustomResourceDefinition")
    job = one(docs, "Job", "stageset-crds")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in docs
               if d["metadata"]["name"].endswith("-crds")}
    assert weights["Job"] > weights["ServiceAccount"] == weights["ClusterRoleBinding"]  # rights first
    pod = job["spec"]["template"]["spec"]
    controller = pod_spec(docs)
    assert pod["containers"][0]["command"] == ["stageset", "crds", "--apply", "--tenant-roles"]
    cli.commands["crds"].make_context("crds", ["--apply", "--tenant-roles"])  # type: ignore[attr-defined]
    assert pod["containers"][0]["image"] == controller["containers"][0]["image"]
    assert pod["securityContext"] == controller["securityContext"]
    assert pod["containers"][0]["securityContext"] == controller["containers"][0]["securityContext"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    assert pod["serviceAccountName"] == "stageset-crds"
    # Not selected by the controller Deployment, its Service or its PDB (no app.kubernetes.io/name).
    assert "app.kubernetes.io/name" not in job["spec"]["template"]["metadata"]["labels"]
    # Accepted (and ignored) for --reuse-values upgrades from charts that rendered the CRDs.
    helm.render("--set", "crds.keep=false", "--set", "crds.annotations.owner=platform")
    assert not find(helm.render("--set", "crds.install=false"), "Job")


def test_the_crd_hook_fails_fast_and_its_rights_go_after_it(helm: Helm) -> None:
    """Issue 50: the hook Job ends by itself well inside Helm's 5-minute wait; on failure Helm prints
    its pod's log, deletes the Job and only then its ServiceAccount and rights (the failed hook is
    deleted before the earlier ones)."""
    docs = helm.render()
    job = one(docs, "Job", "stageset-crds")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded,hook-failed"
    assert annotations["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert (job["spec"]["activeDeadlineSeconds"], job["spec"]["backoffLimit"]) == (120, 1)
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        rights = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith("-crds"))
        # Kept when the hook fails (Helm deletes them after the Job), gone when it succeeded.
        assert rights["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == \
            "before-hook-creation,hook-succeeded", kind
    tuned = one(helm.render("--set", "crds.hook.activeDeadlineSeconds=45",
                            "--set", "crds.hook.backoffLimit=0"), "Job", "stageset-crds")
    assert (tuned["spec"]["activeDeadlineSeconds"], tuned["spec"]["backoffLimit"]) == (45, 0)
    refused = helm.template("--set", "crds.hook.activeDeadlineSeconds=5", check=False)
    assert refused.returncode != 0
    assert "activeDeadlineSeconds" in refused.stderr


def test_the_registry_override_is_the_only_value_an_install_from_a_mirror_needs(helm: Helm) -> None:
    """image.registry replaces the registry of image.repository everywhere the image is named."""
    docs = helm.render("--set", "image.registry=127.0.0.1:5000", "--set", "cleanupOnDelete.enabled=true",
                       "--set", "dashboard.enabled=true")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    images = {c["image"] for d in docs if d["kind"] in ("Deployment", "Job")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"127.0.0.1:5000/stageset/stageset:{version}"}
    mirrored = controller_container(helm.render("--set", "image.registry=registry.example.com/mirror"))
    assert mirrored["image"] == f"registry.example.com/mirror/stageset/stageset:{version}"
    # A repository without a registry part (Docker Hub's) gets the registry in front of it.
    bare = controller_container(helm.render("--set", "image.repository=team/stageset",
                                            "--set", "image.registry=mirror.example.com"))
    assert bare["image"] == f"mirror.example.com/team/stageset:{version}"
    assert controller_container(helm.render())["image"] == f"ghcr.io/stageset/stageset:{version}"
    assert helm.template("--set", "image.registry=https://x", check=False).returncode != 0


def test_the_tenant_roles_are_applied_by_the_crd_hook_with_escalate_on_their_names_only(helm: Helm) -> None:
    """stageset-tenant-deployer and -admin have fixed names (every tenant's RoleBindings name them):
    no release renders them as its own objects; the CRD hook applies them (`--tenant-roles`), its
    account may write exactly those two names, with `escalate` to write rules it does not hold."""
    docs = helm.render()
    assert not [d for d in find(docs, "ClusterRole") if d["metadata"]["name"].startswith("stageset-tenant-")]
    hook = one(docs, "ClusterRole", "stageset-system-stageset-crds")
    assert {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
            "resourceNames": ["stageset-tenant-deployer", "stageset-tenant-admin"],
            "verbs": ["get", "create", "patch", "escalate"]} in hook["rules"]
    assert all(r.get("resourceNames") for r in hook["rules"]), "nothing beyond named objects"
    off = helm.render("--set", "rbac.tenantRoles=false")
    assert one(off, "Job", "stageset-crds")["spec"]["template"]["spec"]["containers"][0]["command"] == \
        ["stageset", "crds", "--apply"]
    assert not [r for r in one(off, "ClusterRole", "stageset-system-stageset-crds")["rules"]
                if "clusterroles" in r["resources"]]


def test_kube_version_is_what_the_crds_need(helm: Helm) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]}.0-0"
    assert chart["version"] == chart["appVersion"]
    older = helm.template("--kube-version", f"1.{MIN_KUBERNETES[1] - 1}.0", check=False)
    assert older.returncode != 0
    assert "kubeVersion" in older.stderr or "incompatible" in older.stderr, older.stderr


# --------------------------------------------------------------------------- sizing


def test_the_default_memory_limit_is_what_the_default_flags_need(helm: Helm) -> None:
    container = controller_container(helm.render())
    assert container["resources"]["limits"]["memory"] == f"{needed(4) // MiB}Mi"


def test_raising_workers_with_memory_at_default_fails_naming_both(helm: Helm) -> None:
    result = helm.template("--set", "controller.workers=8", check=False)
    assert result.returncode != 0
    assert "controller.resources.limits.memory=2304Mi" in result.stderr, result.stderr
    assert "controller.workers=8" in result.stderr
    assert f"{needed(8) // MiB}Mi" in result.stderr
    # Enough memory for eight builds: accepted; no memory limit at all: accepted (nothing to exceed).
    helm.render("--set", "controller.workers=8",
                "--set", f"controller.resources.limits.memory={needed(8) // MiB}Mi")
    helm.render("--set", "controller.workers=8", "--set", "controller.resources.limits=null")
    bigger_builds = helm.template("--set", "controller.build.kustomizeMemory=1Gi", check=False)
    assert f"{needed(4, kustomize=1024 * MiB) // MiB}Mi" in bigger_builds.stderr
    assert "controller.build.kustomizeMemory=1Gi" in bigger_builds.stderr


def test_drift_watches_past_the_reserve_raise_the_memory_the_chart_requires(helm: Helm) -> None:
    """The controller's 256Mi reserve covers the default 500 drift watches; each one more needs 160Ki
    (a thread and a TLS connection, measured about 145 KiB: docs/sizing.md#drift-watches)."""
    assert controller_args(helm.render()).count("--max-drift-watches=500") == 1
    helm.render("--set", "controller.maxDriftWatches=500")
    more = needed(4) + 1500 * 160 * 1024
    refused = helm.template("--set", "controller.maxDriftWatches=2000", check=False)
    assert refused.returncode != 0
    assert "controller.maxDriftWatches=2000" in refused.stderr, refused.stderr
    assert f"{-(-more // MiB)}Mi" in refused.stderr
    helm.render("--set", "controller.maxDriftWatches=2000",
                "--set", f"controller.resources.limits.memory={-(-more // MiB)}Mi")
    helm.render("--set", "controller.maxDriftWatches=0")


def test_mirror_volume_has_headroom_over_the_budget_and_tmp_is_bounded(helm: Helm) -> None:
    def volumes(*values: str) -> dict[str, Any]:
        return {v["name"]: v for v in pod_spec(helm.render(*values))["volumes"]}

    default = volumes()
    # 2Gi of mirrors + 4 source workers x 512Mi fetched at most each.
    assert default["mirrors"]["emptyDir"]["sizeLimit"] == "4Gi"  # 2Gi + 4 x 512Mi, as the apiserver writes it
    assert default["tmp"]["emptyDir"]["sizeLimit"] == "256Mi"
    tuned = volumes("--set", "controller.mirrors.maxSize=500Mi", "--set", "controller.sourceWorkers=2",
                    "--set", "controller.git.maxFetchSize=100M", "--set", "controller.tmp.maxSize=64Mi")
    assert tuned["mirrors"]["emptyDir"]["sizeLimit"] == f"{500 + -(-2 * 100_000_000 // MiB)}Mi"
    assert tuned["tmp"]["emptyDir"]["sizeLimit"] == "64Mi"


def test_artifacts_have_a_volume_of_their_own_sized_for_the_budget_and_downloads_in_flight(
        helm: Helm) -> None:
    """Not /tmp: a store that fills its budget, with every source worker downloading at the limits,
    stays within its emptyDir's sizeLimit, so the kubelet never evicts the pod for it."""
    controller = cli.commands["controller"]  # type: ignore[attr-defined]

    def rendered(*values: str) -> tuple[ArtifactSettings, dict[str, Any], dict[str, Any]]:
        docs = helm.render(*values)
        params = controller.make_context("controller", list(controller_args(docs))).params
        mounts = {m["name"]: m["mountPath"] for m in controller_container(docs)["volumeMounts"]}
        return artifact_settings(params), {v["name"]: v for v in pod_spec(docs)["volumes"]}, mounts

    settings, volumes, mounts = rendered()
    assert str(settings.directory) == mounts["artifacts"] == "/var/cache/stageset-artifacts"
    # The controller's own defaults, now said by the chart.
    assert (settings.max_bytes, settings.max_tenant_bytes) == (ArtifactSettings().max_bytes,
                                                               ArtifactSettings().max_tenant_bytes)
    assert settings.limits == ArtifactLimits()
    # 1Gi of trees + 4 source workers x (100Mi spool + 100Mi staged tree + its index).
    per_download = 100 * MiB + 100 * MiB + MAX_TREE_OVERHEAD_BYTES
    assert 8 * MiB == MAX_TREE_OVERHEAD_BYTES  # the 8Mi the template adds per download
    assert volumes["artifacts"]["emptyDir"]["sizeLimit"] == f"{(1024 * MiB + 4 * per_download) // MiB}Mi"
    assert volumes["tmp"]["emptyDir"]["sizeLimit"] == "256Mi"  # nothing of the artifacts lands there

    settings, volumes, _ = rendered(
        "--set", "controller.artifacts.maxSize=3Gi", "--set", "controller.artifacts.tenantMaxSize=1Gi",
        "--set", "controller.artifacts.maxDownloadSize=20M",
        "--set", "controller.artifacts.maxUnpackedSize=300Mi",
        "--set", "controller.sourceWorkers=3")
    assert (settings.max_bytes, settings.max_tenant_bytes) == (3 * 1024 * MiB, 1024 * MiB)
    assert (settings.limits.max_download_bytes, settings.limits.max_unpacked_bytes) == (20_000_000, 300 * MiB)
    in_flight = 3 * (20_000_000 + 300 * MiB + MAX_TREE_OVERHEAD_BYTES)
    assert volumes["artifacts"]["emptyDir"]["sizeLimit"] == f"{-(-(3 * 1024 * MiB + in_flight) // MiB)}Mi"
    # A tenant's share equal to the whole store is allowed (a single-tenant cluster).
    helm.render("--set", "controller.artifacts.tenantMaxSize=1Gi")


# --------------------------------------------------------------------------- escape hatches

CA_BUNDLE = [
    "--set", "extraVolumes[0].name=corp-ca", "--set", "extraVolumes[0].configMap.name=corp-ca-bundle",
    "--set", "extraVolumeMounts[0].name=corp-ca", "--set", "extraVolumeMounts[0].mountPath=/etc/ssl/corp",
    "--set", "extraVolumeMounts[0].readOnly=true",
    "--set", "controller.env[0].name=SSL_CERT_FILE", "--set", "controller.env[0].value=/etc/ssl/corp/ca.crt",
    "--set", "controller.env[1].name=HTTPS_PROXY", "--set", "controller.env[1].value=http://proxy.corp:3128",
    "--set", "controller.envFrom[0].secretRef.name=proxy-credentials",
]


def test_env_volumes_and_mounts_reach_the_pod(helm: Helm) -> None:
    docs = helm.render(*CA_BUNDLE)
    container, pod = controller_container(docs), pod_spec(docs)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env == {"TMPDIR": "/tmp", "SSL_CERT_FILE": "/etc/ssl/corp/ca.crt", "HTTPS_PROXY": "http://proxy.corp:3128"}
    assert container["envFrom"] == [{"secretRef": {"name": "proxy-credentials"}}]
    assert {"name": "corp-ca", "configMap": {"name": "corp-ca-bundle"}} in pod["volumes"]
    assert {"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True} in container["volumeMounts"]


def test_extra_args_reach_the_controller_and_cannot_override_a_value(helm: Helm) -> None:
    controller = cli.commands["controller"]  # type: ignore[attr-defined]
    args = controller_args(helm.render("--set", "controller.extraArgs={--allow-insecure-sources}"))
    assert args[-1] == "--allow-insecure-sources"
    assert controller.make_context("controller", list(args)).params["allow_insecure_sources"] is True
    # Every flag the chart renders in any mode is the chart's: passing it again is refused.
    rendered: set[str] = set()
    every = ["--set", "rbac.clusterAdmin=true", "--set", "controller.watchNamespaces={a}",
             "--set", "controller.noCrossNamespaceRefs=true", "--set", "controller.build.maxDepth=5",
             "--set", "controller.allowedActionHosts={hooks.example.com}",
             "--set", "controller.defaultServiceAccount=stageset-deployer"]
    for values in ([], every):
        rendered |= {a[2:].partition("=")[0] for a in controller_args(helm.render(*values))}
    for flag in sorted(rendered):
        result = helm.template("--set", f"controller.extraArgs={{--{flag}=x}}", check=False)
        assert result.returncode != 0, flag
        assert f"controller.extraArgs: --{flag} is set by the chart" in result.stderr, result.stderr


@pytest.mark.parametrize(("values", "named"), [
    (["--set", "controller.extraArgs={workers=8}"], "/controller/extraArgs/0"),
    (["--set", "controller.env[0].value=x"], "/controller/env/0"),
    (["--set", "controller.env[0].name=A", "--set", "controller.env[0].valueFrom.bogus.name=x"],
     "/controller/env/0/valueFrom"),
    (["--set", "extraVolumes[0].name=ca"], "/extraVolumes/0"),
    (["--set", "extraVolumes[0].name=ca", "--set", "extraVolumes[0].gitRepo.repository=x"],
     "/extraVolumes/0"),
    (["--set", "extraVolumeMounts[0].name=ca", "--set", "extraVolumeMounts[0].mountPath=relative"],
     "/extraVolumeMounts/0/mountPath"),
    (["--set", "podSecurityContext.runAsUser=-1"], "/podSecurityContext/runAsUser"),
    (["--set", "securityContext.privilegd=true"], "'privilegd'"),
    (["--set", "networkPolicy.enabled=yes"], "/networkPolicy/enabled"),
    (["--set", "topologySpreadConstraints[0].maxSkew=1"], "/topologySpreadConstraints/0"),
    (["--set", "serviceAccount.name=Not_Valid"], "/serviceAccount/name"),
    (['--set', 'commonLabels.bad label=x'], "'bad label'"),
    (["--set", "crds.install=maybe"], "/crds/install"),
    (["--set", "cleanupOnDelete.timeout=10"], "/cleanupOnDelete/timeout"),
    (["--set", "controller.tmp.maxSize=lots"], "/controller/tmp/maxSize"),
    (["--set", "controller.artifacts.maxSize=1GB"], "/controller/artifacts/maxSize"),
    (["--set", "controller.artifacts.tenantMaxSize=-1"], "/controller/artifacts/tenantMaxSize"),
    (["--set", "controller.artifacts.maxDownloadSize=big"], "/controller/artifacts/maxDownloadSize"),
    (["--set", "controller.artifacts.maxUnpackedSize=1.5Gi"], "/controller/artifacts/maxUnpackedSize"),
    (["--set", "controller.artifacts.maxFiles=10"], "'maxFiles'"),
])
def test_new_values_are_schema_checked(helm: Helm, values: list[str], named: str) -> None:
    result = helm.template(*values, check=False)
    assert result.returncode != 0, values
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert named in result.stderr, result.stderr


@pytest.mark.parametrize(("values", "message"), [
    (["--set", "extraVolumes[0].name=tmp", "--set", "extraVolumes[0].emptyDir.medium=Memory"],
     'extraVolumes: the volume name "tmp" is the chart\'s own'),
    (["--set", "extraVolumeMounts[0].name=x", "--set", "extraVolumeMounts[0].mountPath=/tmp/"],
     "extraVolumeMounts: /tmp/ (x) is the chart's own mount"),
    (["--set", "extraVolumes[0].name=artifacts", "--set", "extraVolumes[0].emptyDir.medium=Memory"],
     'extraVolumes: the volume name "artifacts" is the chart\'s own'),
    (["--set", "extraVolumeMounts[0].name=x",
      "--set", "extraVolumeMounts[0].mountPath=/var/cache/stageset-artifacts"],
     "extraVolumeMounts: /var/cache/stageset-artifacts (x) is the chart's own mount"),
    (["--set", "controller.artifacts.tenantMaxSize=2Gi"],
     "controller.artifacts.tenantMaxSize=2Gi is larger than controller.artifacts.maxSize=1Gi"),
    (["--set", "controller.artifacts.maxSize=64Mi", "--set", "controller.artifacts.tenantMaxSize=64Mi"],
     "controller.artifacts.maxSize=64Mi is smaller than controller.artifacts.maxUnpackedSize=100Mi"),
    (["--set", "serviceAccount.create=false"], "serviceAccount.create=false needs serviceAccount.name"),
    (["--set", "controller.mirrors.maxSize=500Mi"],
     "controller.mirrors.maxSize=500Mi is smaller than controller.git.maxFetchSize=512Mi"),
    (["--set", "cleanupOnDelete.enabled=true", "--set", "cleanupOnDelete.timeout=65m"],
     "cleanupOnDelete.timeout=65m does not fit in the time helm uninstall waits for its hook "
     "(cleanupOnDelete.uninstallTimeout=5m; Helm's default --timeout is 5m) with 30s for the pod to start: "
     "lower cleanupOnDelete.timeout, or pass `helm uninstall --timeout 3960s` and set "
     "cleanupOnDelete.uninstallTimeout to that"),
    (["--set", "cleanupOnDelete.enabled=true", "--set", "cleanupOnDelete.timeout=4m31s"],
     "cleanupOnDelete.timeout=4m31s does not fit"),
])
def test_inconsistent_new_values_are_refused_with_what_to_do(helm: Helm, values: list[str],
                                                             message: str) -> None:
    result = helm.template(*values, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_an_existing_service_account_is_bound_instead_of_created(helm: Helm) -> None:
    docs = without_hooks(helm.render("--set", "serviceAccount.create=false",
                                     "--set", "serviceAccount.name=platform-gitops"))
    assert not find(docs, "ServiceAccount")
    assert pod_spec(docs)["serviceAccountName"] == "platform-gitops"
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "platform-gitops",
                                        "namespace": "stageset-system"}]
    named = without_hooks(helm.render("--set", "serviceAccount.name=gitops"))
    assert one(named, "ServiceAccount")["metadata"]["name"] == "gitops"


def test_common_labels_and_annotations_on_every_object(helm: Helm) -> None:
    docs = helm.render("--set", "commonLabels.team=platform",
                       "--set", "commonLabels.app\\.kubernetes\\.io/name=x",
                       "--set", "commonAnnotations.owner=sre", "--set", "cleanupOnDelete.enabled=true",
                       "--set", "networkPolicy.enabled=true", "--set", "replicaCount=2",
                       "--set", "metrics.serviceMonitor.enabled=true",
                       "--set", "metrics.prometheusRule.enabled=true",
                       "--set", "metrics.grafanaDashboard.enabled=true", "--set", "podAnnotations.scrape=yes")
    assert len({d["kind"] for d in docs}) >= 13  # every kind the chart renders (the CRDs are the hook's)
    for doc in docs:
        meta = doc["metadata"]
        assert meta["labels"]["team"] == "platform", (doc["kind"], meta["name"])
        assert meta["labels"]["app.kubernetes.io/name"] == "stageset"  # the chart's own label wins
        assert meta["annotations"]["owner"] == "sre", (doc["kind"], meta["name"])
    template = one(docs, "Deployment")["spec"]["template"]["metadata"]
    assert template["annotations"] == {"owner": "sre", "scrape": "yes"}
    assert template["labels"]["team"] == "platform"


def test_openshift_rendering_leaves_the_ids_to_the_scc(helm: Helm) -> None:
    """OpenShift's restricted-v2 SCC assigns the UID, GID and fsGroup from the namespace's range and
    refuses pods that set others; the rest of the restricted profile stays (test_install.py has the
    apiserver's PodSecurity admission judge this rendering too)."""
    docs = helm.render(*OPENSHIFT)
    pod = pod_spec(docs)
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = controller_container(docs)
    assert not {"runAsUser", "runAsGroup"} & set(container["securityContext"])
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for job in find(helm.render(*OPENSHIFT, "--set", "cleanupOnDelete.enabled=true"), "Job"):
        assert "runAsUser" not in job["spec"]["template"]["spec"]["securityContext"]


OPENSHIFT = ["--set", "podSecurityContext.runAsUser=null", "--set", "podSecurityContext.runAsGroup=null",
             "--set", "podSecurityContext.fsGroup=null"]


def test_network_policy_and_topology_spread(helm: Helm) -> None:
    assert not find(helm.render(), "NetworkPolicy")
    docs = helm.render("--set", "networkPolicy.enabled=true",
                       "--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
                       "--set", "topologySpreadConstraints[0].maxSkew=1",
                       "--set", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
                       "--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway")
    policy = one(docs, "NetworkPolicy")["spec"]
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    # Every controller pod of the release (each shard's too), never a hook's.
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": "stageset",
                                                    "app.kubernetes.io/part-of": "stageset",
                                                    "app.kubernetes.io/component": "controller"}
    assert policy["policyTypes"] == ["Ingress"]  # egress stays open unless rules are given
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}],
                                  "from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]}]
    spread = pod_spec(docs)["topologySpreadConstraints"]
    assert spread == [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                       "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": selector}}]
    closed = one(helm.render("--set", "networkPolicy.enabled=true", "--set", "metrics.enabled=false",
                             "--set", "networkPolicy.egress[0].ports[0].port=443"), "NetworkPolicy")["spec"]
    assert closed["policyTypes"] == ["Ingress", "Egress"]
    assert closed["ingress"] == []
    assert closed["egress"] == [{"ports": [{"port": 443}]}]


# --------------------------------------------------------------------------- cleanupOnDelete


def test_cleanup_hook_deletes_only_stagesets_of_the_release_s_namespaces(helm: Helm) -> None:
    assert not find(helm.render(), "Job", "stageset-cleanup")
    docs = helm.render("--set", "cleanupOnDelete.enabled=true", "--set", "controller.watchNamespaces={a,b}",
                       release="shard", namespace="ops")
    hooks = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"]
    assert {(d["kind"], d["metadata"].get("namespace", "")) for d in hooks} == {
        ("ServiceAccount", "ops"), ("ClusterRole", ""), ("RoleBinding", "a"), ("RoleBinding", "b"),
        ("Job", "ops")}
    role = one(docs, "ClusterRole", "ops-shard-stageset-cleanup")
    assert role["rules"] == [{"apiGroups": ["stages.metio.wtf"], "resources": ["stagesets"],
                              "verbs": ["get", "list", "watch", "delete", "patch"]}]
    job = one(docs, "Job", "shard-stageset-cleanup")
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 4 * 60 + 30  # inside Helm's default 5m
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "shard-stageset-cleanup"
    command = pod["containers"][0]["command"]
    assert command == ["stageset", "cleanup", "--namespaces=a,b", "--timeout=4m", "--release-remaining"]
    # The command is the CLI's, with flags it accepts.
    cli.commands["cleanup"].make_context("cleanup", command[2:])  # type: ignore[attr-defined]
    everywhere = helm.render("--set", "cleanupOnDelete.enabled=true")
    hook = one(everywhere, "Job", "stageset-cleanup")["spec"]["template"]["spec"]["containers"][0]
    assert "--all-namespaces" in hook["command"]
    assert one(everywhere, "ClusterRoleBinding", "stageset-system-stageset-cleanup")


def test_the_sizing_table_in_the_docs_is_what_the_chart_enforces(helm: Helm) -> None:
    """Each row of docs/sizing.md's table: the limit it gives passes, one MiB less is refused."""
    import re

    page = (CHART.parents[1] / "docs" / "sizing.md").read_text()
    rows = re.findall(r"^\| (\d+)(?: \(default\))? \| (\d+)Mi(?: \(default\))? \| \**(\d+)Mi", page,
                      re.MULTILINE)
    assert len(rows) >= 5, rows
    for workers, kustomize, limit in rows:
        assert int(limit) * MiB == needed(int(workers), int(kustomize) * MiB), (workers, kustomize, limit)
        values = ["--set", f"controller.workers={workers}",
                  "--set", f"controller.build.kustomizeMemory={kustomize}Mi"]
        helm.render(*values, "--set", f"controller.resources.limits.memory={limit}Mi")
        short = helm.template(*values, "--set", f"controller.resources.limits.memory={int(limit) - 1}Mi",
                              check=False)
        assert short.returncode != 0, (workers, kustomize)
