"""The action plan's rules (:mod:`stageset.controller.stageset.actionplan`), table by table, and the
action models' own checks.  Pure: no cluster, no clock but the one passed in."""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest
from pydantic import ValidationError

from stageset.api import THIS_CLUSTER, Stage
from stageset.api.actions import ActionLedger, ActionRun, Hook, LabelSelector, PatchAction, StageActions
from stageset.controller.stageset import actionplan as plan

NOW = datetime.datetime(2030, 1, 1, 12, 0, tzinfo=datetime.UTC)
T0 = "2030-01-01T12:00:00Z"


def stage(**fields: Any) -> Stage:
    return Stage.model_validate({"name": "app", "sourceRef": {"name": "app"}, **fields})


def action(**fields: Any) -> Any:
    body = {"name": "a", **fields}
    if not any(verb in body for verb in ("job", "http", "wait", "patch", "delete", "apply")):
        body["wait"] = {"duration": "1s"}
    return StageActions.model_validate({"pre": [body]}).pre[0]


def ledger(**fields: Any) -> ActionLedger:
    return ActionLedger.model_validate({"revision": "main@sha1:1", "inputs": "sha256:1", **fields})


# -- what a revision is ----------------------------------------------------------------------------

BASE = plan.inputs_digest(stage(path="./app"), {"tier": "gold", "token": "hunter2"}, ["hunter2"])


@pytest.mark.parametrize(
    ("what", "digest", "same"),
    [
        (
            "the same inputs",
            plan.inputs_digest(stage(path="./app"), {"token": "hunter2", "tier": "gold"}, ["hunter2"]),
            True,
        ),
        (
            "a rotated Secret value",
            plan.inputs_digest(stage(path="./app"), {"tier": "gold", "token": "s3cret"}, ["s3cret"]),
            True,
        ),
        (
            "another path",
            plan.inputs_digest(stage(path="./prod"), {"tier": "gold", "token": "hunter2"}, ["hunter2"]),
            False,
        ),
        (
            "a ConfigMap value",
            plan.inputs_digest(stage(path="./app"), {"tier": "silver", "token": "hunter2"}, ["hunter2"]),
            False,
        ),
        (
            "a patch",
            plan.inputs_digest(
                stage(path="./app", patches=[{"patch": "kind: Deployment\nmetadata: {name: w}"}]),
                {"tier": "gold", "token": "hunter2"},
                ["hunter2"],
            ),
            False,
        ),
        ("no postBuild at all", plan.inputs_digest(stage(path="./app"), None, []), False),
    ],
)
def test_what_changes_the_revision_actions_run_for(what: str, digest: str, same: bool) -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", digest)
    assert (digest == BASE) is same, what


REMOTE = "https://far:6443#0123456789abcdef"


@pytest.mark.parametrize(
    ("before", "revision", "inputs", "target", "kept"),
    [
        (None, "main@sha1:1", "sha256:1", THIS_CLUSTER, False),
        (ledger(executed=["a"]), "main@sha1:1", "sha256:1", THIS_CLUSTER, True),
        (ledger(executed=["a"]), "main@sha1:2", "sha256:1", THIS_CLUSTER, False),
        (ledger(executed=["a"]), "main@sha1:1", "sha256:2", THIS_CLUSTER, False),
        # A move to another cluster starts over: pre and post run there once.
        (ledger(executed=["a"]), "main@sha1:1", "sha256:1", REMOTE, False),
        (ledger(executed=["a"], target=REMOTE), "main@sha1:1", "sha256:1", REMOTE, True),
        (ledger(executed=["a"], target=REMOTE), "main@sha1:1", "sha256:1", THIS_CLUSTER, False),
    ],
)
def test_a_new_revision_or_target_starts_a_new_ledger(
    before: ActionLedger | None, revision: str, inputs: str, target: str, kept: bool
) -> None:
    found = plan.ledger_for(before, revision=revision, inputs=inputs, target=target)
    assert (found is before) is kept
    assert found.key() == (revision, inputs, target)
    # This cluster is never written as a target: a ledger older than targets reads the same.
    assert found.target == (None if target == THIS_CLUSTER else target)
    if not kept:
        assert (found.executed, found.running, found.on_failure_ran) == ([], None, None)


def test_pending_keeps_the_order_and_skips_what_ran() -> None:
    actions = StageActions.model_validate(
        {"pre": [{"name": n, "wait": {"duration": "1s"}} for n in "abc"]}
    ).pre
    assert [a.name for a in plan.pending(actions, ledger(executed=["b"]))] == ["a", "c"]
    assert plan.pending(actions, ledger(executed=["a", "b", "c"])) == []


# -- attempts --------------------------------------------------------------------------------------


def test_started_keeps_an_action_in_progress_and_starts_another_afresh() -> None:
    a, fresh = action(), ledger()
    first = plan.started(fresh, Hook.PRE, a, now=NOW)
    assert first.running == ActionRun(hook="pre", name="a", since=T0)
    later = plan.started(first, Hook.PRE, a, now=NOW + datetime.timedelta(minutes=5))
    assert later is first
    other = plan.started(
        ledger(running={"hook": "pre", "name": "b", "since": T0, "attempt": 2}), Hook.PRE, a, now=NOW
    )
    assert other.running is not None
    assert (other.running.name, other.running.attempt) == ("a", 0)


@pytest.mark.parametrize(
    ("attempt", "seconds"), [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (50, 30.0)]
)
def test_backoff_doubles_up_to_a_cap(attempt: int, seconds: float) -> None:
    assert plan.backoff(attempt) == seconds


@pytest.mark.parametrize(
    ("retries", "attempt", "retryable", "elapsed", "timeout", "final", "retry_in"),
    [
        (None, 0, True, 0, 600, True, None),  # no retries
        (2, 0, True, 0, 600, False, 1.0),  # first failure: again in 1s
        (2, 1, True, 10, 600, False, 2.0),  # second: 2s
        (2, 2, True, 10, 600, True, None),  # three attempts made
        (5, 0, False, 0, 600, True, None),  # a refusal is not retried
        (5, 1, True, 599, 600, True, None),  # the retry would start after the timeout
    ],
)
def test_a_failed_attempt_is_retried_while_retries_and_time_allow(
    retries: int | None,
    attempt: int,
    retryable: bool,
    elapsed: float,
    timeout: float,
    final: bool,
    retry_in: float | None,
) -> None:
    a = action(retries=retries)
    started = ledger(running={"hook": "pre", "name": "a", "since": T0, "attempt": attempt, "run": 3})
    now = NOW + datetime.timedelta(seconds=elapsed)
    failed = plan.attempt_failed(started, a, now=now, timeout=timeout, retryable=retryable, error="boom")
    assert failed.final is final
    if final:
        assert failed.ledger.running is None
        return
    running = failed.ledger.running
    assert running is not None
    assert (running.attempt, running.error, running.run, running.since) == (attempt + 1, "boom", None, T0)
    assert plan.retry_wait(running, now=now) == retry_in
    assert plan.retry_wait(running, now=now + datetime.timedelta(seconds=60)) == 0.0


@pytest.mark.parametrize(
    ("fields", "stage_timeout", "seconds"),
    [
        ({}, 900.0, 900.0),
        ({"timeout": "10m"}, 900.0, 600.0),
        ({"timeout": "1h"}, 900.0, 3600.0),
        (
            {"wait": {"target": {"kind": "ConfigMap", "name": "c"}, "expr": "true", "timeout": "30s"}},
            900.0,
            30.0,
        ),
        (
            {
                "timeout": "10s",
                "wait": {"target": {"kind": "ConfigMap", "name": "c"}, "expr": "true", "timeout": "30s"},
            },
            900.0,
            10.0,
        ),
    ],
)
def test_an_actions_timeout(fields: dict[str, Any], stage_timeout: float, seconds: float) -> None:
    assert plan.timeout_seconds(action(**fields), stage_timeout=stage_timeout) == seconds


def test_timeout_counts_from_the_first_attempt() -> None:
    running = ActionRun(hook="pre", name="a", since=T0, attempt=3)
    assert not plan.expired(running, now=NOW + datetime.timedelta(seconds=59), timeout=60)
    assert plan.expired(running, now=NOW + datetime.timedelta(seconds=60), timeout=60)
    assert plan.remaining(running, now=NOW + datetime.timedelta(seconds=45), timeout=60) == 15


def test_completed_records_once_and_clears_what_ran() -> None:
    a = action()
    done = plan.completed(plan.started(ledger(executed=["x"]), Hook.PRE, a, now=NOW), a)
    assert (done.executed, done.running) == (["x", "a"], None)
    assert plan.completed(done, a).executed == ["x", "a"]


def test_on_failure_runs_once_per_failure() -> None:
    fresh = ledger()
    assert plan.failure_due(fresh)
    handled = plan.failure_handled(fresh)
    assert not plan.failure_due(handled)
    assert plan.failure_due(plan.recovered(handled))
    assert plan.recovered(fresh) is fresh


# -- http ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "patterns", "allowed"),
    [
        ("hooks.example.com", (), False),
        ("hooks.example.com", ("hooks.example.com",), True),
        ("HOOKS.example.com.", ("hooks.example.com",), True),
        ("evil-hooks.example.com", ("hooks.example.com",), False),
        ("a.b.internal", ("*.internal",), True),
        ("internal", ("*.internal",), False),
        ("internal.evil.com", ("*.internal",), False),
        ("10.0.0.7", ("10.0.0.*",), True),
        ("[fd00::1]", ("fd00::1",), True),
        ("anything.at.all", ("*",), True),
        ("", ("*",), False),
    ],
)
def test_allowed_action_hosts(host: str, patterns: tuple[str, ...], allowed: bool) -> None:
    assert plan.host_allowed(host, patterns) is allowed


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (500, True),
        (503, True),
        (408, True),
        (429, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (302, True),
        (200, True),
    ],
)
def test_which_http_answers_are_retried(status: int, retryable: bool) -> None:
    assert plan.http_retryable(status) is retryable


# -- Jobs ------------------------------------------------------------------------------------------


def test_job_names_are_fixed_by_action_revision_and_run_and_fit_a_label() -> None:
    name = plan.job_name(
        "migrate-database-schema-for-the-payments-ledger-service-v2", action="x", revision="r", run=0
    )
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert name == plan.job_name(
        "migrate-database-schema-for-the-payments-ledger-service-v2", action="x", revision="r", run=0
    )
    others = {
        plan.job_name("m", action=a, revision=r, run=n)
        for a, r, n in [("x", "r", 0), ("x", "r", 1), ("x", "s", 0), ("y", "r", 0)]
    }
    assert len(others) == 4
    label = plan.action_label(namespace="shop", stageset="s" * 253, stage="app", hook=Hook.PRE, action="a")
    assert re.fullmatch(r"[0-9a-f]{16}", label)
    assert label != plan.action_label(
        namespace="shop", stageset="s" * 253, stage="app", hook=Hook.POST, action="a"
    )


# -- what stageset diff says -----------------------------------------------------------------------

ACTIONS = StageActions.model_validate(
    {
        "pre": [{"name": "migrate", "job": {"sourceRef": {"name": "m"}}}],
        "post": [
            {"name": "smoke", "http": {"url": "https://x.example/"}},
            {"name": "purge", "wait": {"duration": "1s"}},
        ],
        "onFailure": [{"name": "page", "http": {"url": "https://x.example/page"}}],
    }
)


@pytest.mark.parametrize(
    ("before", "revision", "expected"),
    [
        (
            None,
            "r1",
            [
                ("pre", "migrate", True, "never ran"),
                ("post", "smoke", True, "never ran"),
                ("post", "purge", True, "never ran"),
            ],
        ),
        (
            ledger(
                revision="r1",
                inputs="i",
                executed=["migrate"],
                running={"hook": "post", "name": "smoke", "since": T0},
            ),
            "r1",
            [
                ("pre", "migrate", False, "ran for r1"),
                ("post", "smoke", True, f"in progress since {T0}"),
                ("post", "purge", True, "not run for this revision yet"),
            ],
        ),
        (
            ledger(revision="r1", inputs="i", executed=["migrate", "smoke", "purge"]),
            "r2",
            [
                ("pre", "migrate", True, "new revision"),
                ("post", "smoke", True, "new revision"),
                ("post", "purge", True, "new revision"),
            ],
        ),
    ],
)
def test_what_diff_says_each_action_would_do(
    before: ActionLedger | None, revision: str, expected: list[tuple[str, str, bool, str]]
) -> None:
    planned = plan.preview(ACTIONS, before, revision=revision, inputs="i", target=THIS_CLUSTER)
    assert [(p.hook.value, p.name, p.runs, p.why) for p in planned] == [
        *expected,
        ("onFailure", "page", False, "runs only if the stage fails"),
    ]


# -- the models' own checks (beyond what the CRD can say) ------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"patch": "spec: {replicas: 3}"}, None),
        ({"patch": '{"spec": {"replicas": 3}}'}, None),
        ({"patch": "- op: add"}, "a merge patch must be an object"),
        ({"type": "json6902", "patch": '[{"op": "replace", "path": "/spec/replicas", "value": 3}]'}, None),
        ({"type": "json6902", "patch": "spec: {}"}, "a json6902 patch must be a list of operations"),
        ({"patch": "spec: [unclosed"}, "patch is neither JSON nor YAML"),
    ],
)
def test_a_patch_must_parse_as_its_type(fields: dict[str, Any], error: str | None) -> None:
    body = {"target": {"kind": "Service", "name": "web"}, **fields}
    if error is None:
        assert PatchAction.model_validate(body).body()
        return
    with pytest.raises(ValidationError, match=re.escape(error)):
        PatchAction.model_validate(body)


def test_a_label_selector_as_a_query() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"app": "web", "tier": "db"},
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "owner", "operator": "Exists"},
            ],
        }
    )
    assert selector.query() == "app=web,tier=db,zone in (a,b),!canary,env notin (dev),owner"


def test_the_sources_of_job_and_apply_actions_wake_their_stageset() -> None:
    from stageset.controller.sourcekinds import OUR_GROUP, DefaultSourceKind, SourceObject, referenced

    stageset = {"metadata": {"namespace": "shop"}, "spec": {"stages": [{
        "name": "app", "sourceRef": {"name": "app"}, "actions": {
            "pre": [{"name": "m", "job": {"sourceRef": {"name": "migrations"}}}],
            "post": [{"name": "h", "http": {"url": "https://x.example/"}}],
            "onFailure": [{"name": "p", "apply": {"sourceRef": {"name": "page", "namespace": "ops"}}}],
        }}]}}
    assert referenced(stageset, DefaultSourceKind.GIT_REPOSITORY) == {
        SourceObject(OUR_GROUP, "GitRepository", "shop", "app"),
        SourceObject(OUR_GROUP, "GitRepository", "shop", "migrations"),
        SourceObject(OUR_GROUP, "GitRepository", "ops", "page"),
    }
