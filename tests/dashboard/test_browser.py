"""``stageset dashboard`` in a real browser (Debian's headless Chromium) against the real apiserver.

Three namespaces:

- ``live``: the example of ``make run`` (examples/stageset.yaml, examples/app/ served by a real
  Git server), reconciled by the real controller;
- ``team``: StageSets whose status the test writes as the controller would (phases chosen by the
  test, a stage turning Ready, hostile text), read by a user bound to ``view`` there only;
- ``other``: a StageSet that user may not read, whose status carries a marker that must never
  reach the user's pages.

Two dashboards run as real processes: the admin's (``-A``) and the team user's (their context's
namespace).  Waits are the browser's own (``expect``), never timed assertions.
"""

from __future__ import annotations

import os
import string
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import Browser, Page, expect

from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli, user_kubeconfig
from tests.dashboard.browser import DashboardProcess, dashboard
from tests.e2e.conftest import condition, stageset, wait_for
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

SUFFIX = uuid.uuid4().hex[:6]
LIVE, TEAM, OTHER = f"dash-live-{SUFFIX}", f"dash-team-{SUFFIX}", f"dash-other-{SUFFIX}"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets"
REVISION = "main@sha1:" + "1f" * 20
MARKER = f"other-team-secret-{SUFFIX}"
HOSTILE_MESSAGE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script> & "quotes"'
HOSTILE_NAME = "<svg onload=window.pwned=3>"
# A directory to save the held release's page to (how docs/images/dashboard-held.png is made).
SCREENSHOTS = os.environ.get("STAGESET_DASHBOARD_SCREENSHOTS")
WAIT = 20_000  # ms: how long the browser waits for what the page should come to show


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return ["--watch-namespaces", LIVE]  # the team's StageSets are the test's to write


@dataclass
class World:
    admin: KubeClient
    plane: ControlPlane
    team_kubeconfig: Path
    viewer: str


def write_status(admin: KubeClient, namespace: str, name: str, status: dict[str, Any]) -> None:
    """As the controller writes it: the status subresource (a merge patch replaces the lists)."""
    admin.request(
        "PATCH",
        f"{API.format(ns=namespace)}/{name}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def apply(admin: KubeClient, path: str, obj: dict[str, Any]) -> None:
    admin.apply(path, obj, field_manager="dashboard-test")


def stage_status(name: str, phase: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "phase": phase, "revision": REVISION, **extra}


def ready(status: str, reason: str, message: str = "") -> list[dict[str, Any]]:
    return [
        {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]


def release_status(api_phase: str) -> dict[str, Any]:
    return {
        "observedGeneration": 1,
        "conditions": ready("False", "StageProgressing", "stage api: Deployment api: 0/1 replicas ready"),
        "stages": [
            stage_status("db", "Ready", objects=1),
            stage_status(
                "api",
                api_phase,
                objects=1,
                message="" if api_phase == "Ready" else "Deployment api: 0/1 replicas ready",
            ),
            stage_status("web", "Ready", objects=0),
            stage_status("edge", "Pending"),
        ],
        "inventory": [
            {"name": "db", "entries": [{"id": f"{TEAM}_db-settings__ConfigMap", "v": "v1"}]},
            {"name": "api", "entries": [{"id": f"{TEAM}_api_apps_Deployment", "v": "apps/v1"}]},
        ],
    }


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "api", "namespace": TEAM},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "api"}},
            "template": {
                "metadata": {"labels": {"app": "api"}},
                "spec": {"containers": [{"name": "api", "image": "example.invalid/api:1"}]},
            },
        },
    }


@pytest.fixture(scope="module")
def world(
    installed: KubeClient,
    control_plane: ControlPlane,
    controller: ControllerProcess,
    git_server: GitServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    admin = installed
    # The example, exactly as `make run` applies it, in its own namespace.
    install.create_tenant(admin, namespace=LIVE, service_account="shop-deployer")
    files = {
        str(p.relative_to(EXAMPLES)): p.read_text() for p in (EXAMPLES / "app").rglob("*") if p.is_file()
    }
    url = git_server.create_repo(f"{LIVE}-examples", files)
    text = string.Template((EXAMPLES / "stageset.yaml").read_text()).safe_substitute(GIT_URL=url)
    for doc in yaml.safe_load_all(text):
        doc["metadata"]["namespace"] = LIVE
        plural = "stagesets" if doc["kind"] == "StageSet" else "gitrepositories"
        apply(admin, f"/apis/stages.metio.wtf/v1/namespaces/{LIVE}/{plural}/{doc['metadata']['name']}", doc)

    for namespace in (TEAM, OTHER):
        apply(
            admin,
            f"/api/v1/namespaces/{namespace}",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
    source = {"sourceRef": {"name": "app"}}
    apply(
        admin,
        f"{API.format(ns=TEAM)}/release",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "release", "namespace": TEAM},
            "spec": {
                "dependsOn": [{"name": "plans", "namespace": OTHER}],
                "stages": [
                    {"name": "db", **source},
                    {"name": "api", **source},
                    {"name": "web", "dependsOn": ["db"], **source},
                    {"name": "edge", "dependsOn": ["api", "web"], **source},
                ],
            },
        },
    )
    write_status(admin, TEAM, "release", release_status("Waiting"))
    apply(
        admin,
        f"/api/v1/namespaces/{TEAM}/configmaps/db-settings",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "db-settings", "namespace": TEAM}},
    )
    apply(admin, f"/apis/apps/v1/namespaces/{TEAM}/deployments/api", deployment())

    apply(
        admin,
        f"{API.format(ns=TEAM)}/hostile",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "hostile", "namespace": TEAM},
            "spec": {"stages": [{"name": "only", **source}]},
        },
    )
    write_status(
        admin,
        TEAM,
        "hostile",
        {
            "observedGeneration": 1,
            "conditions": ready("False", "StageFailed", HOSTILE_MESSAGE),
            "stages": [stage_status("only", "Failed", message=HOSTILE_MESSAGE)],
            "inventory": [
                {"name": "only", "entries": [{"id": f"{TEAM}_{HOSTILE_NAME}__ConfigMap", "v": "v1"}]}
            ],
        },
    )
    admin.request(
        "POST",
        f"/api/v1/namespaces/{TEAM}/events",
        body={
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"hostile.{SUFFIX}", "namespace": TEAM},
            "involvedObject": {
                "apiVersion": "stages.metio.wtf/v1",
                "kind": "StageSet",
                "name": "hostile",
                "namespace": TEAM,
            },
            "type": "Warning",
            "reason": "Hostile",
            "message": HOSTILE_MESSAGE,
            "count": 1,
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:00:00Z",
            "source": {"component": "dashboard-test"},
        },
    )

    apply(
        admin,
        f"{API.format(ns=OTHER)}/plans",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "plans", "namespace": OTHER},
            "spec": {"stages": [{"name": "secret", **source}]},
        },
    )
    write_status(
        admin,
        OTHER,
        "plans",
        {
            "observedGeneration": 1,
            "conditions": ready("False", "StageFailed", MARKER),
            "stages": [stage_status("secret", "Failed", message=MARKER)],
        },
    )

    # A user who may read the team's namespace (ClusterRole view, bound there) and nothing else.
    viewer = "viewer"
    kubeconfig = user_kubeconfig(
        admin,
        control_plane,
        namespace=TEAM,
        account=viewer,
        path=tmp_path_factory.mktemp("viewer") / "kubeconfig",
        context_namespace=TEAM,
    )
    apply(
        admin,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{TEAM}/rolebindings/viewer-view",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "viewer-view", "namespace": TEAM},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": viewer, "namespace": TEAM}],
        },
    )
    return World(
        admin=admin,
        plane=control_plane,
        team_kubeconfig=kubeconfig,
        viewer=f"system:serviceaccount:{TEAM}:{viewer}",
    )


@pytest.fixture(scope="module")
def admin_dashboard(world: World) -> Iterator[DashboardProcess]:
    with dashboard("-A", kubeconfig=world.plane.kubeconfig) as running:
        yield running


@pytest.fixture(scope="module")
def team_dashboard(world: World) -> Iterator[DashboardProcess]:
    with dashboard(kubeconfig=world.team_kubeconfig) as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    opened = context.new_page()
    dialogs: list[str] = []
    opened.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield opened
    context.close()
    assert dialogs == [], f"a script ran: {dialogs}"


def node(page: Page, name: str, *, picture: str = "wide") -> Any:
    return page.locator(f"svg.graph.{picture} g.node[data-node='{name}']")


def colour(page: Page, variable: str) -> str:
    """A CSS variable's colour as getComputedStyle reports fills: ``rgb(r, g, b)``."""
    value = page.evaluate(
        f"getComputedStyle(document.documentElement).getPropertyValue('{variable}')"
    ).strip()
    red, green, blue = (int(value[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({red}, {green}, {blue})"


def fill(page: Page, name: str) -> str:
    return str(node(page, name).locator("rect").evaluate("rect => getComputedStyle(rect).fill"))


def live(page: Page) -> None:
    """The page's stream is connected."""
    expect(page.locator("#live")).to_have_attribute("data-state", "on", timeout=WAIT)


# -- the example, reconciled by the real controller ----------------------------------------------------


def test_the_list_shows_the_example_stagesets(
    world: World, admin_dashboard: DashboardProcess, page: Page
) -> None:
    page.goto(admin_dashboard.url)
    live(page)
    row = page.locator(f"tr[data-stageset='{LIVE}/shop']")
    expect(row).to_be_visible(timeout=WAIT)
    # The controller finishes the example while (or before) the page is open: the row comes to say so.
    expect(row.locator("td").nth(2)).to_have_text("True", timeout=60_000)
    expect(row.locator(".progress")).to_have_text("3/3")
    head = world.admin.get(f"{API.format(ns=LIVE)}/shop")["status"]["lastAppliedRevision"]
    expect(row.locator("code")).to_have_attribute("title", head)
    for name in ("release", "hostile"):
        expect(page.locator(f"tr[data-stageset='{TEAM}/{name}']")).to_be_visible()
    expect(page.locator(f"tr[data-stageset='{TEAM}/release'] td.waits")).to_contain_text(
        "stage api (Waiting)"
    )


def test_the_example_s_graph_objects_and_last_change(
    world: World, admin_dashboard: DashboardProcess, page: Page
) -> None:
    wait_for(
        lambda: (c := condition(stageset(world.admin, LIVE, "shop"))) and c["status"] == "True",
        timeout=90,
        what="the example Ready",
    )
    page.goto(f"{admin_dashboard.url}stagesets/{LIVE}/shop")
    live(page)
    for name in ("config", "backend", "frontend"):
        expect(node(page, name)).to_have_attribute("data-phase", "Ready")
    edges = {
        (e.get_attribute("data-from"), e.get_attribute("data-to"))
        for e in page.locator("svg.graph.wide path.edge").all()
    }
    # backend has no dependsOn: it runs after the stage listed before it; frontend names config.
    assert edges == {("config", "backend"), ("config", "frontend")}
    backend = page.locator("#stage-backend")
    backend.locator("summary").click()
    expect(backend.locator("table.objects")).to_contain_text("Service")
    expect(backend.locator("table.objects .badge").first).to_have_text("Current", timeout=WAIT)
    # The controller's ReconciliationSucceeded event names what the first apply created.
    config = page.locator("#stage-config")
    config.locator("summary").click()
    expect(config.locator("ul.changes")).to_contain_text(f"created ConfigMap/{LIVE}/", timeout=WAIT)
    expect(page.locator("#events table")).to_contain_text("ReconciliationSucceeded")
    expect(page.locator("#events table")).to_contain_text("GitRepository/shop")  # the source's events too


def test_after_a_revert_the_last_change_names_the_revision_applied(
    world: World, admin_dashboard: DashboardProcess, git_server: GitServer, page: Page
) -> None:
    # A change, then its revert: the two writes have the same summary ("ConfigMap/… configured"),
    # the event of each must name its own revision (the recorder folded the revert into the
    # change's event, which named the change's revision).
    settings = (EXAMPLES / "app" / "config" / "settings.yaml").read_text()
    shown = page.locator("#stage-config p.last-change code")
    page.goto(f"{admin_dashboard.url}stagesets/{LIVE}/shop")
    live(page)
    for text in (settings.replace("EUR", "CHF"), settings):
        commit = git_server.commit(f"{LIVE}-examples", {"app/config/settings.yaml": text})
        result = run_cli("reconcile", "shop", "-n", LIVE, "--with-source", "--wait",
                         kubeconfig=world.plane.kubeconfig)
        assert result.exit_code == 0, result.output + result.stderr
        applied = stageset(world.admin, LIVE, "shop")["status"]["lastAppliedRevision"]
        assert applied.endswith(commit), applied
        expect(shown).to_have_attribute("title", applied, timeout=WAIT)
    expect(page.locator("#stage-config ul.changes")).to_contain_text(f"configured ConfigMap/{LIVE}/")


def test_a_dependency_that_failed_is_drawn_failed(admin_dashboard: DashboardProcess, page: Page) -> None:
    # team/release waits for other/plans, whose Ready=False StageFailed was said about its generation.
    page.goto(f"{admin_dashboard.url}stagesets/{TEAM}/release")
    live(page)
    dependency = node(page, f"stageset:{OTHER}/plans")
    expect(dependency).to_have_attribute("data-phase", "Failed", timeout=WAIT)
    stroke = dependency.locator("rect").evaluate("rect => getComputedStyle(rect).stroke")
    assert stroke == colour(page, "--failed")
    assert fill(page, f"stageset:{OTHER}/plans") == colour(page, "--failed-fill")
    expect(page.locator("ul.dependencies .badge")).to_have_text("Failed")


# -- the team's StageSets, their status written by the test ----------------------------------------------


def test_the_graph_shows_every_stage_in_its_phase_and_who_holds_the_release(
    team_dashboard: DashboardProcess, page: Page
) -> None:
    page.goto(f"{team_dashboard.url}stagesets/{TEAM}/release")
    live(page)
    phases = {"db": "Ready", "api": "Waiting", "web": "Ready", "edge": "Pending"}
    for name, phase in phases.items():
        expect(node(page, name)).to_have_attribute("data-phase", phase)
        assert fill(page, name) == colour(page, f"--{phase.lower()}-fill"), name
    assert "holding" in (node(page, "api").get_attribute("class") or "")
    assert "holding" not in (node(page, "edge").get_attribute("class") or "")
    expect(page.locator("#holding")).to_contain_text("Held at stage api: Waiting")
    expect(page.locator("#holding")).to_contain_text("StageProgressing")
    # The StageSet it waits for is in a namespace this user may not read: shown as such.
    dependency = node(page, f"stageset:{OTHER}/plans")
    expect(dependency).to_have_attribute("data-phase", "Unknown")
    expect(page.locator("ul.dependencies")).to_contain_text(
        f"you may not list stagesets in namespace {OTHER}"
    )
    if SCREENSHOTS:  # docs/images/dashboard-held.png is this page's summary and picture
        top, bottom = page.locator("#summary").bounding_box(), page.locator("#graph").bounding_box()
        assert top is not None
        assert bottom is not None
        height = bottom["y"] + bottom["height"] - top["y"] + 16
        clip = {"x": 0, "y": top["y"] - 8, "width": 1200, "height": height}
        page.screenshot(path=str(Path(SCREENSHOTS) / "dashboard-held.png"), clip=clip)  # type: ignore[arg-type]


def test_a_stage_turning_ready_changes_colour_without_a_reload(
    world: World, team_dashboard: DashboardProcess, page: Page
) -> None:
    write_status(world.admin, TEAM, "release", release_status("Waiting"))
    apply(world.admin, f"/apis/apps/v1/namespaces/{TEAM}/deployments/api", deployment())
    navigations: list[str] = []
    page.goto(f"{team_dashboard.url}stagesets/{TEAM}/release")
    live(page)
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.evaluate("window.sameDocument = 'yes'")
    expect(node(page, "api")).to_have_attribute("data-phase", "Waiting")
    api = page.locator("#stage-api")
    expect(api.locator("table.objects .badge")).to_have_text("InProgress", timeout=WAIT)

    # The Deployment rolls out (as its controller would report it), then the controller marks the stage.
    world.admin.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{TEAM}/deployments/api/status",
        body={
            "status": {
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": 1,
                "availableReplicas": 1,
            }
        },
        content_type="application/merge-patch+json",
    )
    expect(api.locator("table.objects .badge")).to_have_text("Current", timeout=WAIT)
    write_status(world.admin, TEAM, "release", release_status("Ready"))

    expect(node(page, "api")).to_have_attribute("data-phase", "Ready", timeout=WAIT)
    assert fill(page, "api") == colour(page, "--ready-fill")
    assert "holding" in (node(page, "edge").get_attribute("class") or "")  # the next one to go
    expect(page.locator("#activity")).to_contain_text("Waiting → Ready")
    assert page.evaluate("window.sameDocument") == "yes"
    assert navigations == []


def test_hostile_names_and_messages_render_as_text(team_dashboard: DashboardProcess, page: Page) -> None:
    page.goto(team_dashboard.url)
    live(page)
    expect(page.locator(f"tr[data-stageset='{TEAM}/hostile'] td.waits")).to_contain_text(HOSTILE_MESSAGE)
    page.goto(f"{team_dashboard.url}stagesets/{TEAM}/hostile")
    live(page)
    expect(page.locator("#stage-only pre.message")).to_have_text(HOSTILE_MESSAGE)
    expect(page.locator("#stage-only table.objects")).to_contain_text(HOSTILE_NAME)
    expect(page.locator("#events table")).to_contain_text(HOSTILE_MESSAGE, timeout=WAIT)
    expect(page.locator("#summary")).to_contain_text(HOSTILE_MESSAGE)
    assert page.evaluate("window.pwned") is None
    assert page.locator("img, script:not([src]), svg[onload], [onerror]").count() == 0
    # Also after the live stream swapped the fragments in again.
    page.reload()
    live(page)
    assert page.evaluate("window.pwned") is None


RUNBOOK = "https://stages.metio.wtf/runbooks/stagefailed/"
LINKED = "https://docs.example/why?a=1&b=2"


def test_runbooks_and_urls_in_messages_are_links_and_nothing_else(
    world: World, team_dashboard: DashboardProcess, page: Page
) -> None:
    hostile = f'{LINKED}"><img src=x onerror="window.pwned=4"> javascript:window.pwned=5 data:text/html,x'
    apply(
        world.admin,
        f"{API.format(ns=TEAM)}/linked",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "linked", "namespace": TEAM},
            "spec": {"stages": [{"name": "only", "sourceRef": {"name": "app"}}]},
        },
    )
    write_status(
        world.admin,
        TEAM,
        "linked",
        {
            "observedGeneration": 1,
            "conditions": ready(
                "False", "StageFailed", f"stage 'only' failed: {hostile}; runbook: {RUNBOOK}"
            ),
            "stages": [stage_status("only", "Failed", message=f"see {hostile}")],
        },
    )
    page.goto(f"{team_dashboard.url}stagesets/{TEAM}/linked")
    live(page)
    expect(page.locator("#summary a.runbook")).to_have_attribute("href", RUNBOOK)
    expect(page.locator("#summary a.runbook")).to_have_text("runbook")
    expect(page.locator("#stage-only pre.message a")).to_have_attribute("href", LINKED)
    expect(page.locator("#stage-only pre.message")).to_have_text(f"see {hostile}")
    hrefs = [a.get_attribute("href") for a in page.locator("main a[href]").all()]
    assert all(h and (h.startswith(("/", "#", "https://"))) for h in hrefs), hrefs
    assert {RUNBOOK, LINKED} <= set(hrefs)
    for anchor in page.locator("main a[target=_blank]").all():
        assert anchor.get_attribute("rel") == "noopener noreferrer"
    assert page.locator("img, [onerror]").count() == 0
    assert page.evaluate("window.pwned") is None


TOKEN = f"t0ken-{SUFFIX}"


def _git_repository(namespace: str, name: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": "stages.metio.wtf/v1",
        "kind": "GitRepository",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m"},
    }


def _source_status(admin: KubeClient, namespace: str, name: str, status: dict[str, Any]) -> None:
    admin.request(
        "PATCH",
        f"/apis/stages.metio.wtf/v1/namespaces/{namespace}/gitrepositories/{name}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def test_the_sources_page_lists_what_the_viewer_may_list_and_who_uses_it(
    world: World, team_dashboard: DashboardProcess, page: Page
) -> None:
    sources = "/apis/stages.metio.wtf/v1/namespaces/{ns}/gitrepositories/{name}"
    apply(
        world.admin,
        sources.format(ns=TEAM, name="app"),
        _git_repository(TEAM, "app", f"https://deploy:{TOKEN}@git.example/team/app.git"),
    )
    _source_status(
        world.admin,
        TEAM,
        "app",
        {
            "observedGeneration": 1,
            "artifact": {"revision": REVISION, "lastUpdateTime": "2026-01-01T00:00:00Z"},
            "conditions": ready(
                "False", "AuthenticationFailed", f"the server refused the credentials; runbook: {RUNBOOK}"
            ),
        },
    )
    apply(world.admin, sources.format(ns=OTHER, name="plans"), _git_repository(OTHER, "plans", f"https://x/{MARKER}"))

    page.goto(team_dashboard.url)
    live(page)
    page.locator("header nav.pages a", has_text="Sources").click()
    expect(page).to_have_url(f"{team_dashboard.url}sources")
    live(page)
    row = page.locator(f"tr[data-source='GitRepository/{TEAM}/app']")
    expect(row).to_be_visible(timeout=WAIT)
    expect(row.locator("td.url")).to_have_text("https://git.example/team/app.git")
    expect(row).to_contain_text("branch main")
    expect(row.locator("code")).to_have_attribute("title", REVISION)
    expect(row.locator(".badge")).to_have_text("False")
    error = page.locator("tr.error-row").first
    expect(error).to_contain_text("AuthenticationFailed: the server refused the credentials")
    expect(error.locator("a.runbook")).to_have_attribute("href", RUNBOOK)
    used = row.locator("td.used-by a")
    expect(used.filter(has_text="release")).to_have_attribute("href", f"/stagesets/{TEAM}/release")
    html = page.content()
    assert TOKEN not in html  # the URL's credentials are cut
    assert MARKER not in html  # another namespace's source: not listed, not watched
    assert page.locator("tr[data-source]").count() == 1

    # Fetched again: the page follows without a reload.
    _source_status(
        world.admin,
        TEAM,
        "app",
        {"conditions": ready("True", "Succeeded", "stored artifact")},
    )
    expect(row.locator(".badge")).to_have_text("True", timeout=WAIT)
    expect(page.locator("tr.error-row")).to_have_count(0)

    # And a StageSet's page links its stage's source here.
    used.filter(has_text="release").click()
    live(page)
    page.locator("#stage-db summary").click()
    page.locator("#stage-db dd a", has_text=f"GitRepository {TEAM}/app").click()
    expect(page.locator(f"tr[data-source='GitRepository/{TEAM}/app']")).to_be_visible(timeout=WAIT)


def test_the_sources_page_as_admin_shows_the_example_s_fetch(
    world: World, admin_dashboard: DashboardProcess, page: Page
) -> None:
    page.goto(f"{admin_dashboard.url}sources")
    live(page)
    row = page.locator(f"tr[data-source='GitRepository/{LIVE}/shop']")
    expect(row.locator(".badge")).to_have_text("True", timeout=WAIT)
    fetched = world.admin.get(f"/apis/stages.metio.wtf/v1/namespaces/{LIVE}/gitrepositories/shop")
    expect(row.locator("code")).to_have_attribute("title", fetched["status"]["artifact"]["revision"])
    expect(row.locator("td.used-by a")).to_have_attribute("href", f"/stagesets/{LIVE}/shop")
    expect(page.locator(f"tr[data-source='GitRepository/{OTHER}/plans']")).to_be_visible()


def test_a_user_who_may_read_one_namespace_sees_only_it(
    world: World, team_dashboard: DashboardProcess, page: Page
) -> None:
    assert f"namespace {TEAM}" in team_dashboard.banner
    page.goto(team_dashboard.url)
    live(page)
    expect(page.locator(f"tr[data-stageset='{TEAM}/release']")).to_be_visible()
    rows = page.locator("tr[data-stageset]")
    assert {r.get_attribute("data-stageset").split("/")[0] for r in rows.all()} == {TEAM}  # type: ignore[union-attr]
    for path in (f"stagesets/{OTHER}/plans", f"stagesets/{LIVE}/shop"):
        answer = page.goto(team_dashboard.url + path)
        assert answer is not None
        assert answer.status == 404
        expect(page.locator("h1")).to_have_text("Not shown here")
    page.goto(f"{team_dashboard.url}stagesets/{TEAM}/release")
    live(page)
    for html in (page.content(), *(_get(team_dashboard.url + p) for p in ("", f"stagesets/{OTHER}/plans"))):
        assert MARKER not in html
    # Asked for more, the command says plainly that this user may not.
    everything = run_cli("dashboard", "-A", "--address", "127.0.0.1:0", kubeconfig=world.team_kubeconfig)
    assert everything.exit_code == 3
    assert "you may not list StageSets in any namespace (-A)" in everything.stderr
    other = run_cli("dashboard", "-n", OTHER, "--address", "127.0.0.1:0", kubeconfig=world.team_kubeconfig)
    assert other.exit_code == 3
    assert f"you may not list StageSets in namespace {OTHER}" in other.stderr


def test_the_dashboard_only_reads(world: World, team_dashboard: DashboardProcess) -> None:
    _get(team_dashboard.url + f"stagesets/{TEAM}/release")
    # Every stage of every request (a watch completes only when it ends).
    mine = [e for e in world.plane.audit_events() if (e.get("user") or {}).get("username") == world.viewer]
    verbs = {e["verb"] for e in mine}
    assert {"list", "watch"} <= verbs, verbs  # the evidence is there: its lists and watches
    assert verbs <= {"get", "list", "watch"}, [
        e["requestURI"] for e in mine if e["verb"] not in {"get", "list", "watch"}
    ]
    assert not any(e.get("impersonatedUser") for e in mine)


def test_open_pages_share_one_watch_per_kind(
    world: World, team_dashboard: DashboardProcess, browser: Browser
) -> None:
    # A StageSet whose stage applied a kind no other page of this module needs: ServiceAccounts.
    apply(
        world.admin,
        f"{API.format(ns=TEAM)}/shared",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": "shared", "namespace": TEAM},
            "spec": {"stages": [{"name": "accounts", "sourceRef": {"name": "app"}}]},
        },
    )
    write_status(
        world.admin,
        TEAM,
        "shared",
        {
            "observedGeneration": 1,
            "conditions": ready("True", "Succeeded"),
            "stages": [stage_status("accounts", "Ready", objects=1)],
            "inventory": [
                {"name": "accounts", "entries": [{"id": f"{TEAM}_viewer__ServiceAccount", "v": "v1"}]}
            ],
        },
    )

    def watches() -> int:
        return sum(
            1
            for e in world.plane.audit_events()
            if (e.get("user") or {}).get("username") == world.viewer
            and e.get("verb") == "watch"
            and e.get("stage") == "ResponseStarted"  # the policy omits RequestReceived
            and (e.get("objectRef") or {}).get("resource") == "serviceaccounts"
        )

    before = watches()
    contexts = [browser.new_context() for _ in range(3)]
    try:
        for context in contexts:
            opened = context.new_page()
            opened.goto(f"{team_dashboard.url}stagesets/{TEAM}/shared")
            live(opened)
            expect(opened.locator("#stage-accounts table.objects .badge")).to_have_text(
                "Current", timeout=WAIT
            )
        assert wait_for(lambda: watches() - before, timeout=30, what="the ServiceAccounts watch") == 1
    finally:
        for context in contexts:
            context.close()


def test_pages_answer_only_loopback_host_names_with_protective_headers(
    team_dashboard: DashboardProcess,
) -> None:
    port = team_dashboard.url.rstrip("/").rpartition(":")[2]
    rebound = {"Host": f"rebound.example:{port}"}  # what a DNS-rebinding page's request would say
    request = urllib.request.Request(team_dashboard.url, headers=rebound)  # noqa: S310 - loopback
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback
    assert refused.value.code == 400
    with urllib.request.urlopen(team_dashboard.url, timeout=10) as answer:  # noqa: S310 - loopback
        policy = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    post = urllib.request.Request(team_dashboard.url, data=b"{}", method="POST")  # noqa: S310 - loopback
    with pytest.raises(urllib.error.HTTPError) as not_allowed:
        urllib.request.urlopen(post, timeout=10)  # noqa: S310 - loopback
    assert not_allowed.value.code == 405


def test_a_phone_gets_the_graph_top_to_bottom(browser: Browser, team_dashboard: DashboardProcess) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        phone = context.new_page()
        phone.goto(f"{team_dashboard.url}stagesets/{TEAM}/release")
        expect(phone.locator("svg.graph.tall")).to_be_visible()
        expect(phone.locator("svg.graph.wide")).to_be_hidden()
        db, edge = (node(phone, n, picture="tall").bounding_box() for n in ("db", "edge"))
        assert db is not None
        assert edge is not None
        assert db["y"] < edge["y"]
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        context.close()


def _get(url: str) -> str:
    """The body of a page, whatever its status."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback
            return str(answer.read().decode())
    except urllib.error.HTTPError as error:
        return str(error.read().decode())
