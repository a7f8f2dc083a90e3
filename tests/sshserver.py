"""A real OpenSSH server on loopback that serves a :class:`~tests.gitserver.GitServer`'s repos.

Why real ``sshd``: what the SSH transport must get right — refusing an unknown or changed
host key, offering only the given key, failing cleanly when the key is refused — is
OpenSSH's behaviour, so the tests talk to OpenSSH.  ``hack/bootstrap.sh`` installs
``openssh-server``.

The server runs as the current user (``sshd -D`` on a free 127.0.0.1 port, its own config,
throw-away host and user keys from ``ssh-keygen``, ``StrictModes no``, no PAM) and only lets
that user in with the generated key.  A ``ForceCommand`` wrapper maps the repository path of
the URL onto the Git server's root, so the same repository is reachable as
``http://127.0.0.1:<http port>/app.git`` and ``ssh://<user>@127.0.0.1:<ssh port>/app.git``
(like a Git host, ``git@host:app.git`` style).  The wrapper only runs ``git-upload-pack`` /
``git-receive-pack`` on paths inside the root and logs each session, so tests can count
connections: ``server.sessions("app")``.

Usage::

    with GitServer() as git, SshServer(git.root) as ssh:
        git.create_repo("app", {"deploy/a.yaml": "a: 1\\n"})
        creds = Credentials(identity=ssh.identity, known_hosts=ssh.known_hosts)
        store.fetch(ssh.url("app"), credentials=creds)
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

SSHD = Path("/usr/sbin/sshd")

_SERVE = r'''
import os, shlex, sys, time
root, log = sys.argv[1], sys.argv[2]
command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
with open(log, "a") as handle:
    handle.write(f"{time.time():.6f}\t{os.environ.get('GIT_PROTOCOL', '')}\t{command}\n")
try:
    words = shlex.split(command)
except ValueError:
    words = []
if len(words) != 2 or words[0] not in ("git-upload-pack", "git-receive-pack"):
    sys.stderr.write(f"fatal: only git-upload-pack/git-receive-pack are served\n")
    sys.exit(128)
rel = words[1].lstrip("/")
if rel.startswith("~/"):
    rel = rel[2:]
if ".." in rel.split("/"):
    sys.stderr.write("fatal: '..' is not allowed\n")
    sys.exit(128)
v0 = os.path.join(os.path.dirname(log), "protocol-v0")
if os.path.exists(v0) and rel in open(v0).read().split():
    os.environ.pop("GIT_PROTOCOL", None)
os.execvp("git", ["git", words[0][len("git-"):], os.path.join(root, rel)])
'''


def sshd_available() -> bool:
    return SSHD.exists() and shutil.which("ssh") is not None and shutil.which("ssh-keygen") is not None


def keygen(path: Path, *, kind: str = "ed25519", passphrase: str = "", pem: bool = False,
           comment: str = "stageset-test") -> tuple[bytes, bytes]:
    """A fresh key pair at ``path`` (and ``path.pub``); returns (private, public line)."""
    args = ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", comment, "-f", str(path)]
    if pem:
        args += ["-m", "PEM"]
    subprocess.run(args, check=True, capture_output=True)
    return path.read_bytes(), path.with_suffix(".pub").read_bytes().strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SshServer:
    """``sshd`` on 127.0.0.1 serving the bare repositories under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.dir = Path(tempfile.mkdtemp(prefix="sshserver-"))
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self.identity = b""
        """The private key (OpenSSH format) the server accepts for :attr:`user`."""
        self.host_public_key = b""
        """The server's host public key line (``ssh-ed25519 AAAA... comment``)."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> SshServer:
        if not sshd_available():
            raise RuntimeError("OpenSSH is not installed (/usr/sbin/sshd, ssh, ssh-keygen): "
                               "run ./hack/bootstrap.sh")
        _, self.host_public_key = keygen(self.dir / "host_key", comment="")
        self.identity, user_public = keygen(self.dir / "user_key")
        (self.dir / "authorized_keys").write_bytes(user_public + b"\n")
        (self.dir / "serve.py").write_text(_SERVE)
        (self.dir / "sessions.log").touch()
        if os.getuid() == 0:
            # sshd's privilege separation directory; Debian creates it only when the
            # service starts, which never happens in a container.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for _ in range(5):
            self.port = _free_port()
            if self._spawn():
                return self
        raise RuntimeError(f"sshd did not start: {self.log()}")

    def _spawn(self) -> bool:
        config = self.dir / "sshd_config"
        force = f"{sys.executable} -I -S {self.dir / 'serve.py'} {self.root} {self.dir / 'sessions.log'}"
        config.write_text("\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.dir / 'host_key'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            f"AllowUsers {self.user}",
            "PidFile none",
            "StrictModes no",
            "UsePAM no",
            "UseDNS no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "PermitTTY no",
            "AcceptEnv GIT_PROTOCOL",
            "MaxStartups 200",
            "MaxSessions 200",
            "LogLevel VERBOSE",
            f"ForceCommand {force}",
            "",
        ]))
        log = self.dir / "sshd.log"
        self._process = subprocess.Popen(
            [str(SSHD), "-D", "-f", str(config), "-E", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(4).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.02)
        self.stop_process()
        return False

    def stop_process(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            if self._process.stderr is not None:
                self._process.stderr.close()
            self._process = None

    def stop(self) -> None:
        self.stop_process()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SshServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def protocol_v0(self, repo_dir: str) -> None:
        """Serve ``repo_dir`` (e.g. ``"app.git"``) with Git protocol version 0 only.  Over
        SSH that means only advertised commits are sent (unless the repository sets
        ``uploadpack.allowReachableSHA1InWant``), like many self-hosted servers."""
        with (self.dir / "protocol-v0").open("a") as handle:
            handle.write(repo_dir + "\n")

    # -- what clients need -------------------------------------------------------------

    @property
    def host(self) -> str:
        """``[127.0.0.1]:<port>``, as ``known_hosts`` names a host on a non-default port."""
        return f"[127.0.0.1]:{self.port}"

    @property
    def known_hosts(self) -> bytes:
        """A ``known_hosts`` line for this server, as ``ssh-keyscan -p <port>`` prints it."""
        key_type, key = self.host_public_key.split()[:2]
        return f"{self.host} ".encode() + key_type + b" " + key + b"\n"

    def url(self, name: str, *, user: str | None = None) -> str:
        """``ssh://<user>@127.0.0.1:<port>/<name>.git``."""
        return f"ssh://{user or self.user}@127.0.0.1:{self.port}/{name}.git"

    # -- observing ---------------------------------------------------------------------

    def sessions(self, name: str | None = None) -> list[str]:
        """The commands of the SSH sessions so far (``git-upload-pack '/app.git'``)."""
        lines = (self.dir / "sessions.log").read_text().splitlines()
        commands = [line.split("\t", 2)[2] for line in lines if line.count("\t") >= 2]
        if name is None:
            return commands
        return [c for c in commands if c.rstrip("'").removesuffix(".git").endswith(f"/{name}")]

    def protocols(self) -> list[str]:
        """The ``GIT_PROTOCOL`` each session got (``version=2`` when the client asked)."""
        lines = (self.dir / "sessions.log").read_text().splitlines()
        return [line.split("\t", 2)[1] for line in lines if line.count("\t") >= 2]

    def log(self) -> str:
        path = self.dir / "sshd.log"
        return path.read_text(errors="replace") if path.exists() else ""


__all__ = ["SshServer", "keygen", "sshd_available"]
