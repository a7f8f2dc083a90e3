"""Fixtures for testing :mod:`sources` against a real Git server on loopback.

``git_server`` is a fresh anonymous server per test (starting one takes milliseconds, and a
fresh one keeps request counts per test); ``make_git_server`` builds servers that require
basic auth or a bearer token.  ``store`` is a :class:`~sources.MirrorStore` in the test's
temporary directory that allows ``http://`` and local URLs, as tests need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sources import Limits, MirrorStore, UrlPolicy
from tests.gitserver import GitServer


@pytest.fixture
def git_server() -> Iterator[GitServer]:
    with GitServer() as server:
        yield server


@pytest.fixture
def make_git_server() -> Iterator[Callable[..., GitServer]]:
    servers: list[GitServer] = []

    def make(*, username: str | None = None, password: str | None = None,
             bearer_token: str | None = None) -> GitServer:
        server = GitServer(username=username, password=password,
                           bearer_token=bearer_token).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def store(tmp_path: Path) -> MirrorStore:
    return MirrorStore(root=tmp_path / "mirrors",
                       policy=UrlPolicy(allow_http=True, allow_file=True), limits=Limits())
