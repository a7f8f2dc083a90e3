"""The dashboard's web application: pages, their live streams, static files.  Starlette (ASGI).

Rendering: every page is a few *fragments* (the list's table; a StageSet's summary, picture,
stages, activity and events), each rendered by a Jinja2 template with autoescaping on for every
template (SVG included), so tenant-written text — names, messages, events — is always text,
never markup.  A page's first answer is the whole page; its script then opens a server-sent
event stream (``/live/...``) which sends a fragment again, whole, whenever what it renders
changed (a fragment's digest tells), which the script swaps in.  No JSON reaches the DOM except
those server-rendered fragments, and the Content-Security-Policy allows only our own script and
stylesheet, so even a mistake in escaping could not run a script.

Streams wake on the hub's changes (its watches), wait :data:`SETTLE` seconds so a burst of
changes renders once, and re-render every :data:`REFRESH` seconds regardless so ages stay true.

Requests: ``GET`` (and ``HEAD``) routes only, unless actions are allowed (``--allow-actions``):
then ``POST /stagesets/NAMESPACE/NAME/actions/VERB`` too, guarded against cross-site requests and
made as the viewer (:mod:`~stageset.cli.dashboard.actions`).  An object's page
(``/stagesets/NAMESPACE/NAME/object?stage=STAGE&id=ID``, one inventory entry) shows its live YAML and
its diff as the viewer (:mod:`~stageset.cli.dashboard.objects`); it is not live (it renders and
dry-runs the stage once per load).  Hosts: on loopback, a request must name a loopback host
(``Host: 127.0.0.1:8090``, ``localhost``, ``[::1]``), so a web page elsewhere cannot reach the
dashboard through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import anyio
import jinja2
from markupsafe import Markup
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stageset.apply.inventory import ObjectId
from stageset.cli import fleet
from stageset.cli.dashboard import layout, objects, sources, views
from stageset.cli.dashboard.actions import COOKIE, ActionLog, Guard, Verb, perform
from stageset.cli.dashboard.hub import Hub, Lease
from stageset.cli.dashboard.links import link, linkify
from stageset.cli.session import Session, age, short_revision

SETTLE = 0.15
REFRESH = 10.0
REVIEW_TTL = 60.0
"""Seconds a viewer's SelfSubjectAccessReview answer (may they act?) is remembered."""
GROUP = "stages.metio.wtf"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action {forms}; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    # Never a referrer to another origin; same-origin (not no-referrer) so that a form post carries
    # its real Origin, which the action guard checks (under no-referrer the browser sends "null").
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


def environment() -> jinja2.Environment:
    """Autoescaping on for every template, whatever its extension (``select_autoescape`` would
    leave ``.svg`` out)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("stageset.cli.dashboard", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    now = datetime.datetime.now

    def age_filter(value: str | None) -> str:
        return age(value, now=now(datetime.UTC)) if value else "-"

    env.filters["age"] = age_filter
    env.filters["linkify"] = linkify
    env.globals["link"] = link
    env.filters["short_revision"] = short_revision
    env.globals["signed_in"] = None  # the shared dashboard's login (who, and the logout form's token)
    env.filters["first_line"] = lambda text, limit=200: views.first_line(str(text or ""), limit)
    env.globals["layout"] = layout
    env.globals["phase_class"] = views.phase_class
    env.globals["status_class"] = views.status_class
    env.globals["source_anchor"] = sources.source_anchor
    return env


def digest(html: str) -> str:
    return hashlib.sha256(html.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fragment:
    id: str
    html: Markup

    @property
    def digest(self) -> str:
        return digest(str(self.html))


class Page:
    """One kind of page: its fragments, and the watches it needs while open."""

    title: str
    template: str

    def fragments(self) -> list[Fragment]:
        raise NotImplementedError

    def context(self) -> dict[str, Any]:
        return {}

    def lease(self, previous: Lease | None) -> Lease | None:
        return previous


@dataclass(frozen=True)
class SignedIn:
    """Who is signed in to the shared dashboard's pages, and their logout form's token."""

    user: str
    token: str


class Dashboard:
    """The pages over one hub.  ``session``: the viewer's (object pages, actions); ``actions``: the
    action log when actions are allowed (``None``: read-only); ``signed_in``: the login these pages
    belong to (the shared dashboard), ``None`` for one user's own dashboard."""

    def __init__(self, hub: Hub, *, scope: str, session: Session | None = None,
                 actions: ActionLog | None = None, signed_in: SignedIn | None = None):
        self.hub = hub
        self.scope = scope
        self.session = session
        self.actions = actions
        self.guard = Guard()
        self._reviews: dict[tuple[str, str, str, str], tuple[float, bool]] = {}
        self._reviews_lock = threading.Lock()
        self.env = environment()
        self.env.globals["signed_in"] = signed_in

    def render(self, template: str, **context: Any) -> Markup:
        return Markup(self.env.get_template(template).render(**context))  # noqa: S704 - autoescaped output

    def may(self, *, verb: str, resource: str, namespace: str, name: str | None = None) -> bool:
        """Would the apiserver let the viewer ``verb`` the ``resource`` (of our group)?  Asked of it
        as the viewer (a SelfSubjectAccessReview), remembered :data:`REVIEW_TTL` seconds; a review
        that cannot be made counts as no (the buttons stay hidden; the action itself is asked as the
        viewer anyway, so nothing is decided here)."""
        if self.session is None:
            return False
        key = (verb, resource, namespace, name or "")
        now = time.monotonic()
        with self._reviews_lock:
            cached = self._reviews.get(key)
            if cached is not None and now - cached[0] < REVIEW_TTL:
                return cached[1]
        attributes = {"verb": verb, "group": GROUP, "resource": resource, "namespace": namespace,
                      **({"name": name} if name else {})}
        try:
            review = self.session.client().request(
                "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": attributes}})
            allowed = bool((review.get("status") or {}).get("allowed"))
        except Exception:  # an unanswered review hides the buttons, nothing more
            allowed = False
        with self._reviews_lock:
            self._reviews[key] = (now, allowed)
            if len(self._reviews) > 4096:
                self._reviews.pop(next(iter(self._reviews)))
        return allowed

    def problems(self) -> list[str]:
        return self.hub.problems() if self.hub.synced else ["listing StageSets…", *self.hub.problems()]

    @property
    def mode(self) -> str:
        return "read-only" if self.actions is None else "actions allowed, as you"


class ListPage(Page):
    template = "list.html"

    def __init__(self, dashboard: Dashboard):
        self.dashboard = dashboard
        self.title = "StageSets"

    def fragments(self) -> list[Fragment]:
        hub = self.dashboard.hub
        rows = views.list_rows(hub.stagesets())
        return [Fragment("stagesets", self.dashboard.render(
            "fragments/stagesets.html", rows=rows, every=hub.namespace is None, scope=self.dashboard.scope,
            synced=hub.synced, problems=self.dashboard.problems()))]

    def context(self) -> dict[str, Any]:
        return {"live": "/live/"}


class SourcesPage(Page):
    """Every source the viewer may list in the dashboard's scope, and the StageSets using each."""

    template = "sources.html"

    def __init__(self, dashboard: Dashboard):
        self.dashboard = dashboard
        self.title = "Sources"

    def lease(self, previous: Lease | None) -> Lease:
        return self.dashboard.hub.source_lease(previous)

    def fragments(self) -> list[Fragment]:
        hub = self.dashboard.hub
        rows = sources.source_rows(hub.sources(), hub.stagesets(), linkable=hub.in_scope)
        return [Fragment("sources", self.dashboard.render(
            "fragments/sources.html", rows=rows, every=hub.namespace is None, scope=self.dashboard.scope,
            problems=self.dashboard.problems()))]

    def context(self) -> dict[str, Any]:
        return {"live": "/live/sources"}


class FleetPage(Page):
    """Every FleetRollout the viewer may list: each wave, its members, what each was released and holds."""

    template = "fleet.html"

    def __init__(self, dashboard: Dashboard):
        self.dashboard = dashboard
        self.title = "Fleet rollouts"

    def lease(self, previous: Lease | None) -> Lease:
        return self.dashboard.hub.fleet_lease(previous)

    def fragments(self) -> list[Fragment]:
        hub = self.dashboard.hub
        rollouts = sorted((fleet.summary(obj) for obj in hub.fleetrollouts()), key=lambda v: v["name"])
        return [Fragment("fleet", self.dashboard.render("fragments/fleet.html", rollouts=rollouts,
                                                        problems=self.dashboard.problems()))]

    def context(self) -> dict[str, Any]:
        return {"live": "/live/fleet"}


class StageSetPage(Page):
    template = "stageset.html"

    def __init__(self, dashboard: Dashboard, *, namespace: str, name: str, token: str | None = None):
        """``token``: the viewer's session token, for the action forms (``None``: no forms)."""
        self.dashboard = dashboard
        self.namespace, self.name = namespace, name
        self.title = f"{namespace}/{name}"
        self.token = token if dashboard.actions is not None else None

    def lease(self, previous: Lease | None) -> Lease:
        return self.dashboard.hub.lease(self.dashboard.hub.stageset(self.namespace, self.name), previous)

    def fragments(self) -> list[Fragment]:
        hub = self.dashboard.hub
        obj = hub.stageset(self.namespace, self.name)
        if obj is None:
            gone = self.dashboard.render("fragments/gone.html", namespace=self.namespace, name=self.name,
                                         synced=hub.synced)
            return [Fragment("summary", gone), *(Fragment(i, Markup("")) for i in
                                                 ("graph", "stages", "history", "activity", "events"))]
        detail = views.detail(obj, lookup=hub.lookup, events=hub.events_for(obj),
                              activity=hub.activity(self.namespace, self.name), linkable=hub.in_scope,
                              now=datetime.datetime.now(datetime.UTC))
        render = self.dashboard.render
        log = self.dashboard.actions
        done = log.of(self.namespace, self.name) if log is not None else []
        forms = None if self.token is None else {
            "token": self.token, "action": f"{views.stageset_href(self.namespace, self.name)}/actions/",
            # The buttons only for what the apiserver would let the viewer do (every verb patches the
            # StageSet; "with source" also its GitRepositories).
            "allowed": self.dashboard.may(verb="patch", resource="stagesets", namespace=self.namespace,
                                          name=self.name),
            "sources": self.dashboard.may(verb="patch", resource="gitrepositories", namespace=self.namespace)}
        return [
            Fragment("summary", render("fragments/summary.html", d=detail, forms=forms,
                                       problems=self.dashboard.problems())),
            Fragment("graph", render("fragments/graph.html", d=detail)),
            Fragment("stages", render("fragments/stages.html", d=detail, forms=forms)),
            Fragment("history", render("fragments/history.html", d=detail)),
            Fragment("activity", render("fragments/activity.html", d=detail, done=done)),
            Fragment("events", render("fragments/events.html", d=detail)),
        ]

    def context(self) -> dict[str, Any]:
        return {"live": f"/live{views.stageset_href(self.namespace, self.name)}"}


def _page_response(dashboard: Dashboard, page: Page, *, status: int = 200,
                   new_session: str | None = None) -> HTMLResponse:
    """The whole page; ``new_session``: a session id to set in the cookie (a first visit)."""
    lease = page.lease(None)
    try:
        fragments = page.fragments()
    finally:
        if lease is not None:
            dashboard.hub.release(lease)
    html = dashboard.render(page.template, title=page.title, fragments={f.id: f for f in fragments},
                            scope=dashboard.scope, mode=dashboard.mode, **page.context())
    response = HTMLResponse(str(html), status_code=status)
    if new_session is not None:
        response.set_cookie(COOKIE, new_session, httponly=True, samesite="strict", path="/")
    return response


def _not_here(dashboard: Dashboard, namespace: str, name: str) -> HTMLResponse:
    html = dashboard.render("missing.html", title="not shown", namespace=namespace, name=name,
                            scope=dashboard.scope, mode=dashboard.mode, live=None)
    return HTMLResponse(str(html), status_code=404)


async def _stream(request: Request, page: Page, hub: Hub,
                  shutdown: anyio.Event) -> AsyncIterator[dict[str, str]]:
    """The page's fragments, each time one changes (its first message: all of them).  Ends, so
    that the response completes, when the server shuts down (``shutdown``)."""
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    async def relay_shutdown() -> None:
        await shutdown.wait()
        woken.set()

    relay = asyncio.ensure_future(relay_shutdown())

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    unsubscribe = hub.on_change(wake)
    lease: Lease | None = None
    sent: dict[str, str] = {}
    try:
        while True:
            lease = await run_in_threadpool(page.lease, lease)
            fragments = await run_in_threadpool(page.fragments)
            for fragment in fragments:
                if sent.get(fragment.id) != fragment.digest:
                    sent[fragment.id] = fragment.digest
                    yield {"event": "swap", "data": json.dumps({"id": fragment.id, "digest": fragment.digest,
                                                                "html": str(fragment.html)})}
            try:
                await asyncio.wait_for(woken.wait(), timeout=REFRESH)
                await asyncio.sleep(SETTLE)
            except TimeoutError:
                pass
            woken.clear()
            if shutdown.is_set() or await request.is_disconnected():
                return
    finally:
        relay.cancel()
        unsubscribe()
        if lease is not None:
            hub.release(lease)


async def _act(request: Request, dashboard: Dashboard) -> Response:
    """``POST .../actions/VERB``: refused before any request unless same-origin with the session's
    token; then the verb, as the viewer; then back to the page (its activity list says how it went)."""
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    verb_text = request.path_params["verb"]
    actions, session = dashboard.actions, dashboard.session
    assert actions is not None  # the route exists only with an action log (and a session)
    assert session is not None
    body = (await request.body())[:4096].decode(errors="replace")
    form = {key: values[0] for key, values in parse_qs(body).items()}
    why = dashboard.guard.refusal(headers=request.headers, scheme=request.url.scheme,
                                  session=request.cookies.get(COOKIE), token=form.get("token"))
    if why is not None:
        actions.refused(namespace=namespace, name=name, verb=verb_text, why=why)
        return PlainTextResponse(f"refused: {why.value}", status_code=403)
    if not dashboard.hub.in_scope(namespace):
        return PlainTextResponse("not in this dashboard's namespace", status_code=404)
    try:
        verb = Verb(verb_text)
    except ValueError:
        return PlainTextResponse("no such action", status_code=404)
    stage = form.get("stage") or None
    ok, message = await run_in_threadpool(perform, session.client(), verb, namespace=namespace, name=name,
                                          stage=stage)
    actions.record(namespace=namespace, name=name, verb=verb, stage=stage, ok=ok, message=message)
    dashboard.hub.touch()
    return RedirectResponse(f"{views.stageset_href(namespace, name)}#activity", status_code=303)


def _stageset(request: Request, dashboard: Dashboard) -> Response:
    hub = dashboard.hub
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    if not hub.in_scope(namespace):
        return _not_here(dashboard, namespace, name)
    # The viewer's session: the cookie's, or a new one this answer sets.
    viewer = request.cookies.get(COOKIE)
    new = None if viewer else Guard.new_session()
    page = StageSetPage(dashboard, namespace=namespace, name=name,
                        token=dashboard.guard.token(viewer or new or ""))
    known = hub.stageset(page.namespace, page.name) is not None
    return _page_response(dashboard, page, status=200 if known or not hub.synced else 404,
                          new_session=new)


async def _object_page(request: Request, dashboard: Dashboard) -> Response:
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    session = dashboard.session
    if not dashboard.hub.in_scope(namespace) or session is None:
        return _not_here(dashboard, namespace, name)
    stage, encoded = request.query_params.get("stage", ""), request.query_params.get("id", "")
    html = await run_in_threadpool(_object_html, dashboard, session, namespace=namespace, name=name,
                                   stage=stage, encoded=encoded)
    if html is None:
        return PlainTextResponse("no such object in this StageSet's inventory", status_code=404)
    return HTMLResponse(str(html))


def _object_html(dashboard: Dashboard, session: Session, *, namespace: str, name: str, stage: str,
                 encoded: str) -> Markup | None:
    """An inventory object's page: its live YAML and its diff, both as the viewer (``None``: the
    StageSet's inventory holds no such entry — only inventory objects are shown)."""
    obj = dashboard.hub.stageset(namespace, name)
    if obj is None:
        return None
    ref = next((ref for ref, oid in views.inventory(obj).get(stage, []) if oid.encode() == encoded), None)
    if ref is None:
        return None
    live = objects.live(session.client(), ref)
    change = objects.diff(session, obj, stage=stage, oid=ObjectId.decode(encoded))
    return dashboard.render("object.html", title=f"{ref.describe()} · {namespace}/{name}", ref=ref,
                            stage=stage,
                            live_object=live, change=change, namespace=namespace, name=name,
                            href=views.stageset_href(namespace, name), scope=dashboard.scope,
                            mode=dashboard.mode, live=None)


class SecurityHeaders:
    """The same protective headers on every answer (pages, streams, static files, errors).  Forms
    may post (to this dashboard only) just when actions are allowed."""

    def __init__(self, app: ASGIApp, *, forms: bool = False):
        self.app = app
        policy = CSP.format(forms="'self'" if forms else "'none'")
        self.headers = [(b"content-security-policy", policy.encode()), *SECURITY_HEADERS]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(hub: Hub, *, scope: str, allowed_hosts: Sequence[str] | None, session: Session | None = None,
               actions: ActionLog | None = None, signed_in: SignedIn | None = None) -> Starlette:
    """``allowed_hosts``: the Host names a request may use (``None``: any, for a non-loopback
    address); ``session``: the viewer's, for object pages and actions; ``actions``: the action log
    when actions are allowed (``None``: no action routes exist); ``signed_in``: the shared
    dashboard's login these pages are made for (they then carry its logout form)."""
    dashboard = Dashboard(hub, scope=scope, session=session, actions=actions, signed_in=signed_in)

    def stageset_page(request: Request) -> StageSetPage | None:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        known = request.cookies.get(COOKIE)
        token = dashboard.guard.token(known) if known else None
        return StageSetPage(dashboard, namespace=namespace, name=name, token=token) \
            if hub.in_scope(namespace) else None

    def stageset(request: Request) -> Response:
        return _stageset(request, dashboard)

    async def object_page(request: Request) -> Response:
        return await _object_page(request, dashboard)

    async def act(request: Request) -> Response:
        return await _act(request, dashboard)

    def live(request: Request, page: Page) -> Response:
        shutdown = anyio.Event()
        return EventSourceResponse(_stream(request, page, hub, shutdown), ping=15, shutdown_event=shutdown,
                                   shutdown_grace_period=1.0)

    def whole(make: Callable[[Dashboard], Page]) -> tuple[Callable[[Request], Response],
                                                          Callable[[Request], Awaitable[Response]]]:
        """A page that is the same for every viewer of this dashboard: itself, and its live stream."""
        def page(_request: Request) -> Response:
            return _page_response(dashboard, make(dashboard))

        async def live_page(request: Request) -> Response:
            return live(request, make(dashboard))
        return page, live_page

    index, live_index = whole(ListPage)
    sources_page, live_sources = whole(SourcesPage)
    fleet_page, live_fleet = whole(FleetPage)

    async def live_stageset(request: Request) -> Response:
        page = stageset_page(request)  # its forms carry the token of the cookie the page was given
        if page is None:
            return PlainTextResponse("not in this dashboard's namespace", status_code=404)
        return live(request, page)

    def healthz(_request: Request) -> Response:
        return PlainTextResponse("ok" if hub.synced else "listing", status_code=200 if hub.synced else 503)

    routes = [
        Route("/", index),
        Route("/stagesets/{namespace}/{name}", stageset),
        Route("/stagesets/{namespace}/{name}/object", object_page),
        Route("/sources", sources_page),
        Route("/fleet", fleet_page),
        Route("/live/fleet", live_fleet),
        Route("/live/", live_index),
        Route("/live/sources", live_sources),
        Route("/live/stagesets/{namespace}/{name}", live_stageset),
        Route("/healthz", healthz),
        Mount("/static", app=StaticFiles(packages=[("stageset.cli.dashboard", "static")]), name="static"),
    ]
    if actions is not None:
        routes.append(Route("/stagesets/{namespace}/{name}/actions/{verb}", act, methods=["POST"]))
    middleware = [Middleware(SecurityHeaders, forms=actions is not None or signed_in is not None)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts),
                                     www_redirect=False))
    return Starlette(routes=routes, middleware=middleware)

