"""The shared dashboard (``stageset dashboard --login``): one process many people sign in to.

Identity: each person's own bearer token, for every request about tenant data
(:mod:`~stageset.cli.dashboard.login`).  Each login has its own pages, watches and — with
``--allow-actions`` — actions, all made with that login's token: the pages of
:func:`~stageset.cli.dashboard.app.create_app` over a :class:`~stageset.cli.dashboard.hub.Hub` of
its own.  The process itself holds no credential for the cluster; what it serves without a login
is the login page, the static files and ``/healthz`` (which asks the cluster nothing).

Routing (:class:`SharedDashboard`, an ASGI app): ``/login``, ``/logout``, ``/static/...`` and
``/healthz`` are its own; any other path goes to the pages of the login its cookie names, or —
without a live login — back to ``/login`` (a live stream gets ``401``: the page's script stops).

Cookie: a random login id (never the token), ``HttpOnly``, ``SameSite=Strict``, ``Path=/``, and
``Secure`` when the dashboard is reached over HTTPS (its own TLS, or ``--secure-cookies`` behind a
proxy that terminates TLS).  Cross-site requests: ``POST /login`` must be same-origin (no login
forced on a browser from elsewhere); ``POST /logout`` must be same-origin and carry the login's
token (an HMAC of its id, as the action forms' tokens are).

Sign-ins are throttled (:class:`~stageset.cli.dashboard.login.SignInThrottle`): per client address
before the apiserver is asked anything (``429``), per identity once it said who the token is; a
refused one counts against both.  The client address is the connection's (a proxy in front makes
every person one client: its bound then protects the apiserver, and the per-identity bound still
keeps people apart).  Logins are bounded per identity (:class:`~stageset.cli.dashboard.login.LoginStore`):
past the bound in all, a sign-in is refused (``503``), never anyone else's login ended.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Sequence
from urllib.parse import parse_qs

from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from stageset.cli.dashboard.actions import ActionLog, same_origin
from stageset.cli.dashboard.app import SecurityHeaders, SignedIn, create_app, environment
from stageset.cli.dashboard.hub import Hub
from stageset.cli.dashboard.login import (
    COOKIE,
    Cluster,
    Login,
    LoginStore,
    Refusal,
    SignInThrottle,
    note,
    sign_in,
)
from stageset.cli.dashboard.login import SignedIn as Verified

OWN_PATHS = frozenset({"/login", "/logout", "/healthz"})
MAX_FORM = 32768  # bytes of a login form (a token of at most login.MAX_TOKEN, and a namespace)
SWEEP = 30.0  # seconds between sweeps of expired logins (their watches stop)
SIGN_IN_WAIT = 5.0  # how long a sign-in waits for the first list of StageSets before showing the page


class SharedDashboard:
    """The login pages, and every signed-in person's own pages behind them."""

    def __init__(self, *, cluster: Cluster, store: LoginStore, allow_actions: bool, secure_cookies: bool,
                 throttle: SignInThrottle | None = None):
        self.cluster = cluster
        self.store = store
        self.throttle = throttle or SignInThrottle()
        self.allow_actions = allow_actions
        self.secure_cookies = secure_cookies
        self._key = secrets.token_bytes(32)
        self._env = environment()
        self._stop = threading.Event()
        self._janitor = threading.Thread(target=self._sweep, name="dashboard-logins", daemon=True)
        own = Starlette(routes=[
            Route("/login", self._login_page, methods=["GET", "HEAD"]),
            Route("/login", self._sign_in, methods=["POST"]),
            Route("/logout", self._logout, methods=["POST"]),
            Route("/healthz", lambda _request: PlainTextResponse("ok")),
            Mount("/static", app=StaticFiles(packages=[("stageset.cli.dashboard", "static")]), name="static"),
            Route("/{rest:path}", self._signed_out, methods=["GET", "HEAD", "POST"]),
        ])
        self._own: ASGIApp = SecurityHeaders(own, forms=True)

    # -- life ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._janitor.start()

    def close(self) -> None:
        self._stop.set()
        self.store.close()

    def _sweep(self) -> None:
        while not self._stop.wait(SWEEP):
            self.store.sweep()

    # -- routing ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._own(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if path in OWN_PATHS or path.startswith("/static/"):
            await self._own(scope, receive, send)
            return
        login = self.store.get(Request(scope).cookies.get(COOKIE))
        await (self._own if login is None else login.app)(scope, receive, send)

    def logout_token(self, login_id: str) -> str:
        return hmac.new(self._key, login_id.encode(), hashlib.sha256).hexdigest()

    # -- pages -----------------------------------------------------------------------------------

    def _page(self, *, status: int = 200, refused: str = "", ended: str = "",
              namespace: str = "") -> HTMLResponse:
        html = self._env.get_template("login.html").render(
            title="Sign in", scope="not signed in", mode="read-only", live=None, refused=refused, ended=ended,
            namespace=namespace)
        return HTMLResponse(str(Markup(html)), status_code=status)  # noqa: S704 - autoescaped output

    def _login_page(self, request: Request) -> Response:
        ended = "You are signed out." if request.query_params.get("ended") == "1" else ""
        return self._page(ended=ended)

    def _signed_out(self, request: Request) -> Response:
        if request.url.path.startswith("/live/"):
            return PlainTextResponse("not signed in", status_code=401)
        return RedirectResponse("/login", status_code=303)

    async def _form(self, request: Request) -> dict[str, str]:
        body = (await request.body())[:MAX_FORM].decode(errors="replace")
        return {key: values[0] for key, values in parse_qs(body).items()}

    async def _sign_in(self, request: Request) -> Response:
        if not same_origin(headers=request.headers, scheme=request.url.scheme):
            note("sign-in refused before any request: cross-origin request")
            return PlainTextResponse("refused: cross-origin request", status_code=403)
        form = await self._form(request)
        namespace = form.get("namespace", "").strip() or None
        if namespace is not None and not _dns_label(namespace):
            return self._page(status=400, refused=f"{namespace!r} is not a namespace name",
                              namespace=namespace)
        token = form.get("token", "")
        client = request.client.host if request.client is not None else "?"
        if not self.throttle.client(client):
            note(f"sign-in refused before any request: too many from {client}")
            return self._page(status=429, refused=Refusal.THROTTLED.value, namespace=namespace or "")
        outcome = await run_in_threadpool(sign_in, self.cluster, token=token, namespace=namespace)
        if not isinstance(outcome, Verified):
            why, detail, *whose = outcome
            self.throttle.failed(client, whose[0] if whose else None)
            note(f"sign-in refused: {why.value}" + (f" ({detail})" if detail else ""))
            text = why.value + (f" — {detail}" if detail and why is not Refusal.UNAUTHENTICATED else "")
            return self._page(status=401 if why is Refusal.UNAUTHENTICATED else 403, refused=text,
                              namespace=namespace or "")
        if not self.throttle.identity(outcome.user):
            outcome.session.close()
            note(f"sign-in of {outcome.user} refused: too many sign-ins of its identity")
            return self._page(status=429, refused=Refusal.THROTTLED.value, namespace=namespace or "")
        login = await run_in_threadpool(self._open, outcome, token=token.strip(), namespace=namespace)
        if not self.store.add(login):
            login.close()
            note(f"sign-in of {login.user} refused: {self.store.limit} logins kept, none of its own to end")
            return self._page(status=503, refused=Refusal.FULL.value, namespace=namespace or "")
        where = f"namespace {namespace}" if namespace else "every namespace"
        note(f"login of {login.user} to {where}; its requests are made with its own token")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, login.id, httponly=True, samesite="strict", path="/",
                            secure=self.secure_cookies or request.url.scheme == "https")
        return response

    def _open(self, verified: Verified, *, token: str, namespace: str | None) -> Login:
        """The signed-in person's pages: a hub and (maybe) actions, both with their token only."""
        session = verified.session
        hub = Hub(client=session.client(), namespace=namespace)
        hub.start(timeout=SIGN_IN_WAIT)
        login = Login(user=verified.user, namespace=namespace, app=_NOT_YET, close=lambda: None,
                      expires=self.store.expiry(token))
        shown = "every namespace" if namespace is None else f"namespace {namespace}"
        actions = ActionLog(who=f"{verified.user} (signed in)") if self.allow_actions else None
        login.app = create_app(hub, scope=shown, allowed_hosts=None, session=session, actions=actions,
                               signed_in=SignedIn(user=verified.user, token=self.logout_token(login.id)))

        def close() -> None:
            hub.close()
            session.close()

        login.close = close
        return login

    async def _logout(self, request: Request) -> Response:
        login_id = request.cookies.get(COOKIE)
        form = await self._form(request)
        if not same_origin(headers=request.headers, scheme=request.url.scheme):
            return PlainTextResponse("refused: cross-origin request", status_code=403)
        if not login_id or not hmac.compare_digest(form.get("token", ""), self.logout_token(login_id)):
            return PlainTextResponse("refused: the form's token does not match this login", status_code=403)
        self.store.remove(login_id)
        response = RedirectResponse("/login?ended=1", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                               secure=self.secure_cookies or request.url.scheme == "https")
        return response


async def _not_yet(_scope: Scope, _receive: Receive, _send: Send) -> None:  # pragma: no cover
    raise RuntimeError("a login's pages are made before the login is stored")


_NOT_YET: ASGIApp = _not_yet


def _dns_label(text: str) -> bool:
    import re

    from stageset.api.common import DNS_LABEL_PATTERN

    return len(text) <= 63 and re.fullmatch(DNS_LABEL_PATTERN, text) is not None


def shared_app(*, cluster: Cluster, store: LoginStore, allow_actions: bool, secure_cookies: bool,
               allowed_hosts: Sequence[str] | None) -> tuple[SharedDashboard, ASGIApp]:
    """The shared dashboard, and the ASGI app to serve (with a Host check on loopback)."""
    shared = SharedDashboard(cluster=cluster, store=store, allow_actions=allow_actions,
                             secure_cookies=secure_cookies)
    app: ASGIApp = shared
    if allowed_hosts is not None:
        app = TrustedHostMiddleware(app, allowed_hosts=list(allowed_hosts), www_redirect=False)
    return shared, app
