"""Credentials over HTTP: basic auth, bearer tokens, and never leaking either."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sources import (
    AuthenticationError,
    Credentials,
    MirrorStore,
    RefSelector,
    SourceError,
    UrlPolicyError,
)
from tests.gitserver import GitServer

PASSWORD = "pa55-w0rd-that-must-not-leak"
TOKEN = "tok-3f9a-must-not-leak"
FILES = {"deploy/app.yaml": "kind: ConfigMap\n"}


def _assert_nothing_on_disk_contains(root: Path, secret: str) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_basic_auth(make_git_server: Callable[..., GitServer], store: MirrorStore,
                    tmp_path: Path) -> None:
    server = make_git_server(username="alice", password=PASSWORD)
    url = server.create_repo("private", FILES)
    creds = Credentials(username="alice", password=PASSWORD)

    snap = store.fetch(url, ref=RefSelector(branch="main"), credentials=creds)

    assert snap.commit == server.head("private")
    assert store.read_tree(url, commit=snap.commit, path="deploy") == {
        "app.yaml": b"kind: ConfigMap\n"}
    assert PASSWORD not in repr(creds)
    assert PASSWORD not in repr(snap)
    _assert_nothing_on_disk_contains(tmp_path / "mirrors", PASSWORD)


def test_wrong_password_is_an_authentication_error_without_the_password(
    make_git_server: Callable[..., GitServer], store: MirrorStore
) -> None:
    server = make_git_server(username="alice", password=PASSWORD)
    url = server.create_repo("private", FILES)
    wrong = "wrong-" + PASSWORD

    with pytest.raises(AuthenticationError) as caught:
        store.fetch(url, ref=RefSelector(branch="main"),
                    credentials=Credentials(username="alice", password=wrong))

    message = str(caught.value)
    assert message == f"authentication failed for {url}"
    assert wrong not in message
    assert PASSWORD not in message
    assert caught.value.__cause__ is None  # no library exception with request details chained


def test_missing_credentials(make_git_server: Callable[..., GitServer],
                             store: MirrorStore) -> None:
    server = make_git_server(username="alice", password=PASSWORD)
    url = server.create_repo("private", FILES)
    with pytest.raises(AuthenticationError, match=r"\(no credentials were given\)"):
        store.fetch(url, ref=RefSelector(branch="main"))


def test_shared_mirror_still_checks_each_callers_credentials(
    make_git_server: Callable[..., GitServer], store: MirrorStore
) -> None:
    server = make_git_server(username="alice", password=PASSWORD)
    url = server.create_repo("private", FILES)
    commit = store.fetch(url, credentials=Credentials(username="alice",
                                                      password=PASSWORD)).commit

    # The commit is in the mirror now, but another caller must still authenticate.
    with pytest.raises(AuthenticationError):
        store.fetch(url, ref=RefSelector(commit=commit),
                    credentials=Credentials(username="mallory", password="guess"))


def test_bearer_token(make_git_server: Callable[..., GitServer], store: MirrorStore,
                      tmp_path: Path) -> None:
    server = make_git_server(bearer_token=TOKEN)
    url = server.create_repo("private", FILES)

    snap = store.fetch(url, credentials=Credentials(bearer_token=TOKEN))
    assert snap.revision == f"main@sha1:{server.head('private')}"
    _assert_nothing_on_disk_contains(tmp_path / "mirrors", TOKEN)

    with pytest.raises(AuthenticationError) as caught:
        store.fetch(url, credentials=Credentials(bearer_token="not-" + TOKEN))
    assert TOKEN not in str(caught.value)
    assert TOKEN not in repr(Credentials(bearer_token=TOKEN))


def test_password_in_url_is_refused_without_echoing_it(git_server: GitServer,
                                                       store: MirrorStore) -> None:
    url = git_server.create_repo("app", FILES)
    with_password = url.replace("http://", f"http://alice:{PASSWORD}@")
    with pytest.raises(UrlPolicyError) as caught:
        store.fetch(with_password)
    assert PASSWORD not in str(caught.value)


def test_username_in_url_is_used_with_password_from_credentials(
    make_git_server: Callable[..., GitServer], store: MirrorStore
) -> None:
    server = make_git_server(username="alice", password=PASSWORD)
    url = server.create_repo("private", FILES).replace("http://", "http://alice@")
    snap = store.fetch(url, credentials=Credentials(password=PASSWORD))
    assert "alice" not in snap.url  # userinfo never reported


def test_unreachable_server_is_a_git_operation_error(store: MirrorStore) -> None:
    with GitServer() as server:
        url = server.url("gone")
    with pytest.raises(SourceError, match=r"listing refs of http://127\.0\.0\.1:\d+/gone\.git"):
        store.fetch(url, timeout=5)


def test_missing_repository(git_server: GitServer, store: MirrorStore) -> None:
    with pytest.raises(SourceError, match=r"no Git repository at http://.*/nope\.git"):
        store.fetch(git_server.url("nope"))


def test_https_with_a_private_ca(store: MirrorStore) -> None:
    with GitServer(tls=True, username="alice", password=PASSWORD) as server:
        url = server.create_repo("private", FILES)
        assert url.startswith("https://127.0.0.1:")
        assert server.ca_pem is not None

        with pytest.raises(SourceError, match="CERTIFICATE_VERIFY_FAILED") as caught:
            store.fetch(url, credentials=Credentials(username="alice", password=PASSWORD))
        assert PASSWORD not in str(caught.value)

        snap = store.fetch(url, credentials=Credentials(username="alice", password=PASSWORD,
                                                        ca_pem=server.ca_pem))
        assert snap.commit == server.head("private")

        with pytest.raises(SourceError, match="not valid PEM"):
            store.fetch(url, credentials=Credentials(ca_pem=b"garbage"))
