"""The dashboard's pure parts: the picture's layout, who holds a release, each stage's last change,
what the watch saw change, the address rule, and escaping in every template."""

from __future__ import annotations

import datetime
from typing import Any

import click
import pytest

from stageset.apply.changeset import Action, Change
from stageset.apply.inventory import ObjectId
from stageset.cli.dashboard import layout, views
from stageset.cli.dashboard.app import Dashboard, FleetPage, ListPage, SourcesPage, StageSetPage, environment
from stageset.cli.dashboard.command import Address, is_loopback, parse_address
from stageset.cli.dashboard.diffs import EventRow, last_changes, parse_summary
from stageset.controller.events import change_summary
from stageset.controller.ordering import StageNode, stage_graph


def stageset(
    stages: list[dict[str, Any]],
    *,
    status: dict[str, Any] | None = None,
    depends_on: list[dict[str, str]] | None = None,
    suspend: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": "stages.metio.wtf/v1",
        "kind": "StageSet",
        "metadata": {"name": "shop", "namespace": "shop", "creationTimestamp": "2026-01-01T11:00:00Z"},
        "spec": {
            "stages": [{"sourceRef": {"name": "app"}, **s} for s in stages],
            "dependsOn": depends_on or [],
            "suspend": suspend,
        },
        "status": status or {},
    }


def ready(status: str, reason: str = "", message: str = "") -> list[dict[str, str]]:
    return [{"type": "Ready", "status": status, "reason": reason, "message": message}]


# -- layout ----------------------------------------------------------------------------------------------


def graph(*stages: tuple[str, tuple[str, ...] | None]) -> tuple[Any, list[str]]:
    nodes = [StageNode(name, deps) for name, deps in stages]
    return stage_graph(nodes), [n.name for n in nodes]


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        pytest.param(
            [("a", None), ("b", None), ("c", None)],
            [["a"], ["b"], ["c"]],
            id="a plain list runs top to bottom",
        ),
        pytest.param(
            [("config", None), ("backend", None), ("frontend", ("config",))],
            [["config"], ["backend", "frontend"]],
            id="the example: frontend beside backend",
        ),
        pytest.param([("a", ()), ("b", ()), ("c", ("a", "b"))], [["a", "b"], ["c"]], id="two roots"),
        pytest.param(
            [("db", None), ("api", None), ("web", ("db",)), ("edge", ("api", "web"))],
            [["db"], ["api", "web"], ["edge"]],
            id="a diamond",
        ),
        pytest.param(
            [("a", ()), ("x", ()), ("b", ("x",)), ("c", ("a",))],
            [["a", "x"], ["c", "b"]],
            id="a layer follows its predecessors' rows, not only the listing",
        ),
    ],
)
def test_layers(stages: list[tuple[str, tuple[str, ...] | None]], expected: list[list[str]]) -> None:
    g, order = graph(*stages)
    assert layout.layers(g, order) == expected


def test_a_cycle_is_drawn_one_stage_per_layer_in_listing_order() -> None:
    import networkx as nx

    g: nx.DiGraph = nx.DiGraph([("b", "a"), ("a", "b")])
    assert layout.layers(g, ["a", "b"]) == [["a"], ["b"]]


@pytest.mark.parametrize("vertical", [False, True])
def test_the_picture_keeps_every_box_inside_and_dependencies_before_dependents(vertical: bool) -> None:
    g, order = graph(("db", None), ("api", None), ("web", ("db",)), ("edge", ("api", "web")))
    picture = layout.picture(g, order=order, vertical=vertical)
    for placed in picture.nodes.values():
        assert placed.x >= 0
        assert placed.x + layout.NODE_WIDTH <= picture.width
        assert placed.y >= 0
        assert placed.y + layout.NODE_HEIGHT <= picture.height
    along = "y" if vertical else "x"
    for arrow in picture.arrows:
        assert getattr(picture.nodes[arrow.source], along) < getattr(picture.nodes[arrow.target], along)
        assert arrow.path.startswith("M")
        assert " C" in arrow.path
    assert {(a.source, a.target) for a in picture.arrows} == {
        ("db", "api"),
        ("db", "web"),
        ("api", "edge"),
        ("web", "edge"),
    }


def test_an_empty_graph_is_an_empty_picture() -> None:
    import networkx as nx

    picture = layout.picture(nx.DiGraph(), order=[])
    assert picture.nodes == {}
    assert picture.arrows == []


# -- who holds the release --------------------------------------------------------------------------------

STAGES = [
    {"name": "db"},
    {"name": "api"},
    {"name": "web", "dependsOn": ["db"]},
    {"name": "edge", "dependsOn": ["api", "web"]},
]


def phases(**by_stage: str) -> list[dict[str, str]]:
    return [{"name": name, "phase": phase, "message": f"{name} says"} for name, phase in by_stage.items()]


@pytest.mark.parametrize(
    ("conditions", "stage_phases", "nodes", "phase"),
    [
        pytest.param(ready("True", "Succeeded"), {"db": "Ready"}, None, None, id="Ready: nothing holds it"),
        pytest.param(
            ready("False", "StageFailed"),
            {"db": "Ready", "api": "Waiting", "web": "Failed"},
            ["web"],
            "Failed",
            id="a failure wins over a wait",
        ),
        pytest.param(
            ready("False", "StageProgressing"),
            {"db": "Ready", "api": "Progressing", "web": "Waiting"},
            ["api"],
            "Progressing",
            id="held at its timeout",
        ),
        pytest.param(
            ready("Unknown", "Progressing"),
            {"db": "Ready", "api": "Applying", "web": "Waiting"},
            ["api", "web"],
            "Applying",
            id="every stage in flight",
        ),
        pytest.param(
            ready("False", "SourceNotReady"),
            {"db": "Ready", "api": "Ready", "web": "Pending"},
            ["web"],
            "Pending",
            id="pending stages whose dependencies are Ready",
        ),
    ],
)
def test_holding(
    conditions: list[dict[str, str]], stage_phases: dict[str, str], nodes: list[str] | None, phase: str | None
) -> None:
    obj = stageset(STAGES, status={"conditions": conditions, "stages": phases(**stage_phases)})
    held = views.holding(obj)
    if nodes is None:
        assert held is None
        return
    assert held is not None
    assert (held.nodes, held.phase, held.reason) == (nodes, phase, conditions[0]["reason"])


def test_a_stageset_waiting_for_stagesets_is_held_by_those_not_ready() -> None:
    obj = stageset(
        STAGES,
        depends_on=[{"name": "base"}, {"name": "infra", "namespace": "ops"}],
        status={"conditions": ready("False", "DependencyNotReady", "StageSet ops/infra is not Ready")},
    )
    known = {
        "stageset:shop/base": views.ObjectState("Current"),
        "stageset:ops/infra": views.ObjectState("Unknown"),
    }
    held = views.holding(obj, dependencies=known)
    assert held is not None
    assert held.nodes == ["stageset:ops/infra"]
    assert held.text() == "StageSet ops/infra: StageSet ops/infra is not Ready"


@pytest.mark.parametrize(
    ("obj", "text"),
    [
        pytest.param(
            stageset(STAGES, suspend=True),
            "Suspended: suspended: nothing is applied until it is resumed (stageset resume)",
            id="suspended",
        ),
        pytest.param(
            stageset(STAGES),
            "not reconciled yet (is a controller watching this namespace?)",
            id="no status yet",
        ),
        pytest.param(
            stageset(
                STAGES,
                status={
                    "conditions": ready("False", "StageFailed", "x; runbook: https://r/x/"),
                    "stages": phases(db="Failed"),
                },
            ),
            "stage db (Failed): db says",
            id="a failed stage, its message",
        ),
    ],
)
def test_what_a_stageset_waits_for(obj: dict[str, Any], text: str) -> None:
    held = views.holding(obj)
    assert held is not None
    assert held.text() == text


def test_a_list_row() -> None:
    obj = stageset(
        STAGES,
        status={
            "conditions": ready("False", "StageProgressing", "api waits; runbook: https://r/"),
            "stages": phases(db="Ready", api="Waiting", web="Ready"),
            "lastAppliedRevision": "main@sha1:" + "a" * 40,
        },
    )
    row = views.list_row(obj)
    assert (row.ready, row.reason, row.done, row.total) == ("False", "StageProgressing", 2, 4)
    assert row.message == "api waits"
    assert row.revision == "main@sha1:" + "a" * 40
    assert row.waits_for == "stage api (Waiting): api says"
    assert row.href == "/stagesets/shop/shop"


# -- the last change of each stage --------------------------------------------------------------------------


def oid(kind: str, name: str, namespace: str = "shop", group: str = "") -> ObjectId:
    return ObjectId(namespace=namespace, name=name, group=group, kind=kind)


def event(reason: str, message: str, when: str, revision: str | None = None) -> EventRow:
    return EventRow(
        uid=when,
        namespace="shop",
        kind="StageSet",
        name="shop",
        type="Normal",
        reason=reason,
        message=message,
        last_seen=when,
        count=1,
        revision=revision,
    )


def test_the_summary_reads_back_what_the_controller_writes() -> None:
    changes = [Change(oid("ConfigMap", f"c{i}"), Action.CONFIGURED) for i in range(12)]
    changes += [
        Change(oid("Namespace", "team", namespace=""), Action.CREATED),
        Change(oid("Service", "web"), Action.UNCHANGED),
    ]
    summary = parse_summary(change_summary(changes, pruned=2))
    assert (len(summary.objects), summary.more, summary.pruned) == (10, 3, 2)
    assert summary.objects[0] == ("ConfigMap/shop/c0", "configured")  # sorted by name, as written
    assert ("Service/shop/web", "unchanged") not in summary.objects
    alone = parse_summary(change_summary([Change(oid("Namespace", "team", namespace=""), Action.CREATED)]))
    assert (alone.objects, alone.more) == ([("Namespace/team", "created")], 0)


def test_each_stage_gets_its_newest_known_change() -> None:
    inventories = {
        "config": [oid("ConfigMap", "settings")],
        "backend": [oid("Service", "api")],
        "frontend": [oid("Service", "web")],
    }
    events = [
        event(
            "ReconciliationSucceeded",
            "ConfigMap/shop/settings created, Service/shop/api created",
            "2026-01-01T10:00:00.000000Z",
            revision="main@sha1:1",
        ),
        event(
            "ReconciliationSucceeded",
            "ConfigMap/shop/settings configured",
            "2026-01-01T11:00:00.000000Z",
            revision="main@sha1:2",
        ),
        event("DriftCorrected", "stage 'backend': restored Service shop/api", "2026-01-01T10:30:00.000000Z"),
        event("NewArtifact", "Service/shop/web created", "2026-01-01T11:30:00.000000Z"),
    ]
    found = last_changes(events, inventories)
    assert found["config"].objects == [("ConfigMap/shop/settings", "configured")]
    assert found["config"].revision == "main@sha1:2"
    assert found["backend"].drift
    assert found["backend"].objects == [("Service/shop/api", "restored")]
    assert "frontend" not in found  # nothing the controller said names it: not known, not guessed


def test_a_drift_message_that_names_only_some_objects() -> None:
    found = last_changes(
        [
            event(
                "DriftCorrected",
                "stage 'backend': restored Service shop/a, Service shop/b and 4 more",
                "2026-01-01T10:00:00.000000Z",
            )
        ],
        {"backend": []},
    )
    assert found["backend"].more
    assert found["backend"].objects == [("Service/shop/a", "restored"), ("Service/shop/b", "restored")]


def test_one_passs_event_is_read_part_by_part_its_success_before_the_drift_it_restored() -> None:
    # A pass that restored drift and turned Ready again records one Event: the DriftCorrected
    # Warning heads it, its success follows in the note, annotated with the revision it applied.
    inventories = {"config": [oid("ConfigMap", "settings")], "backend": [oid("Service", "api")]}
    note = ("stage 'backend': restored Service shop/api; also ReconciliationSucceeded: "
            "ConfigMap/shop/settings configured, Service/shop/api configured; and 1 more")
    found = last_changes([event("DriftCorrected", note, "2026-01-01T10:00:00.000000Z",
                                revision="main@sha1:2")], inventories)
    assert found["config"].objects == [("ConfigMap/shop/settings", "configured")]
    assert found["config"].revision == "main@sha1:2"
    assert not found["backend"].drift  # the success names it too, and was told after the drift
    assert found["backend"].objects == [("Service/shop/api", "configured")]


# -- what the watch saw change ------------------------------------------------------------------------------


def test_transitions() -> None:
    before = stageset(
        STAGES,
        status={
            "conditions": ready("False", "StageProgressing"),
            "stages": [
                {"name": "db", "phase": "Ready", "revision": "r1"},
                {"name": "api", "phase": "Waiting", "revision": "r1"},
            ],
        },
    )
    after = stageset(
        STAGES,
        status={
            "conditions": ready("True", "Succeeded"),
            "lastAppliedRevision": "r2",
            "stages": [
                {"name": "db", "phase": "Ready", "revision": "r2"},
                {"name": "api", "phase": "Ready", "revision": "r1"},
                {"name": "web", "phase": "Applying"},
            ],
        },
    )
    found = views.transitions(before, after, when="t")
    assert [(t.stage, t.before, t.after, t.revision) for t in found] == [
        ("db", "Ready", "Ready", "r2"),
        ("api", "Waiting", "Ready", None),
        ("web", None, "Applying", None),
        ("", "Ready=False StageProgressing", "Ready=True Succeeded", "r2"),
    ]
    assert views.transitions(after, after, when="t") == []


# -- the address ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:8090", Address("127.0.0.1", 8090)),
        ("[::1]:0", Address("::1", 0)),
        ("localhost:80", Address("localhost", 80)),
        ("0.0.0.0:8090", Address("0.0.0.0", 8090)),  # noqa: S104
    ],
)
def test_addresses(text: str, address: Address) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["8090", ":8090", "127.0.0.1:http", "::1:8090", "127.0.0.1:70000"])
def test_addresses_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_address(text)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),  # noqa: S104 - only parsed
        ("::", False),
        ("192.0.2.1", False),
        ("name.invalid", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# -- escaping in every template ---------------------------------------------------------------------------

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


class FakeHub:
    """Just enough of the hub for the pages to render from memory."""

    namespace = None
    synced = True

    def __init__(self, obj: dict[str, Any]):
        self.obj = obj

    def stagesets(self) -> list[dict[str, Any]]:
        return [self.obj]

    def stageset(self, _namespace: str, _name: str) -> dict[str, Any]:
        return self.obj

    def lookup(self, _ref: views.Ref) -> views.ObjectState:
        return views.ObjectState("Failed", HOSTILE, revision=HOSTILE)

    def fleetrollouts(self) -> list[dict[str, Any]]:
        member = {"namespace": "shop", "name": HOSTILE, "wave": "canary", "ready": False,
                  "released": {HOSTILE: HOSTILE}, "pending": {HOSTILE: HOSTILE}}
        lost = {"namespace": "shop", "name": "lost", "hold": HOSTILE}
        return [{"metadata": {"name": "web"}, "status": {
            "conditions": ready("False", "Halted", f"member {HOSTILE} failed"),
            "round": {"revisions": [HOSTILE]}, "withdrawn": [HOSTILE],
            "waves": [{"name": "canary", "phase": "Halted", "members": 1, "ready": 0},
                      {"name": "all", "phase": "Waiting", "members": 0, "ready": 0}],
            "members": [member, lost]}}]

    def sources(self) -> list[dict[str, Any]]:
        return [{
            "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": "shop"},
            "spec": {"url": f"https://x.example/{HOSTILE}", "ref": {"branch": HOSTILE}},
            "status": {"artifact": {"revision": HOSTILE, "lastUpdateTime": HOSTILE},
                       "conditions": ready("False", HOSTILE, f"{HOSTILE}; runbook: https://r.example/{HOSTILE}")},
        }]

    def events_for(self, _obj: dict[str, Any]) -> list[EventRow]:
        return [
            EventRow(
                uid="1",
                namespace="shop",
                kind="StageSet",
                name="shop",
                type="Warning",
                reason=HOSTILE,
                message=HOSTILE,
                last_seen="2026-01-01T10:00:00.000000Z",
                count=1,
            )
        ]

    def activity(self, _namespace: str, _name: str) -> list[views.Transition]:
        return [
            views.Transition(
                when="2026-01-01T10:00:00Z", stage="db", before=HOSTILE, after=HOSTILE, revision=HOSTILE
            )
        ]

    def in_scope(self, _namespace: str) -> bool:
        return True

    def problems(self) -> list[str]:
        return [HOSTILE]

    def lease(self, _obj: Any, _previous: Any = None) -> None:
        return None


def test_every_template_escapes_tenant_text() -> None:
    from stageset.cli.dashboard.app import Dashboard

    obj = stageset(
        STAGES,
        depends_on=[{"name": "base"}],
        status={
            "conditions": ready("False", HOSTILE, HOSTILE),
            "lastAppliedRevision": HOSTILE,
            "stages": [
                {"name": "db", "phase": HOSTILE, "message": HOSTILE, "revision": HOSTILE, HOSTILE: HOSTILE}
            ],
            "inventory": [
                {
                    "name": "db",
                    "serviceAccountName": HOSTILE,
                    "entries": [{"id": f"shop_{HOSTILE}__ConfigMap", "v": HOSTILE}],
                }
            ],
        },
    )
    dashboard = Dashboard(FakeHub(obj), scope=HOSTILE)  # type: ignore[arg-type]
    pages = [ListPage(dashboard), StageSetPage(dashboard, namespace="shop", name="shop")]
    pages.append(SourcesPage(dashboard))
    pages.append(FleetPage(dashboard))
    rendered = [str(f.html) for page in pages for f in page.fragments()]
    rendered.append(
        str(
            dashboard.render(
                "missing.html", title=HOSTILE, namespace=HOSTILE, name=HOSTILE, scope=HOSTILE, live=None
            )
        )
    )
    for html in rendered:
        assert "<script>" not in html
        assert "<img" not in html
    assert sum(html.count("&lt;script&gt;") for html in rendered) > 10


def test_autoescaping_is_on_for_svg_too() -> None:
    env = environment()
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    assert env.get_template("fragments/svg.html").environment.autoescape is True


# -- sources of any kind, status fields a newer controller writes --------------------------------------------


def test_a_flux_source_is_shown_by_the_kind_and_name_the_spec_gives() -> None:
    flux = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "OCIRepository",
        "name": "app",
        "namespace": "ops",
    }
    obj = stageset([{"name": "one", "sourceRef": flux}, {"name": "two"}])
    sources = views.stage_sources(obj)
    assert sources["one"] == views.Ref("source.toolkit.fluxcd.io/v1", "OCIRepository", "ops", "app")
    assert sources["two"] == views.Ref("stages.metio.wtf/v1", "GitRepository", "shop", "app")
    # The page watches the events about each source's API group, in the source's namespace.
    assert views.event_scopes(obj) == {
        ("stages.metio.wtf/v1", "shop"),
        ("source.toolkit.fluxcd.io/v1", "ops"),
    }


def test_stage_status_fields_this_dashboard_does_not_know_are_shown_as_they_are() -> None:
    promotion = {"state": "Soaking", "until": "2026-01-01T12:00:00Z"}
    obj = stageset(
        [{"name": "db"}], status={"stages": [{"name": "db", "phase": "Ready", "promotionState": promotion}]}
    )
    page = views.detail(
        obj,
        lookup=lambda _ref: views.ObjectState("Current"),
        events=[],
        activity=[],
        linkable=lambda _namespace: True,
        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )
    assert page.stages[0].extra == [
        ("promotionState", '{"state": "Soaking", "until": "2026-01-01T12:00:00Z"}')
    ]


def test_the_page_names_the_platform_target_and_never_its_server() -> None:
    def page(obj: dict[str, Any]) -> views.Detail:
        return views.detail(obj, lookup=lambda _ref: views.ObjectState("Current"), events=[], activity=[],
                            linkable=lambda _namespace: True,
                            now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))

    obj = stageset([{"name": "db"}])
    obj["spec"]["targetRef"] = {"name": "prod-eu", "namespace": "platform"}
    assert page(obj).target == "StageTarget platform/prod-eu"
    assert page(stageset([{"name": "db"}])).target is None


def test_the_dashboard_s_client_refuses_every_verb_but_get(mocker: Any) -> None:
    from stageset.cli.dashboard.hub import ReadOnlyClient

    client = mocker.Mock()
    reader = ReadOnlyClient(client)
    for verb in ("POST", "PUT", "PATCH", "DELETE"):
        with pytest.raises(PermissionError, match="read-only"):
            reader.request(verb, "/api/v1/namespaces/shop/configmaps")
    assert client.request.call_count == 0
    reader.request("GET", "/api/v1/namespaces/shop/configmaps", query={"limit": 1})
    client.request.assert_called_once_with("GET", "/api/v1/namespaces/shop/configmaps", query={"limit": 1})


# -- links and failed dependencies (issue 37) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "html"),
    [
        ("plain & <b>", "plain &amp; &lt;b&gt;"),
        (
            "failed; runbook: https://stages.metio.wtf/runbooks/stagefailed/.",
            'failed; runbook: <a href="https://stages.metio.wtf/runbooks/stagefailed/" '
            'rel="noopener noreferrer" target="_blank">https://stages.metio.wtf/runbooks/stagefailed/</a>.',
        ),
        # A quote or an angle bracket ends the URL: it can never leave the attribute.
        (
            'see http://x.example/a"onmouseover="alert(1)',
            'see <a href="http://x.example/a" rel="noopener noreferrer" target="_blank">'
            "http://x.example/a</a>&#34;onmouseover=&#34;alert(1)",
        ),
        ("javascript:alert(1) data:text/html,<script>", "javascript:alert(1) data:text/html,&lt;script&gt;"),
        ("https://", "https://"),
        ("a&b https://h.example/?a=1&b=<2>", 'a&amp;b <a href="https://h.example/?a=1&amp;b=" '
         'rel="noopener noreferrer" target="_blank">https://h.example/?a=1&amp;b=</a>&lt;2&gt;'),
    ],
)
def test_linkify_links_only_http_urls_and_escapes_the_rest(text: str, html: str) -> None:
    from stageset.cli.dashboard.links import linkify

    assert str(linkify(text)) == html


@pytest.mark.parametrize(
    ("message", "parts"),
    [
        ("stage 'api' failed; runbook: https://h.example/runbooks/stagefailed/",
         ("stage 'api' failed", "https://h.example/runbooks/stagefailed/")),
        ("runbook: https://h.example/r/", ("", "https://h.example/r/")),
        ("no link here", ("no link here", None)),
        ("runbook: javascript:alert(1)", ("runbook: javascript:alert(1)", None)),
    ],
)
def test_split_runbook(message: str, parts: tuple[str, str | None]) -> None:
    from stageset.cli.dashboard.links import split_runbook

    assert split_runbook(message) == parts


def _with_conditions(*found: dict[str, Any], generation: int = 2) -> dict[str, Any]:
    obj = stageset([{"name": "a"}], status={"conditions": list(found)})
    obj["metadata"]["generation"] = generation
    return obj


@pytest.mark.parametrize(
    ("found", "state"),
    [
        ([{"type": "Ready", "status": "False", "reason": "StageFailed", "observedGeneration": 2}], "Failed"),
        ([{"type": "Ready", "status": "False", "reason": "Stalled", "observedGeneration": 1},
          {"type": "Stalled", "status": "True", "reason": "Stalled"}], "Failed"),
        # Waiting for something else, still working, or said about an older generation: in progress.
        ([{"type": "Ready", "status": "False", "reason": "DependencyNotReady", "observedGeneration": 2}],
         "InProgress"),
        ([{"type": "Ready", "status": "False", "reason": "StageFailed", "observedGeneration": 1}],
         "InProgress"),
        ([{"type": "Ready", "status": "False", "reason": "StageFailed", "observedGeneration": 2},
          {"type": "Reconciling", "status": "True", "reason": "Progressing"}], "InProgress"),
        ([{"type": "Ready", "status": "True", "reason": "Succeeded", "observedGeneration": 2}], "Current"),
    ],
)
def test_a_stageset_that_failed_is_failed_not_in_progress(found: list[dict[str, Any]], state: str) -> None:
    from stageset.cli.dashboard.hub import object_state

    assert object_state(_with_conditions(*found)).status == state


def test_a_failed_dependency_is_drawn_failed() -> None:
    waits = ready("False", "DependencyNotReady", "StageSet shop/base is not Ready")
    obj = stageset([{"name": "a"}], depends_on=[{"name": "base"}], status={"conditions": waits})
    failed = views.ObjectState("Failed", "Ready=False StageFailed: boom")
    found = views.detail(obj, lookup=lambda _ref: failed, events=[], activity=[], linkable=lambda _ns: True,
                         now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    node = found.nodes["stageset:shop/base"]
    assert node.phase == "Failed"
    assert node.css == "dependency bad"
    waiting = views.detail(obj, lookup=lambda _ref: views.ObjectState("InProgress"), events=[], activity=[],
                           linkable=lambda _ns: True, now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    assert waiting.nodes["stageset:shop/base"].css == "dependency progress"


# -- the Sources page -----------------------------------------------------------------------------------


def test_a_source_row_never_shows_credentials_and_names_its_users() -> None:
    from stageset.cli.dashboard.sources import source_rows, without_credentials

    assert without_credentials("https://user:t0ken@git.example/app.git") == "https://git.example/app.git"
    assert without_credentials("ssh://git@git.example:22/app.git") == "ssh://git.example:22/app.git"
    assert without_credentials("https://git.example/a@b") == "https://git.example/a@b"
    ours = {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": "shop"},
        "spec": {"url": "https://user:t0ken@git.example/app.git", "ref": {"branch": "main"},
                 "secretRef": {"name": "git-credentials"}},
        "status": {"artifact": {"revision": "main@sha1:" + "a" * 40,
                                "lastUpdateTime": "2026-01-01T00:00:00Z"},
                   "conditions": ready("False", "AuthenticationFailed", "denied; runbook: https://r.example/x/")},
    }
    flux = {
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": "shop"},
        "spec": {"url": "https://git.example/flux.git", "ref": {"tag": "v1"}},
        "status": {"conditions": ready("True", "Succeeded", "stored")},
    }
    users = [
        stageset([{"name": "a"}]),  # sourceRef app: ours
        {**stageset([{"name": "b", "sourceRef": {"name": "app", "kind": "GitRepository",
                                                  "apiVersion": "source.toolkit.fluxcd.io/v1"}}]),
         "metadata": {"name": "other", "namespace": "shop"}},
    ]
    mine, theirs = source_rows([ours, flux], users, linkable=lambda _ns: True)
    by_group = {row.group: row for row in (mine, theirs)}
    ours_row, flux_row = by_group["stages.metio.wtf"], by_group["source.toolkit.fluxcd.io"]
    assert ours_row.url == "https://git.example/app.git"
    assert "t0ken" not in repr(ours_row)
    assert "git-credentials" not in repr(ours_row)
    assert (ours_row.ref, ours_row.ready, ours_row.reason) == ("branch main", "False", "AuthenticationFailed")
    assert (ours_row.message, ours_row.runbook) == ("denied", "https://r.example/x/")
    assert [u.name for u in ours_row.used_by] == ["shop"]
    assert [u.name for u in flux_row.used_by] == ["other"]
    assert (flux_row.message, flux_row.ref) == ("", "tag v1")


def test_the_fleet_page_shows_each_wave_its_members_and_what_holds_them() -> None:
    dashboard = Dashboard(FakeHub({"metadata": {"name": "x", "namespace": "shop"}, "spec": {"stages": []}}),
                          scope="every namespace")  # type: ignore[arg-type]
    (fragment,) = FleetPage(dashboard).fragments()
    html = str(fragment.html)
    assert "<td rowspan=\"1\">canary</td><td rowspan=\"1\">Halted</td>" in html
    assert "no members" in html  # the wave "all"
    assert "not in a wave" in html
    assert "shop/lost" in html
    assert "Withdrawn (never released again)" in html


def test_objects_of_other_kinds_it_waits_for_are_drawn_with_their_kind_and_readiness() -> None:
    waits = ready("False", "DependencyNotReady", "Database db is not Ready: provisioning")
    obj = stageset([{"name": "a"}], depends_on=[
        {"name": "base"},
        {"apiVersion": "db.example/v1", "kind": "Database", "name": "db"},
        {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "name": "op", "namespace": "ops",
         "readyExpr": "status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"}],
        status={"conditions": waits})
    assert [(r.kind, r.namespace, r.name) for r in views.dependency_refs(obj)] == [
        ("StageSet", "shop", "base"), ("Database", "shop", "db"), ("HelmRelease", "ops", "op")]
    states = {"Database": views.ObjectState("InProgress", "provisioning")}
    found = views.detail(obj, lookup=lambda ref: states.get(ref.kind, views.ObjectState("Current")),
                         events=[], activity=[], linkable=lambda _ns: True,
                         now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    database = found.nodes["object:Database/shop/db"]
    assert (database.title, database.detail, database.css) == ("Database shop/db", "Database · InProgress",
                                                               "dependency progress")
    assert database.href is None  # only StageSets have pages here
    assert found.nodes["object:HelmRelease/ops/op"].title.startswith("HelmRelease ops/op (ready when status.")
    assert found.holding is not None
    assert found.holding.nodes == ["object:Database/shop/db"]
    assert found.holding.text().startswith("Database shop/db: Database db is not Ready")
    assert list(found.ready_exprs.values()) == [
        "status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"]
    # The picture: every dependency before the stages that start first.
    assert {views.dependency_id(r) for r in views.dependency_refs(obj)} <= set(found.nodes)


def test_a_warn_stageset_shows_what_it_left_drifted_escaped() -> None:
    """The Drifted message on the page, a badge per drifted object and per row; tenant text escaped."""
    from stageset.cli.dashboard.app import Dashboard

    entry = f"shop_{HOSTILE}__ConfigMap"
    obj = stageset(
        [{"name": "db"}],
        status={
            "conditions": [*ready("True"), {"type": "Drifted", "status": "True", "reason": "DriftDetected",
                                            "message": f"1 object differs: {HOSTILE}"}],
            "inventory": [{"name": "db", "entries": [{"id": entry, "v": "v1"}]}],
            "drifted": [{"stage": "db", "id": entry, "fields": [f"data.{HOSTILE}"]}],
        },
    )
    page = views.detail(obj, lookup=lambda _ref: views.ObjectState("Current"), events=[], activity=[],
                        linkable=lambda _namespace: True,
                        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    assert page.drift == f"1 object differs: {HOSTILE}"
    assert page.stages[0].objects[0].drifted == f"data.{HOSTILE}"
    assert views.list_row(obj).drifted == 1
    dashboard = Dashboard(FakeHub(obj), scope="shop")  # type: ignore[arg-type]
    html = "".join(str(f.html) for page_ in (ListPage(dashboard), StageSetPage(dashboard, namespace="shop",
                                                                                 name="shop"))
                   for f in page_.fragments())
    assert "drifted 1" in html
    assert 'id="drifted"' in html
    assert "<script>" not in html
