"""The shared dashboard's logins (pure parts): tokens, the bounded expiring store, the cookie, and the
routes that answer before any sign-in.  The browser test (tests/dashboard/test_shared.py) signs in
against the real apiserver; here ``sign_in`` is replaced so that no cluster is needed."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import anyio
import pytest
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stageset.cli.dashboard import login as login_module
from stageset.cli.dashboard import shared as shared_module
from stageset.cli.dashboard.login import (
    COOKIE,
    Cluster,
    Login,
    LoginStore,
    SignedIn,
    token_expiry,
    well_formed,
)
from stageset.cli.session import Session

ORIGIN = "http://testserver"
# Expires in an hour from when the module is imported; the expiry test reads it back exactly.
EXPIRES = int(time.time()) + 3600
TOKEN = "eyJhbGciOiJSUzI1NiJ9." + base64.urlsafe_b64encode(
    json.dumps({"exp": EXPIRES}).encode()).decode().rstrip("=") + ".signature"


def test_a_token_is_one_line_of_visible_ascii() -> None:
    assert well_formed(TOKEN)
    for bad in ("", "two words", "line\nbreak", "tab\t", "é", "x" * (login_module.MAX_TOKEN + 1)):
        assert not well_formed(bad), bad


def test_the_expiry_of_a_jwt_is_read_and_anything_else_has_none() -> None:
    assert token_expiry(TOKEN) == EXPIRES
    assert token_expiry("opaque-token") is None
    assert token_expiry("a.%%%.c") is None
    assert token_expiry("a." + base64.urlsafe_b64encode(b'{"exp": true}').decode() + ".c") is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    found = Clock()
    monkeypatch.setattr(login_module.time, "monotonic", found)
    return found


def login(store: LoginStore, user: str, closed: list[str], *, token: str = "opaque") -> Login:  # noqa: S107
    made = Login(user=user, namespace="team", app=PlainTextResponse(user),
                 close=lambda: closed.append(user), expires=store.expiry(token))
    store.add(made)
    return made


def test_the_store_is_bounded_and_ends_the_least_recently_used(clock: Clock) -> None:
    closed: list[str] = []
    store = LoginStore(limit=2, idle=600, lifetime=3600)
    first, second = login(store, "a", closed), login(store, "b", closed)
    clock.now += 1
    assert store.get(first.id) is first  # a is now the more recently used
    login(store, "c", closed)
    assert closed == ["b"]
    assert len(store) == 2
    assert store.get(second.id) is None


def test_logins_expire_when_idle_at_their_lifetime_and_with_their_token(clock: Clock) -> None:
    closed: list[str] = []
    store = LoginStore(limit=10, idle=600, lifetime=3600)
    idle = login(store, "idle", closed)
    busy = login(store, "busy", closed)
    for _ in range(5):  # used every 500 s: never idle, but past its lifetime at 3600 s
        clock.now += 500
        assert store.get(busy.id) is busy
    assert store.get(idle.id) is None
    assert closed == ["idle"]
    clock.now += 1100
    assert store.get(busy.id) is None
    assert closed == ["idle", "busy"]
    # A token that expires in an hour bounds a login of an eight-hour lifetime.
    long = LoginStore(limit=10, idle=7200, lifetime=8 * 3600)
    jwt = login(long, "jwt", closed, token=TOKEN)
    assert jwt.expires <= clock.now + 3600 + 5
    clock.now += 3700
    assert long.get(jwt.id) is None


def test_logout_and_close_end_each_login_once(clock: Clock) -> None:
    closed: list[str] = []
    store = LoginStore(limit=10, idle=600, lifetime=3600)
    one, _two = login(store, "one", closed), login(store, "two", closed)
    assert store.remove(one.id) is one
    assert store.remove(one.id) is None
    store.close()
    assert closed == ["one", "two"]
    assert len(store) == 0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    set_cookies: list[str]
    text: str

    @property
    def cookie(self) -> str | None:
        """The login cookie's value this answer sets, if any."""
        for line in self.set_cookies:
            name, _, rest = line.partition("=")
            if name == COOKIE:
                return rest.split(";")[0].strip('"') or None
        return None


class Client:
    """Requests straight into the ASGI app (no network, no HTTP client library)."""

    def __init__(self, app: ASGIApp, *, scheme: str = "http"):
        self.app, self.scheme = app, scheme

    def request(self, method: str, path: str, *, form: dict[str, str] | None = None,
                headers: dict[str, str] | None = None, cookie: str | None = None) -> Answer:
        body = urlencode(form or {}).encode()
        raw = [(b"host", b"testserver"), *((k.encode(), v.encode()) for k, v in (headers or {}).items())]
        if cookie is not None:
            raw.append((b"cookie", f"{COOKIE}={cookie}".encode()))
        if form is not None:
            raw.append((b"content-type", b"application/x-www-form-urlencoded"))
        target, _, query = path.partition("?")
        scope: Scope = {"type": "http", "http_version": "1.1", "method": method, "scheme": self.scheme,
                        "path": target, "raw_path": target.encode(), "query_string": query.encode(),
                        "headers": raw, "server": ("testserver", 80), "client": ("127.0.0.1", 1),
                        "root_path": ""}
        sent: list[Message] = []
        received = False

        async def receive() -> Message:
            nonlocal received
            if received:
                await anyio.sleep_forever()
            received = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        anyio.run(self.app, scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        pairs = [(k.decode().lower(), v.decode()) for k, v in start["headers"]]
        text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
        return Answer(status=start["status"], headers=dict(pairs),
                      set_cookies=[v for k, v in pairs if k == "set-cookie"], text=text)

    def get(self, path: str, **kwargs: Any) -> Answer:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Answer:
        return self.request("POST", path, **kwargs)


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[shared_module.SharedDashboard, list[str]]]:
    """The shared dashboard with ``sign_in`` accepting exactly TOKEN (no cluster asked)."""
    closed: list[str] = []
    asked: list[str] = []

    def sign_in(_cluster: Cluster, *, token: str, namespace: str | None) -> object:
        asked.append(token)
        if token.strip() != TOKEN:
            return login_module.Refusal.UNAUTHENTICATED, ""
        return SignedIn(user="system:serviceaccount:team:reader", session=Session())

    def open_login(self: shared_module.SharedDashboard, verified: SignedIn, *, token: str,
                   namespace: str | None) -> Login:
        async def pages(scope: Scope, receive: Receive, send: Send) -> None:
            await PlainTextResponse(f"pages of {verified.user}")(scope, receive, send)

        return Login(user=verified.user, namespace=namespace, app=pages,
                     close=lambda: closed.append("closed"), expires=self.store.expiry(token))

    monkeypatch.setattr(shared_module, "sign_in", sign_in)
    monkeypatch.setattr(shared_module.SharedDashboard, "_open", open_login)
    dashboard = shared_module.SharedDashboard(
        cluster=Cluster(server="https://127.0.0.1:1", certificate_authority=None),
        store=LoginStore(limit=5, idle=600, lifetime=3600), allow_actions=False, secure_cookies=False)
    yield dashboard, asked
    dashboard.close()


Shared = tuple[shared_module.SharedDashboard, list[str]]


def test_without_a_login_only_the_login_page_answers(app: Shared) -> None:
    dashboard, _asked = app
    client = Client(dashboard)
    page = client.get("/login")
    assert page.status == 200
    assert 'name="token"' in page.text
    assert "form-action 'self'" in page.headers["content-security-policy"]
    for path in ("/", "/sources", "/stagesets/team/app", "/stagesets/team/app/object?stage=a&id=b"):
        response = client.get(path)
        assert (response.status, response.headers["location"]) == (303, "/login"), path
    assert client.get("/live/").status == 401
    assert client.post("/stagesets/team/app/actions/suspend").status == 303
    assert client.get("/", cookie="made-up").status == 303


def test_a_cross_origin_sign_in_is_refused_before_the_cluster_is_asked(app: Shared) -> None:
    dashboard, asked = app
    client = Client(dashboard)
    for origin in ("http://evil.example", "null", None):
        headers = {"origin": origin} if origin else {}
        response = client.post("/login", form={"token": TOKEN, "namespace": "team"}, headers=headers)
        assert response.status == 403
    assert asked == []
    assert len(dashboard.store) == 0


def test_sign_in_sets_a_strict_http_only_cookie_of_a_random_id_and_logout_ends_it(app: Shared) -> None:
    dashboard, _asked = app
    client = Client(dashboard, scheme="https")
    same = {"origin": "https://testserver"}
    refused = client.post("/login", form={"token": "pasted-by-mistake", "namespace": "team"}, headers=same)
    assert refused.status == 401
    assert "did not accept this token" in refused.text
    assert refused.cookie is None
    assert "pasted-by-mistake" not in refused.text  # a refused token is never shown back
    bad_namespace = {"token": TOKEN, "namespace": "Not_A_Namespace"}
    assert client.post("/login", form=bad_namespace, headers=same).status == 400
    response = client.post("/login", form={"token": TOKEN, "namespace": "team"}, headers=same)
    assert response.status == 303
    (cookie,) = response.set_cookies
    for flag in ("HttpOnly", "SameSite=strict", "Secure", "Path=/"):
        assert flag in cookie
    login_id = response.cookie
    assert login_id is not None
    assert TOKEN not in cookie
    assert client.get("/", cookie=login_id).text == "pages of system:serviceaccount:team:reader"
    # Logout needs the login's own token and the same origin.
    assert client.post("/logout", form={"token": "x"}, headers=same, cookie=login_id).status == 403
    good = dashboard.logout_token(login_id)
    assert client.post("/logout", form={"token": good}, headers={"origin": "https://evil.example"},
                       cookie=login_id).status == 403
    out = client.post("/logout", form={"token": good}, headers=same, cookie=login_id)
    assert (out.status, out.headers["location"]) == (303, "/login?ended=1")
    assert len(dashboard.store) == 0
    assert client.get("/", cookie=login_id).status == 303


def test_over_plain_http_the_cookie_is_not_secure_unless_told(app: Shared) -> None:
    dashboard, _asked = app
    client = Client(dashboard)
    response = client.post("/login", form={"token": TOKEN, "namespace": "team"},
                           headers={"origin": "http://testserver"})
    assert "Secure" not in response.set_cookies[0]
    dashboard.secure_cookies = True
    response = client.post("/login", form={"token": TOKEN, "namespace": "team"},
                           headers={"origin": "http://testserver"})
    assert "Secure" in response.set_cookies[0]
