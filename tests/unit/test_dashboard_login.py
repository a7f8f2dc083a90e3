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
    # Issue 43 item 6 changed this test: it asserted that a third identity's sign-in ended the
    # least recently used login of *another* identity (b's) — the way one tenant emptied the
    # shared dashboard.  Now the least recently used login that ends is the same identity's own,
    # and a sign-in past the bound with none of its own to end is refused.
    closed: list[str] = []
    store = LoginStore(limit=2, idle=600, lifetime=3600)
    first, second = login(store, "a", closed), login(store, "b", closed)
    clock.now += 1
    assert store.get(first.id) is first  # a is now the more recently used
    refused = Login(user="c", namespace="team", app=PlainTextResponse("c"), close=lambda: closed.append("c"),
                    expires=store.expiry("opaque"))
    assert store.add(refused) is False
    assert closed == []
    assert len(store) == 2
    assert store.get(second.id) is second
    clock.now += 1
    login(store, "b", closed)  # b's own least recently used login ends for its new one
    assert closed == ["b"]
    assert store.get(second.id) is None
    assert store.get(first.id) is first


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


# -- one identity never ends another's login; sign-ins throttled (issue 43 item 6) -------------------

@pytest.mark.parametrize(("user", "identity"), [
    ("system:serviceaccount:team:reader", "system:serviceaccount:team"),
    ("system:serviceaccount:team:other", "system:serviceaccount:team"),
    ("system:serviceaccount:other:reader", "system:serviceaccount:other"),
    ("alice@example.com", "alice@example.com"),
    ("system:admin", "system:admin"),
])
def test_a_namespaces_service_accounts_are_one_identity(user: str, identity: str) -> None:
    assert login_module.identity_of(user) == identity


def test_an_identity_at_its_bound_ends_its_own_oldest_login_never_anothers(clock: Clock) -> None:
    closed: list[str] = []
    store = LoginStore(limit=10, idle=600, lifetime=3600, per_identity=2)
    victim = login(store, "system:serviceaccount:victim:reader", closed)
    mine = [login(store, f"system:serviceaccount:attacker:sa{n}", closed) for n in range(8)]
    assert len(store) == 3, "the attacker's namespace holds two logins, however many accounts it mints"
    assert closed == [f"system:serviceaccount:attacker:sa{n}" for n in range(6)]
    assert store.get(victim.id) is victim
    assert [store.get(m.id) is m for m in mine] == [False] * 6 + [True] * 2


def test_a_full_store_refuses_a_new_identity_and_keeps_everyone_signed_in(clock: Clock) -> None:
    closed: list[str] = []
    store = LoginStore(limit=3, idle=600, lifetime=3600, per_identity=3)
    kept = [login(store, f"user-{n}", closed) for n in range(3)]
    for n in range(3, 10):
        assert store.add(Login(user=f"user-{n}", namespace=None, app=PlainTextResponse(""),
                               close=lambda: None, expires=store.expiry("t"))) is False
    assert closed == []
    assert all(store.get(k.id) is k for k in kept)
    clock.now += 700  # every login idle: ended, room again
    assert store.add(Login(user="user-9", namespace=None, app=PlainTextResponse(""), close=lambda: None,
                           expires=store.expiry("t"))) is True


def test_sign_ins_are_throttled_per_client_and_failures_more_strictly(clock: Clock) -> None:
    throttle = login_module.SignInThrottle(attempts=3, failures=2, per_minute=3, failures_per_minute=1,
                                           clock=clock)
    assert [throttle.client("10.0.0.1") for _ in range(4)] == [True, True, True, False]
    assert throttle.client("10.0.0.2"), "another client has its own bound"
    clock.now += 20  # one attempt back (3 a minute)
    assert throttle.client("10.0.0.1")
    throttle.failed("10.0.0.3", None)
    throttle.failed("10.0.0.3", None)
    assert not throttle.client("10.0.0.3"), "two failures: no more attempts until one is forgiven"
    clock.now += 60
    assert throttle.client("10.0.0.3")
    assert [throttle.identity("system:serviceaccount:t:a") for _ in range(3)] == [True] * 3
    assert not throttle.identity("system:serviceaccount:t:b"), "the namespace's accounts share one bound"
    assert throttle.identity("system:serviceaccount:u:a")
    throttle.failed("10.0.0.9", "alice")
    throttle.failed("10.0.0.8", "alice")
    assert not throttle.identity("alice"), "failures of one identity from any client count together"


def test_bounded_memory_of_clients() -> None:
    throttle = login_module.SignInThrottle(keys=100)
    for n in range(10_000):
        throttle.client(f"10.0.{n // 256}.{n % 256}")
    assert len(throttle._client._buckets) == 100


@pytest.fixture
def throttled(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[shared_module.SharedDashboard, list[str]]]:
    """The shared dashboard with ``sign_in`` answering by token (no cluster asked), a tight throttle."""
    asked: list[str] = []
    users = {TOKEN: "system:serviceaccount:team:reader", "other": "system:serviceaccount:team:other",
             "victim": "system:serviceaccount:victim:reader", "forbidden": "alice"}

    def sign_in(_cluster: Cluster, *, token: str, namespace: str | None) -> object:
        asked.append(token)
        if token == "forbidden":
            return login_module.Refusal.FORBIDDEN_SCOPE, "namespace team: no", "alice"
        if token not in users:
            return login_module.Refusal.UNAUTHENTICATED, ""
        return SignedIn(user=users[token], session=Session())

    def open_login(self: shared_module.SharedDashboard, verified: SignedIn, *, token: str,
                   namespace: str | None) -> Login:
        return Login(user=verified.user, namespace=namespace, app=PlainTextResponse(verified.user),
                     close=lambda: None, expires=self.store.expiry(token))

    monkeypatch.setattr(shared_module, "sign_in", sign_in)
    monkeypatch.setattr(shared_module.SharedDashboard, "_open", open_login)
    dashboard = shared_module.SharedDashboard(
        cluster=Cluster(server="https://127.0.0.1:1", certificate_authority=None),
        store=LoginStore(limit=5, idle=600, lifetime=3600, per_identity=2), allow_actions=False,
        secure_cookies=False, throttle=login_module.SignInThrottle(attempts=4, failures=2))
    yield dashboard, asked
    dashboard.close()


def test_failed_sign_ins_from_one_client_are_refused_before_the_cluster_is_asked(throttled: Shared) -> None:
    dashboard, asked = throttled
    client = Client(dashboard)
    same = {"origin": "http://testserver"}
    answers = [client.post("/login", form={"token": f"wrong-{n}", "namespace": "team"}, headers=same).status
               for n in range(5)]
    assert answers == [401, 401, 429, 429, 429]
    assert asked == ["wrong-0", "wrong-1"], "a throttled sign-in costs the apiserver nothing"
    assert "too many sign-ins" in client.post("/login", form={"token": TOKEN, "namespace": "team"},
                                              headers=same).text


def test_one_identity_signing_in_again_and_again_ends_only_its_own_logins(throttled: Shared) -> None:
    dashboard, _asked = throttled
    client = Client(dashboard)
    same = {"origin": "http://testserver"}
    victim = client.post("/login", form={"token": "victim", "namespace": "victim"}, headers=same).cookie
    first = client.post("/login", form={"token": TOKEN, "namespace": "team"}, headers=same).cookie
    answers = [client.post("/login", form={"token": "other", "namespace": "team"}, headers=same).status
               for _ in range(3)]
    assert answers == [303, 303, 429], "four attempts a minute from one client"
    assert len(dashboard.store) == 3, "the namespace's accounts keep two logins between them"
    assert first is not None
    assert victim is not None
    assert client.get("/", cookie=first).status == 303, "its own oldest login ended"
    assert client.get("/", cookie=victim).text == "system:serviceaccount:victim:reader", "never another's"
