"""``check`` and ``version``: is this cluster ready for the controller, and is the controller healthy.

``check --pre`` (before an install): the apiserver's version against what the CRDs need
(:data:`~stageset.api.crd.MIN_KUBERNETES`), and whether the user may install the chart's
cluster-wide objects.  ``check``: that too, then the CRDs (installed, established, and the same
schema this CLI generates), the chart's Helm releases (each one's latest revision deployed, or
why not: the hook that failed and its reason, from the hook Job or its pods' events), then every
controller Deployment the chart installed (found by its
labels): ready replicas (and when some are not, why: each pod's failing container -- an image
that cannot be pulled, a crash loop -- or why it is not scheduled), the rights its
ServiceAccount needs for the flags it runs with (asked of the apiserver with
SubjectAccessReviews), the leader Lease held and fresh, and ``/metrics`` answering (through the
apiserver's service proxy, or ``--metrics-url`` when the apiserver cannot reach the pod network,
e.g. behind ``kubectl port-forward``).  As ``flux check`` does: one line per check, exit 3 when
any failed.

``version``: this CLI's version, the apiserver's, and each installed controller's (its Deployment's
image and chart labels).

Identity: every request is the user's own (the kubeconfig's credentials).  SubjectAccessReviews
ask what the controller's ServiceAccount may do; they need ``create subjectaccessreviews`` (a
cluster admin has it) and never act as that account.  Nothing is written.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import click
import urllib3

from stageset.api import parse_time
from stageset.api.crd import KINDS, MIN_KUBERNETES, VERSION_ANNOTATION, custom_resource_definition
from stageset.api.rbac import (
    CONTROLLER_RULES,
    LEADER_ELECTION_RULES,
    TOKEN_REQUEST_RULES,
    WORKLOAD_TARGET_RULES,
)
from stageset.cli import helmstore
from stageset.cli.session import CliError, Session, cluster_options, dump, echo
from stageset.kube.client import ApiError, KubeClient

CONTROLLER_SELECTOR = "app.kubernetes.io/part-of=stageset,app.kubernetes.io/component=controller"
"""The labels the chart puts on every controller Deployment (helm/stageset/templates/_helpers.tpl)."""
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"


def client_version() -> str:
    try:
        return importlib.metadata.version("stageset")
    except importlib.metadata.PackageNotFoundError:  # a checkout without an installed distribution
        return "unknown"


def kubernetes_version(client: KubeClient) -> tuple[str, tuple[int, int] | None]:
    """The apiserver's ``gitVersion`` and its (major, minor), when readable."""
    info = client.get("/version")
    text = str(info.get("gitVersion", ""))
    match = re.match(r"v?(\d+)\.(\d+)", text)
    return text, (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class Controller:
    """One controller Deployment the chart installed, and the flags it runs with."""

    namespace: str
    name: str
    release: str
    chart: str
    image: str
    service_account: str
    flags: dict[str, str]
    replicas: int
    ready: int
    selector: dict[str, str] = field(default_factory=dict)
    app_version: str = ""
    """The chart's ``app.kubernetes.io/version`` label (its appVersion)."""
    replica_failure: str = ""
    """The Deployment's ``ReplicaFailure`` message (its pods could not be created: quota, policy)."""

    @property
    def version(self) -> str:
        """The image's tag; for an image pinned by digest, the chart's appVersion."""
        name = self.image.partition("@")[0]
        last = name.rpartition("/")[2]
        if ":" in last and "@" not in self.image:
            return last.rpartition(":")[2]
        return self.app_version or "unknown"


def parse_flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` / ``--name`` (a switch, ``"true"``) as {name: value}; the last one wins."""
    flags: dict[str, str] = {}
    for arg in args:
        if arg.startswith("--"):
            name, sep, value = arg[2:].partition("=")
            flags[name] = value if sep else "true"
    return flags


def find_controllers(client: KubeClient, namespace: str | None) -> list[Controller]:
    """The chart's controller Deployments (in ``namespace``, or every namespace)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments" if namespace else "/apis/apps/v1/deployments"
    try:
        items = client.request("GET", path, query={"labelSelector": CONTROLLER_SELECTOR}).get("items", [])
    except ApiError as error:
        if error.forbidden:
            where = f"in namespace {namespace}" if namespace else "in every namespace (or pass -n)"
            raise CliError(f"you may not list Deployments {where}: {error.message}") from None
        raise
    found = []
    for item in items:
        meta, spec = item["metadata"], item.get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") or {}
        container = next((c for c in pod.get("containers", []) if c.get("name") == "controller"), None)
        if container is None:
            continue
        labels = meta.get("labels") or {}
        found.append(Controller(
            namespace=meta["namespace"], name=meta["name"],
            release=labels.get("app.kubernetes.io/instance", ""),
            chart=labels.get("helm.sh/chart", ""), image=str(container.get("image", "")),
            service_account=pod.get("serviceAccountName") or "default",
            flags=parse_flags([str(a) for a in container.get("args", [])]),
            replicas=int(spec.get("replicas", 1)),
            ready=int((item.get("status") or {}).get("readyReplicas", 0)),
            selector=dict((spec.get("selector") or {}).get("matchLabels") or {}),
            app_version=labels.get("app.kubernetes.io/version", ""),
            replica_failure=next((str(c.get("message") or c.get("reason") or "")
                                  for c in (item.get("status") or {}).get("conditions") or []
                                  if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), "")))
    return sorted(found, key=lambda c: (c.namespace, c.name))


# Waiting reasons that are only a pod starting, not a failure.
_STARTING = {"ContainerCreating", "PodInitializing"}


def _container_problems(pod: str, statuses: list[dict[str, Any]]) -> Iterator[str]:
    for status in statuses:
        state = status.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        where = f"pod {pod} container {status.get('name')}"
        if waiting.get("reason") and waiting["reason"] not in _STARTING:
            message = str(waiting.get("message") or "").strip()
            yield f"{where}: {waiting['reason']}" + (f" ({_short(message)})" if message else "")
        elif terminated and terminated.get("exitCode") not in (0, None):
            yield (f"{where}: {terminated.get('reason') or 'terminated'} (exit code {terminated['exitCode']}"
                   + (f": {_short(str(terminated['message']))}" if terminated.get("message") else "") + ")")
        last = (status.get("lastState") or {}).get("terminated") or {}
        if waiting.get("reason") == "CrashLoopBackOff" and last.get("exitCode") not in (0, None):
            yield f"{where} last exited with code {last['exitCode']} ({last.get('reason') or 'Error'})"


def _short(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def pod_problems(client: KubeClient, controller: Controller) -> list[str]:
    """Why the controller's pods are not ready, named as ``kubectl describe pod`` would: a
    container waiting (``ImagePullBackOff``, ``CrashLoopBackOff``, ``CreateContainerConfigError``)
    or exited with an error, a pod that cannot be scheduled, or no pod at all (the Deployment's
    ``ReplicaFailure``).  Read as the user; empty when nothing is known to be wrong."""
    if controller.replica_failure:
        return [f"pods cannot be created: {_short(controller.replica_failure)}"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(controller.selector.items()))
    try:
        pods = client.request("GET", f"/api/v1/namespaces/{controller.namespace}/pods",
                              query={"labelSelector": selector}).get("items", [])
    except ApiError as error:
        if error.forbidden:
            return [f"you may not list pods in {controller.namespace}: {error.message}"]
        raise
    if not pods:
        return ["no pods: see `kubectl -n " f"{controller.namespace} describe deployment {controller.name}`"]
    found: list[str] = []
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        name, status = str(pod["metadata"]["name"]), pod.get("status") or {}
        problems = [*_container_problems(name, status.get("initContainerStatuses") or []),
                    *_container_problems(name, status.get("containerStatuses") or [])]
        scheduled: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        if scheduled.get("status") == "False":
            problems.append(f"pod {name}: {scheduled.get('reason') or 'not scheduled'}"
                            + (f" ({_short(str(scheduled['message']))})" if scheduled.get("message") else ""))
        if status.get("phase") == "Failed":
            why = _short(str(status.get("reason") or status.get("message") or ""))
            problems.append(f"pod {name}: Failed ({why})")
        found.extend(problems)
    return found


# -- the report ----------------------------------------------------------------------------------


class Report:
    """``► section`` and ``✔``/``✗`` lines, as flux check prints them; counts the failures."""

    def __init__(self) -> None:
        self.failures = 0

    def section(self, title: str) -> None:
        echo(f"► {title}\n")

    def ok(self, text: str) -> None:
        echo(f"✔ {text}\n")

    def fail(self, text: str) -> None:
        self.failures += 1
        echo(f"✗ {text}\n")

    def outcome(self, passed: bool, text: str) -> None:
        (self.ok if passed else self.fail)(text)


def _review(client: KubeClient, *, user: str, groups: list[str], attributes: dict[str, str]) -> bool:
    review = client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}})
    return bool((review.get("status") or {}).get("allowed"))


def _self_review(client: KubeClient, attributes: dict[str, str]) -> bool:
    review = client.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes}})
    return bool((review.get("status") or {}).get("allowed"))


def _needed(rules: list[dict[str, Any]], namespace: str) -> Iterator[dict[str, str]]:
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                plural, _, sub = resource.partition("/")
                for verb in rule["verbs"]:
                    attributes = {"verb": verb, "group": group, "resource": plural, "subresource": sub}
                    if namespace:
                        attributes["namespace"] = namespace
                    yield attributes


def _describe(attributes: dict[str, str]) -> str:
    resource = attributes["resource"] + (f"/{attributes['subresource']}" if attributes["subresource"] else "")
    resource += f".{attributes['group']}" if attributes["group"] else ""
    where = f"in {attributes['namespace']}" if attributes.get("namespace") else "cluster-wide"
    return f"{attributes['verb']} {resource} {where}"


def rights_needed(flags: dict[str, str], *, namespace: str) -> list[dict[str, str]]:
    """The SubjectAccessReview attributes a controller in ``namespace`` running with ``flags`` needs
    granted: the controller's rules where it watches, and the Lease rules where its Leases live —
    the leader's (``--leader-elect``) and, on a label shard, the hand-off records beside it; with
    ``--workload-identity``, ServiceAccount tokens where it watches and in the target namespaces."""
    watched = [n for n in flags.get("watch-namespaces", "").split(",") if n] or [""]
    wanted = [a for where in watched for a in _needed(CONTROLLER_RULES, where)]
    electing = flags.get("leader-elect") == "true"
    if electing or flags.get("watch-label-selector"):
        lease_ns = (flags.get("leader-election-namespace") if electing else None) or namespace
        wanted += list(_needed(LEADER_ELECTION_RULES, lease_ns))
    if flags.get("cluster-admin") == "true":
        wanted.append({"verb": "*", "group": "*", "resource": "*", "subresource": ""})
    elif flags.get("workload-identity") == "true":
        # Token requests where it watches; in each target namespace, the ConfigMaps too.
        wanted += [a for where in watched for a in _needed(TOKEN_REQUEST_RULES, where)]
        targets = [n for n in flags.get("target-namespaces", "").split(",") if n]
        wanted += [a for where in targets for a in _needed(WORKLOAD_TARGET_RULES, where)]
    return wanted


def check_rbac(client: KubeClient, controller: Controller) -> tuple[int, list[str]]:
    """(checks made, what the ServiceAccount lacks) for the flags the controller runs with."""
    user = f"system:serviceaccount:{controller.namespace}:{controller.service_account}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{controller.namespace}",
              "system:authenticated"]
    wanted = rights_needed(controller.flags, namespace=controller.namespace)
    missing = [_describe(a) for a in wanted if not _review(client, user=user, groups=groups, attributes=a)]
    return len(wanted), missing


def check_lease(client: KubeClient, controller: Controller, *, now: datetime.datetime) -> tuple[bool, str]:
    namespace = controller.flags.get("leader-election-namespace") or controller.namespace
    name = controller.flags.get("leader-election-id") or controller.name
    where = f"Lease {namespace}/{name}"
    try:
        lease = client.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    except ApiError as error:
        if error.not_found:
            return False, f"no leader: {where} does not exist (no replica has started; see `kubectl -n " \
                          f"{controller.namespace} describe deployment {controller.name}`)"
        if error.forbidden:
            return False, f"you may not read {where}: {error.message}"
        raise
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 15)
    if not holder or renewed is None:
        return False, f"no leader holds {where} (released: every replica stopped or is standing by)"
    age = (now - renewed).total_seconds()
    if age > duration:
        return False, f"the leader {holder} of {where} last renewed {age:.0f}s ago (lease {duration:g}s): " \
                      "it is stuck or gone, and no standby has taken over"
    return True, f"leader {holder} ({where}, renewed {max(age, 0):.0f}s ago)"


def _metrics_path(client: KubeClient, controller: Controller) -> str | None:
    """The apiserver's proxy path to the release's metrics Service (the chart's ``metrics`` port)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(controller.selector.items()))
    services = client.request("GET", f"/api/v1/namespaces/{controller.namespace}/services",
                              query={"labelSelector": selector}).get("items", [])
    for service in services:
        if any(p.get("name") == "metrics" for p in (service.get("spec") or {}).get("ports", [])):
            name = service["metadata"]["name"]
            return f"/api/v1/namespaces/{controller.namespace}/services/{name}:metrics/proxy/metrics"
    return None


def _looks_like_ours(text: str) -> bool:
    return "stageset_" in text


def check_metrics(client: KubeClient, controller: Controller, url: str | None) -> tuple[bool, str]:
    if url:
        try:
            response = urllib3.PoolManager().request("GET", url, timeout=10.0, retries=False,
                                                     preload_content=False)
            body = response.read(8 * 2**20).decode("utf-8", "replace")
            response.close()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            return False, f"metrics: cannot reach {url}: {error}"
        ok = response.status == 200 and _looks_like_ours(body)
        answer = "answers" if ok else f"answered {response.status} without stageset_ series"
        return ok, f"metrics: {url} {answer}"
    path = _metrics_path(client, controller)
    if path is None:
        return False, "metrics: the release has no metrics Service (metrics.enabled=false?)"
    try:
        body = client.get_text(path)
    except ApiError as error:
        return False, (f"metrics: the apiserver could not reach them through the Service ({error.status} "
                       f"{error.message or error.reason}); if it cannot reach the pod network, run `kubectl "
                       f"-n {controller.namespace} port-forward deployment/{controller.name} 8080` and pass "
                       "--metrics-url http://127.0.0.1:8080/metrics")
    ok = _looks_like_ours(body)
    return ok, "metrics: answering through the Service" if ok else "metrics: the Service answered without " \
                                                                    "stageset_ series"


def _pre(report: Report, client: KubeClient) -> None:
    report.section("checking prerequisites")
    version, parsed = kubernetes_version(client)
    needed = f">={MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]}.0-0"
    report.outcome(parsed is not None and parsed >= MIN_KUBERNETES,
                   f"Kubernetes {version.lstrip('v')} {needed}")
    for verb, group, resource in (("create", "apiextensions.k8s.io", "customresourcedefinitions"),
                                  ("create", "rbac.authorization.k8s.io", "clusterroles"),
                                  ("create", "rbac.authorization.k8s.io", "clusterrolebindings")):
        allowed = _self_review(client, {"verb": verb, "group": group, "resource": resource})
        report.outcome(allowed, f"you may {verb} {resource}" if allowed else
                       f"you may not {verb} {resource}: installing the chart needs a cluster admin")


def _crds(report: Report, client: KubeClient) -> None:
    report.section("checking CRDs")
    for kind in KINDS:
        try:
            live = client.get(CRD_PATH.format(name=kind.crd_name))
        except ApiError as error:
            if not error.not_found:
                raise
            report.fail(f"{kind.crd_name} is not installed (helm install with crds.install=true, or "
                        "`stageset crds --apply`)")
            continue
        conditions = {c.get("type"): c.get("status")
                      for c in (live.get("status") or {}).get("conditions", [])}
        wanted = custom_resource_definition(kind)["spec"]["versions"]
        current = _schemas((live.get("spec") or {}).get("versions", [])) == _schemas(wanted)
        annotations = live["metadata"].get("annotations") or {}
        applied, owner = annotations.get(VERSION_ANNOTATION), annotations.get("meta.helm.sh/release-name")
        by = (f"applied by stageset {applied}" if applied else
              f"release {annotations.get('meta.helm.sh/release-namespace')}/{owner}" if owner else
              "applied outside stageset")
        if conditions.get("Established") != "True":
            report.fail(f"{kind.crd_name} is not established ({by})")
        elif not current:
            report.fail(f"{kind.crd_name} differs from this CLI's ({client_version()}; {by}): upgrade a "
                        "release (its hook applies them), or use the CLI of the installed version")
        else:
            report.ok(f"{kind.crd_name} (established, schema of stageset {client_version()}; {by})")


def _schemas(versions: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(v.get("name", ""), (v.get("schema") or {}).get("openAPIV3Schema")) for v in versions]


def _releases(report: Report, client: KubeClient, *, namespace: str | None) -> None:
    """The chart's Helm releases: each one's latest revision deployed, or why not -- the failed
    hook and its reason (an image that cannot be pulled, the command's failure)."""
    records = helmstore.latest(helmstore.releases(client, namespace))
    if not records:
        return
    report.section("checking Helm releases")
    for record in records:
        what = (f"release {record.namespace}/{record.name} (revision {record.revision}, "
                f"chart {record.chart_version})")
        if record.status == "deployed":
            report.ok(f"{what}: deployed")
            continue
        hooks = helmstore.failed_hooks(record)
        reasons = [f"hook {kind} {record.namespace}/{name}: " + ("; ".join(
            helmstore.job_reasons(client, record.namespace, name) if kind == "Job" else [])
            or "no reason left (its events are kept an hour)") for kind, name in hooks]
        report.fail(f"{what}: {record.status}: {_short(record.description, 400)}"
                    + "".join(f"\n    {reason}" for reason in reasons))


def _controllers(report: Report, client: KubeClient, *, namespace: str | None, metrics_url: str | None,
                 now: Callable[[], datetime.datetime]) -> None:
    report.section("checking controllers")
    found = find_controllers(client, namespace)
    if not found:
        where = f"namespace {namespace}" if namespace else "any namespace"
        report.fail(f"no stageset controller Deployment in {where} (labels {CONTROLLER_SELECTOR})")
        return
    if metrics_url and len(found) > 1:
        raise click.UsageError("--metrics-url names one controller: pick it with -n")
    for controller in found:
        report.section(f"{controller.namespace}/{controller.name} (release {controller.release}, "
                       f"{controller.image})")
        replicas = f"{controller.ready}/{controller.replicas}"
        problems = pod_problems(client, controller) if controller.ready < controller.replicas else []
        report.outcome(controller.ready >= 1, f"deployment: {replicas} replicas ready"
                       + (" (scaled to zero)" if controller.replicas == 0 else "")
                       + (": " + "; ".join(problems) if problems else ""))
        try:
            checks, missing = check_rbac(client, controller)
        except ApiError as error:
            if not error.forbidden:
                raise
            report.fail(f"RBAC: you may not create SubjectAccessReviews ({error.message})")
        else:
            account = f"{controller.namespace}/{controller.service_account}"
            if missing:
                report.fail(f"RBAC: ServiceAccount {account} may not: " + "; ".join(missing))
            else:
                report.ok(f"RBAC: ServiceAccount {account} has all {checks} rights its flags need")
        if controller.flags.get("leader-elect") == "true":
            report.outcome(*check_lease(client, controller, now=now()))
        if "metrics-address" in controller.flags or metrics_url:
            passed, text = check_metrics(client, controller, metrics_url)
            report.outcome(passed, text)


@click.command("check")
@click.option("--pre", is_flag=True, default=False,
              help="Only the prerequisites of an install: the Kubernetes version and your rights.")
@click.option("--metrics-url", default=None, metavar="URL",
              help="Read the controller's /metrics here (e.g. through kubectl port-forward) instead of "
              "through the apiserver's service proxy.")
@cluster_options(outputs=("table",))
def check(session: Session, pre: bool, metrics_url: str | None) -> None:
    """Check the cluster (and with the controller installed, its health), as `flux check` does.

    Without -n, every controller the chart installed in any namespace is checked; with -n only
    those of that namespace.  Exit code 3 when any check failed.
    """
    client = session.client()
    report = Report()
    _pre(report, client)
    if not pre:
        _crds(report, client)
        _releases(report, client, namespace=session.namespace_flag)
        _controllers(report, client, namespace=session.namespace_flag, metrics_url=metrics_url,
                     now=lambda: datetime.datetime.now(datetime.UTC))
    if report.failures:
        raise CliError(f"{report.failures} check(s) failed")
    echo("✔ all checks passed\n")


@click.command("version")
@click.option("--client", "client_only", is_flag=True, default=False, help="Only this CLI's version.")
@cluster_options(outputs=("table", "yaml", "json"))
def version(session: Session, client_only: bool) -> None:
    """Print the versions of this CLI, the apiserver and every installed controller."""
    info: dict[str, Any] = {"client": {"version": client_version(),
                                       "python": ".".join(map(str, sys.version_info[:3]))}}
    if not client_only:
        client = session.client()
        info["kubernetes"] = kubernetes_version(client)[0]
        info["controllers"] = [{"namespace": c.namespace, "name": c.name, "release": c.release,
                                "version": c.version, "image": c.image, "chart": c.chart,
                                "ready": f"{c.ready}/{c.replicas}"}
                               for c in find_controllers(client, session.namespace_flag)]
    if session.output != "table":
        echo(dump(info, session.output))
        return
    echo(f"client: stageset {info['client']['version']} (Python {info['client']['python']})\n")
    if client_only:
        return
    echo(f"kubernetes: {info['kubernetes']}\n")
    if not info["controllers"]:
        echo("controllers: none found (labels " + CONTROLLER_SELECTOR + ")\n")
    for c in info["controllers"]:
        echo(f"controller {c['namespace']}/{c['name']}: {c['version']} (image {c['image']}, "
             f"chart {c['chart']}, {c['ready']} ready)\n")

