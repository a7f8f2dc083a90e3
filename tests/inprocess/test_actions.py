"""A stage's actions, in process: the real reconciler and ledger over the recording fake cluster.

Which requests, as whom, in which order — and what a second reconcile, a restart or a new revision
runs again.  Time is the injected clock; the readiness slice is zero, so every step looks once and
says what it waits for.  ``http`` actions call a real server on loopback.
"""

from __future__ import annotations

import base64
import html
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from stageset.controller.redact import MASK, MIN_CUT, LogRedactor, Redactor
from stageset.controller.stageset.actionsteps import _answer
from stageset.kube.types import KubeObject
from tests.actionserver import ActionServer
from tests.inprocess.conftest import NS, TENANT, World, configmap, stageset_path
from tests.inprocess.fakes import CONTROLLER

MIGRATIONS = "https://git.example/migrations.git"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"


def job(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "template": {
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "migrate:1"}]}
                }
            },
        }
    )


def jobs(world: World) -> dict[str, KubeObject]:
    return {p: o for p, o in world.cluster.objects.items() if p.startswith(JOBS + "/")}


def finish(world: World, path: str, condition: str = "Complete") -> None:
    world.cluster.set_status(
        path,
        {
            "conditions": [
                {
                    "type": condition,
                    "status": "True",
                    "reason": "BackoffLimitExceeded" if condition == "Failed" else "",
                }
            ]
        },
    )


def stage_status(world: World) -> dict[str, Any]:
    (stage,) = world.get("shop")["status"]["stages"]
    return dict(stage)


def creates(world: World, prefix: str) -> list[str]:
    return [r.path for r in world.cluster.requests if r.verb == "create" and r.path.startswith(prefix)]


def with_migration(
    world: World,
    *,
    post: list[dict[str, Any]] | None = None,
    on_failure: list[dict[str, Any]] | None = None,
    **action: Any,
) -> None:
    world.commit({"jobs/migrate.json": job("migrate")}, url=MIGRATIONS, name="migrations")
    actions: dict[str, Any] = {
        "pre": [{"name": "migrate", "job": {"sourceRef": {"name": "migrations"}, "path": "./jobs"}, **action}]
    }
    if post:
        actions["post"] = post
    if on_failure:
        actions["onFailure"] = on_failure
    world.stageset("shop", [{"name": "app", "path": "./app", "actions": actions}])


def test_a_pre_job_gates_the_apply_and_runs_once_per_revision(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    with_migration(world)

    world.reconcile("shop")
    ((path, created),) = jobs(world).items()
    assert creates(world, JOBS) == [JOBS]
    assert [r.user for r in world.cluster.requests if r.path.startswith(JOBS)] == [
        TENANT
    ] * 3  # list, create, list
    labels = created["metadata"]["labels"]
    assert labels["stages.metio.wtf/action-run"] == "0"
    assert created["spec"]["ttlSecondsAfterFinished"] == 86400
    assert world.configmap("a") is None  # nothing applied before the migration completed
    status = stage_status(world)
    assert status["phase"] == "Waiting"
    assert "pre action 'migrate': Job shop/migrate-" in status["message"]
    assert status["actions"]["running"]["name"] == "migrate"

    # A requeue, and a restart that lost what was in progress: the Job is found, not created again.
    world.reconcile("shop")
    world.cluster.objects[stageset_path("shop")]["status"]["stages"][0]["actions"].pop("running")
    world.reconciler = world.make_reconciler()
    world.reconcile("shop")
    assert creates(world, JOBS) == [JOBS]

    finish(world, path)
    world.reconcile("shop")
    assert world.configmap("a") is not None
    assert world.ready("shop")["status"] == "True"
    ledger = stage_status(world)["actions"]
    assert ledger["executed"] == ["migrate"]
    assert ledger["revision"].startswith("main@sha1:")
    assert "running" not in ledger

    # Ready at the same revision: the migration is not run again, however often it reconciles.
    world.cluster.clear()
    world.reconciler = world.make_reconciler()
    world.reconcile("shop")
    world.reconcile("shop")
    assert [r for r in world.cluster.requests if r.path.startswith(JOBS)] == []
    assert [r for r in world.cluster.requests if r.write] == []  # a quiet pass: no write at all
    assert world.cluster.requests  # (it did look: the stage was dry-run)

    # A new revision runs it again (a new Job), and the last revision's Job goes.
    world.commit({"app/a.json": configmap("a", "v2")})
    world.reconcile("shop")
    assert creates(world, JOBS) == [JOBS]
    ((new_path, _),) = jobs(world).items()
    assert new_path != path


def test_a_failed_pre_job_applies_nothing_is_retried_and_skips_on_failure(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.commit({"cleanup/cm.json": configmap("cleaned")}, url="https://git.example/c.git", name="cleanup")
    with_migration(
        world,
        retries=1,
        on_failure=[{"name": "cleanup", "apply": {"sourceRef": {"name": "cleanup"}, "path": "./cleanup"}}],
    )
    world.reconcile("shop")
    ((first, _),) = jobs(world).items()
    finish(world, first, "Failed")
    world.reconcile("shop")
    status = stage_status(world)
    assert status["phase"] == "Waiting"
    assert "attempt 1 of 2 failed (Job shop/migrate-" in status["message"]
    assert status["actions"]["running"]["attempt"] == 1

    world.clock.advance(2)
    world.reconcile("shop")
    second = next(p for p in jobs(world) if p != first)
    assert jobs(world)[second]["metadata"]["labels"]["stages.metio.wtf/action-run"] == "1"
    finish(world, second, "Failed")
    world.reconcile("shop")

    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "ActionFailed")
    assert "pre action 'migrate' failed: Job shop/migrate-" in ready["message"]
    assert "(attempt 2 of 2); nothing was applied" in ready["message"]
    assert world.configmap("a") is None
    assert world.configmap("cleaned") is None  # onFailure runs from the apply on, not for pre
    assert "running" not in stage_status(world)["actions"]


def _events(world: World) -> list[KubeObject]:
    return [o for p, o in world.cluster.objects.items() if "/events/" in p]


@pytest.fixture
def server() -> Iterator[ActionServer]:
    with ActionServer() as running:
        yield running


def test_post_http_gates_ready_with_a_secret_header_that_never_leaves(
    world: World, server: ActionServer, caplog: pytest.LogCaptureFixture
) -> None:
    token = "s3cr3t-gate-token"
    world.cluster.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gate", "namespace": NS},
            "data": {"Authorization": base64.b64encode(f"Bearer {token}".encode()).decode()},
        }
    )
    # The endpoint echoes the header back in its error, as careless ones do.
    url = server.answer("/smoke", 503, body=f"unavailable: token {token} is not known here".encode())
    world.reconciler = world.make_reconciler(allowed_action_hosts=("127.0.0.1",), allow_insecure_sources=True)
    world.commit({"app/a.json": configmap("a")})
    world.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {
                    "post": [
                        {
                            "name": "smoke",
                            "retries": 2,
                            "http": {
                                "url": url,
                                "method": "GET",
                                "expectedStatus": [200],
                                "headersFrom": [{"name": "gate", "key": "Authorization"}],
                            },
                        }
                    ],
                    "onFailure": [
                        {"name": "page", "http": {"url": server.url("/page"), "body": '{"stage": "app"}'}}
                    ],
                },
            }
        ],
    )
    server.answer("/page", 202)

    with caplog.at_level(logging.DEBUG):
        world.reconcile("shop")
        assert world.configmap("a") is not None  # applied first: post runs once the stage is ready
        status = stage_status(world)
        assert status["phase"] == "Waiting"
        assert "attempt 1 of 3 failed (GET http://127.0.0.1" in status["message"]
        assert "answered HTTP 503" in status["message"]
        (first,) = server.received("/smoke")
        assert first.headers["Authorization"] == f"Bearer {token}"
        assert [r.path for r in world.cluster.requests if "/secrets/" in r.path and r.user == TENANT]

        server.answer("/smoke", 200)
        world.clock.advance(2)
        world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert stage_status(world)["actions"]["executed"] == ["smoke"]
    assert server.received("/page") == []  # no failure: onFailure never ran
    everything = json.dumps([world.get("shop")["status"], _events(world)]) + caplog.text
    assert token not in everything
    assert "unavailable: token" not in everything  # the request carried a Secret: no body is shown
    assert "the response is not shown, as the request carried values from a Secret" in everything
    assert any(e.get("reason") == "ActionSucceeded" for e in _events(world))
    assert all(r.user in (TENANT, CONTROLLER) for r in world.cluster.requests)
    assert not [r for r in world.cluster.requests if "/secrets/" in r.path and r.user == CONTROLLER]


def test_a_failing_post_action_fails_the_stage_and_runs_on_failure_once(
    world: World, server: ActionServer
) -> None:
    server.answer("/smoke", 404, body=b"no such thing")
    server.answer("/page", 202)
    world.reconciler = world.make_reconciler(allowed_action_hosts=("127.0.0.*",), allow_insecure_sources=True)
    world.commit({"app/a.json": configmap("a")})
    world.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {
                    "post": [{"name": "smoke", "retries": 3, "http": {"url": server.url("/smoke")}}],
                    "onFailure": [
                        {"name": "page", "http": {"url": server.url("/page"), "body": '{"stage": "app"}'}},
                        {
                            "name": "annotate",
                            "patch": {
                                "target": {"kind": "ConfigMap", "name": "a"},
                                "patch": "metadata: {annotations: {failed: 'yes'}}",
                            },
                        },
                    ],
                },
            }
        ],
    )
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "ActionFailed")
    # A 404 is not retried: the same request gets the same answer.
    assert "post action 'smoke' failed: POST http://127.0.0.1" in ready["message"]
    assert "answered HTTP 404, expected 2xx: no such thing" in ready["message"]
    assert "(onFailure: page ran, annotate ran)" in ready["message"]
    assert len(server.received("/smoke")) == 1
    (page,) = server.received("/page")
    assert (page.method, page.body, page.headers["Content-Type"]) == (
        "POST",
        b'{"stage": "app"}',
        "application/json",
    )
    assert (world.configmap("a") or {})["metadata"]["annotations"] == {"failed": "yes"}
    assert [r.user for r in world.cluster.requests if r.verb == "patch" and "/configmaps/" in r.path] == [
        TENANT
    ]

    # Still failing: onFailure does not run again until the stage was Ready.
    world.reconcile("shop")
    assert len(server.received("/page")) == 1
    assert len(server.received("/smoke")) == 2  # the post action itself is retried at retryInterval
    server.answer("/smoke", 200)
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True"
    assert stage_status(world)["actions"].get("onFailureRan") is None


@pytest.mark.parametrize(
    ("allowed", "says"),
    [
        ((), "--allowed-action-hosts is empty: no host is allowed"),
        (("alerts.example.com", "*.internal"), "--allowed-action-hosts lists alerts.example.com, *.internal"),
    ],
)
def test_a_host_not_allowed_is_never_called(
    world: World, server: ActionServer, allowed: tuple[str, ...], says: str
) -> None:
    url = server.answer("/hook")
    world.reconciler = world.make_reconciler(allowed_action_hosts=allowed, allow_insecure_sources=True)
    world.commit({"app/a.json": configmap("a")})
    world.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {"pre": [{"name": "approve", "retries": 5, "http": {"url": url}}]},
            }
        ],
    )
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "ActionFailed")
    assert f"host 127.0.0.1 is not allowed for actions (the controller's {says})" in ready["message"]
    assert server.requests == []
    assert world.configmap("a") is None


def test_an_expression_wait_times_out_by_the_clock_and_a_duration_wait_spans_passes(world: World) -> None:
    world.commit({"app/a.json": configmap("a", "blue")})
    world.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {
                    "pre": [{"name": "settle", "wait": {"duration": "30s"}}],
                    "post": [
                        {
                            "name": "green",
                            "timeout": "1m",
                            "wait": {
                                "target": {"kind": "ConfigMap", "name": "a"},
                                "expr": "self.data.k == 'green'",
                                "timeout": "10s",
                            },
                        }
                    ],
                },
            }
        ],
    )
    world.reconcile("shop")
    assert "pre action 'settle': waiting 30s more of 30s" in stage_status(world)["message"]
    world.clock.advance(31)
    world.reconcile("shop")
    assert world.configmap("a") is not None
    assert (
        "post action 'green': self.data.k == 'green' does not hold on ConfigMap shop/a yet"
        in stage_status(world)["message"]
    )
    world.clock.advance(11)
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "ActionFailed")
    assert "post action 'green' failed: did not complete within 10s" in ready["message"]


def test_a_denied_action_is_rbac_denied_and_not_retried(world: World) -> None:
    world.commit({"app/a.json": configmap("a")})
    world.stageset(
        "shop",
        [
            {
                "name": "app",
                "path": "./app",
                "actions": {
                    "post": [
                        {
                            "name": "drop",
                            "retries": 3,
                            "delete": {
                                "target": {
                                    "apiVersion": "v1",
                                    "kind": "ConfigMap",
                                    "name": "x",
                                    "namespace": "kube-system",
                                }
                            },
                        }
                    ]
                },
            }
        ],
    )
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "RBACDenied")
    assert (
        "post action 'drop' failed: system:serviceaccount:shop:deployer may not delete ConfigMap x"
        in ready["message"]
    )
    assert [r.user for r in world.cluster.requests if "kube-system" in r.path] == [TENANT]


ECHOES: dict[str, Callable[[str], str]] = {
    "url": lambda v: quote(v, safe=""),
    "form": lambda v: urlencode({"authorization": v}),
    "hex": lambda v: v.encode().hex(),
    "HEX": lambda v: v.encode().hex().upper(),
    "html": lambda v: html.escape(f"<p>{v}</p>"),
    "html-numeric": lambda v: v.encode("ascii", "xmlcharrefreplace").decode().replace("/", "&#47;"),
    "json": lambda v: json.dumps({"header": v}),
    "base64": lambda v: base64.b64encode(f"Authorization: {v}".encode()).decode(),
    "split": lambda v: v[:17] + "\r\n  " + v[17:],
    # The value straddling what a message may quote (it used to leave a prefix of the token).
    "at-the-cut": lambda v: "x" * 230 + v,
}


@pytest.mark.parametrize("encoding", sorted(ECHOES))
def test_an_endpoint_that_reflects_a_secret_header_leaks_it_nowhere(
    world: World, server: ActionServer, caplog: pytest.LogCaptureFixture, encoding: str
) -> None:
    """The attack of issue 30: an allowed endpoint answers an error that reflects the header it was
    sent, encoded; the Ready message, the ActionFailed event and the controller's log (through the
    log filter the controller installs) hold no form of it, and say what the endpoint answered."""
    token = "tok_9c2e81d4b5a0/Zq+w==:ünï"
    header = f"Bearer {token}"
    world.cluster.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gate", "namespace": NS},
            "data": {"Authorization": base64.b64encode(header.encode()).decode()},
        }
    )
    reflect = ECHOES[encoding]
    url = server.answer(
        "/smoke", 500, echo=lambda headers: f"error: {reflect(headers['Authorization'])} refused".encode()
    )
    world.reconciler = world.make_reconciler(allowed_action_hosts=("127.0.0.1",), allow_insecure_sources=True)
    world.commit({"app/a.json": configmap("a")})
    smoke = {
        "name": "smoke",
        "http": {"url": url, "headersFrom": [{"name": "gate", "key": "Authorization"}]},
    }
    world.stageset("shop", [{"name": "app", "path": "./app", "actions": {"post": [smoke]}}])
    caplog.handler.addFilter(LogRedactor())  # as the controller's log setup does

    with caplog.at_level(logging.DEBUG):
        world.reconcile("shop")
    (received,) = server.received("/smoke")
    assert received.headers["Authorization"] == header  # it was sent, and echoed

    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "ActionFailed")
    assert "post action 'smoke' failed: POST http://127.0.0.1" in ready["message"]
    assert "answered HTTP 500, expected 2xx: the response is not shown" in ready["message"]
    failed = [e for e in _events(world) if e.get("reason") == "ActionFailed"]
    assert failed
    assert "answered HTTP 500" in failed[0]["note"]
    assert "post action 'smoke' failed" in caplog.text

    everything = json.dumps([world.get("shop")["status"], _events(world)]) + caplog.text
    for piece in ("9c2e81d4", "tok_9c2e", "Zq+w", "Zq%2Bw", "Zq%2bw"):
        assert piece not in everything, f"{piece} leaked through the {encoding} echo"
    for name, encode in ECHOES.items():
        assert encode(token)[:12] not in everything, (encoding, name)
    # Nor did anything of the body reach a message: its words are not there either.
    assert "refused" not in everything


@pytest.mark.parametrize("encoding", ["url", "hex", "html-numeric", "split", "at-the-cut"])
def test_an_answer_without_secrets_is_quoted_redacted_before_it_is_cut(encoding: str) -> None:
    """A request that carried nothing from a Secret shows an excerpt of the answer; a value the
    StageSet read elsewhere (substituted, decrypted) is redacted in it before the excerpt is cut."""
    value = "s3cr3t-substituted-Value/42"
    body = f"error: {ECHOES[encoding](value)} refused\x1b[31m".encode()
    said = _answer(body, carried_secrets=False, redact=Redactor([value]))
    assert MASK in said
    assert len(said) <= 256
    assert "\x1b" not in said  # printable only
    for size in range(MIN_CUT, len(value) + 1):
        assert ECHOES[encoding](value[:size]) not in said or size < MIN_CUT, said
    assert "s3cr3t" not in said
    # A body longer than what is read: the value straddling the read is masked as a prefix.
    long = b"y" * (4096 - 10) + value.encode()
    assert "s3cr3t" not in _answer(long, carried_secrets=False, redact=Redactor([value]))
    assert _answer(body, carried_secrets=True, redact=Redactor()) == (
        "the response is not shown, as the request carried values from a Secret"
    )


def test_an_apply_action_writes_no_object_another_stageset_holds_a_patch_action_may(world: World) -> None:
    """The rule (docs/actions.md, "Whose objects an action may write"): ``apply`` renders desired state
    as a stage does and is held to the same ownership (``OwnershipConflict``, nothing written);
    ``patch`` and ``delete`` act on what they name, as the stage's identity may."""
    shared = f"/api/v1/namespaces/{NS}/configmaps/shared"
    world.commit({"app/shared.json": configmap("shared", "holder's")}, url="https://git.example/holder.git",
                 name="holder-src")
    world.stageset("holder", [{"name": "app", "path": "./app", "sourceRef": {"name": "holder-src"}}])
    world.reconcile("holder")
    assert world.ready("holder")["status"] == "True"

    world.commit({"app/a.json": configmap("a"), "extra/shared.json": configmap("shared", "mine"),
                  "tag/t.json": configmap("t")})
    apply_action = {"name": "extra", "apply": {"sourceRef": {"name": "app"}, "path": "./extra"}}
    world.stageset("shop", [{"name": "app", "path": "./app", "actions": {"post": [apply_action]}}])
    world.cluster.clear()
    world.reconcile("shop")
    ready = world.ready("shop")
    assert (ready["status"], ready["reason"]) == ("False", "OwnershipConflict")
    assert f"ConfigMap {NS}/shared is held by StageSet {NS}/holder" in ready["message"]
    assert [r.verb for r in world.cluster.requests if r.path == shared and r.verb != "get"] == [], \
        "nothing written to the holder's object"
    assert world.configmap("shared")["data"] == {"k": "holder's"}  # type: ignore[index]

    target = {"apiVersion": "v1", "kind": "ConfigMap", "name": "shared"}
    marked = "metadata: {annotations: {marked: 'yes'}}"
    patch_action = {"name": "mark", "patch": {"target": target, "patch": marked}}
    world.stageset("tagger", [{"name": "app", "path": "./tag", "actions": {"post": [patch_action]}}])
    world.reconcile("tagger")
    assert world.ready("tagger")["status"] == "True"
    assert world.configmap("shared")["metadata"]["annotations"]["marked"] == "yes"  # type: ignore[index]
