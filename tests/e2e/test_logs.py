"""The controller's logs in an end-to-end run: JSON lines with their fields, an info line for each
thing that changed the cluster or was refused, and never a Secret value or a credential."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.controller.redact import go_quote
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import GITREPOS, apply, get_or_none, wait_for
from tests.e2e.stagesets import Scenario, cm, poke
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]

PASSWORD = "git-Passw0rd-for-the-log-test"
SUBSTITUTED = "substituted-value-4f2a9c"
TOKEN = "token-in-a-Secret-manifest-8b3e"
LABEL = 'Not "a" label value!'  # substituted into a label: the apiserver echoes it back
SECRETS = (PASSWORD, SUBSTITUTED, TOKEN, LABEL)


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--log-format", "json"]  # and --log-level debug: ControllerProcess's default


@pytest.fixture(scope="module")
def private_git() -> Iterator[GitServer]:
    with GitServer(username="bot", password=PASSWORD) as server:
        yield server


def forms(value: str) -> set[str]:
    """The value as a log line could carry it."""
    encoded = base64.b64encode(value.encode()).decode()
    return {
        value,
        encoded,
        encoded.rstrip("="),
        json.dumps(value)[1:-1],
        go_quote(value),
        json.dumps(json.dumps(value)[1:-1])[1:-1],
    }


def secret(admin: KubeClient, namespace: str, name: str, data: dict[str, str]) -> None:
    admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={"metadata": {"name": name}, "stringData": data},
    )


def lines(controller: ControllerProcess) -> list[dict[str, Any]]:
    text = controller.output()
    parsed = []
    for line in text.splitlines():
        if line.strip():
            parsed.append(json.loads(line))  # every line is one JSON object
    return parsed


def test_a_run_with_secrets_credentials_and_substitution_logs_what_happened_and_no_secret(
    controller: ControllerProcess,
    installed: KubeClient,
    private_git: GitServer,
    make_tenant: TenantFactory,
) -> None:
    tenant = make_tenant("logs")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    url = private_git.create_repo(
        f"{ns}-repo",
        {
            "app/cm.yaml": cm("plain", "${value}"),
            "app/gone.yaml": cm("gone"),
            "app/secret.yaml": f"apiVersion: v1\nkind: Secret\nmetadata: {{name: app-token}}\n"
            f"stringData: {{token: {TOKEN}}}\n",
            "echo/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: echo\n"
            '  labels: {tier: "${label}"}\n',
        },
    )
    # Partial clone off, so dulwich warns that the server ignores the filter (we drop that line).
    private_git.configure(f"{ns}-repo", "uploadpack.allowFilter", "false")
    # Git credentials, read as a ServiceAccount that may read only them.
    secret(installed, ns, "git-auth", {"username": "bot", "password": PASSWORD})
    installed.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body={"metadata": {"name": "git"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    installed.request(
        "POST",
        f"{rbac}/roles",
        body={
            "metadata": {"name": "git-auth"},
            "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["git-auth"], "verbs": ["get"]}
            ],
        },
    )
    installed.request(
        "POST",
        f"{rbac}/rolebindings",
        body={
            "metadata": {"name": "git-auth"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "git-auth"},
            "subjects": [{"kind": "ServiceAccount", "name": "git", "namespace": ns}],
        },
    )
    secret(installed, ns, "vars", {"value": SUBSTITUTED, "label": LABEL})
    apply(
        installed,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": ns},
            "spec": {
                "url": url,
                "ref": {"branch": "main"},
                "interval": "1m",
                "secretRef": {"name": "git-auth"},
                "serviceAccountName": "git",
            },
        },
    )
    s = Scenario(admin=installed, git=private_git, tenant=tenant, repo=f"{ns}-repo")
    substitute = {"substituteFrom": [{"kind": "Secret", "name": "vars"}]}
    s.stageset("shop", [{"name": "app", "path": "./app", "postBuild": substitute}])
    s.stageset("echo", [{"name": "echo", "path": "./echo", "postBuild": substitute}])
    s.wait_ready("shop")
    failed = s.wait_reason("echo", "StageFailed")
    assert "***" in failed["message"]  # the apiserver's echo, redacted in status too

    # Drift, then prune.
    installed.request(
        "PATCH",
        f"/api/v1/namespaces/{ns}/configmaps/plain",
        content_type="application/merge-patch+json",
        body={"data": {"k": "by hand"}},
    )
    poke(installed, s.path("shop"))
    wait_for(lambda: (s.configmap("plain") or {}).get("data") == {"k": SUBSTITUTED}, what="drift corrected")
    second = s.commit({"app/gone.yaml": None})
    s.wait_ready("shop", revision=second)
    # A denial: a StageSet acting as a ServiceAccount bound to nothing.
    installed.request(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body={"metadata": {"name": "nobody"}}
    )
    s.stageset("denied", [{"name": "app", "path": "./app"}], serviceAccountName="nobody")
    s.wait_reason("denied", "RBACDenied")
    # Teardown.
    installed.request("DELETE", s.path("shop"))
    wait_for(lambda: get_or_none(installed, s.path("shop")) is None, what="StageSet shop torn down")
    wait_for(
        lambda: any(
            e.get("message") == "teardown finished: finalizer removed" and e.get("stageset") == f"{ns}/shop"
            for e in lines(controller)
        ),
        what="the teardown logged",
    )
    assert get_or_none(installed, f"{GITREPOS.format(ns=ns)}/app") is not None

    text = controller.output()
    entries = lines(controller)
    for value in SECRETS:
        for form in forms(value):
            assert form not in text, f"a form of a secret value is in the log: {form!r}"
    assert "object filtering not recognized" not in text
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)

    mine = [e for e in entries if e.get("stageset", "").startswith(f"{ns}/")]

    def find(prefix: str, stageset: str) -> list[dict[str, Any]]:
        return [
            e
            for e in mine
            if e["message"].startswith(prefix)
            and e["stageset"] == f"{ns}/{stageset}"
            and e["level"] in ("info", "warning")
        ]

    applied = find("applied:", "shop")
    assert applied, "no info line for an apply that wrote"
    assert f"ConfigMap/{ns}/plain created" in applied[0]["message"]
    assert f"Secret/{ns}/app-token created" in applied[0]["message"]
    for entry in applied:
        assert entry["stage"] == "app"
        assert entry["revision"].startswith("main@sha1:")
        assert entry["identity"] == "tenant"
        assert len(entry["reconcileID"]) == 36
    assert find("drift corrected in stage app", "shop")
    assert any(f"ConfigMap {ns}/gone" in e["message"] for e in find("pruned", "shop"))
    assert any(f"ConfigMap {ns}/plain deleted" in e["message"] for e in find("teardown of stage app", "shop"))
    denied = find("denied:", "denied")
    assert denied
    assert denied[0]["identity"] == "tenant"
    assert "nobody" in denied[0]["message"]
    # No line names a ServiceAccount as a field: only its kind.
    assert {e["identity"] for e in entries if "identity" in e} <= {"tenant", "controller"}
    # The GitRepository's lines carry it and the revision fetched.
    fetched = [e for e in entries if e.get("gitrepository") == f"{ns}/app" and "revision" in e]
    assert fetched
