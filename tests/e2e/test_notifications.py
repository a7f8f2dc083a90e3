"""Notifications end to end: the real controller (the chart's multi-tenant rights, plus the Role of
its notification namespace) against the real apiserver, sending to a loopback receiver that
stands in for a webhook, Slack, Teams, GitHub's and GitLab's commit-status APIs.

What must hold: each provider gets its payload for the StageSets its alert selects and no other;
the commit statuses name the commit that was applied (success) or failed (failure); nothing of a
tenant's Secret reaches any payload, though the apiserver echoed it into the failure; providers
and alerts in a tenant's namespace are ignored; sends and failures show in the metrics.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.controller.redact import forms
from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.actionserver import ActionServer, Received
from tests.conftest import Tenant
from tests.e2e.conftest import wait_for
from tests.e2e.metrics import METRICS_ARGS, metrics_url, scrape
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
PLATFORM = "stageset-notify"
GROUP = "/apis/stages.metio.wtf/v1/namespaces/{ns}"
HOOK_TOKEN = "hook-token-7d1e0a"
GITHUB_TOKEN = "ghp-test-token-51c2"
GITLAB_TOKEN = "glpat-test-token-9f3b"
# Substituted into a label: the apiserver refuses it and echoes it in its error (a StageFailed message).
SECRET_LABEL = 'not "a" valid\\label value s3cret'
ECHOING = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: labelled\n  labels: {tier: "${label}"}\n'


@pytest.fixture(scope="module")
def receiver() -> Iterator[ActionServer]:
    with ActionServer() as server:
        yield server


@pytest.fixture(scope="module")
def controller_args(installed: KubeClient, receiver: ActionServer) -> list[str]:
    install.grant_notifications(installed, namespace=PLATFORM)
    # The suspend test's providers, there before the controller first reads the configuration (it
    # reads it again only every 30 s): a StageSet named `paused`, in whichever tenant namespace.
    for path in ("/pause-hook", "/pause-slack"):
        receiver.answer(path, 200)
    provider(installed, "pause-hook", {"type": "generic", "address": receiver.url("/pause-hook")})
    provider(installed, "pause-slack", {"type": "slack", "address": receiver.url("/pause-slack")})
    provider(installed, "pause-github", {"type": "github", "address": receiver.url("/org/paused")})
    for name in ("pause-hook", "pause-slack", "pause-github"):
        alert(installed, name, {"providerRef": {"name": name},
                                "eventSources": [{"kind": "StageSet", "namespace": "*", "name": "paused"}]})
    return ["--notification-namespace", PLATFORM, *METRICS_ARGS]


def secret(admin: KubeClient, namespace: str, name: str, data: dict[str, str]) -> None:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    admin.request("POST", f"/api/v1/namespaces/{namespace}/secrets",
                  body={"metadata": {"name": name}, "data": encoded})


def provider(admin: KubeClient, name: str, spec: dict[str, Any], *, namespace: str = PLATFORM) -> None:
    admin.apply(f"{GROUP.format(ns=namespace)}/notificationproviders/{name}",
                {"apiVersion": "stages.metio.wtf/v1", "kind": "NotificationProvider",
                 "metadata": {"name": name, "namespace": namespace}, "spec": spec}, field_manager="e2e-test")


def alert(admin: KubeClient, name: str, spec: dict[str, Any], *, namespace: str = PLATFORM) -> None:
    admin.apply(f"{GROUP.format(ns=namespace)}/notificationalerts/{name}",
                {"apiVersion": "stages.metio.wtf/v1", "kind": "NotificationAlert",
                 "metadata": {"name": name, "namespace": namespace}, "spec": spec}, field_manager="e2e-test")


def header(request: Received, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), "")


def bodies(receiver: ActionServer, path: str) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in receiver.received(path)]


def events_to(receiver: ActionServer, path: str, reason: str, name: str) -> list[Received]:
    return [r for r in receiver.received(path)
            if (body := json.loads(r.body))["reason"] == reason and body["involvedObject"]["name"] == name]


def test_events_reach_webhook_slack_teams_and_commit_statuses_with_no_secret(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    receiver: ActionServer,
) -> None:
    s = scenario(installed, git_server, make_tenant("notify"),
                 {"app/cm.yaml": cm("app"), "label/cm.yaml": ECHOING, "quiet/cm.yaml": cm("quiet")})
    sha = git_server.head(s.repo)
    github = f"/api/v3/repos/org/repo/statuses/{sha}"
    gitlab = f"/api/v4/projects/group%2Fproject/statuses/{sha}"
    for path in ("/hook", "/slack", "/teams", "/tenant-hook"):
        receiver.answer(path, 200)
    receiver.answer(github, 201)
    receiver.answer(gitlab, 201)
    receiver.answer("/refuses", 400)
    # The platform's configuration: credentials in Secrets beside the providers.
    secret(installed, PLATFORM, "hook", {"address": receiver.url("/hook"), "token": HOOK_TOKEN})
    secret(installed, PLATFORM, "github", {"token": GITHUB_TOKEN})
    secret(installed, PLATFORM, "gitlab", {"token": GITLAB_TOKEN})
    provider(installed, "hook", {"type": "generic", "secretRef": {"name": "hook"}})
    provider(installed, "slack", {"type": "slack", "address": receiver.url("/slack"), "channel": "#releases"})
    provider(installed, "teams", {"type": "msteams", "address": receiver.url("/teams")})
    provider(installed, "github", {"type": "github", "address": receiver.url("/org/repo"),
                                   "secretRef": {"name": "github"}})
    provider(installed, "gitlab", {"type": "gitlab", "address": receiver.url("/group/project.git"),
                                   "secretRef": {"name": "gitlab"}})
    provider(installed, "no-secret", {"type": "generic", "secretRef": {"name": "missing"}})
    provider(installed, "refuses", {"type": "generic", "address": receiver.url("/refuses")})
    selected = [{"kind": "StageSet", "namespace": s.ns, "name": "web"},
                {"kind": "StageSet", "namespace": s.ns, "name": "echo"}]
    for name in ("hook", "slack", "teams", "github", "gitlab", "no-secret", "refuses"):
        alert(installed, name, {"providerRef": {"name": name}, "eventSources": selected,
                                "summary": "cluster: e2e"})
    # A tenant's own provider and alert (in its namespace) are ignored: only the platform's count.
    provider(installed, "mine", {"type": "generic", "address": receiver.url("/tenant-hook")},
             namespace=s.ns)
    alert(installed, "mine", {"providerRef": {"name": "mine"}, "eventSources": [{"name": "*"}]},
          namespace=s.ns)
    secret(installed, s.ns, "values", {"label": SECRET_LABEL})

    s.stageset("web", [{"name": "app", "path": "./app"}])
    s.stageset("quiet", [{"name": "app", "path": "./quiet"}])  # selected by no alert
    s.wait_ready("web")
    s.wait_ready("quiet")
    wait_for(lambda: events_to(receiver, "/hook", "ReconciliationSucceeded", "web"),
             what="the webhook's event")
    [hooked] = events_to(receiver, "/hook", "ReconciliationSucceeded", "web")
    body = json.loads(hooked.body)
    uid = s.get("web")["metadata"]["uid"]
    assert body["involvedObject"] == {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                                      "namespace": s.ns, "name": "web", "uid": uid}
    assert body["severity"] == "info"
    assert body["metadata"] == {"revision": f"main@sha1:{sha}", "summary": "cluster: e2e"}
    assert "ConfigMap" in body["message"]
    assert header(hooked, "Authorization") == f"Bearer {HOOK_TOKEN}"

    wait_for(lambda: receiver.received(github) and receiver.received(gitlab), what="both commit statuses")
    status = receiver.received(github)[0]
    assert json.loads(status.body)["state"] == "success"
    assert json.loads(status.body)["context"] == f"stageset/{s.ns}/web"
    assert header(status, "Authorization") == f"Bearer {GITHUB_TOKEN}"
    status = receiver.received(gitlab)[0]
    assert json.loads(status.body)["state"] == "success"
    assert json.loads(status.body)["name"] == f"stageset/{s.ns}/web"
    assert header(status, "PRIVATE-TOKEN") == GITLAB_TOKEN
    # (Slack and Teams may also have heard the SourceNotReady before the first fetch.)
    succeeded = f"StageSet/{s.ns}/web: ReconciliationSucceeded"
    slack = wait_for(lambda: [b for b in bodies(receiver, "/slack") if b["text"] == succeeded],
                     what="slack's message")[0]
    assert slack["channel"] == "#releases"
    assert slack["attachments"][0]["color"] == "good"
    assert slack["attachments"][0]["text"].startswith("cluster: e2e\n")
    revision = {"title": "revision", "value": f"main@sha1:{sha}", "short": False}
    assert revision in slack["attachments"][0]["fields"]

    def teams_card() -> list[dict[str, Any]]:
        cards = [b["attachments"][0]["content"] for b in bodies(receiver, "/teams")]
        reason = {"title": "reason", "value": "ReconciliationSucceeded"}
        return [c for c in cards if reason in c["body"][2]["facts"]]
    card = wait_for(teams_card, what="teams' card")[0]
    assert card["body"][0]["text"] == f"StageSet/{s.ns}/web"

    # A failure that echoes a tenant's Secret value: the webhook hears StageFailed, redacted, and
    # the commit's status fails.
    s.stageset("echo", [{"name": "app", "path": "./label",
                         "postBuild": {"substituteFrom": [{"kind": "Secret", "name": "values"}]}}])
    s.wait_reason("echo", "StageFailed")
    wait_for(lambda: events_to(receiver, "/hook", "StageFailed", "echo"), what="the failure's webhook")
    failed = json.loads(events_to(receiver, "/hook", "StageFailed", "echo")[0].body)
    assert failed["severity"] == "error"
    assert failed["metadata"]["revision"] == f"main@sha1:{sha}"
    assert "***" in failed["message"], "the echo is there, redacted"
    wait_for(lambda: [b for b in bodies(receiver, github) if b["state"] == "failure"
                      and b["context"] == f"stageset/{s.ns}/echo"], what="the failed commit status")

    everything = "\n".join(r.body.decode() for r in receiver.requests)
    for form in forms(SECRET_LABEL):
        assert form not in everything, f"the Secret's value ({form!r}) reached a receiver"
    assert "quiet" not in everything, "a StageSet no alert selects is told nowhere"
    assert not receiver.received("/tenant-hook"), "a provider in a tenant's namespace is ignored"
    for request in receiver.requests:
        for token in (HOOK_TOKEN, GITHUB_TOKEN, GITLAB_TOKEN):
            assert token not in request.body.decode(), "a token travels in headers only"

    def counted() -> Any:
        found = scrape(metrics_url(controller))
        sent = found.value("stageset_notifications_sent_total", provider="hook", type="generic")
        failing = {p: found.value("stageset_notification_failures_total", provider=p, type="generic")
                   for p in ("no-secret", "refuses")}
        return (sent, failing) if sent >= 2 and all(v >= 2 for v in failing.values()) else None
    wait_for(counted, what="sends and failures in the metrics")
    assert "/refuses" not in controller.output(), "a failure names the receiver's origin, never its path"


# -- issue 43 item 5: tenant text that cannot ping a channel; fair between tenants ---------------------

# Tenant text from Git that the apiserver refuses and echoes in its error (the StageFailed message).
EVIL_TEXT = "<!channel><https://evil.example/approve|Approve release>"
EVIL = f'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: evil\n  labels: {{tier: "{EVIL_TEXT}"}}\n'
FAILING = 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: "Not_A_Valid_Name"}\n'


def test_a_tenants_burst_never_delays_another_tenants_alert_and_its_markup_pings_nobody(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    receiver: ActionServer,
) -> None:
    noisy = scenario(installed, git_server, make_tenant("noisy"), {"bad/cm.yaml": FAILING})
    quiet = scenario(installed, git_server, make_tenant("quiet"), {"evil/x.yaml": EVIL})
    receiver.answer("/fair", 200)
    # (a long timeout: the receiver holds one request for as long as the test needs, never retried)
    provider(installed, "fair", {"type": "slack", "address": receiver.url("/fair"), "channel": "#releases",
                                 "timeout": "10m"})
    alert(installed, "fair", {"providerRef": {"name": "fair"}, "eventSeverity": "error",
                              "eventReasons": ["StageFailed"],
                              "eventSources": [{"kind": "StageSet", "namespace": noisy.ns, "name": "*"},
                                               {"kind": "StageSet", "namespace": quiet.ns, "name": "*"}]})

    def told(namespace: str, name: str) -> list[int]:
        return [i for i, r in enumerate(receiver.received("/fair"))
                if f"StageSet/{namespace}/{name}:" in json.loads(r.body)["text"]]
    # The configuration is read again within its refresh (30 s): a failure every 10 s until one is
    # told says it is in use.
    probes: list[str] = []

    def probed() -> bool:
        if any(told(noisy.ns, p) for p in probes):
            return True
        probes.append(f"probe-{len(probes)}")
        noisy.stageset(probes[-1], [{"name": "app", "path": "./bad"}])
        return False
    wait_for(probed, what="the provider in use", timeout=120, interval=10)

    # The receiver holds the noisy tenant's next alert: everything after it waits in the queue.
    hold = threading.Event()
    receiver.replies["/fair"].hold = hold
    try:
        noisy.stageset("n00", [{"name": "app", "path": "./bad"}])
        wait_for(lambda: told(noisy.ns, "n00"), what="the first alert in flight", timeout=60)
        names = [f"n{n:02d}" for n in range(1, 21)]
        for name in names:
            noisy.stageset(name, [{"name": "app", "path": "./bad"}])
        for name in names:
            noisy.wait_reason(name, "StageFailed", timeout=90)
        quiet.stageset("evil", [{"name": "app", "path": "./evil"}])
        quiet.wait_reason("evil", "StageFailed", timeout=90)
        time.sleep(2)  # the event reaches the outbox (no assertion on time: the order is asserted)
    finally:
        hold.set()
    wait_for(lambda: all(told(noisy.ns, n) for n in names)
             and told(quiet.ns, "evil"), what="every alert sent", timeout=120)
    first = min(told(noisy.ns, "n00"))
    evil = min(told(quiet.ns, "evil"))
    between = [i for n in names for i in told(noisy.ns, n) if first < i < evil]
    assert len(between) <= 1, f"{len(between)} of the noisy tenant's alerts went out before the quiet one's"

    body = json.loads(receiver.received("/fair")[evil].body)
    sent = json.dumps(body)
    assert "<!channel>" not in sent, "a mention"
    assert "<https://evil.example" not in sent, "a disguised link"
    text = body["attachments"][0]["text"]
    assert "&lt;!channel&gt;&lt;https://evil.example/approve|Approve release&gt;" in text, text


def test_suspend_and_resume_are_told_as_a_state_never_as_a_failure(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    receiver: ActionServer,
) -> None:
    """``stageset suspend`` (the dashboard's Suspend: ``spec.suspend``) and resume: a Normal
    ``Suspended`` then ``Resumed`` event, sent as info to a webhook and in green to Slack, no failing
    commit status, and no Warning event on the StageSet.  (Its providers and alerts are made with
    the module's controller: ``controller_args``.)"""
    s = scenario(installed, git_server, make_tenant("pause"), {"app/cm.yaml": cm("app")})
    sha = git_server.head(s.repo)
    github = f"/api/v3/repos/org/paused/statuses/{sha}"
    receiver.answer(github, 201)
    s.stageset("paused", [{"name": "app", "path": "./app"}])
    s.wait_ready("paused")
    wait_for(lambda: [b for b in bodies(receiver, github) if b["state"] == "success"],
             what="the success status")

    def set_suspend(value: bool) -> None:
        installed.request("PATCH", s.path("paused"), content_type="application/merge-patch+json",
                          body={"spec": {"suspend": value}})

    set_suspend(True)
    ready = s.wait_reason("paused", "Suspended")  # the Ready condition
    assert ready["status"] == "False"
    assert "suspended" in ready["message"]
    told = wait_for(lambda: events_to(receiver, "/pause-hook", "Suspended", "paused"),
                    what="the Suspended event")
    assert json.loads(told[0].body)["severity"] == "info"
    set_suspend(False)
    s.wait_ready("paused")
    resumed = wait_for(lambda: events_to(receiver, "/pause-hook", "Resumed", "paused"),
                       what="the Resumed event")
    assert json.loads(resumed[0].body)["severity"] == "info"
    slack = wait_for(lambda: [b for b in bodies(receiver, "/pause-slack")
                              if b["text"] == f"StageSet/{s.ns}/paused: Resumed"], what="slack's Resumed")
    assert slack[0]["attachments"][0]["color"] == "good"

    told_as_failure = [b for b in bodies(receiver, "/pause-hook") if b["severity"] == "error"]
    assert not told_as_failure, told_as_failure
    assert all(b["attachments"][0]["color"] == "good" for b in bodies(receiver, "/pause-slack"))
    states = {b["state"] for b in bodies(receiver, github)}
    assert states == {"success"}, "no failing (nor pending) commit status"  # the resume's pass: success
    events = installed.request("GET", f"/apis/events.k8s.io/v1/namespaces/{s.ns}/events",
                               query={"fieldSelector": "regarding.name=paused"})["items"]
    assert {(e["type"], e["reason"]) for e in events} >= {("Normal", "Suspended"), ("Normal", "Resumed")}
    assert not [e for e in events if e["type"] == "Warning"], [(e["reason"], e.get("note")) for e in events]
