"""Every user command against the real apiserver, with the controller running as a subprocess.

One tenant namespace with two StageSets: ``base`` (one stage) and ``shop`` (three stages, one of
them substituting a value from a Secret, waiting for ``base``).  The tests run in file order:
the read-only commands first, then ``diff`` of local changes, then the commands that change
things (drift, new commits, suspend).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli, user_kubeconfig
from tests.e2e.conftest import GITREPOS, STAGESETS, apply, condition, stageset, wait_for
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

SECRET_VALUE = "s3cr3t-Value-42"
FILES = {
    "config/settings.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n"
    "data: {currency: EUR}\n",
    "backend/db.yaml": "apiVersion: v1\nkind: Secret\nmetadata: {name: db}\n"
    "stringData: {password: '${DB_PASSWORD}'}\n",
    "backend/app.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\n"
    "data: {url: 'postgres://app:${DB_PASSWORD}@db'}\n",
    "frontend/service.yaml": "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
    "spec: {selector: {app: web}, ports: [{port: 80}]}\n",
    "base/namespace-config.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: base}\ndata: {a: b}\n",
}


@dataclass
class Shop:
    admin: KubeClient
    git: GitServer
    namespace: str
    repo: str
    kubeconfig: Path

    def cli(self, *args: str, kubeconfig: Path | None = None) -> Any:
        return run_cli(*args, kubeconfig=kubeconfig or self.kubeconfig)

    def get(self, name: str = "shop") -> dict[str, Any]:
        return stageset(self.admin, self.namespace, name)


@pytest.fixture(scope="module")
def shop(
    installed: KubeClient, controller: ControllerProcess, git_server: GitServer, control_plane: ControlPlane
) -> Shop:
    namespace = f"cli-{uuid.uuid4().hex[:6]}"
    install.create_tenant(installed, namespace=namespace, service_account="deployer")
    repo = f"{namespace}-app"
    url = git_server.create_repo(repo, FILES)
    installed.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "vars"},
            "stringData": {"DB_PASSWORD": SECRET_VALUE},
        },
    )
    apply(
        installed,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"url": url, "ref": {"branch": "main"}, "interval": "10m"},
        },
    )
    source = {"sourceRef": {"name": "app"}}
    apply(
        installed,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "base", "namespace": namespace},
            "spec": {
                "serviceAccountName": "deployer",
                "stages": [{"name": "base", "path": "./base", **source}],
            },
        },
    )
    apply(
        installed,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "shop", "namespace": namespace},
            "spec": {
                "serviceAccountName": "deployer",
                "dependsOn": [{"name": "base"}],
                "stages": [
                    {"name": "config", "path": "./config", **source},
                    {
                        "name": "backend",
                        "path": "./backend",
                        **source,
                        "postBuild": {"substituteFrom": [{"kind": "Secret", "name": "vars"}]},
                    },
                    {"name": "frontend", "path": "./frontend", "dependsOn": ["config"], **source},
                ],
            },
        },
    )
    wait_for(
        lambda: (c := condition(stageset(installed, namespace, "shop"))) and c["status"] == "True",
        timeout=90,
        what="shop Ready=True",
    )
    return Shop(
        admin=installed, git=git_server, namespace=namespace, repo=repo, kubeconfig=control_plane.kubeconfig
    )


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET_VALUE not in text


def test_get_lists_stagesets_and_one_in_detail(shop: Shop) -> None:
    listed = shop.cli("get", "-n", shop.namespace)
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "READY",
        "REASON",
        "STAGES",
        "REVISION",
        "SUSPENDED",
        "AGE",
        "MESSAGE",
    ]
    row = next(line.split() for line in lines if line.startswith("shop "))
    assert row[1:4] == ["True", "Succeeded", "3/3"]
    assert row[4] == f"main@sha1:{shop.git.head(shop.repo)[:12]}"

    one = shop.cli("get", "shop", "-n", shop.namespace)
    assert one.exit_code == 0
    assert one.stdout.startswith(f"StageSet {shop.namespace}/shop: Ready=True (Succeeded)")
    lines = one.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("STAGE "))
    phases = {line.split()[0]: line.split()[1] for line in lines[header + 1 :] if line.strip()}
    assert phases == {"config": "Ready", "backend": "Ready", "frontend": "Ready"}

    every = shop.cli("get", "-A")
    assert every.stdout.splitlines()[0].split()[0] == "NAMESPACE"
    assert any(line.split()[:2] == [shop.namespace, "shop"] for line in every.stdout.splitlines())

    # -o json prints the object, as kubectl does (issue 50: it printed the table's summary).
    data = json.loads(shop.cli("get", "shop", "-n", shop.namespace, "-o", "json").stdout)
    assert (data["apiVersion"], data["kind"], data["metadata"]["name"]) == ("stages.metio.wtf/v1", "StageSet",
                                                                            "shop")
    assert "managedFields" not in data["metadata"]
    assert next(c for c in data["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    assert data["status"]["lastAppliedRevision"] == f"main@sha1:{shop.git.head(shop.repo)}"
    assert [s["phase"] for s in data["status"]["stages"]] == ["Ready"] * 3
    assert [s["objects"] for s in data["status"]["stages"]] == [1, 2, 1]
    listed = yaml.safe_load(shop.cli("get", "-n", shop.namespace, "-o", "yaml").stdout)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert "shop" in [item["metadata"]["name"] for item in listed["items"]]
    assert {item["kind"] for item in listed["items"]} == {"StageSet"}


def test_the_namespace_comes_from_the_context(
    shop: Shop, tmp_path: Path, control_plane: ControlPlane
) -> None:
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = shop.namespace
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    result = shop.cli("get", kubeconfig=path)
    assert result.exit_code == 0
    assert any(line.startswith("shop ") for line in result.stdout.splitlines())
    missing = shop.cli("get", "nothing-here", kubeconfig=path)
    assert missing.exit_code == 3
    assert f"StageSet {shop.namespace}/nothing-here not found" in missing.stderr


def test_the_kubeconfig_falls_back_to_the_home_directory(
    shop: Shop, tmp_path: Path, control_plane: ControlPlane
) -> None:
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(control_plane.kubeconfig.read_text())
    env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")}
    result = run_cli("get", "shop", "-n", shop.namespace, env=env)  # $KUBECONFIG names no file
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"StageSet {shop.namespace}/shop: Ready=True")


def test_tree_shows_stages_and_objects_with_readiness(shop: Shop) -> None:
    result = shop.cli("tree", "shop", "-n", shop.namespace)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith(f"StageSet/{shop.namespace}/shop  Ready=True")
    for line in (
        f"ConfigMap/{shop.namespace}/settings  Current",
        f"Secret/{shop.namespace}/db  Current",
        f"ConfigMap/{shop.namespace}/app  Current",
        f"Service/{shop.namespace}/web  Current",
    ):
        assert line in text
    assert text.index("stage config") < text.index("settings") < text.index("stage backend")
    data = yaml.safe_load(shop.cli("tree", "shop", "-n", shop.namespace, "-o", "yaml").stdout)
    assert [[o["name"] for o in s["objects"]] for s in data["stages"]] == [
        ["settings"],
        ["app", "db"],
        ["web"],
    ]
    assert {o["status"] for s in data["stages"] for o in s["objects"]} == {"Current"}


def test_graph_shows_stage_edges_and_stageset_dependencies(shop: Shop) -> None:
    table = shop.cli("graph", "shop", "-n", shop.namespace).stdout
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:4]}
    assert rows == {"config": ["Ready", "-"], "backend": ["Ready", "config"], "frontend": ["Ready", "config"]}
    assert [f"{shop.namespace}/base", "Ready=True"] in [line.split() for line in table.splitlines()]
    dot = shop.cli("graph", "shop", "-n", shop.namespace, "-o", "dot").stdout
    assert dot.startswith(f'digraph "{shop.namespace}/shop" {{')
    assert '"stage/config" -> "stage/backend";' in dot
    assert '"stage/config" -> "stage/frontend";' in dot
    assert f'"stageset/{shop.namespace}/base" -> "stage/config" [style=dashed];' in dot
    assert '"stage/backend" -> "stage/frontend"' not in dot


def test_build_renders_from_git_as_the_tenant_with_secrets_masked(shop: Shop) -> None:
    result = shop.cli("build", "shop", "-n", shop.namespace)
    assert result.exit_code == 0, result.output
    _no_secret(result.stdout, result.stderr)
    objects = {d["metadata"]["name"]: d for d in yaml.safe_load_all(result.stdout) if d}
    assert set(objects) == {"settings", "db", "app", "web"}
    assert objects["db"]["stringData"] == {"password": "***"}
    assert objects["app"]["data"]["url"] == "postgres://app:***@db"  # substituted from a Secret
    revision = f"main@sha1:{shop.git.head(shop.repo)}"
    assert (
        f"# stage backend: path ./backend at {revision}, applied as "
        f"system:serviceaccount:{shop.namespace}:deployer" in result.stdout
    )
    shown = shop.cli("build", "shop", "-n", shop.namespace, "--show-secrets")
    assert SECRET_VALUE in shown.stdout


def test_diff_of_an_unchanged_stageset_is_empty(shop: Shop) -> None:
    result = shop.cli("diff", "shop", "-n", shop.namespace)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "stage config (as system:serviceaccount" in result.stderr
    assert "prune: 0 object(s) would be deleted" in result.stderr
    # The dry-run ran as the tenant, through impersonation, and wrote nothing.
    assert shop.get()["status"]["lastAppliedRevision"].endswith(shop.git.head(shop.repo))


def _checkout(tmp_path: Path, changes: dict[str, str | None]) -> Path:
    root = tmp_path / "checkout"
    for name, text in {**FILES, **changes}.items():
        if text is None:
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_diff_of_local_changes_shows_them_and_the_prune_with_secrets_masked(
    shop: Shop, tmp_path: Path
) -> None:
    checkout = _checkout(
        tmp_path,
        {
            "config/settings.yaml": FILES["config/settings.yaml"].replace("EUR", "USD"),
            "backend/db.yaml": FILES["backend/db.yaml"].replace("${DB_PASSWORD}", "${DB_PASSWORD}-v2"),
            "backend/app.yaml": None,  # removed: prune would delete it
        },
    )
    result = shop.cli("diff", "shop", "-n", shop.namespace, "--source-dir", str(checkout))
    assert result.exit_code == 1, result.output
    _no_secret(result.stdout, result.stderr)
    out = result.stdout
    assert f"--- live/ConfigMap/{shop.namespace}/settings" in out
    assert "-  currency: EUR\n+  currency: USD" in out
    assert f"--- live/Secret/{shop.namespace}/db" in out
    assert "+  password: '*** (changed)'" in out
    assert f"--- live/ConfigMap/{shop.namespace}/app\n+++ /dev/null" in out
    assert "stage backend no longer renders it" in out
    assert "prune: 1 object(s) would be deleted" in result.stderr
    data = json.loads(
        shop.cli("diff", "shop", "-n", shop.namespace, "--source-dir", str(checkout), "-o", "json").stdout
    )
    actions = {o["object"]: o["action"] for s in data["stages"] for o in s["objects"]}
    assert actions[f"ConfigMap/{shop.namespace}/settings"] == "Configured"
    assert actions[f"Service/{shop.namespace}/web"] == "Unchanged"
    assert [o["object"] for o in data["prune"]] == [f"ConfigMap/{shop.namespace}/app"]
    # Nothing was written: the live objects are as before.
    live = shop.admin.get(f"/api/v1/namespaces/{shop.namespace}/configmaps/settings")
    assert live["data"] == {"currency": "EUR"}


def test_diff_of_a_changed_stageset_file(shop: Shop, tmp_path: Path) -> None:
    live = shop.get()
    spec = {**live["spec"], "stages": [s for s in live["spec"]["stages"] if s["name"] != "frontend"]}
    path = tmp_path / "stageset.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "stages.metio.wtf/v1",
                "kind": "StageSet",
                "metadata": {"name": "shop", "namespace": shop.namespace},
                "spec": spec,
            }
        )
    )
    result = shop.cli("diff", "-f", str(path))  # no -n: the file's namespace
    assert result.exit_code == 1, result.output
    assert f"--- live/Service/{shop.namespace}/web\n+++ /dev/null" in result.stdout
    assert "stage frontend no longer renders it" in result.stdout
    assert "stage frontend" not in result.stderr  # the file has no such stage any more


def test_diff_reports_what_the_tenant_may_not_apply(shop: Shop, tmp_path: Path) -> None:
    checkout = _checkout(
        tmp_path,
        {
            "frontend/role.yaml": "apiVersion: rbac.authorization.k8s.io/v1\n"
            "kind: ClusterRole\nmetadata: {name: cli-escalation}\nrules: []\n"
        },
    )
    result = shop.cli("diff", "shop", "-n", shop.namespace, "--source-dir", str(checkout))
    assert result.exit_code == 3, result.output
    assert (
        "stage frontend: error: RBACDenied: "
        f"system:serviceaccount:{shop.namespace}:deployer may not apply ClusterRole cli-escalation"
        in result.stderr
    )
    assert "prune: not previewed" in result.stderr


def test_build_and_diff_need_the_right_to_impersonate(
    shop: Shop, tmp_path: Path, control_plane: ControlPlane
) -> None:
    viewer = user_kubeconfig(
        shop.admin,
        control_plane,
        namespace=shop.namespace,
        account="viewer",
        path=tmp_path / "viewer",
        context_namespace=shop.namespace,
    )
    shop.admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{shop.namespace}/rolebindings/viewer",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "viewer", "namespace": shop.namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": shop.namespace}],
        },
        field_manager="test",
    )
    assert shop.cli("get", "shop", kubeconfig=viewer).exit_code == 0  # reading is the viewer's own right
    for command in ("diff", "build"):
        result = shop.cli(command, "shop", kubeconfig=viewer)
        assert result.exit_code == 3, result.output
        assert f"you may not impersonate system:serviceaccount:{shop.namespace}:deployer" in result.stderr
        assert "Traceback" not in result.output


def test_events_show_what_the_controller_did(shop: Shop) -> None:
    # Drift: someone edits an applied object; the next pass restores it and says so.
    shop.admin.request(
        "PATCH",
        f"/api/v1/namespaces/{shop.namespace}/configmaps/settings",
        body={"data": {"currency": "GBP"}},
        content_type="application/merge-patch+json",
    )
    result = shop.cli("reconcile", "shop", "-n", shop.namespace, "--wait", "--timeout", "60s")
    assert result.exit_code == 0, result.output
    wait_for(
        lambda: "DriftCorrected" in shop.cli("events", "shop", "-n", shop.namespace).stdout,
        what="a DriftCorrected event",
    )
    text = shop.cli("events", "shop", "-n", shop.namespace).stdout
    assert text.splitlines()[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "COUNT", "MESSAGE"]
    row = next(line for line in text.splitlines() if "DriftCorrected" in line)
    assert "StageSet/shop" in row
    assert "settings" in row
    rows = json.loads(shop.cli("events", "shop", "-n", shop.namespace, "-o", "json").stdout)
    assert any(r["reason"] == "DriftCorrected" and r["type"] == "Warning" for r in rows)


def test_reconcile_with_source_applies_a_new_commit(shop: Shop) -> None:
    commit = shop.git.commit(
        shop.repo, {"config/settings.yaml": FILES["config/settings.yaml"].replace("EUR", "JPY")}
    )
    result = shop.cli(
        "reconcile", "shop", "-n", shop.namespace, "--with-source", "--wait", "--timeout", "90s"
    )
    assert result.exit_code == 0, result.output
    assert f"GitRepository {shop.namespace}/app: Ready=True (Succeeded)" in result.stdout
    assert (
        f"StageSet {shop.namespace}/shop: Ready=True (Succeeded) applied 3 stage(s) at main@sha1:{commit}"
        in result.stdout
    )
    live = shop.admin.get(f"/api/v1/namespaces/{shop.namespace}/configmaps/settings")
    assert live["data"] == {"currency": "JPY"}
    annotations = shop.admin.get(f"{GITREPOS.format(ns=shop.namespace)}/app")["metadata"]["annotations"]
    assert "reconcile.fluxcd.io/requestedAt" in annotations


def test_suspend_and_resume(shop: Shop) -> None:
    result = shop.cli("suspend", "shop", "-n", shop.namespace)
    assert result.exit_code == 0
    assert shop.get()["spec"]["suspend"] is True
    assert shop.cli("suspend", "shop", "-n", shop.namespace).stdout.endswith("already suspended\n")
    wait_for(lambda: (c := condition(shop.get())) and c["reason"] == "Suspended", what="Suspended")
    row = next(
        line.split()
        for line in shop.cli("get", "-n", shop.namespace).stdout.splitlines()
        if line.startswith("shop ")
    )
    assert row[1:3] == ["False", "Suspended"]
    assert row[5] == "true"
    refused = shop.cli("reconcile", "shop", "-n", shop.namespace)
    assert refused.exit_code == 3
    assert "is suspended" in refused.stderr
    resumed = shop.cli("resume", "shop", "-n", shop.namespace, "--wait", "--timeout", "60s")
    assert resumed.exit_code == 0, resumed.output
    assert f"StageSet {shop.namespace}/shop: Ready=True (Succeeded)" in resumed.stdout
    assert shop.get()["spec"]["suspend"] is False


def test_a_failing_stageset_makes_reconcile_wait_exit_3(shop: Shop) -> None:
    apply(
        shop.admin,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "broken", "namespace": shop.namespace},
            "spec": {
                "serviceAccountName": "deployer",
                "stages": [{"name": "x", "path": "./nowhere", "sourceRef": {"name": "app"}}],
            },
        },
    )
    wait_for(
        lambda: (c := condition(stageset(shop.admin, shop.namespace, "broken"))) and c["status"] == "False",
        what="broken Ready=False",
    )
    result = shop.cli("reconcile", "broken", "-n", shop.namespace, "--wait", "--timeout", "60s")
    assert result.exit_code == 3, result.output
    assert "Ready=False (StageFailed)" in result.stdout
    assert "runbook: https://stageset.github.io/stageset/runbooks/stagefailed/" in result.stdout
    shop.admin.delete(f"{STAGESETS.format(ns=shop.namespace)}/broken")
