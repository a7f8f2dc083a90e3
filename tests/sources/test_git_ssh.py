"""Git over SSH against a real OpenSSH ``sshd`` on loopback (see ``tests/sshserver.py``).

Host keys are checked strictly: an unknown or changed key is refused, never learnt.  Only
the given key is offered; it lives in a private scratch directory for the length of one
connection and never appears in a message.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sources import (
    AuthenticationError,
    Credentials,
    GitOperationError,
    HostKeyError,
    MirrorStore,
    RefNotFoundError,
    RefSelector,
    SourceError,
    UrlPolicy,
)
from sources.ssh import StrictSSHVendor
from tests.gitserver import GitServer
from tests.sshserver import SshServer, keygen

FILES = {"deploy/app.yaml": "kind: ConfigMap\n"}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[GitServer, SshServer]]:
    with GitServer() as git, SshServer(git.root) as ssh:
        yield git, ssh


@pytest.fixture
def git(servers: tuple[GitServer, SshServer]) -> GitServer:
    return servers[0]


@pytest.fixture
def ssh(servers: tuple[GitServer, SshServer]) -> SshServer:
    return servers[1]


@pytest.fixture
def repo(git: GitServer, request: pytest.FixtureRequest) -> str:
    """A fresh repository named after the test (the servers are shared by the module)."""
    name = str(request.node.name).replace("[", "-").replace("]", "")
    git.create_repo(name, FILES)
    return name


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch"
    path.mkdir()
    return path


@pytest.fixture
def ssh_store(tmp_path: Path, scratch: Path) -> MirrorStore:
    return MirrorStore(root=tmp_path / "mirrors", policy=UrlPolicy(allow_http=True),
                       ssh_scratch_dir=scratch)


def _creds(ssh: SshServer, **changes: bytes | str | None) -> Credentials:
    fields: dict[str, bytes | str | None] = {"identity": ssh.identity,
                                             "known_hosts": ssh.known_hosts}
    fields.update(changes)
    return Credentials(**fields)  # type: ignore[arg-type]


def _assert_no_key_material(scratch: Path, mirrors: Path, ssh: SshServer) -> None:
    assert list(scratch.iterdir()) == []
    for path in mirrors.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert ssh.identity.strip() not in data, path
            assert b"PRIVATE KEY" not in data, path


def test_clone_over_ssh_and_poll(git: GitServer, ssh: SshServer, repo: str,
                                 ssh_store: MirrorStore, scratch: Path, tmp_path: Path) -> None:
    url = ssh.url(repo)
    before = len(ssh.sessions(repo))

    snap = ssh_store.fetch(url, ref=RefSelector(branch="main"), credentials=_creds(ssh))

    assert snap.commit == git.head(repo)
    assert snap.revision == f"main@sha1:{snap.commit}"
    assert snap.url == f"ssh://127.0.0.1:{ssh.port}/{repo}.git"  # no user name reported
    assert ssh_store.read_tree(url, commit=snap.commit, path="deploy") == {
        "app.yaml": b"kind: ConfigMap\n"}
    assert len(ssh.sessions(repo)) - before == 2  # ls-refs, then fetch
    assert set(ssh.protocols()) == {"version=2"}

    # An unchanged remote costs one session (ls-refs), and no fetch.
    again = ssh_store.fetch(url, ref=RefSelector(branch="main"), credentials=_creds(ssh))
    assert not again.fetched
    assert len(ssh.sessions(repo)) - before == 3

    new = git.commit(repo, {"deploy/app.yaml": "kind: Secret\n"})
    changed = ssh_store.fetch(url, ref=RefSelector(branch="main"), credentials=_creds(ssh))
    assert changed.commit == new
    assert changed.fetched
    _assert_no_key_material(scratch, tmp_path / "mirrors", ssh)


def test_same_repository_over_http_and_ssh(git: GitServer, ssh: SshServer, repo: str,
                                           ssh_store: MirrorStore) -> None:
    git.tag(repo, "v1.0.0", annotated=True)
    over_http = ssh_store.fetch(git.url(repo), ref=RefSelector(semver="^1"))
    over_ssh = ssh_store.fetch(ssh.url(repo).removesuffix(".git"), ref=RefSelector(semver="^1"),
                               credentials=_creds(ssh))
    assert over_http.revision == over_ssh.revision == f"v1.0.0@sha1:{git.head(repo)}"


def test_user_comes_from_the_url_only(git: GitServer, ssh: SshServer, repo: str,
                                      ssh_store: MirrorStore) -> None:
    """As Flux: the URL's user, else ``git`` — never the Secret's ``username`` (the user is
    part of the mirror key, which a Secret cannot change)."""
    url = f"ssh://127.0.0.1:{ssh.port}/{repo}.git"
    with pytest.raises(AuthenticationError):
        ssh_store.fetch(url, credentials=_creds(ssh, username=ssh.user))
    assert ssh_store.mirror_path(url) == ssh_store.mirror_path(
        f"ssh://git@127.0.0.1:{ssh.port}/{repo}.git")
    snap = ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh))
    assert snap.commit == git.head(repo)


def test_wrong_host_key_is_refused(ssh: SshServer, repo: str, ssh_store: MirrorStore,
                                   scratch: Path, tmp_path: Path) -> None:
    _, other = keygen(tmp_path / "impostor")
    key_type, key = other.split()[:2]
    known_hosts = f"{ssh.host} ".encode() + key_type + b" " + key + b"\n"

    with pytest.raises(HostKeyError, match=rf"SSH host key of \[127\.0\.0\.1\]:{ssh.port} does "
                                           r"not match known_hosts \(the server offered "
                                           r"SHA256:[A-Za-z0-9+/]+\): refused") as caught:
        ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, known_hosts=known_hosts))

    assert isinstance(caught.value, AuthenticationError)
    assert str(scratch) not in str(caught.value)
    _assert_no_key_material(scratch, tmp_path / "mirrors", ssh)


def test_unknown_host_is_refused(ssh: SshServer, repo: str, ssh_store: MirrorStore,
                                 scratch: Path, tmp_path: Path) -> None:
    # known_hosts that trusts this very key, but for other hosts.  (OpenSSH matches an entry
    # without a port, "127.0.0.1 <key>", for any port of that host.)
    key = ssh.known_hosts.split(b" ", 1)[1]
    for other_host in (b"[127.0.0.2]:%d " % ssh.port, b"[127.0.0.1]:22 ", b"github.com "):
        with pytest.raises(HostKeyError, match=r"is not in known_hosts.*: refused"):
            ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, known_hosts=other_host + key))
    with pytest.raises(HostKeyError, match="no known_hosts given"):
        ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, known_hosts=None))
    with pytest.raises(HostKeyError, match="no known_hosts given"):
        ssh_store.fetch(ssh.url(repo), credentials=None)
    _assert_no_key_material(scratch, tmp_path / "mirrors", ssh)


def test_wrong_user_key_is_an_authentication_error(ssh: SshServer, repo: str,
                                                   ssh_store: MirrorStore, scratch: Path,
                                                   tmp_path: Path) -> None:
    wrong, _ = keygen(tmp_path / "wrong")

    with pytest.raises(AuthenticationError) as caught:
        ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, identity=wrong))

    assert not isinstance(caught.value, HostKeyError)
    assert str(caught.value) == f"authentication failed for ssh://127.0.0.1:{ssh.port}/{repo}.git"
    assert caught.value.__cause__ is None
    with pytest.raises(AuthenticationError, match=r"\(no identity was given\)"):
        ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, identity=None))
    with pytest.raises(AuthenticationError, match="SSH identity could not be loaded"):
        ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, identity=b"not a key"))
    _assert_no_key_material(scratch, tmp_path / "mirrors", ssh)


def test_identity_never_in_messages_or_reprs(ssh: SshServer, repo: str,
                                             ssh_store: MirrorStore) -> None:
    creds = _creds(ssh)
    assert b"PRIVATE" not in repr(creds).encode()
    missing = ssh.url(repo).replace(repo, "no-such-repo")
    with pytest.raises(SourceError) as caught:
        ssh_store.fetch(missing, credentials=creds)
    assert "PRIVATE" not in str(caught.value)
    assert "stageset-ssh-" not in str(caught.value)


def test_missing_repository_and_ref(ssh: SshServer, repo: str, ssh_store: MirrorStore) -> None:
    with pytest.raises(GitOperationError, match=r"no Git repository at ssh://.*/nope\.git"):
        ssh_store.fetch(ssh.url("nope"), credentials=_creds(ssh))
    with pytest.raises(RefNotFoundError, match="branch 'gone' not found in ssh://"):
        ssh_store.fetch(ssh.url(repo), ref=RefSelector(branch="gone"), credentials=_creds(ssh))


def test_passphrase_protected_key(ssh: SshServer, repo: str, ssh_store: MirrorStore,
                                  tmp_path: Path) -> None:
    private, public = keygen(tmp_path / "pem", kind="ecdsa", passphrase="s3cret", pem=True)
    authorized = ssh.dir / "authorized_keys"
    original = authorized.read_bytes()
    authorized.write_bytes(original + public + b"\n")
    try:
        snap = ssh_store.fetch(ssh.url(repo),
                               credentials=_creds(ssh, identity=private, password="s3cret"))
        assert snap.fetched
        with pytest.raises(AuthenticationError, match="could not be decrypted") as caught:
            ssh_store.fetch(ssh.url(repo),
                            credentials=_creds(ssh, identity=private, password="wrong"))
        assert "wrong" not in str(caught.value)
        # Without the passphrase ssh cannot load it and must not prompt.
        with pytest.raises(AuthenticationError):
            ssh_store.fetch(ssh.url(repo), credentials=_creds(ssh, identity=private))
    finally:
        authorized.write_bytes(original)


@pytest.mark.parametrize("banner", [b"", b"SSH-2.0-OpenSSH_9.2p1 stalled\r\n"])
def test_stalled_server_times_out(ssh_store: MirrorStore, ssh: SshServer, scratch: Path,
                                  banner: bytes) -> None:
    """A server that accepts connections and then stalls: ssh's ConnectTimeout covers the
    banner exchange, our watchdog everything after it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        accepted: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn = listener.accept()[0]
                    accepted.append(conn)
                    conn.sendall(banner)
                except OSError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        started = time.monotonic()
        try:
            with pytest.raises(GitOperationError, match=r"failed: timed out after 1\.5s"):
                ssh_store.fetch(f"ssh://git@127.0.0.1:{port}/x.git", timeout=1.5,
                                credentials=Credentials(known_hosts=ssh.known_hosts))
        finally:
            stop.set()
            thread.join()
            for conn in accepted:
                conn.close()
    assert time.monotonic() - started < 10
    assert list(scratch.iterdir()) == []


def test_ssh_command_line_is_strict(tmp_path: Path) -> None:
    vendor = StrictSSHVendor(known_hosts_file=tmp_path / "kh", identity_file=tmp_path / "id",
                             timeout=30)
    argv = vendor.command("-oProxyCommand=evil", b"git-upload-pack 'x'", username=None,
                          port=2222, protocol_version=2)
    text = [a if isinstance(a, str) else a.decode() for a in argv]
    joined = " ".join(text)
    for option in ("StrictHostKeyChecking=yes", f"UserKnownHostsFile={tmp_path / 'kh'}",
                   "GlobalKnownHostsFile=/dev/null", "IdentitiesOnly=yes", "IdentityAgent=none",
                   "BatchMode=yes", "PasswordAuthentication=no"):
        assert option in joined
    assert text[:3] == ["ssh", "-F", "/dev/null"]
    # A hostile host name is an argument after "--", never an option.
    assert text[-3:] == ["--", "-oProxyCommand=evil", "git-upload-pack 'x'"]
    assert text[text.index("-l") + 1] == "git"
