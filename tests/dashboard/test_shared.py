"""The shared dashboard (``stageset dashboard --login``) in a real browser against the real apiserver.

One dashboard process with no credentials of its own (no kubeconfig, no ServiceAccount token);
two people, each a ServiceAccount with a token from the TokenRequest API and a Role in its own
namespace only, sign in to it from two browser contexts (two cookie jars):

- each sees their own namespace's StageSet and never the other's (the other namespace is refused
  at sign-in, and its StageSet's marker never reaches their pages);
- the apiserver's audit log shows the dashboard's requests made as each person, and none as any
  other identity in their namespaces;
- a wrong token is refused (and leaves no session); logout ends the session, and its cookie,
  replayed, no longer opens a page.

Waits are the browser's own (``expect``), never timed assertions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, Page, expect

from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.dashboard.browser import DashboardProcess, dashboard

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

SUFFIX = uuid.uuid4().hex[:6]
ALPHA, BETA = f"shared-alpha-{SUFFIX}", f"shared-beta-{SUFFIX}"
API = "/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets"
WAIT = 20_000  # ms


@dataclass(frozen=True)
class Person:
    namespace: str
    account: str
    token: str
    app: str  # their StageSet's name

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"


def person(admin: KubeClient, namespace: str, app: str) -> Person:
    """A ServiceAccount with a Role to read StageSets (and Events) in ``namespace`` only."""
    def apply(path: str, obj: dict[str, object]) -> None:
        admin.apply(path, obj, field_manager="shared-dashboard-test")

    apply(f"/api/v1/namespaces/{namespace}", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": namespace}})
    account = "reader"
    apply(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}",
          {"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": account, "namespace": namespace}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    apply(f"{rbac}/roles/stageset-reader", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "stageset-reader", "namespace": namespace},
        "rules": [{"apiGroups": ["stages.metio.wtf"], "resources": ["stagesets", "gitrepositories"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]}]})
    apply(f"{rbac}/rolebindings/stageset-reader", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "stageset-reader", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stageset-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})
    apply(f"{API.format(ns=namespace)}/{app}", {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": app, "namespace": namespace},
        "spec": {"stages": [{"name": "only", "sourceRef": {"name": "app"}}]}})
    token = admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                          body={"spec": {"expirationSeconds": 3600}})["status"]["token"]
    return Person(namespace=namespace, account=account, token=str(token), app=app)


@dataclass
class World:
    plane: ControlPlane
    alpha: Person
    beta: Person
    audit_start: int


@pytest.fixture(scope="module")
def world(installed: KubeClient, control_plane: ControlPlane) -> World:
    alpha = person(installed, ALPHA, f"alpha-app-{SUFFIX}")
    beta = person(installed, BETA, f"beta-app-{SUFFIX}")
    return World(plane=control_plane, alpha=alpha, beta=beta, audit_start=len(control_plane.audit_events()))


@pytest.fixture(scope="module")
def shared(world: World) -> Iterator[DashboardProcess]:
    with dashboard("--login", "--server", world.plane.url, "--certificate-authority",
                   str(world.plane.pki.ca_cert), kubeconfig=None) as running:
        yield running
    # Logins and refusals are logged without the tokens.
    assert world.alpha.token not in running.stderr
    assert world.beta.token not in running.stderr
    assert f"login of {world.alpha.username}" in running.stderr


def sign_in(page: Page, url: str, *, token: str, namespace: str) -> None:
    page.goto(url)
    expect(page).to_have_url(f"{url}login")
    page.fill("#token", token)
    page.fill("#namespace", namespace)
    page.click("#sign-in")


def test_two_people_each_see_only_their_namespace(browser: Browser, world: World,
                                                  shared: DashboardProcess) -> None:
    pages: dict[str, Page] = {}
    for me, other in ((world.alpha, world.beta), (world.beta, world.alpha)):
        context = browser.new_context()
        page = context.new_page()
        pages[me.namespace] = page
        # The other person's namespace is refused: this identity may not list StageSets there.
        sign_in(page, shared.url, token=me.token, namespace=other.namespace)
        expect(page.locator("#refused")).to_contain_text("may not list StageSets")
        # Every namespace too (the token may list none cluster-wide).
        sign_in(page, shared.url, token=me.token, namespace="")
        expect(page.locator("#refused")).to_contain_text("may not list StageSets")
        sign_in(page, shared.url, token=me.token, namespace=me.namespace)
        expect(page).to_have_url(shared.url)
        expect(page.locator("#signed-in-as")).to_have_text(me.username)
        expect(page.locator("#stagesets")).to_contain_text(me.app, timeout=WAIT)
        # The cookie: HttpOnly, SameSite=Strict, a random id (not the token).
        (cookie,) = [c for c in context.cookies() if c["name"] == "stageset-dashboard-login"]
        assert cookie["httpOnly"]
        assert cookie["sameSite"] == "Strict"
        assert me.token not in cookie["value"]
        # The other person's StageSet is outside this login's pages.
        page.goto(f"{shared.url}stagesets/{other.namespace}/{other.app}")
        expect(page.locator("h1")).to_have_text("Not shown here")

    # Both logins live in one process at once, each still on its own namespace.
    for me, other in ((world.alpha, world.beta), (world.beta, world.alpha)):
        page = pages[me.namespace]
        page.goto(shared.url)
        expect(page.locator("#stagesets")).to_contain_text(me.app, timeout=WAIT)
        assert other.app not in page.content()
        assert me.username in page.content()
        assert other.username not in page.content()

    # The audit log: the dashboard's requests in each namespace were made as that namespace's person.
    # (a watch is audited when its response starts; it completes only when it ends)
    events = [e for e in world.plane.audit_events()[world.audit_start:]
              if e.get("stage") in ("ResponseComplete", "ResponseStarted")]
    by_user: dict[str, set[str]] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "stagesets" and ref.get("namespace") in (ALPHA, BETA):
            user = event["user"]
            if "system:masters" in (user.get("groups") or []):
                continue  # the test's own admin
            by_user.setdefault(user["username"], set()).add(f"{ref['namespace']}:{event['verb']}")
    assert set(by_user) == {world.alpha.username, world.beta.username}, by_user
    assert {f"{ALPHA}:list", f"{ALPHA}:watch"} <= by_user[world.alpha.username]
    assert {f"{BETA}:list", f"{BETA}:watch"} <= by_user[world.beta.username]
    # The refused sign-ins asked the apiserver, as each person, about the other namespace only once
    # each (a list, refused): nothing was read there.
    alpha_in_beta = [e for e in events if e["user"]["username"] == world.alpha.username
                     and (e.get("objectRef") or {}).get("namespace") == BETA]
    assert all(e["responseStatus"]["code"] == 403 for e in alpha_in_beta), alpha_in_beta
    # Who each person is was asked with their own token.
    reviews = {e["user"]["username"] for e in events
               if (e.get("objectRef") or {}).get("resource") == "selfsubjectreviews"}
    assert {world.alpha.username, world.beta.username} <= reviews
    for page in pages.values():
        page.context.close()


def test_a_wrong_token_is_refused(browser: Browser, world: World, shared: DashboardProcess) -> None:
    context = browser.new_context()
    page = context.new_page()
    forged = world.alpha.token[:-6] + ("AAAAAA" if not world.alpha.token.endswith("AAAAAA") else "BBBBBB")
    for wrong in ("not-a-token-" + SUFFIX, forged):
        sign_in(page, shared.url, token=wrong, namespace=ALPHA)
        expect(page.locator("#refused")).to_contain_text("did not accept this token")
        assert not [c for c in context.cookies() if c["name"] == "stageset-dashboard-login"]
    page.goto(f"{shared.url}stagesets/{ALPHA}/{world.alpha.app}")
    expect(page).to_have_url(f"{shared.url}login")
    context.close()


def test_logout_ends_the_session(browser: Browser, world: World, shared: DashboardProcess) -> None:
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, shared.url, token=world.alpha.token, namespace=ALPHA)
    expect(page.locator("#stagesets")).to_contain_text(world.alpha.app, timeout=WAIT)
    (cookie,) = [c for c in context.cookies() if c["name"] == "stageset-dashboard-login"]
    page.click("#logout")
    expect(page.locator("#ended")).to_have_text("You are signed out.")
    page.goto(shared.url)
    expect(page).to_have_url(f"{shared.url}login")
    # The old cookie, replayed from another browser, opens nothing: the session is gone on the server.
    replay = browser.new_context()
    replay.add_cookies([{k: cookie[k] for k in ("name", "value", "domain", "path")}])  # type: ignore[misc]
    other = replay.new_page()
    other.goto(f"{shared.url}stagesets/{ALPHA}/{world.alpha.app}")
    expect(other).to_have_url(f"{shared.url}login")
    assert world.alpha.app not in other.content()
    replay.close()
    context.close()


# -- issue 43 item 6: one identity cannot sign another out; sign-ins are throttled -------------------

def _post_login(url: str, *, token: str, namespace: str) -> tuple[int, str | None]:
    """A sign-in as a script would make it (same origin, no browser): the status and the cookie."""
    import http.client
    from urllib.parse import urlencode, urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    try:
        connection.request("POST", "/login", body=urlencode({"token": token, "namespace": namespace}),
                           headers={"Content-Type": "application/x-www-form-urlencoded",
                                    "Origin": f"http://{where.netloc}"})
        response = connection.getresponse()
        response.read()
        cookie = next((v.split(";")[0].partition("=")[2] for k, v in response.getheaders()
                       if k.lower() == "set-cookie" and v.startswith("stageset-dashboard-login=")), None)
        return response.status, cookie
    finally:
        connection.close()


def _page_as(url: str, cookie: str) -> tuple[int, str]:
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    try:
        connection.request("GET", "/", headers={"Cookie": f"stageset-dashboard-login={cookie}"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_one_identity_cannot_sign_another_out_and_failed_sign_ins_are_throttled(
    world: World, installed: KubeClient,
) -> None:
    with dashboard("--login", "--server", world.plane.url, "--certificate-authority",
                   str(world.plane.pki.ca_cert), "--max-logins", "4", kubeconfig=None) as small:
        status, victim = _post_login(small.url, token=world.alpha.token, namespace=ALPHA)
        assert status == 303
        assert victim is not None
        # Beta signs in again and again, each time with a new token of its account (anyone who may
        # list StageSets somewhere can): past the bound, only its own logins end.
        account = f"/api/v1/namespaces/{BETA}/serviceaccounts/{world.beta.account}/token"
        for _ in range(8):
            token = installed.request("POST", account, body={"spec": {"expirationSeconds": 600}})
            status, _cookie = _post_login(small.url, token=str(token["status"]["token"]), namespace=BETA)
            assert status == 303
        status, page = _page_as(small.url, victim)
        assert status == 200, "the victim was signed out by another identity's sign-ins"
        assert world.alpha.app in page or world.alpha.username in page
        # Wrong tokens from one client: a bounded number reach the apiserver, then each is refused
        # before any request (429).
        answers = [_post_login(small.url, token=f"wrong-{n}-{SUFFIX}", namespace=BETA)[0] for n in range(15)]
        assert set(answers) <= {401, 429}, answers
        assert answers.count(401) <= 10, answers
        assert answers[-1] == 429, answers
    asked = small.stderr.count("sign-in refused: the cluster did not accept this token")
    assert asked == answers.count(401), "each 401 was one review, each 429 none"
    assert "sign-in refused before any request: too many from 127.0.0.1" in small.stderr
    assert f"login of {world.alpha.username} ended: evicted" not in small.stderr
    assert f"login of {world.beta.username} ended: evicted" in small.stderr, "beta's own logins ended"
