"""The dashboard's action guard and a Secret's live view (pure parts; the browser tests drive the rest)."""

from __future__ import annotations

from stageset.cli.dashboard.actions import Guard, Refusal
from stageset.cli.dashboard.objects import LAST_APPLIED, shown
from stageset.cli.releases import history_rows

HOST = "127.0.0.1:8090"


def test_a_post_needs_the_dashboard_s_own_origin_and_the_session_s_token() -> None:
    guard = Guard()
    session = Guard.new_session()
    token = guard.token(session)
    same = {"host": HOST, "origin": f"http://{HOST}", "sec-fetch-site": "same-origin"}
    assert guard.refusal(headers=same, scheme="http", session=session, token=token) is None
    for headers in (
        {**same, "origin": "http://127.0.0.1:9999"},  # another port: same site, another origin
        {**same, "origin": "null"},
        {"host": HOST},  # no Origin at all
        {**same, "sec-fetch-site": "same-site"},
        {**same, "origin": f"https://{HOST}"},
    ):
        assert guard.refusal(headers=headers, scheme="http", session=session, token=token) \
            is Refusal.CROSS_ORIGIN, headers
    assert guard.refusal(headers=same, scheme="http", session=None, token=token) is Refusal.NO_SESSION
    other = Guard.new_session()
    assert guard.refusal(headers=same, scheme="http", session=other, token=token) is Refusal.BAD_TOKEN
    assert guard.refusal(headers=same, scheme="http", session=session, token=None) is Refusal.BAD_TOKEN
    # Another dashboard process (another key) does not accept this one's tokens.
    assert Guard().refusal(headers=same, scheme="http", session=session, token=token) is Refusal.BAD_TOKEN


def test_a_live_secret_shows_no_value() -> None:
    secret = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "managedFields": [{"manager": "x"}],
                     "annotations": {LAST_APPLIED: '{"data":{"password":"c2VjcmV0"}}', "team": "a"}},
        "data": {"password": "c2VjcmV0"}, "stringData": {"token": "secret"},
    }
    text = str(shown(secret))
    assert "c2VjcmV0" not in text
    assert "secret'" not in text
    assert "managedFields" not in text
    assert shown(secret)["metadata"]["annotations"]["team"] == "a"
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    assert shown(config) == config


def test_history_rows_skip_what_they_cannot_read() -> None:
    obj = {"status": {"history": [
        {"stage": "db", "releases": [{"revision": "r2", "appliedAt": "2026-01-01T00:00:02Z", "phase": "Ready",
                                      "created": 1, "configured": 2, "deleted": 3, "objects": ["x created"]},
                                     "junk"]},
        {"stage": "web", "releases": [{"revision": "r1", "appliedAt": "2026-01-01T00:00:01Z",
                                       "created": True}]},
        "junk",
    ]}}
    rows = history_rows(obj)
    assert [(r.stage, r.revision) for r in rows] == [("db", "r2"), ("web", "r1")]
    assert rows[0].changed() == "1 created, 2 configured, 3 pruned"
    assert rows[1].changed() == "no changes"
