"""The controller under attack by a tenant: each case asserts the secure outcome AND that the
controller stayed up and kept reconciling.

Every test runs its own controller process with exactly the chart's multi-tenant rights,
sharded to the test's namespaces (``--watch-namespaces``), so cases cannot disturb each
other and each may choose its flags.  Tenants are bound to ``edit`` (or ``admin``) in their
own namespace only.  The table of cases is in docs/security.md.
"""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.controller.redact import forms
from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import (
    ControllerProcess,
    apply,
    get_or_none,
    start_controller,
    stop_controller,
    wait_for,
)
from tests.e2e.stagesets import Scenario, cm, poke, scenario
from tests.gitserver import GitServer, _tls_context

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
Shard = Callable[..., ControllerProcess]
CANARY = {"canary/cm.yaml": cm("canary")}


@pytest.fixture
def shard(installed: KubeClient, control_plane: ControlPlane,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shard]:
    """Start a controller that watches only ``namespaces`` (its RBAC bound only there)."""
    started: list[ControllerProcess] = []

    def start(namespaces: list[str], *extra: str) -> ControllerProcess:
        account = f"attack-{uuid.uuid4().hex[:8]}"
        workdir = tmp_path_factory.mktemp(account)
        kubeconfig = install.controller_kubeconfig(
            installed, url=control_plane.url, ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig",
            account=account, watch_namespaces=namespaces)
        handle = start_controller(kubeconfig=kubeconfig, workdir=workdir,
                                  extra=["--watch-namespaces", ",".join(namespaces), *extra])
        started.append(handle)
        return handle

    yield start
    for handle in started:
        stop_controller(handle)


def responsive(handle: ControllerProcess, s: Scenario) -> None:
    """The controller is up and still reconciles: a new StageSet in its namespace becomes Ready."""
    handle.check_alive()
    name = f"canary-{uuid.uuid4().hex[:6]}"
    s.stageset(name, [{"name": "canary", "path": "./canary"}])
    s.wait_ready(name, timeout=60)
    handle.check_alive()


def message(s: Scenario, name: str, reason: str) -> str:
    return str(s.wait_reason(name, reason)["message"])


# -- RBAC ----------------------------------------------------------------------------------------

ESCALATION = {
    "rbac/a-cm.yaml": cm("before-rbac"),
    "rbac/crb.yaml": "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
                     'metadata: {name: "${ns}-everything"}\n'
                     "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole,"
                     " name: cluster-admin}\n"
                     'subjects: [{kind: ServiceAccount, name: deployer, namespace: "${ns}"}]\n',
    "rbac/rb.yaml": "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"
                    "metadata: {name: to-admin}\n"
                    "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole,"
                    " name: cluster-admin}\n"
                    'subjects: [{kind: ServiceAccount, name: deployer, namespace: "${ns}"}]\n',
    "rbac/role.yaml": "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: star}\n"
                      "rules: [{apiGroups: ['*'], resources: ['*'], verbs: ['*']}]\n",
}


def test_rendered_rbac_cannot_escalate_the_tenant(
    shard: Shard, installed: KubeClient, kube_pool: ClientPool, git_server: GitServer,
    make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("escalate")
    # admin: the tenant may write Roles and RoleBindings in its namespace — but only within its rights.
    s = scenario(installed, git_server, tenant, {**ESCALATION, **CANARY}, role="admin")
    handle = shard([s.ns])
    s.stageset("escalate", [{"name": "rbac", "path": "./rbac",
                             "postBuild": {"substitute": {"ns": s.ns}}}])
    denied = message(s, "escalate", "RBACDenied")
    assert tenant.username in denied
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    assert get_or_none(installed, f"{rbac}/clusterrolebindings/{s.ns}-everything") is None
    assert get_or_none(installed, f"{rbac}/namespaces/{s.ns}/rolebindings/to-admin") is None
    assert get_or_none(installed, f"{rbac}/namespaces/{s.ns}/roles/star") is None
    assert s.configmap("before-rbac") is None, "a stage that may not be fully applied applies nothing"
    as_tenant = kube_pool.client(Identity(user=tenant.username))
    with pytest.raises(ApiError) as caught:
        as_tenant.get("/api/v1/namespaces/kube-system/secrets")
    assert caught.value.forbidden, "the tenant's rights did not grow"
    responsive(handle, s)


# -- other namespaces and existence oracles ------------------------------------------------------

def same_but_for(first: str, second: str, a: str, b: str) -> bool:
    return first.replace(a, "<x>") == second.replace(b, "<x>")


def test_objects_in_other_namespaces_are_refused_alike_whether_or_not_they_exist(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    make_namespace: Callable[..., str],
) -> None:
    victim = make_namespace("victim")
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    installed.request("POST", f"/api/v1/namespaces/{victim}/configmaps",
                      body={"metadata": {"name": "target"}, "data": {"k": "theirs"}})
    s = scenario(installed, git_server, make_tenant("intruder"), {
        "existing/cm.yaml": cm("target", "mine", namespace=victim),
        "ghost/cm.yaml": cm("target", "mine", namespace=ghost), **CANARY})
    handle = shard([s.ns])
    s.stageset("into-existing", [{"name": "app", "path": "./existing"}])
    s.stageset("into-ghost", [{"name": "app", "path": "./ghost"}])
    existing = message(s, "into-existing", "RBACDenied")
    missing = message(s, "into-ghost", "RBACDenied")
    assert same_but_for(existing, missing, victim, ghost), (existing, missing)
    target = installed.get(f"/api/v1/namespaces/{victim}/configmaps/target")
    assert target["data"] == {"k": "theirs"}
    assert "stages.metio.wtf/name" not in (target["metadata"].get("labels") or {})
    assert get_or_none(installed, f"/api/v1/namespaces/{ghost}") is None
    responsive(handle, s)


def test_no_message_tells_whether_something_exists_in_an_unreadable_namespace(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    make_namespace: Callable[..., str],
) -> None:
    victim = make_namespace("private")
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                      "metadata": {"name": "real", "namespace": victim},
                      "spec": {"url": "https://git.invalid/r"}})
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": "real", "namespace": victim},
                      "spec": {"stages": [{"name": "x", "sourceRef": {"name": "real"}}]}})
    installed.request("POST", f"/apis/apps/v1/namespaces/{victim}/deployments", body=yaml.safe_load(
        "metadata: {name: real}\nspec:\n  selector: {matchLabels: {a: b}}\n"
        "  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: x}]}}\n"))
    # Each StageSet that gets to apply renders its own ConfigMap: two rendering one object would
    # be an OwnershipConflict, not the probe this test makes.
    s = scenario(installed, git_server, make_tenant("prober"), {
        "app/cm.yaml": cm("mine"), "real/cm.yaml": cm("mine-real"), "fake/cm.yaml": cm("mine-fake"),
        **CANARY})
    handle = shard([s.ns])
    for name in ("real", "fake"):
        s.stageset(f"source-{name}", [{"name": "app", "path": "./app",
                                       "sourceRef": {"name": name, "namespace": victim}}])
        s.stageset(f"depends-{name}", [{"name": "app", "path": "./app"}],
                   dependsOn=[{"name": name, "namespace": victim}])
        s.stageset(f"checks-{name}", [{"name": "app", "path": f"./{name}", "readyChecks": {"objects": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "namespace": victim}]}}])
    for probe in ("source", "depends", "checks"):
        real = message(s, f"{probe}-real", "RBACDenied")
        fake = message(s, f"{probe}-fake", "RBACDenied")
        assert same_but_for(real, fake, "real", "fake"), (probe, real, fake)
    responsive(handle, s)


# -- remote kubeconfigs --------------------------------------------------------------------------

def kubeconfig(server: str, user: dict[str, Any], **cluster: Any) -> bytes:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}).encode()


def secret(admin: KubeClient, namespace: str, name: str, data: bytes) -> None:
    admin.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body={
        "metadata": {"name": name}, "data": {"value": base64.b64encode(data).decode()}})


def test_remote_kubeconfigs_may_not_run_commands_read_files_or_lack_credentials(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory, tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    touch = ["-c", f"touch {marker}"]
    server = "https://127.0.0.1:1"
    cases: dict[str, tuple[bytes, str]] = {
        "exec": (kubeconfig(server, {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                              "command": "/bin/sh", "args": touch}}),
                 "'exec' is not allowed"),
        "auth-provider": (kubeconfig(server, {"auth-provider": {"name": "gcp", "config": {
            "cmd-path": "/bin/sh", "cmd-args": " ".join(touch)}}}), "'auth-provider' is not allowed"),
        "token-file": (kubeconfig(server, {"tokenFile": "/etc/hostname"}), "'tokenFile' is not allowed"),
        "client-cert-file": (kubeconfig(server, {"client-certificate": "/etc/ssl/private/x.crt",
                                                 "client-key": "/etc/ssl/private/x.key"}),
                             "'client-certificate' is not allowed"),
        "ca-file": (kubeconfig(server, {"token": "t"}, **{"certificate-authority": "/etc/hostname"}),
                    "'certificate-authority' is not allowed"),
        "proxy": (kubeconfig(server, {"token": "t"}, **{"proxy-url": "http://127.0.0.1:3128"}),
                  "'proxy-url' is not allowed"),
        "no-credentials": (kubeconfig(server, {}), "needs a token or client-certificate-data"),
        "plain-http": (kubeconfig("http://127.0.0.1:1", {"token": "t"}), "must be an https:// URL"),
    }
    s = scenario(installed, git_server, make_tenant("kubeconfigs"), {"app/cm.yaml": cm("remote-only"),
                                                                     **CANARY})
    handle = shard([s.ns])
    for name, (data, _) in cases.items():
        secret(installed, s.ns, name, data)
        s.stageset(name, [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": name}})
    for name, (_, expected) in cases.items():
        assert expected in message(s, name, "InvalidSpec"), name
    assert not marker.exists(), "a tenant's kubeconfig ran a command on the controller"
    assert s.configmap("remote-only") is None
    responsive(handle, s)


class _Answer502(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        body = b"<html>REMOTE-BODY-MARKER: stack trace of the remote</html>"
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: ARG002 - keep test output quiet
        return


@pytest.fixture
def bad_gateway(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """An https server on loopback that answers every request with an HTML 502 page."""
    handler = type("Answer502", (_Answer502,), {"hits": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    _, context = _tls_context(tmp_path / "tls")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", handler.hits
    server.shutdown()
    server.server_close()


def test_a_failing_remote_cluster_gets_a_short_condition_backs_off_and_logs_no_traceback(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    bad_gateway: tuple[str, list[str]],
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_url = f"https://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    gateway_url, hits = bad_gateway
    s = scenario(installed, git_server, make_tenant("remotes"), {"app/cm.yaml": cm("x"), **CANARY})
    secret(installed, s.ns, "refused", kubeconfig(closed_url, {"token": "t"}))
    secret(installed, s.ns, "gateway",
           kubeconfig(gateway_url, {"token": "t"}, **{"insecure-skip-tls-verify": True}))
    handle = shard([s.ns])
    s.stageset("refused", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "refused"}})
    s.stageset("gateway", [{"name": "app", "path": "./app"}], kubeConfig={"secretRef": {"name": "gateway"}})
    runbook = "; runbook: https://stageset.github.io/stageset/runbooks/clusterunreachable/"
    assert message(s, "refused", "ClusterUnreachable") == (
        f"spec.kubeConfig: the cluster at {closed_url} cannot be used: connection refused; "
        "retrying with backoff" + runbook)
    assert message(s, "gateway", "ClusterUnreachable") == (
        f"spec.kubeConfig: the cluster at {gateway_url} cannot be used: answered HTTP 502; "
        "retrying with backoff" + runbook)
    # Backoff: over 8 seconds the broken remote is asked a handful of times, not once per worker loop.
    start = len(hits)
    time.sleep(8)
    retries = len(hits) - start
    assert 1 <= retries <= 8, retries
    log = handle.output()
    assert "REMOTE-BODY-MARKER" not in log
    assert "REMOTE-BODY-MARKER" not in json.dumps(s.get("gateway"))
    assert "Traceback" not in log
    responsive(handle, s)


# -- Secret values in messages -------------------------------------------------------------------

SECRETS = {
    # Each one makes the apiserver refuse the object and echo the value in its error.
    "label": 'not "a" valid\\label value',
    "name": "S3CRET-Name.With_Caps",
    "host": "s3cret_host.EXAMPLE",
    "annotation": "s3cret key/with spaces!",
}
ECHOING = {
    "label/cm.yaml": 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: labelled\n'
                     '  labels: {tier: "${label}"}\n',
    "name/cm.yaml": 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: "${name}"\n',
    "host/ingress.yaml": 'apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\nspec:\n'
                         '  rules: [{host: "${host}"}]\n',
    "annotation/cm.yaml": 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: annotated\n'
                          '  annotations: {"${annotation}": "x"}\n',
}


def test_secret_values_never_leave_through_status_events_or_logs(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    s = scenario(installed, git_server, make_tenant("leak"), {**ECHOING, **CANARY})
    installed.request("POST", f"/api/v1/namespaces/{s.ns}/secrets", body={
        "metadata": {"name": "values"}, "stringData": SECRETS})
    handle = shard([s.ns])
    post_build = {"substituteFrom": [{"kind": "Secret", "name": "values"}]}
    for case in SECRETS:
        s.stageset(case, [{"name": "app", "path": f"./{case}", "postBuild": post_build}])
    for case in SECRETS:
        echoed = message(s, case, "StageFailed")
        assert "Invalid value" in echoed or "is invalid" in echoed, (case, echoed)
        assert "***" in echoed, f"{case}: the echo must be there, redacted: {echoed}"
    poke(installed, s.path("label"))  # one more pass: messages written twice stay clean
    time.sleep(2)
    everywhere = {
        "status": json.dumps([(s.get(case).get("status") or {}) for case in SECRETS]),
        "events": json.dumps(installed.get(f"/api/v1/namespaces/{s.ns}/events")["items"]),
        "controller log": handle.output(),
    }
    for place, text in everywhere.items():
        for case, value in SECRETS.items():
            for form in forms(value):
                assert form not in text, f"{case} value ({form!r}) leaked through the {place}"
    responsive(handle, s)


# -- fairness ------------------------------------------------------------------------------------

@pytest.fixture
def tarpit() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback TCP server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], held
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_tarpit_sources_in_one_namespace_do_not_starve_another(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    tarpit: tuple[int, list[socket.socket]], record_property: Callable[[str, object], None],
) -> None:
    port, held = tarpit
    slow = make_tenant("tarpit")
    patient = make_tenant("patient")
    patient.bind_cluster_role("edit")
    url = git_server.create_repo(f"{patient.namespace}-repo", {"app/cm.yaml": cm("converged"), **CANARY})
    handle = shard([slow.namespace, patient.namespace])
    for i in range(4):
        apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                          "metadata": {"name": f"slow-{i}", "namespace": slow.namespace},
                          "spec": {"url": f"http://127.0.0.1:{port}/repo-{i}.git", "timeout": "60s"}})
    wait_for(lambda: len(held) >= 2, timeout=30, what="tarpit fetches holding workers")
    time.sleep(1)  # every source worker the tarpit namespace may take is taken by now
    # Another tenant arrives: its source and StageSet must not wait for the tarpits' deadline.
    started = time.monotonic()
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                      "metadata": {"name": "app", "namespace": patient.namespace},
                      "spec": {"url": url, "ref": {"branch": "main"}}})
    s = Scenario(admin=installed, git=git_server, tenant=patient, repo=f"{patient.namespace}-repo")
    s.stageset("patient", [{"name": "app", "path": "./app"}])
    s.wait_ready("patient", timeout=30)
    took = time.monotonic() - started
    record_property("converged_while_tarpits_block_s", round(took, 2))
    print(f"\nStageSet converged in {took:.2f}s while {len(held)} tarpit fetches blocked")
    assert took < 15, took
    assert len(held) == 2, "the tarpit namespace held half the source workers, no more"
    responsive(handle, s)


# -- cycles across namespaces --------------------------------------------------------------------

def test_a_cycle_message_names_no_stageset_of_another_namespace(
    shard: Shard, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    mine = scenario(installed, git_server, make_tenant("cycle-a"), {"app/cm.yaml": cm("a"), **CANARY})
    theirs = scenario(installed, git_server, make_tenant("cycle-b"), {"app/cm.yaml": cm("b")})
    handle = shard([mine.ns, theirs.ns], "--no-cross-namespace-refs")
    secret_name = f"hidden-plan-{uuid.uuid4().hex[:6]}"
    theirs.stageset(secret_name, [{"name": "app", "path": "./app"}],
                    dependsOn=[{"name": "ping", "namespace": mine.ns}])
    mine.stageset("ping", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "pong"}])
    mine.stageset("pong", [{"name": "app", "path": "./app"}],
                  dependsOn=[{"name": secret_name, "namespace": theirs.ns}])
    refused = message(mine, "pong", "DependencyNotReady")
    assert "another namespace" in refused
    waiting = message(mine, "ping", "DependencyNotReady")
    assert f"{mine.ns}/pong" in waiting
    for name in ("ping", "pong"):
        text = json.dumps(mine.get(name).get("status"))
        assert secret_name not in text, f"{name} names a StageSet of another namespace: {text}"
    # The same cycle inside one namespace is spelled out.
    mine.stageset("x", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "y"}])
    mine.stageset("y", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "x"}])
    stalled = message(mine, "x", "Stalled")
    assert f"{mine.ns}/x" in stalled
    assert f"{mine.ns}/y" in stalled
    responsive(handle, mine)
