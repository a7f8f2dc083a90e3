"""flux's everyday verbs in the CLI, against the real apiserver (no controller: the test writes what
the controller would, so each verb's effect is the only thing that changes).

``logs`` (the filter on real log lines from a file or stdin; the pod lookup and the ``pods/log``
request checked in the apiserver's audit log), ``export`` (re-appliable YAML), ``create``/``delete``
of StageSets and GitRepositories (server-side apply as the user, confirmation), and the
GitRepository verbs ``get sources git``, ``reconcile``/``suspend``/``resume source git``, with
completion of their names.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from stageset.cli.main import main
from stageset.controller import logs as controller_logs
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, KubeClient
from tests.cli.conftest import complete, namespaces, run_cli, viewer_kubeconfig
from tests.e2e.conftest import GITREPOS, STAGESETS, apply, stageset

pytestmark = [pytest.mark.apiserver]

SUFFIX = uuid.uuid4().hex[:6]
NS, CONTROLLER_NS = f"verbs-{SUFFIX}", f"verbs-ctrl-{SUFFIX}"
REVISION = "main@sha1:" + "cd" * 20
CONTROLLER_LABELS = {
    "app.kubernetes.io/name": "stageset",
    "app.kubernetes.io/instance": "stageset",
    "app.kubernetes.io/part-of": "stageset",
    "app.kubernetes.io/component": "controller",
}


@dataclass
class World:
    admin: KubeClient
    plane: ControlPlane
    viewer: Path
    """A user who may read ``NS`` (ClusterRole view) and nothing of the controller's namespace."""


def _gitrepository(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "stages.metio.wtf/v1",
        "kind": "GitRepository",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"url": "https://git.example/app.git", "ref": {"branch": "main"}, "interval": "1m"},
    }


@pytest.fixture(scope="module")
def world(
    installed: KubeClient, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> World:
    admin = installed
    namespaces(admin, NS, CONTROLLER_NS)
    apply(admin, _gitrepository("app"))
    admin.request(
        "PATCH",
        f"{GITREPOS.format(ns=NS)}/app/status",
        body={
            "status": {
                "artifact": {"revision": REVISION, "lastUpdateTime": "2026-01-01T00:00:00Z"},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Succeeded",
                        "message": f"stored artifact for revision '{REVISION}'",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            }
        },
        content_type="application/merge-patch+json",
    )
    viewer = viewer_kubeconfig(admin, control_plane, namespace=NS,
                               path=tmp_path_factory.mktemp("viewer") / "kubeconfig")
    return World(admin=admin, plane=control_plane, viewer=viewer)


# -- logs: the filter ----------------------------------------------------------------------------


def _controller_log(fmt: str) -> str:
    """Lines as the controller writes them (its own formatter and fields), about two StageSets of
    NS, one of another namespace, and none at all."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        controller_logs.JsonFormatter() if fmt == "json" else controller_logs.TextFormatter()
    )
    handler.addFilter(controller_logs.ContextFilter())
    logger = logging.getLogger(f"stageset.test.logs.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.info("leader elected")
    with controller_logs.bind(stageset=f"{NS}/shop", reconcileID="r1"):
        with controller_logs.bind(stage="config", revision=REVISION, identity="tenant"):
            logger.info("applied stage")
        logger.error("stage failed: ImagePullBackOff")
    with controller_logs.bind(stageset=f"{NS}/blog"):
        logger.info("blog reconciled")
    with controller_logs.bind(stageset=f"elsewhere-{SUFFIX}/shop"):
        logger.info("other namespace's shop")
    with controller_logs.bind(gitrepository=f"{NS}/app"):
        logger.info("fetched")
    return stream.getvalue()


@pytest.fixture
def log_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for fmt in ("json", "text"):
        files[fmt] = tmp_path / f"controller.{fmt}.log"
        files[fmt].write_text(_controller_log(fmt))
    return files


def test_logs_keep_only_the_stagesets_lines(log_files: dict[str, Path]) -> None:
    shop = run_cli("logs", "shop", "-n", NS, "--from-file", str(log_files["json"]), env={"KUBECONFIG": ""})
    assert shop.exit_code == 0, shop.stderr
    lines = shop.stdout.splitlines()
    assert len(lines) == 2, lines
    assert (
        f"info StageSet/{NS}/shop stage=config revision={REVISION} identity=tenant: applied stage" in lines[0]
    )
    assert lines[1].endswith(f"error StageSet/{NS}/shop: stage failed: ImagePullBackOff")
    # The text format, the same lines.
    text = run_cli("logs", "shop", "-n", NS, "--from-file", str(log_files["text"]))
    assert [line.split(": ", 1)[1].split(" stageset=")[0] for line in text.stdout.splitlines()] == [
        "applied stage",
        "stage failed: ImagePullBackOff",
    ]
    # Without NAME: every StageSet of the namespace; -A: of every namespace; never a line about none.
    namespace = run_cli("logs", "-n", NS, "--from-file", str(log_files["json"]))
    assert [line.split(": ", 1)[1] for line in namespace.stdout.splitlines()] == [
        "applied stage",
        "stage failed: ImagePullBackOff",
        "blog reconciled",
    ]
    every = run_cli("logs", "-A", "--from-file", str(log_files["json"]))
    assert len(every.stdout.splitlines()) == 4
    assert "leader elected" not in every.stdout
    assert "fetched" not in every.stdout


def test_logs_level_tail_json_and_stdin(log_files: dict[str, Path]) -> None:
    source = str(log_files["json"])
    errors = run_cli("logs", "shop", "-n", NS, "--level", "error", "--from-file", source)
    assert errors.stdout.splitlines() == [errors.stdout.splitlines()[0]]
    assert "ImagePullBackOff" in errors.stdout
    raw = run_cli("logs", "shop", "-n", NS, "-o", "json", "--from-file", source)
    records = [json.loads(line) for line in raw.stdout.splitlines()]
    assert [r["stageset"] for r in records] == [f"{NS}/shop", f"{NS}/shop"]
    assert records[0]["stage"] == "config"
    # --tail counts the log's lines before filtering (as the apiserver's tailLines does).
    tail = run_cli("logs", "-n", NS, "--tail", "3", "--from-file", source)
    assert [line.split(": ", 1)[1] for line in tail.stdout.splitlines()] == ["blog reconciled"]
    piped = CliRunner().invoke(
        main, ["logs", "shop", "-n", NS, "--from-file", "-"], input=log_files["json"].read_text()
    )
    assert piped.exit_code == 0, piped.output
    assert len(piped.stdout.splitlines()) == 2
    assert run_cli("logs", "shop", "--from-file", source, "-n", NS, "--follow").exit_code == 2
    assert run_cli("logs", "shop", "--from-file", source, env={"KUBECONFIG": ""}).exit_code == 2
    assert run_cli("logs", "shop", "-A", "--from-file", source).exit_code == 2


# -- logs: the controller's pods, through the API ---------------------------------------------------


def _pod(admin: KubeClient, name: str, labels: dict[str, str], node: str | None = None) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "controller", "image": "ghcr.io/stageset/stageset:test"}]}
    if node:
        spec["nodeName"] = node
    admin.apply(
        f"/api/v1/namespaces/{CONTROLLER_NS}/pods/{name}",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": CONTROLLER_NS, "labels": labels},
            "spec": spec,
        },
        field_manager="test",
    )


def test_logs_read_the_controller_pods_log_through_the_api(world: World) -> None:
    admin, kubeconfig = world.admin, world.plane.kubeconfig
    args = ("logs", "shop", "-n", NS, "--controller-namespace", CONTROLLER_NS)
    none = run_cli(*args, kubeconfig=kubeconfig)
    assert none.exit_code == 3
    assert f"no controller pod in namespace {CONTROLLER_NS}" in none.stderr
    _pod(admin, "unrelated", {"app": "other"})
    assert run_cli(*args, kubeconfig=kubeconfig).exit_code == 3  # another app's pod is not the controller
    # A pod the chart made, not scheduled (a test apiserver has no nodes): the apiserver answers
    # its log with nothing, so the command prints nothing -- and the request is the right one.
    _pod(admin, "stageset-7d9c4-a", CONTROLLER_LABELS)
    since = len(world.plane.audit_events())
    read = run_cli(*args, "--tail", "50", "--since", "10m", kubeconfig=kubeconfig)
    assert read.exit_code == 0, read.stderr
    assert read.stdout == ""
    # One entry per request (a streamed answer is audited when it starts and when it completes).
    audited = {e["auditID"]: e for e in world.plane.audit_events()[since:] if "/pods" in e["requestURI"]}
    requests = [e["requestURI"] for e in audited.values()]
    assert any(uri.startswith(f"/api/v1/namespaces/{CONTROLLER_NS}/pods?labelSelector=") for uri in requests)
    logs = [uri for uri in requests if "/log" in uri]
    assert len(logs) == 1, requests
    path, _, query = logs[0].partition("?")
    assert path == f"/api/v1/namespaces/{CONTROLLER_NS}/pods/stageset-7d9c4-a/log"
    assert sorted(query.split("&")) == ["container=controller", "sinceSeconds=600", "tailLines=50"]
    # --follow asks the apiserver to follow (one reader per pod); the unscheduled pod's stream ends.
    since = len(world.plane.audit_events())
    followed = run_cli(*args, "-f", kubeconfig=kubeconfig)
    assert followed.exit_code == 0, followed.stderr
    uris = {e["requestURI"] for e in world.plane.audit_events()[since:] if "/log" in e["requestURI"]}
    assert uris == {
        f"/api/v1/namespaces/{CONTROLLER_NS}/pods/stageset-7d9c4-a/log?container=controller&follow=true"
    }
    # A pod on a node the apiserver cannot reach: its error, named with the pod.
    _pod(admin, "stageset-7d9c4-b", CONTROLLER_LABELS, node=f"gone-{SUFFIX}")
    unreachable = run_cli(*args, kubeconfig=kubeconfig)
    assert unreachable.exit_code == 3
    assert f"cannot read the log of pod {CONTROLLER_NS}/stageset-7d9c4-b" in unreachable.stderr
    # A tenant who may not look into the controller's namespace is told so.
    denied = run_cli(*args, kubeconfig=world.viewer)
    assert denied.exit_code == 3
    assert f"you may not list pods in namespace {CONTROLLER_NS}" in denied.stderr


# -- export ----------------------------------------------------------------------------------------


def test_export_prints_what_a_person_wrote_and_applies_again(world: World) -> None:
    admin = world.admin
    obj = {
        "apiVersion": "stages.metio.wtf/v1",
        "kind": "StageSet",
        "metadata": {
            "name": "exported",
            "namespace": NS,
            "labels": {"team": "shop"},
            "annotations": {
                "note": "kept",
                "stages.metio.wtf/inventory-record": '{"format":1}',
                "reconcile.fluxcd.io/requestedAt": "2026-01-01T00:00:00Z",
            },
            "finalizers": ["stages.metio.wtf/teardown"],
        },
        "spec": {"stages": [{"name": "config", "sourceRef": {"name": "app"}, "path": "./config"}]},
    }
    apply(admin, obj)
    admin.request(
        "PATCH",
        f"{STAGESETS.format(ns=NS)}/exported/status",
        body={"status": {"observedGeneration": 1, "lastAppliedRevision": REVISION}},
        content_type="application/merge-patch+json",
    )
    result = run_cli("export", "stageset", "exported", "-n", NS, kubeconfig=world.viewer)
    assert result.exit_code == 0, result.stderr
    [printed] = list(yaml.safe_load_all(result.stdout))
    assert set(printed) == {"apiVersion", "kind", "metadata", "spec"}
    assert printed["metadata"] == {
        "name": "exported",
        "namespace": NS,
        "labels": {"team": "shop"},
        "annotations": {"note": "kept"},
    }
    assert printed["spec"]["stages"][0]["path"] == "./config"
    # Re-appliable: deleted and created again from the export, the same spec.
    live = stageset(admin, NS, "exported")
    admin.request(
        "PATCH",
        f"{STAGESETS.format(ns=NS)}/exported",
        body={"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )
    admin.delete(f"{STAGESETS.format(ns=NS)}/exported")
    created = admin.request("POST", STAGESETS.format(ns=NS), body=printed)
    assert created["spec"] == live["spec"]
    every = run_cli("export", "gitrepository", "--all", "-n", NS, kubeconfig=world.viewer)
    assert every.exit_code == 0, every.stderr
    [repo] = list(yaml.safe_load_all(every.stdout))
    assert repo["kind"] == "GitRepository"
    assert repo["spec"]["url"] == "https://git.example/app.git"
    assert "status" not in repo
    # Flux's shape prints the same (issue 50).
    flux_shape = run_cli("export", "source", "git", "--all", "-n", NS, kubeconfig=world.viewer)
    assert flux_shape.exit_code == 0, flux_shape.stderr
    assert flux_shape.stdout == every.stdout
    assert run_cli("export", "stageset", "-n", NS, kubeconfig=world.viewer).exit_code == 2
    missing = run_cli("export", "stageset", "nothing", "-n", NS, kubeconfig=world.viewer)
    assert missing.exit_code == 3
    assert "not found" in missing.stderr


# -- create and delete -------------------------------------------------------------------------------


def test_create_stageset_and_source_git_apply_as_the_user(world: World) -> None:
    admin, kubeconfig = world.admin, world.plane.kubeconfig
    made = run_cli(
        "create",
        "source",
        "git",
        "shop",
        "-n",
        NS,
        "--url",
        "https://git.example/shop.git",
        "--tag",
        "v1.2.0",
        "--interval",
        "5m",
        kubeconfig=kubeconfig,
    )
    assert made.exit_code == 0, made.stderr
    assert made.stdout == f"applied GitRepository {NS}/shop\n"
    repo = admin.get(f"{GITREPOS.format(ns=NS)}/shop")
    assert repo["spec"]["ref"] == {"tag": "v1.2.0"}
    assert repo["spec"]["interval"] == "5m"
    assert {"stageset"} <= {m["manager"] for m in repo["metadata"]["managedFields"]}
    created = run_cli(
        "create",
        "stageset",
        "shop",
        "-n",
        NS,
        "--source",
        "GitRepository/shop",
        "--stage",
        "config=./config",
        "--stage",
        "app=./app,dependsOn=config",
        "--service-account",
        "deployer",
        kubeconfig=kubeconfig,
    )
    assert created.exit_code == 0, created.stderr
    spec = stageset(admin, NS, "shop")["spec"]
    assert spec["serviceAccountName"] == "deployer"
    assert [(s["name"], s["path"], s.get("dependsOn")) for s in spec["stages"]] == [
        ("config", "./config", None),
        ("app", "./app", ["config"]),
    ]
    assert spec["stages"][1]["sourceRef"] == {"kind": "GitRepository", "name": "shop"}
    # --export: the same object as YAML, no cluster.
    exported = run_cli(
        "create",
        "stageset",
        "shop",
        "-n",
        NS,
        "--source",
        "GitRepository/shop",
        "--stage",
        "config=./config",
        "--export",
        env={"KUBECONFIG": "/nonexistent"},
    )
    assert exported.exit_code == 0, exported.stderr
    assert yaml.safe_load(exported.stdout)["spec"]["stages"][0]["sourceRef"]["name"] == "shop"
    # Refused by the apiserver as the user; refused as usage before any request.
    denied = run_cli(
        "create", "stageset", "other", "--source", "shop", "--stage", "a=./a", kubeconfig=world.viewer
    )
    assert denied.exit_code == 3
    assert f"you may not apply StageSet {NS}/other" in denied.stderr
    for bad in (["--stage", "noequals"], ["--stage", "a=./a,after=b"], ["--stage", "Bad=./a"]):
        assert run_cli("create", "stageset", "x", "--source", "shop", *bad, "--export").exit_code == 2
    both = ("create", "source", "git", "x", "--url", "https://x", "--branch", "a", "--tag", "b", "--export")
    assert run_cli(*both).exit_code == 2


def test_delete_asks_unless_silent(world: World) -> None:
    admin, kubeconfig = world.admin, world.plane.kubeconfig
    apply(admin, _gitrepository("doomed"))
    apply(
        admin,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "doomed", "namespace": NS},
            "spec": {"stages": [{"name": "a", "sourceRef": {"name": "doomed"}}]},
        },
    )
    environment = {"KUBECONFIG": str(kubeconfig)}
    declined = CliRunner().invoke(
        main, ["delete", "stageset", "doomed", "-n", NS], input="n\n", env=environment
    )
    assert declined.exit_code == 1  # click's Abort
    assert f"Are you sure you want to delete StageSet {NS}/doomed?" in declined.output
    assert stageset(admin, NS, "doomed")
    confirmed = CliRunner().invoke(
        main, ["delete", "stageset", "doomed", "-n", NS], input="y\n", env=environment
    )
    assert confirmed.exit_code == 0, confirmed.output
    assert f"deleted StageSet {NS}/doomed" in confirmed.output
    silent = run_cli("delete", "source", "git", "doomed", "-n", NS, "-s", kubeconfig=kubeconfig)
    assert silent.exit_code == 0, silent.stderr
    with pytest.raises(ApiError) as gone:
        admin.get(f"{GITREPOS.format(ns=NS)}/doomed")
    assert gone.value.not_found
    missing = run_cli("delete", "source", "git", "doomed", "-n", NS, "--silent", kubeconfig=kubeconfig)
    assert missing.exit_code == 3
    assert "not found" in missing.stderr


# -- GitRepository verbs ---------------------------------------------------------------------------


def test_get_sources_git(world: World) -> None:
    listed = run_cli("get", "sources", "git", "-n", NS, kubeconfig=world.viewer)
    assert listed.exit_code == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "URL", "REF", "REVISION"]
    app = next(row for row in rows if row.startswith("app "))
    assert "branch/main" in app
    assert REVISION in app
    one = run_cli("get", "sources", "git", "app", "-n", NS, "-o", "json", kubeconfig=world.viewer)
    printed = json.loads(one.stdout)  # the object, as kubectl prints it
    assert (printed["kind"], printed["metadata"]["name"]) == ("GitRepository", "app")
    assert printed["status"]["artifact"]["revision"] == REVISION
    every = run_cli("get", "sources", "git", "-A", kubeconfig=world.plane.kubeconfig)
    assert every.stdout.splitlines()[0].split()[0] == "NAMESPACE"
    # The StageSet form of the verb is unchanged, and reachable by its explicit name too.
    assert run_cli("get", "-n", NS, kubeconfig=world.viewer).stdout.split()[:2] == ["NAME", "READY"]
    assert run_cli("get", "stagesets", "-n", NS, kubeconfig=world.viewer).exit_code == 0
    assert run_cli("get", "sources", "git", "-A", kubeconfig=world.viewer).exit_code == 3


def test_reconcile_suspend_resume_source_git(world: World) -> None:
    admin, kubeconfig = world.admin, world.plane.kubeconfig
    path = f"{GITREPOS.format(ns=NS)}/app"
    requested = run_cli("reconcile", "source", "git", "app", "-n", NS, kubeconfig=kubeconfig)
    assert requested.exit_code == 0, requested.stderr
    stamp = admin.get(path)["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"]
    assert stamp in requested.stdout
    assert run_cli("suspend", "source", "git", "app", "-n", NS, kubeconfig=kubeconfig).exit_code == 0
    assert admin.get(path)["spec"]["suspend"] is True
    refused = run_cli("reconcile", "source", "git", "app", "-n", NS, kubeconfig=kubeconfig)
    assert refused.exit_code == 3
    assert "is suspended" in refused.stderr
    assert run_cli("resume", "source", "git", "app", "-n", NS, kubeconfig=kubeconfig).exit_code == 0
    resumed = admin.get(path)
    assert resumed["spec"]["suspend"] is False
    assert resumed["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"] != stamp
    denied = run_cli("suspend", "source", "git", "app", "-n", NS, kubeconfig=world.viewer)
    assert denied.exit_code == 3
    assert "you may not patch GitRepository" in denied.stderr


def test_new_verbs_complete_names_from_the_cluster(world: World) -> None:
    apply(
        world.admin,
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "completed", "namespace": NS},
            "spec": {"stages": [{"name": "a", "sourceRef": {"name": "app"}}]},
        },
    )
    viewer = world.viewer
    assert complete(f"stageset reconcile source git -n {NS} a", kubeconfig=viewer) == ["app"]
    assert "app" in complete(f"stageset get sources git -n {NS} ", kubeconfig=viewer)
    assert complete(f"stageset export gitrepository -n {NS} a", kubeconfig=viewer) == ["app"]
    assert complete(f"stageset export stageset -n {NS} comp", kubeconfig=viewer) == ["completed"]
    assert complete(f"stageset delete stageset -n {NS} comp", kubeconfig=viewer) == ["completed"]
    assert complete(f"stageset logs -n {NS} comp", kubeconfig=viewer) == ["completed"]
    assert complete(f"stageset get -n {NS} comp", kubeconfig=viewer) == [
        "completed"
    ]  # the verb's StageSet form
    assert complete(f"stageset create stageset -n {NS} comp", kubeconfig=viewer) == []  # a new name
