"""Notifications as units: the payload of each provider type (a table), commit shas and states,
alert matching, redaction of a notice, and the outboxes' rate limit, retries and metrics against a
loopback receiver (a real HTTP server; the metrics are the controller's own registry)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sources.addresses import AddressGuard
from stageset.api.notification import EventSource, NotificationAlertSpec, ProviderType
from stageset.api.vocabulary import EventType
from stageset.controller.metrics import Metrics
from stageset.controller.notifications.config import Config, Provider, Subject, matches, routes
from stageset.controller.notifications.delivery import DeliverySettings, Outboxes, http_sender
from stageset.controller.notifications.payloads import (
    AddressError,
    Notice,
    Outgoing,
    commit_shas,
    commit_state,
    notice,
    requests_for,
)
from stageset.controller.redact import Redactor, forms
from tests.actionserver import ActionServer

SHA = "0123456789abcdef0123456789abcdef01234567"
REF = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "namespace": "shop", "name": "web",
       "uid": "u-1"}


def make(reason: str = "StageFailed", type_: EventType = EventType.WARNING,
         message: str = "stage 'app' failed", revision: str = f"main@sha1:{SHA}") -> Notice:
    return notice(obj_ref=REF, type_=type_, reason=reason, message=message,
                  annotations={"stages.metio.wtf/revision": revision} if revision else None,
                  timestamp="2026-01-01T00:00:00.000000Z", redact=lambda text: text)


# -- payloads ---------------------------------------------------------------------------------------

PAYLOADS: list[tuple[ProviderType, str, str, dict[str, Any]]] = [
    # type, address, the URL sent to, fields the body must hold
    (ProviderType.GENERIC, "https://hooks.example/in", "https://hooks.example/in",
     {"severity": "error", "reason": "StageFailed", "message": "stage 'app' failed",
      "metadata": {"revision": f"main@sha1:{SHA}"}, "reportingController": "stageset-controller",
      "involvedObject": {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "namespace": "shop",
                         "name": "web", "uid": "u-1"}}),
    (ProviderType.SLACK, "https://hooks.slack.example/T/B/x", "https://hooks.slack.example/T/B/x",
     {"text": "StageSet/shop/web: StageFailed", "channel": "#releases"}),
    (ProviderType.MSTEAMS, "https://teams.example/workflows/1", "https://teams.example/workflows/1",
     {"type": "message"}),
    (ProviderType.GITHUB, "https://github.com/org/repo", f"https://api.github.com/repos/org/repo/statuses/{SHA}",
     {"state": "failure", "context": "stageset/shop/web", "description": "StageFailed: stage 'app' failed"}),
    (ProviderType.GITHUB, "https://ghe.example/org/repo.git", f"https://ghe.example/api/v3/repos/org/repo/statuses/{SHA}",
     {"state": "failure"}),
    (ProviderType.GITLAB, "https://gitlab.com/group/sub/project",
     f"https://gitlab.com/api/v4/projects/group%2Fsub%2Fproject/statuses/{SHA}",
     {"state": "failed", "name": "stageset/shop/web", "description": "StageFailed: stage 'app' failed"}),
]


@pytest.mark.parametrize(("type_", "address", "url", "fields"), PAYLOADS, ids=lambda v: str(v)[:40])
def test_each_provider_type_sends_its_payload_to_its_url(type_: ProviderType, address: str, url: str,
                                                        fields: dict[str, Any]) -> None:
    [sent] = requests_for(type_, make(), address=address, token="tok", channel="#releases")
    assert sent.url == url
    for key, value in fields.items():
        assert sent.body[key] == value, key
    assert "tok" not in json.dumps(sent.body), "a provider's token travels in headers only"


def test_slack_and_teams_carry_the_message_the_revision_and_the_summary() -> None:
    item = make()
    item = type(item)(**{**item.__dict__, "summary": "cluster: prod-eu"})
    [slack] = requests_for(ProviderType.SLACK, item, address="https://h.example/x")
    attachment = slack.body["attachments"][0]  # type: ignore[index]
    assert attachment["color"] == "danger"
    assert attachment["text"] == "cluster: prod-eu\nstage 'app' failed"
    assert attachment["fields"] == [{"title": "revision", "value": f"main@sha1:{SHA}", "short": False}]
    [teams] = requests_for(ProviderType.MSTEAMS, item, address="https://h.example/x")
    card = teams.body["attachments"][0]["content"]  # type: ignore[index]
    assert card["type"] == "AdaptiveCard"
    assert card["body"][1]["text"] == "cluster: prod-eu\nstage 'app' failed"
    assert {"title": "revision", "value": f"main@sha1:{SHA}"} in card["body"][2]["facts"]


def test_tokens_go_in_each_providers_header() -> None:
    assert requests_for(ProviderType.GITHUB, make(), address="https://github.com/o/r", token="t1")[0] \
        .headers["Authorization"] == "Bearer t1"
    assert requests_for(ProviderType.GITLAB, make(), address="https://gitlab.com/o/r", token="t2")[0] \
        .headers["PRIVATE-TOKEN"] == "t2"
    assert requests_for(ProviderType.GENERIC, make(), address="https://h.example/", token="t3")[0] \
        .headers["Authorization"] == "Bearer t3"
    assert "Authorization" not in requests_for(ProviderType.GENERIC, make(), address="https://h.example/")[0].headers


@pytest.mark.parametrize(("reason", "type_", "state"), [
    ("StageFailed", EventType.WARNING, "failure"),
    ("RolledBack", EventType.WARNING, "failure"),
    ("AwaitingPromotion", EventType.NORMAL, "pending"),
    ("UpdateDeferred", EventType.NORMAL, "pending"),
    ("ReconciliationSucceeded", EventType.NORMAL, "success"),
    ("Promoted", EventType.NORMAL, "success"),
    ("NewArtifact", EventType.NORMAL, None),
])
def test_commit_state_follows_the_event(reason: str, type_: EventType, state: str | None) -> None:
    assert commit_state(make(reason, type_)) == state
    sent = requests_for(ProviderType.GITHUB, make(reason, type_), address="https://github.com/o/r")
    assert [r.body["state"] for r in sent] == ([state] if state else [])


@pytest.mark.parametrize(("revision", "shas"), [
    (f"main@sha1:{SHA}", [SHA]),
    (f"v1.2.3@sha1:{SHA}, main@sha1:{'f' * 40}", [SHA, "f" * 40]),
    (f"main@sha1:{SHA}, other@sha1:{SHA}", [SHA]),
    (f"latest@sha256:{'a' * 64}", ["a" * 64]),
    ("", []),
    ("main@sha1:abc", []),  # not a whole commit id
    ("sha256:" + "b" * 64 + "@extra", ["b" * 64]),
])
def test_commit_shas_from_a_revision(revision: str, shas: list[str]) -> None:
    assert commit_shas(revision) == shas


def test_no_commit_no_status_and_a_bad_repository_address_is_refused() -> None:
    assert requests_for(ProviderType.GITHUB, make(revision=""), address="https://github.com/o/r") == []
    with pytest.raises(AddressError):
        requests_for(ProviderType.GITLAB, make(), address="https://gitlab.com/only-a-group")
    with pytest.raises(AddressError):
        requests_for(ProviderType.GITHUB, make(), address="ssh://git@github.com/o/r")


def test_a_notice_is_redacted_whatever_the_recorder_left() -> None:
    value = "s3cret-Value/with+signs=="
    redactor = Redactor([value])
    item = notice(obj_ref=REF, type_=EventType.WARNING, reason="StageFailed",
                  message=f"label {json.dumps(value)} is invalid; base64 {value.encode().hex()}",
                  annotations={"stages.metio.wtf/revision": f"main@sha1:{SHA}"}, timestamp="t",
                  redact=redactor)
    for type_, address in ((t, a) for t, a, _, _ in PAYLOADS):
        for sent in requests_for(type_, item, address=address):
            text = json.dumps(sent.body)
            for form in forms(value):
                assert form not in text, (type_, form)


# -- matching ---------------------------------------------------------------------------------------

def alert(**spec: Any) -> NotificationAlertSpec:
    return NotificationAlertSpec.model_validate({"providerRef": {"name": "p"}, **spec})


WEB = Subject(namespace="shop", name="web", labels={"team": "a"}, type=EventType.NORMAL,
              reason="ReconciliationSucceeded")


@pytest.mark.parametrize(("spec", "matched"), [
    ({"eventSources": [{"kind": "StageSet", "name": "*"}]}, True),
    ({"eventSources": [{"name": "web", "namespace": "shop"}]}, True),
    ({"eventSources": [{"name": "web", "namespace": "other"}]}, False),
    ({"eventSources": [{"name": "api"}]}, False),
    ({"eventSources": [{"matchLabels": {"team": "a"}}]}, True),
    ({"eventSources": [{"matchLabels": {"team": "b"}}]}, False),
    ({"eventSources": [{"name": "api"}, {"namespace": "shop"}]}, True),
    ({"eventSources": [{}], "eventSeverity": "error"}, False),
    ({"eventSources": [{}], "eventReasons": ["RolledBack", "ReconciliationSucceeded"]}, True),
    ({"eventSources": [{}], "eventReasons": ["RolledBack"]}, False),
])
def test_an_alert_selects_stagesets_and_reasons(spec: dict[str, Any], matched: bool) -> None:
    assert matches(alert(**spec), WEB) is matched


def test_routes_send_each_provider_once_and_skip_suspended_ones() -> None:
    providers = {n: Provider(name=n, type=ProviderType.GENERIC, address="https://h.example/",
                             suspended=n == "off") for n in ("p", "q", "off")}
    config = Config(providers=providers, alerts=(
        ("a1", alert(eventSources=[{}], summary="first")),
        ("a2", alert(eventSources=[{}], summary="second")),
        ("a3", NotificationAlertSpec(provider_ref={"name": "q"}, event_sources=[EventSource()],  # type: ignore[arg-type]
                                     suspend=True)),
        ("a4", NotificationAlertSpec(provider_ref={"name": "off"}, event_sources=[EventSource()])),  # type: ignore[arg-type]
        ("a5", NotificationAlertSpec(provider_ref={"name": "missing"}, event_sources=[EventSource()])),  # type: ignore[arg-type]
    ))
    assert [(p.name, summary) for p, summary in routes(config, WEB)] == [("p", "first")]


# -- delivery ---------------------------------------------------------------------------------------

@pytest.fixture
def receiver() -> Iterator[ActionServer]:
    with ActionServer() as server:
        yield server


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def dropped(metrics: Metrics) -> float:
    return counter(metrics, "stageset_notifications_dropped_total", provider="hook", reason="queue_full")


def wait_until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def outboxes(metrics: Metrics, **settings: Any) -> Outboxes:
    return Outboxes(settings=DeliverySettings(**{"backoff": 0.01, **settings}),
                    send=http_sender(AddressGuard(allow_insecure=True, purpose="notifications")),
                    counters=metrics)


def hook(server: ActionServer, path: str) -> Provider:
    return Provider(name="hook", type=ProviderType.GENERIC, address=server.url(path), timeout=5.0)


def test_sent_and_failed_are_counted_and_only_retryable_answers_are_retried(receiver: ActionServer) -> None:
    metrics = Metrics()
    boxes = outboxes(metrics, attempts=3)
    try:
        for url in (receiver.answer("/ok", 202), receiver.answer("/busy", 503), receiver.answer("/no", 400)):
            provider = Provider(name=url.rsplit("/", 1)[1], type=ProviderType.GENERIC, address=url)
            boxes.put(provider, requests_for(ProviderType.GENERIC, make(), address=url))
        wait_until(lambda: boxes.pending() == 0 and len(receiver.requests) == 5, "every attempt")
        assert len(receiver.received("/ok")) == 1
        assert len(receiver.received("/busy")) == 3, "a 503 is tried again, at most `attempts` times"
        assert len(receiver.received("/no")) == 1, "a 400 is not tried again"
        assert counter(metrics, "stageset_notifications_sent_total", provider="ok", type="generic") == 1
        assert counter(metrics, "stageset_notification_failures_total", provider="busy", type="generic") == 1
        assert counter(metrics, "stageset_notification_failures_total", provider="no", type="generic") == 1
        assert json.loads(receiver.received("/ok")[0].body)["reason"] == "StageFailed"
    finally:
        boxes.close()


def test_a_slow_receiver_fills_only_its_bounded_queue_and_the_rest_is_dropped(receiver: ActionServer) -> None:
    metrics = Metrics()
    boxes = outboxes(metrics, capacity=2)
    hold = threading.Event()
    receiver.answer("/slow", 200)
    receiver.replies["/slow"].hold = hold
    provider = hook(receiver, "/slow")
    one = Outgoing(provider.address, {"n": 0}, {"Content-Type": "application/json"})
    try:
        boxes.put(provider, [one])
        wait_until(lambda: len(receiver.requests) == 1, "the first request held by the receiver")
        # Returns while the receiver still holds the first: two queued, two dropped and counted.
        boxes.put(provider, [one, one, one, one])
        assert dropped(metrics) == 2
        assert len(receiver.requests) == 1
        hold.set()
        wait_until(lambda: boxes.pending() == 0, "the queue drained")
        assert len(receiver.requests) == 3
        assert counter(metrics, "stageset_notifications_sent_total", provider="hook", type="generic") == 3
    finally:
        hold.set()
        boxes.close()


def test_the_rate_limit_holds_requests_past_the_burst(receiver: ActionServer) -> None:
    metrics = Metrics()
    boxes = outboxes(metrics, rate=0.001, burst=2, capacity=3)
    receiver.answer("/rate", 200)
    provider = hook(receiver, "/rate")
    one = Outgoing(provider.address, {"n": 0}, {"Content-Type": "application/json"})
    try:
        boxes.put(provider, [one] * 6)  # 3 queued (the bound), 3 dropped
        wait_until(lambda: len(receiver.requests) == 2, "the burst sent")
        wait_until(lambda: counter(metrics, "stageset_notifications_sent_total", provider="hook",
                                   type="generic") == 2, "the burst counted")
        assert boxes.pending() == 1, "the third waits for a token"
        assert len(receiver.requests) == 2
        assert dropped(metrics) == 3
    finally:
        boxes.close()


# -- tenant text is inert in every receiver that formats it (issue 43 item 5) ----------------------

HOSTILE = ("applied Evil<!channel><https://evil.example/approve|Approve release> & "
           "[Approve](https://evil.example) *now*")


@pytest.mark.parametrize(("text", "slack", "teams"), [
    ("<!channel>", "&lt;!channel&gt;", "\\<\\!channel\\>"),
    ("<!here|here> <@U123>", "&lt;!here|here&gt; &lt;@U123&gt;", "\\<\\!here\\|here\\> \\<@U123\\>"),
    ("<https://evil.example|Approve>", "&lt;https://evil.example|Approve&gt;",
     "\\<https://evil.example\\|Approve\\>"),
    ("a & b", "a &amp; b", "a & b"),
    ("[Approve](https://evil.example)", "[Approve](https://evil.example)", "\\[Approve\\]\\(https://evil.example\\)"),
    ("**bold** _it_ `code`", "**bold** _it_ `code`", "\\*\\*bold\\*\\* \\_it\\_ \\`code\\`"),
    ("- item\n1. one\nprod-eu 2.0", "- item\n1. one\nprod-eu 2.0", "\\- item\n1\\. one\nprod-eu 2.0"),
    ("stage 'app' failed", "stage 'app' failed", "stage 'app' failed"),
])
def test_slack_and_teams_escape_what_their_markup_reads(text: str, slack: str, teams: str) -> None:
    from stageset.controller.notifications.payloads import slack_escape, teams_escape
    assert slack_escape(text) == slack
    assert teams_escape(text) == teams


def test_no_payload_carries_a_tenants_markup_unescaped() -> None:
    item = make(message=HOSTILE, revision=f"feature/<!channel>[x](y)@sha1:{SHA}")
    [slack] = requests_for(ProviderType.SLACK, item, address="https://h.example/x")
    texts = json.dumps(slack.body)
    assert "<" not in texts, "no mention, no link: Slack reads only <...> as either"
    assert ">" not in texts
    assert "&lt;!channel&gt;" in slack.body["attachments"][0]["text"]  # type: ignore[index]
    assert "&amp;" in slack.body["attachments"][0]["text"]  # type: ignore[index]
    [teams] = requests_for(ProviderType.MSTEAMS, item, address="https://h.example/x")
    card = teams.body["attachments"][0]["content"]  # type: ignore[index]
    assert card["body"][1]["text"].count("\\[Approve\\]\\(https://evil.example\\)") == 1
    assert "](" not in json.dumps(card).replace("\\\\](", ""), "no markdown link survives"
    revision = next(f["value"] for f in card["body"][2]["facts"] if f["title"] == "revision")
    assert revision.startswith("feature/\\<\\!channel\\>\\[x\\]\\(y\\)")
    # Commit statuses are plain text by their APIs, the generic payload is Flux's JSON: verbatim.
    [github] = requests_for(ProviderType.GITHUB, item, address="https://github.com/o/r")
    assert str(github.body["description"]).startswith("StageFailed: applied Evil<!channel><https://evil")
    [generic] = requests_for(ProviderType.GENERIC, item, address="https://h.example/")
    assert generic.body["message"] == HOSTILE


# -- fair between tenants on one provider (issue 43 item 5) ----------------------------------------

class Recording:
    """A receiver that records what it was sent, in order (a pure unit: no HTTP)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.called = threading.Event()

    def __call__(self, request: Outgoing, timeout: float) -> int:
        del timeout
        self.called.set()
        self.release.wait(10)
        with self.lock:
            self.sent.append(request.body)
        return 200


def test_one_tenants_burst_delays_another_tenants_first_alert_by_one_send_at_most() -> None:
    metrics = Metrics()
    receiver = Recording()
    boxes = Outboxes(settings=DeliverySettings(rate=1000.0, burst=1, capacity=100), send=receiver,
                     counters=metrics)
    provider = Provider(name="hook", type=ProviderType.GENERIC, address="https://h.example/")

    def one(tenant: str, n: int) -> Outgoing:
        return Outgoing(provider.address, {"tenant": tenant, "n": n}, {})
    try:
        boxes.put(provider, [one("noisy", n) for n in range(20)], tenant="noisy")
        wait_until(receiver.called.is_set, "the first send in flight")
        boxes.put(provider, [one("quiet", 0)], tenant="quiet")
        boxes.put(provider, [one("third", 0)], tenant="third")
        receiver.release.set()
        wait_until(lambda: boxes.pending() == 0, "everything sent")
        order = [(b["tenant"], b["n"]) for b in receiver.sent]
        assert order[:4] == [("noisy", 0), ("quiet", 0), ("third", 0), ("noisy", 1)], order
        assert [n for t, n in order if t == "noisy"] == list(range(20)), "each tenant's own order is kept"
    finally:
        receiver.release.set()
        boxes.close()


def test_a_full_queue_drops_the_fullest_tenants_newest_never_a_quiet_tenants_alert() -> None:
    metrics = Metrics()
    receiver = Recording()
    boxes = Outboxes(settings=DeliverySettings(rate=1000.0, burst=1, capacity=5), send=receiver,
                     counters=metrics)
    provider = Provider(name="hook", type=ProviderType.GENERIC, address="https://h.example/")
    try:
        noisy = [Outgoing(provider.address, {"tenant": "noisy", "n": n}, {}) for n in range(9)]
        boxes.put(provider, noisy[:1], tenant="noisy")
        wait_until(receiver.called.is_set, "one in flight")
        boxes.put(provider, noisy[1:], tenant="noisy")
        assert boxes.pending() == 6, "one in flight, five queued"
        assert dropped(metrics) == 3
        boxes.put(provider, [Outgoing(provider.address, {"tenant": "quiet", "n": 0}, {})], tenant="quiet")
        assert dropped(metrics) == 4, "room made by the fullest tenant's newest"
        receiver.release.set()
        wait_until(lambda: boxes.pending() == 0, "everything sent")
        order = [(b["tenant"], b["n"]) for b in receiver.sent]
        assert ("quiet", 0) in order[:2], order
        assert [n for t, n in order if t == "noisy"] == [0, 1, 2, 3, 4]
    finally:
        receiver.release.set()
        boxes.close()
