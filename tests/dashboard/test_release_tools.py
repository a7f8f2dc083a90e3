"""The dashboard's release tools in a real browser (Debian's headless Chromium) against the real
apiserver and controller: release history, an object's live YAML and diff, and actions as the viewer.

One namespace, reconciled by the real controller (this module's own, so a test can restart it):

- ``shop``: stages ``config`` (a ConfigMap and a Secret whose value is :data:`MARKER`) and ``web``;
- ``gated``: stage ``first`` behind a manual promotion gate, then ``second``.

Three people: the admin; an *editor* (ClusterRole ``edit`` in the namespace: may patch StageSets
and impersonate the tenant's ServiceAccount, so ``stageset diff`` works for them); a *viewer*
(``view``: may read, not patch).  Every dashboard runs as a real process with the person's
kubeconfig.  Waits are the browser's own (``expect``) or the cluster's, never timed assertions.
"""

from __future__ import annotations

import base64
import http.server
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli, user_kubeconfig
from tests.dashboard.browser import DashboardProcess, dashboard
from tests.e2e.conftest import (
    condition,
    controller_kubeconfig,
    stageset,
    start_controller,
    stop_controller,
    wait_for,
)
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

SUFFIX = uuid.uuid4().hex[:6]
NS = f"dash-tools-{SUFFIX}"
API = f"/apis/stages.metio.wtf/v1/namespaces/{NS}"
MARKER = f"s3cret-{SUFFIX}"
WAIT = 30_000  # ms
REPO = f"{NS}-app"


def _settings(currency: str) -> str:
    return ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop-settings\n"
            f"data:\n  currency: {currency}\n")


FILES = {
    "app/config/settings.yaml": _settings("EUR"),
    "app/config/secret.yaml": ("apiVersion: v1\nkind: Secret\nmetadata:\n  name: shop-credentials\n"
                               f"stringData:\n  password: {MARKER}\n"),
    "app/web/web.yaml": ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-settings\n"
                         "data:\n  port: '80'\n"),
    "gated/first/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gated-first\n",
    "gated/second/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gated-second\n",
}


class Controllers:
    """This module's controller, which a test may restart (a new process, the same rights)."""

    def __init__(self, *, kubeconfig: Path, workdir: Path):
        self._kubeconfig, self._workdir = kubeconfig, workdir
        self.current: ControllerProcess = self._start()

    def _start(self) -> ControllerProcess:
        return start_controller(kubeconfig=self._kubeconfig, workdir=self._workdir,
                                extra=["--watch-namespaces", NS])

    def restart(self) -> None:
        stop_controller(self.current)
        self.current = self._start()


@dataclass
class World:
    admin: KubeClient
    plane: ControlPlane
    controllers: Controllers
    git: GitServer
    editor_kubeconfig: Path
    viewer_kubeconfig: Path
    editor: str
    viewer: str


def _bind(admin: KubeClient, account: str, role: str) -> None:
    admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/{account}-{role}",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{account}-{role}", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NS}]},
        field_manager="dashboard-test")


def _stage(name: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "sourceRef": {"name": "app"}, "path": path, **extra}


@pytest.fixture(scope="module")
def world(installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    admin = installed
    install.create_tenant(admin, namespace=NS, service_account="deployer")
    url = git_server.create_repo(REPO, FILES)
    admin.apply(f"{API}/gitrepositories/app", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": NS},
        "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1h"}}, field_manager="dashboard-test")
    for name, stages in (
        ("shop", [_stage("config", "./app/config"), _stage("web", "./app/web")]),
        ("gated", [_stage("first", "./gated/first", promotion={"requireManualPromotion": True}),
                   _stage("second", "./gated/second", dependsOn=["first"])]),
    ):
        admin.apply(f"{API}/stagesets/{name}", {
            "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"serviceAccountName": "deployer", "interval": "1h", "stages": stages}},
            field_manager="dashboard-test")
    people = {}
    for account, role in (("editor", "edit"), ("viewer", "view")):
        people[account] = user_kubeconfig(admin, control_plane, namespace=NS, account=account,
                                          path=tmp_path_factory.mktemp(account) / "kubeconfig",
                                          context_namespace=NS)
        _bind(admin, account, role)
    workdir = tmp_path_factory.mktemp("controller")
    kubeconfig = controller_kubeconfig(admin, control_plane=control_plane, path=workdir / "kubeconfig")
    controllers = Controllers(kubeconfig=kubeconfig, workdir=workdir)
    try:
        yield World(admin=admin, plane=control_plane, controllers=controllers, git=git_server,
                    editor_kubeconfig=people["editor"], viewer_kubeconfig=people["viewer"],
                    editor=f"system:serviceaccount:{NS}:editor", viewer=f"system:serviceaccount:{NS}:viewer")
    finally:
        stop_controller(controllers.current)


@pytest.fixture(scope="module")
def editor_dashboard(world: World) -> Iterator[DashboardProcess]:
    with dashboard("--allow-actions", kubeconfig=world.editor_kubeconfig) as running:
        yield running
    assert "action suspend on StageSet" in running.stderr  # every action is logged


@pytest.fixture(scope="module")
def viewer_dashboard(world: World) -> Iterator[DashboardProcess]:
    with dashboard("--allow-actions", kubeconfig=world.viewer_kubeconfig) as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    opened = context.new_page()
    yield opened
    context.close()


def live(page: Page) -> None:
    expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT)


def ready(world: World, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        obj = stageset(world.admin, NS, name)
        found = condition(obj)
        current = found is not None and found.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and found is not None and found["status"] == "True" else None

    result: dict[str, Any] = wait_for(done, timeout=120, what=f"StageSet {name} Ready")
    return result


def releases(obj: dict[str, Any], stage: str) -> list[dict[str, Any]]:
    found: dict[str, Any] = next((h for h in obj["status"].get("history") or [] if h["stage"] == stage),
                                 {"releases": []})
    return list(found["releases"])


def change_settings(world: World, currency: str) -> str:
    """Commit a new ConfigMap value and have it applied (as the admin's CLI would); the revision."""
    commit = world.git.commit(REPO, {"app/config/settings.yaml": _settings(currency)})
    result = run_cli("reconcile", "shop", "-n", NS, "--with-source", "--wait",
                     kubeconfig=world.plane.kubeconfig)
    assert result.exit_code == 0, result.output + result.stderr
    applied = str(stageset(world.admin, NS, "shop")["status"]["lastAppliedRevision"])
    assert applied.endswith(commit), applied
    return applied


def writes_by(world: World, user: str, since: int) -> list[dict[str, Any]]:
    """The write requests ``user`` made after audit event number ``since`` (their final stage); a
    SelfSubjectAccessReview (the page asking whether to show a button) is a question, not a write."""
    return [e for e in world.plane.audit_events()[since:]
            if (e.get("user") or {}).get("username") == user and e.get("stage") == "ResponseComplete"
            and e.get("verb") in {"create", "update", "patch", "delete", "deletecollection"}
            and (e.get("objectRef") or {}).get("resource") != "selfsubjectaccessreviews"]


# -- release history -------------------------------------------------------------------------------


def test_history_is_kept_in_status_and_survives_restarts(world: World, browser: Browser) -> None:
    first = ready(world, "shop")["status"]["lastAppliedRevision"]
    # Release times are kept to the second: the next release starts in a later second than the first
    # one's, so "its own time" can be told from the first release's.
    time.sleep(1.05 - time.time() % 1)
    second = change_settings(world, "CHF")
    shop = stageset(world.admin, NS, "shop")
    config = releases(shop, "config")
    assert [r["revision"] for r in config] == [second, first]
    assert config[0]["configured"] == 1
    assert config[0]["objects"] == [f"ConfigMap/{NS}/shop-settings configured"]
    assert config[1]["created"] == 2  # the first release created the ConfigMap and the Secret
    web = releases(shop, "web")  # applied at the new revision too, writing nothing
    assert [r["revision"] for r in web] == [second, first]
    assert (web[0]["created"], web[0]["configured"], web[0]["objects"]) == (0, 0, [])
    # Its own time: the pass that released it, not the first release's apply (issue 50).
    assert web[0]["appliedAt"] == config[0]["appliedAt"] != web[1]["appliedAt"]
    assert MARKER not in str(shop["status"])
    assert "password" not in str(shop["status"]["history"])

    # Both the controller and the dashboard start again: the history is still there, and grows.
    world.controllers.restart()
    with dashboard(kubeconfig=world.viewer_kubeconfig) as running:
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        try:
            page = context.new_page()
            page.goto(f"{running.url}stagesets/{NS}/shop")
            live(page)
            rows = page.locator("#history tr[data-stage='config']")
            expect(rows).to_have_count(2)
            expect(rows.nth(0)).to_have_attribute("data-revision", second)
            expect(rows.nth(0).locator("td.changed")).to_contain_text("1 configured")
            expect(rows.nth(1)).to_have_attribute("data-revision", first)
            expect(rows.nth(1).locator("td.changed")).to_contain_text("2 created")
            third = change_settings(world, "GBP")  # applied by the new controller
            expect(rows).to_have_count(3, timeout=WAIT)  # the page follows without a reload
            expect(rows.nth(0)).to_have_attribute("data-revision", third)
        finally:
            context.close()
    # A suspend and a resume (two spec generations applying nothing) add no row.
    assert run_cli("suspend", "shop", "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 0
    assert run_cli("resume", "shop", "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 0
    ready(world, "shop")
    cli = run_cli("history", "shop", "-n", NS, "--stage", "config", kubeconfig=world.viewer_kubeconfig)
    assert cli.exit_code == 0, cli.output + cli.stderr
    lines = cli.output.splitlines()
    assert lines[0].split() == ["APPLIED", "STAGE", "REVISION", "GEN", "PHASE", "CHANGED"]
    assert len(lines) == 4
    assert all(" config " in line and " Ready " in line for line in lines[1:])
    assert "1 configured" in lines[1]
    assert "2 created" in lines[3]
    as_json = run_cli("history", "shop", "-n", NS, "-o", "json", kubeconfig=world.viewer_kubeconfig)
    assert '"revision": "' + third + '"' in as_json.output


# -- an object's live YAML and diff ----------------------------------------------------------------


def _object_link(page: Page, stage: str, name: str) -> Any:
    page.locator(f"#stage-{stage} summary").click()
    return page.locator(f"#stage-{stage} table.objects a.object", has_text=name)


def test_an_object_s_live_yaml_and_its_diff_as_the_viewer(
    world: World, editor_dashboard: DashboardProcess, viewer_dashboard: DashboardProcess, page: Page
) -> None:
    ready(world, "shop")
    assert run_cli("suspend", "shop", "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 0
    try:
        # Someone changes the ConfigMap behind the controller's back.
        world.admin.request("PATCH", f"/api/v1/namespaces/{NS}/configmaps/shop-settings",
                            body={"data": {"currency": "drifted"}},
                            content_type="application/merge-patch+json")
        page.goto(f"{editor_dashboard.url}stagesets/{NS}/shop")
        live(page)
        _object_link(page, "config", "shop-settings").click()
        expect(page.locator("#live-object pre.yaml")).to_contain_text("currency: drifted")
        expect(page.locator("#diff .diff-action")).to_have_attribute("data-action", "Configured")
        expect(page.locator("#diff .diff-action")).to_contain_text(f"system:serviceaccount:{NS}:deployer")
        expect(page.locator("#diff pre.diff span.del")).to_contain_text(["currency: drifted"])
        expect(page.locator("#diff pre.diff span.add")).to_contain_text(["currency: GBP"])
        assert "managedFields" not in page.locator("#live-object").inner_text()

        # A Secret: never its values, neither live nor in the diff (nor base64-encoded).
        page.go_back()
        live(page)
        _object_link(page, "config", "shop-credentials").click()
        expect(page.locator("#live-object pre.yaml")).to_contain_text("password: '***'")
        expect(page.locator("#diff .diff-action")).to_have_attribute("data-action", "Unchanged")
        html = page.content()
        assert MARKER not in html
        assert base64.b64encode(MARKER.encode()).decode() not in html

        # The viewer may read the ConfigMap but not the Secret, and may not impersonate the
        # tenant's ServiceAccount: shown as such, never worked around.
        page.goto(f"{viewer_dashboard.url}stagesets/{NS}/shop")
        live(page)
        _object_link(page, "config", "shop-credentials").click()
        expect(page.locator("#live-object .note.bad")).to_contain_text("you may not read Secret")
        expect(page.locator("#diff .note.bad")).to_contain_text("impersonate")
        page.go_back()
        live(page)
        _object_link(page, "config", "shop-settings").click()
        expect(page.locator("#live-object pre.yaml")).to_contain_text("currency: drifted")
        assert MARKER not in page.content()
        # The page names only inventory objects.
        answer = page.goto(f"{viewer_dashboard.url}stagesets/{NS}/shop/object?stage=config&id={NS}_x__Secret")
        assert answer is not None
        assert answer.status == 404
    finally:
        assert run_cli("resume", "shop", "-n", NS, "--wait", kubeconfig=world.plane.kubeconfig).exit_code == 0


# -- actions ---------------------------------------------------------------------------------------


def _click(page: Page, verb: str) -> None:
    """Press the verb's button; the answer leads back to the page's activity list."""
    back = f"{page.url.split('#')[0]}#activity"
    page.locator(f"button[data-verb='{verb}']").click()
    expect(page).to_have_url(back)
    live(page)


def _post(page: Page, verb: str, **fields: str) -> None:
    """A same-origin form post from the page (for a verb the page shows no button for now)."""
    token = page.locator("input[name=token]").first.get_attribute("value")
    page.evaluate(
        """([action, fields]) => { const form = document.createElement("form"); form.method = "post";
           form.action = action; for (const [k, v] of Object.entries(fields)) { const i =
           document.createElement("input"); i.type = "hidden"; i.name = k; i.value = v; form.append(i); }
           document.body.append(form); form.submit(); }""",
        [f"/stagesets/{NS}/shop/actions/{verb}", {"token": token, **fields}])
    page.wait_for_url("**#activity")
    live(page)


def _done(page: Page, verb: str) -> Any:
    return page.locator(f"ol.actions-done li[data-verb='{verb}']").first


def test_a_viewer_without_the_right_sees_no_button_and_a_forged_post_is_refused(
    world: World, viewer_dashboard: DashboardProcess, page: Page
) -> None:
    """Issue 50: the buttons show only for what the apiserver would allow the viewer (a
    SelfSubjectAccessReview as them); a post made anyway is still the viewer's own request, refused."""
    ready(world, "shop")
    since = len(world.plane.audit_events())
    page.goto(f"{viewer_dashboard.url}stagesets/{NS}/shop")
    live(page)
    expect(page.locator("#actions")).to_have_attribute("data-denied", "true")
    expect(page.locator("#actions")).to_contain_text("You may not act on this StageSet")
    expect(page.locator("button[data-verb]")).to_have_count(0)
    for verb in ("reconcile", "reconcile-with-source", "suspend"):
        _post(page, verb)
        expect(_done(page, verb)).to_have_attribute("data-ok", "false")
        expect(_done(page, verb)).to_contain_text("you may not patch")
    _post(page, "update-now")
    expect(_done(page, "update-now")).to_contain_text("you may not patch StageSet")
    # Resume, on a suspended StageSet; promote, on a stage at its gate: no button, refused.
    assert run_cli("suspend", "shop", "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 0
    try:
        expect(page.locator("#summary dd").first).to_be_visible(timeout=WAIT)
        expect(page.locator("button[data-verb='resume']")).to_have_count(0)
        _post(page, "resume")
        expect(_done(page, "resume")).to_contain_text("you may not patch StageSet")
    finally:
        assert run_cli("resume", "shop", "-n", NS, kubeconfig=world.plane.kubeconfig).exit_code == 0
    page.goto(f"{viewer_dashboard.url}stagesets/{NS}/gated")
    live(page)
    expect(page.locator("#stage-first p.gate")).to_be_visible(timeout=120_000)
    expect(page.locator("button[data-verb='promote']")).to_have_count(0)
    page.evaluate(
        """([action, token]) => { const form = document.createElement("form"); form.method = "post";
           form.action = action; for (const [k, v] of [["token", token], ["stage", "first"]]) { const i =
           document.createElement("input"); i.type = "hidden"; i.name = k; i.value = v; form.append(i); }
           document.body.append(form); form.submit(); }""",
        [f"/stagesets/{NS}/gated/actions/promote",
         page.locator("input[name=token]").first.get_attribute("value")])
    page.wait_for_url("**#activity")
    live(page)
    expect(_done(page, "promote")).to_contain_text("you may not patch StageSet")
    # Denied means nothing written: every write the viewer's dashboard asked for was refused.
    writes = writes_by(world, world.viewer, since)
    assert writes, "the viewer's requests reached the apiserver"
    assert {e["responseStatus"]["code"] for e in writes} == {403}
    assert not (stageset(world.admin, NS, "shop")["spec"].get("suspend"))
    annotations = stageset(world.admin, NS, "gated")["metadata"].get("annotations") or {}
    assert "stages.metio.wtf/promote" not in annotations


def test_an_editor_acts_as_themselves_and_the_controller_follows(
    world: World, editor_dashboard: DashboardProcess, page: Page
) -> None:
    ready(world, "shop")
    since = len(world.plane.audit_events())
    page.goto(f"{editor_dashboard.url}stagesets/{NS}/shop")
    live(page)
    # Suspend asks first (issue 50): dismissed, nothing is asked of the cluster.
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.locator("button[data-verb='suspend']").click()
    assert asked == [f"Suspend {NS}/shop? Nothing is applied, pruned or corrected until it is resumed."]
    assert not stageset(world.admin, NS, "shop")["spec"].get("suspend")
    assert not writes_by(world, world.editor, since)
    page.once("dialog", lambda dialog: dialog.accept())
    _click(page, "suspend")
    expect(_done(page, "suspend")).to_have_attribute("data-ok", "true")
    assert stageset(world.admin, NS, "shop")["spec"]["suspend"] is True
    expect(page.locator("button[data-verb='resume']")).to_be_visible(timeout=WAIT)
    _click(page, "resume")
    expect(_done(page, "resume")).to_have_attribute("data-ok", "true")
    assert stageset(world.admin, NS, "shop")["spec"]["suspend"] is False
    ready(world, "shop")
    _click(page, "reconcile")
    stamp = stageset(world.admin, NS, "shop")["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"]
    wait_for(lambda: stageset(world.admin, NS, "shop")["status"].get("lastHandledReconcileAt") == stamp,
             timeout=60, what="the controller to handle the reconcile")
    _click(page, "reconcile-with-source")
    expect(_done(page, "reconcile-with-source")).to_contain_text(f"a fetch of {NS}/app")
    source = world.admin.get(f"{API}/gitrepositories/app")
    assert "reconcile.fluxcd.io/requestedAt" in source["metadata"]["annotations"]
    _post(page, "update-now")
    expect(_done(page, "update-now")).to_have_attribute("data-ok", "true")
    assert "stages.metio.wtf/update-now" in stageset(world.admin, NS, "shop")["metadata"]["annotations"]

    page.goto(f"{editor_dashboard.url}stagesets/{NS}/gated")
    live(page)
    expect(page.locator("#stage-first button[data-verb='promote']")).to_be_visible(timeout=120_000)
    _click(page, "promote")
    expect(_done(page, "promote")).to_have_attribute("data-ok", "true")
    ready(world, "gated")  # promoted: the second stage ran
    expect(page.locator("svg.graph.wide g.node[data-node='second']")).to_have_attribute(
        "data-phase", "Ready", timeout=WAIT)
    # Every write was the editor's own request (no impersonation), and the apiserver accepted it.
    writes = writes_by(world, world.editor, since)
    assert len(writes) >= 7
    assert {e["responseStatus"]["code"] for e in writes} == {200}
    assert not any(e.get("impersonatedUser") for e in writes)


class _Attacker(http.server.BaseHTTPRequestHandler):
    """A page on another origin (another port of the same host: same-site, so SameSite cookies
    would still be sent) whose form posts to the dashboard's suspend action on load."""

    target = ""

    def do_GET(self) -> None:
        body = (f'<form id="f" method="post" action="{self.target}"><input name="token" value="guess"></form>'
                '<script>document.getElementById("f").submit()</script>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_cross_site_post_is_refused(world: World, editor_dashboard: DashboardProcess, page: Page) -> None:
    page.goto(f"{editor_dashboard.url}stagesets/{NS}/shop")  # the viewer has a session (its cookie)
    live(page)
    since = len(world.plane.audit_events())
    _Attacker.target = f"{editor_dashboard.url}stagesets/{NS}/shop/actions/suspend"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with page.expect_response(_Attacker.target) as refused:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        assert refused.value.status == 403
        assert "cross-origin" in refused.value.text()
    finally:
        server.shutdown()
    # Even with the session's real token, a request from elsewhere is refused.
    page.goto(f"{editor_dashboard.url}stagesets/{NS}/shop")
    token = page.locator("input[name=token]").first.get_attribute("value") or ""
    answer = page.request.post(_Attacker.target, form={"token": token},
                               headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert answer.status == 403
    # And from the page's own origin, a wrong token is refused too.
    origin = editor_dashboard.url.rstrip("/")
    wrong = page.request.post(_Attacker.target, form={"token": "0" * 64}, headers={"Origin": origin})
    assert wrong.status == 403
    assert "token" in wrong.text()
    assert writes_by(world, world.editor, since) == []
    assert not stageset(world.admin, NS, "shop")["spec"].get("suspend")
