"""Attacks on the shared mirror and the transport, against real Git servers on loopback.

Each test is a row of the "Git sources" table in docs/security.md: what an attacker (a
tenant who writes a GitRepository, or who runs the Git server it points at) tries, and the
secure outcome.  Servers are real: ``git http-backend`` (with per-user configuration, as a
Git host shows different users different things) and OpenSSH; the few hostile servers
that no Git implementation would be (tarpits, endless listings, dumb HTTP) are small
sockets written here.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sources import (
    AuthenticationError,
    Credentials,
    GitOperationError,
    InvalidRefError,
    LimitExceededError,
    MirrorStore,
    NotFetchedError,
    RefNotFoundError,
    RefSelector,
    UrlPolicy,
    UrlPolicyError,
)
from tests.gitserver import GitServer
from tests.sshserver import SshServer

ALICE = Credentials(username="alice", password="alice-pw")
BOB = Credentials(username="bob", password="bob-pw")
SECRET = {"deploy/secret.yaml": "kind: ConfigMap\ndata: {token: alice-only}\n"}


@pytest.fixture
def host() -> Iterator[GitServer]:
    """A Git host with two accounts."""
    with GitServer(accounts={"alice": "alice-pw", "bob": "bob-pw"}) as server:
        yield server


# -- (a) the key of B's URL used to collide with A's ------------------------------------


def test_pin_of_a_private_commit_through_a_public_dot_git_twin(host: GitServer,
                                                                 store: MirrorStore) -> None:
    """``/vault.git`` is A's private repository, ``/vault`` B's public one (two directories
    on the server).  B pins A's commit: refused, and nothing of A's mirror is readable
    through B's URL."""
    private = host.create_repo("vault", SECRET)
    host.restrict("vault", {"alice"})
    public = host.create_repo("vault-public", {"deploy/app.yaml": "public\n"}, directory="vault")
    secret = store.fetch(private, credentials=ALICE, consumer="a/vault/1").commit

    with pytest.raises(RefNotFoundError, match=f"commit {secret} not found"):
        store.fetch(public, ref=RefSelector(commit=secret), consumer="b/vault/2")
    assert store.mirror_path(public) != store.mirror_path(private)
    with pytest.raises(NotFetchedError):
        store.read_tree(public, commit=secret, path="./", consumer="b/vault/2")
    assert not store.is_served(public, commit=secret, consumer="b/vault/2")
    # B with no credentials cannot list A's repository at all.
    with pytest.raises(AuthenticationError):
        store.fetch(private, ref=RefSelector(commit=secret))


def test_ssh_user_is_part_of_the_key(tmp_path: Path) -> None:
    """``team-a@host:app.git`` and ``team-b@host:app.git`` are different mirrors; B, with
    A's commit pinned, gets nothing (the server refuses B's user)."""
    with GitServer() as git, SshServer(git.root) as ssh:
        git.create_repo("app", SECRET)
        store = MirrorStore(root=tmp_path / "m", ssh_scratch_dir=tmp_path / "scratch")
        creds = Credentials(identity=ssh.identity, known_hosts=ssh.known_hosts)
        a_url = ssh.url("app")
        b_url = ssh.url("app", user="team-b")
        secret = store.fetch(a_url, credentials=creds, consumer="a/app/1").commit

        assert store.mirror_path(a_url) != store.mirror_path(b_url)
        with pytest.raises(AuthenticationError):
            store.fetch(b_url, ref=RefSelector(commit=secret), credentials=creds,
                        consumer="b/app/2")
        assert not store.is_served(b_url, commit=secret, consumer="b/app/2")


# -- (b) the server shows B fewer refs than A ------------------------------------------


def _hidden_ref_host(host: GitServer) -> tuple[str, str, str]:
    url = host.create_repo("shared", {"deploy/app.yaml": "shared\n"})
    public = host.head("shared")
    secret = host.commit("shared", SECRET, branch="refs/private/alice")
    host.restrict("shared", {"alice", "bob"})
    # Bob is not shown refs/private/*; over protocol v0 git then refuses to send them.
    host.user_config("bob", "uploadpack.hideRefs", "refs/private")
    host.user_protocol_v0("bob")
    return url, public, secret


def test_pin_of_a_commit_only_another_user_can_see(host: GitServer, store: MirrorStore) -> None:
    url, public, secret = _hidden_ref_host(host)
    assert store.fetch(url, ref=RefSelector(name="refs/private/alice"), credentials=ALICE,
                       consumer="a/shared/1").commit == secret

    for selector in (RefSelector(commit=secret), RefSelector(branch="main", commit=secret)):
        with pytest.raises(RefNotFoundError, match=f"commit {secret} is not readable with "
                                                   "these credentials"):
            store.fetch(url, ref=selector, credentials=BOB, consumer="b/shared/2")
    with pytest.raises(RefNotFoundError):
        store.fetch(url, ref=RefSelector(name="refs/private/alice"), credentials=BOB)
    assert not store.is_served(url, commit=secret, consumer="b/shared/2")
    with pytest.raises(NotFetchedError, match="has not been fetched for this source"):
        store.read_tree(url, commit=secret, consumer="b/shared/2")
    # What Bob may see, he gets, from the same mirror.
    assert store.fetch(url, credentials=BOB, consumer="b/shared/2").commit == public
    assert store.is_served(url, commit=public, consumer="b/shared/2")
    # Alice may pin her own commit.
    assert store.fetch(url, ref=RefSelector(commit=secret), credentials=ALICE).commit == secret


def test_served_records_are_per_consumer_and_survive_a_restart(host: GitServer,
                                                               tmp_path: Path) -> None:
    url = host.create_repo("app", {"deploy/app.yaml": "a\n"})
    store = MirrorStore(root=tmp_path / "m", policy=UrlPolicy(allow_http=True))
    commit = store.fetch(url, consumer="ns/app/uid-1").commit
    again = MirrorStore(root=tmp_path / "m", policy=UrlPolicy(allow_http=True))
    assert again.is_served(url, commit=commit, consumer="ns/app/uid-1")
    assert not again.is_served(url, commit=commit, consumer="ns/app/uid-2")  # recreated object
    assert again.read_tree(url, commit=commit, path="deploy", consumer="ns/app/uid-1") == {
        "app.yaml": b"a\n"}


# -- a bogus ref.commit ----------------------------------------------------------------


def test_bogus_commit_costs_one_request_on_a_v2_server(host: GitServer,
                                                       store: MirrorStore) -> None:
    url = host.create_repo("app", {"deploy/app.yaml": "a\n"})
    host.commit("app", {"other": "o\n"}, branch="refs/heads/other")
    host.reset_log()
    with pytest.raises(RefNotFoundError):
        store.fetch(url, ref=RefSelector(commit="1" * 40))
    assert host.fetch_count("app") == 1


def test_bogus_commit_never_fetches_all_history_on_a_tips_only_server(tmp_path: Path) -> None:
    """Over SSH with protocol v0 git sends only advertised tips: the pinned commit is
    looked for in at most PIN_HISTORY commits of one ref — never all refs' history."""
    with GitServer() as git, SshServer(git.root) as ssh:
        git.create_repo("app", {"deploy/app.yaml": "v0\n"})
        old = git.head("app")
        for i in range(5):
            git.commit("app", {"deploy/app.yaml": f"v{i + 1}\n"})
        unrelated = git.commit("app", {"big.txt": "x" * 100_000}, branch="refs/heads/other")
        ssh.protocol_v0("app.git")
        store = MirrorStore(root=tmp_path / "m", ssh_scratch_dir=tmp_path / "scratch")
        creds = Credentials(identity=ssh.identity, known_hosts=ssh.known_hosts)
        url = ssh.url("app")

        with pytest.raises(RefNotFoundError, match="only advertised commits"):
            store.fetch(url, ref=RefSelector(commit="1" * 40), credentials=creds)
        assert unrelated.encode() not in subprocess.run(
            ["git", "-C", str(store.mirror_path(url)), "cat-file", "--batch-all-objects",
             "--batch-check"], capture_output=True, check=True).stdout
        # A real old commit on the branch is found by deepening that branch.
        snap = store.fetch(url, ref=RefSelector(branch="main", commit=old), credentials=creds)
        assert snap.commit == old
        assert store.read_tree(url, commit=old, path="deploy") == {"app.yaml": b"v0\n"}


# -- URL and ref injection -------------------------------------------------------------


@pytest.mark.parametrize("template", [
    "ssh://-oProxyCommand=touch%20{marker}/x.git",
    "ssh://-oProxyCommand=touch {marker}@127.0.0.1/x.git",
    "-oProxyCommand=touch {marker}:x.git",
    "ext::sh -c touch% {marker}",
    "--upload-pack=touch {marker}",
    "file://{marker}/../../proc/self/root/",
])
def test_url_injection_runs_nothing(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    store = MirrorStore(root=tmp_path / "m",
                        policy=UrlPolicy(allow_http=True, allow_file=True))
    with pytest.raises((UrlPolicyError, GitOperationError)):
        store.fetch(template.format(marker=marker), timeout=5)
    assert not marker.exists()


@pytest.mark.parametrize("selector", [
    {"branch": "--upload-pack=touch /tmp/x"}, {"branch": "-oProxyCommand=x"},
    {"tag": "-x"}, {"name": "refs/heads/-x"}, {"branch": "main\nx"},
])
def test_ref_injection_is_refused(selector: dict[str, str]) -> None:
    with pytest.raises(InvalidRefError):
        RefSelector(**selector)


def test_local_sources_never_read_the_mirrors(git_server: GitServer, tmp_path: Path) -> None:
    """Even with local sources allowed (single-tenant), a tenant cannot name another
    tenant's mirror directory, directly or through a symlink."""
    url = git_server.create_repo("app", SECRET)
    store = MirrorStore(root=tmp_path / "m", policy=UrlPolicy(allow_http=True, allow_file=True),
                        ssh_scratch_dir=tmp_path / "scratch")
    store.fetch(url)
    mirror = store.mirror_path(url)
    (tmp_path / "link").symlink_to(mirror)
    for attempt in (f"file://{mirror}", str(mirror), str(tmp_path / "link"),
                    f"file://{tmp_path}/scratch", "/proc/self/root" + str(mirror)):
        with pytest.raises(UrlPolicyError, match="never serves"):
            store.fetch(attempt)
    # Without the switch, no local path at all.
    strict = MirrorStore(root=tmp_path / "s", policy=UrlPolicy(allow_http=True))
    with pytest.raises(UrlPolicyError, match="local repositories are off"):
        strict.fetch(str(git_server.repo_path("app")))


# -- hostile servers -------------------------------------------------------------------


class _RawServer:
    """A TCP server on loopback that runs ``handler(connection)`` for each client."""

    def __init__(self, handler: object) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._handler = handler
        self._stop = threading.Event()
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection = self._listener.accept()[0]
            except OSError:
                continue
            self._connections.append(connection)
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self._handler(connection, self._stop)  # type: ignore[operator]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self._connections:
            connection.close()
        self._listener.close()


def _silent(connection: socket.socket, stop: threading.Event) -> None:
    stop.wait()


def _trickle(connection: socket.socket, stop: threading.Event) -> None:
    connection.recv(65536)
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-"
                       b"advertisement\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nfff0\r\n")
    # A pkt-line of 65 516 bytes, one byte every 0.3 s: no read ever waits long.
    while not stop.wait(0.3):
        connection.sendall(b"1\r\nx\r\n")


def _endless_refs(connection: socket.socket, stop: threading.Event) -> None:
    connection.recv(65536)
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-"
                       b"advertisement\r\n\r\n001e# service=git-upload-pack\n0000")
    payload = b"1" * 40 + b" refs/heads/" + b"b" * 10 + b"\n"
    line = f"{len(payload) + 4:04x}".encode() + payload
    first = b"1" * 40 + b" HEAD\0side-band-64k ofs-delta\n"
    connection.sendall(f"{len(first) + 4:04x}".encode() + first)
    block = line * 4096
    while not stop.is_set():
        connection.sendall(block)


@pytest.mark.parametrize("handler", [_silent, _trickle], ids=["silent", "trickle"])
def test_tarpit_server_fails_within_the_deadline(store: MirrorStore, handler: object) -> None:
    server = _RawServer(handler)
    try:
        started = time.monotonic()
        with pytest.raises(GitOperationError, match=r"timed out after 2s"):
            store.fetch(f"http://127.0.0.1:{server.port}/app.git", timeout=2)
        assert time.monotonic() - started < 15  # the deadline is 2 s; slack for a busy CI
    finally:
        server.close()


def test_endless_ref_listing_is_cut_off(store: MirrorStore) -> None:
    server = _RawServer(_endless_refs)
    try:
        with pytest.raises(LimitExceededError, match="a ref listing over the limit"):
            store.fetch(f"http://127.0.0.1:{server.port}/app.git", timeout=60)
    finally:
        server.close()


def test_dumb_http_server_is_refused(git_server: GitServer, store: MirrorStore,
                                     tmp_path: Path) -> None:
    """dulwich would fetch from a dumb server by loading whole objects into memory."""
    git_server.create_repo("app", {"deploy/app.yaml": "a\n"})
    git_server.git("app", "update-server-info")
    root = git_server.root

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *_args: object) -> None:
            return

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(GitOperationError, match="dumb HTTP servers are not supported"):
            store.fetch(f"http://127.0.0.1:{httpd.server_address[1]}/app.git")
    finally:
        httpd.shutdown()
        httpd.server_close()
