"""Git over SSH through the system's OpenSSH client, with strict host key checking.

Why the ``ssh`` binary rather than a Python SSH library: OpenSSH is what every Git user's
``known_hosts`` and keys are made for (every key type, ``@cert-authority`` and hashed
entries, ``[host]:port``), and it is already audited.  dulwich's ``SSHGitClient`` runs the
remote ``git-upload-pack`` through a *vendor*; ours (:class:`StrictSSHVendor`) starts
``ssh`` with options that make the connection depend on nothing but the caller's
credentials:

* ``-F /dev/null``: no user or system ``ssh_config`` (no proxies, no multiplexing, no
  ``Host *`` surprises from the container image);
* ``UserKnownHostsFile=<the caller's known_hosts>``, ``GlobalKnownHostsFile=/dev/null``,
  ``StrictHostKeyChecking=yes``: a host key that is unknown or different is refused —
  never learnt, never asked about (:class:`~sources.errors.HostKeyError`);
* ``IdentitiesOnly=yes``, ``IdentityAgent=none`` and ``-i <the caller's key>``: only the
  GitRepository's own key is offered — never the controller's ``~/.ssh`` keys or an agent;
  without a key, public-key authentication is off altogether;
* ``BatchMode=yes``, no password or keyboard-interactive authentication: nothing can
  prompt;
* ``ConnectTimeout`` and keep-alives, plus a watchdog that kills ``ssh`` when the
  operation's timeout has passed, so a stalled server cannot hang a worker.

``ssh`` reads the key and ``known_hosts`` from files, so they are written to a private
scratch directory (mode 0700, files 0600; ``/dev/shm`` when it exists, so they stay in
memory) for the duration of one connection and removed as soon as it closes, failed or
not.  Their paths are replaced by ``<scratch>`` in every message.

A passphrase-protected key is decrypted in memory with ``cryptography`` when a passphrase
(the Secret's ``password``) is given, and written decrypted to the scratch file.  PEM and
PKCS#8 keys work; encrypted keys in the OpenSSH format need the ``bcrypt`` package, which
is not installed, and are reported as such.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dulwich.client import SSHVendor, SubprocessWrapper

from sources.errors import AuthenticationError, HostKeyError
from sources.urls import DEFAULT_SSH_USER

_SCRATCH_PREFIX = "stageset-ssh-"


def default_scratch_dir() -> Path | None:
    """Where key files are written: ``/dev/shm`` (memory) when usable, else the temp dir."""
    shm = Path("/dev/shm")  # noqa: S108 - only the parent of a private mkdtemp() directory
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def _normalise_identity(identity: bytes, passphrase: str | None) -> bytes:
    """The private key as ``ssh`` can read it without prompting."""
    key = identity.replace(b"\r\n", b"\n").strip() + b"\n"
    if not passphrase:
        return key
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

    password = passphrase.encode()
    private: PrivateKeyTypes
    try:
        if b"BEGIN OPENSSH PRIVATE KEY" in key:
            private = serialization.load_ssh_private_key(key, password=password)
        else:
            private = serialization.load_pem_private_key(key, password=password)
    except UnsupportedAlgorithm:
        raise AuthenticationError(
            "the SSH identity is encrypted in a way that cannot be decrypted here (encrypted "
            "OpenSSH-format keys need the 'bcrypt' package); use an unencrypted key or a PEM key"
        ) from None
    except (ValueError, TypeError):
        raise AuthenticationError(
            "the SSH identity could not be decrypted with the given password (or is not a "
            "private key)"
        ) from None
    except ImportError:  # pragma: no cover - bcrypt missing on some cryptography builds
        raise AuthenticationError(
            "the SSH identity is an encrypted OpenSSH key, which needs the 'bcrypt' package"
        ) from None
    try:
        return private.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.OpenSSH,
                                     serialization.NoEncryption())
    except ValueError:
        raise AuthenticationError("the SSH identity's key type cannot be used for SSH") from None


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


_STDERR_WAIT = 2.0
"""Seconds a closing connection waits for its ``ssh`` to end before its stderr is read."""
_STDERR_BYTES = 64 * 1024
"""Most bytes of an ``ssh``'s stderr kept."""


class _KeepingWrapper(SubprocessWrapper):
    """dulwich's pipe wrapper, which lets the vendor keep the process's stderr before closing it."""

    def __init__(self, proc: subprocess.Popen[bytes], *, keep: Callable[[subprocess.Popen[bytes]], None]):
        super().__init__(proc)
        self._keep = keep

    def close(self, timeout: int | None = 60) -> None:
        self._keep(self.proc)
        super().close(timeout)


@dataclass
class StrictSSHVendor(SSHVendor):
    """Runs ``ssh`` for dulwich with only the caller's key and ``known_hosts``.

    Create it with :func:`ssh_session`, which owns the scratch files and the processes.
    """

    known_hosts_file: Path
    identity_file: Path | None
    timeout: float
    wrap_read: Callable[[Callable[..., bytes]], Callable[..., bytes]] | None = None
    """Applied to the connection's ``read`` (the transport counts bytes with it)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    timed_out: threading.Event = field(default_factory=threading.Event)
    stderr_kept: list[str] = field(default_factory=list)
    """What each ended ``ssh`` wrote to stderr, kept as its connection closed (:meth:`hangup_reason`)."""
    _timers: list[threading.Timer] = field(default_factory=list)

    def command(self, host: str, remote_command: bytes | str, *, username: str | None,
                port: int | None, protocol_version: int | None) -> list[str | bytes]:
        """The ``ssh`` argv (exposed for tests)."""
        options = [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            f"UserKnownHostsFile={self.known_hosts_file}",
            "GlobalKnownHostsFile=/dev/null",
            "CheckHostIP=no",
            "UpdateHostKeys=no",
            "HashKnownHosts=no",
            "IdentitiesOnly=yes",
            "IdentityAgent=none",
            "PasswordAuthentication=no",
            "KbdInteractiveAuthentication=no",
            "ControlMaster=no",
            "ControlPath=none",
            "ForwardAgent=no",
            "ClearAllForwardings=yes",
            "LogLevel=ERROR",
            f"ConnectTimeout={max(1, int(self.timeout))}",
            "ServerAliveInterval=15",
            "ServerAliveCountMax=4",
        ]
        args: list[str | bytes] = ["ssh", "-F", "/dev/null", "-x", "-T"]
        for option in options:
            args += ["-o", option]
        if self.identity_file is not None:
            args += ["-o", "PubkeyAuthentication=yes", "-i", str(self.identity_file)]
        else:
            args += ["-o", "PubkeyAuthentication=no"]
        if protocol_version is None or protocol_version > 0:
            args += ["-o", f"SetEnv GIT_PROTOCOL=version={protocol_version or 2}"]
        if port:
            args += ["-p", str(port)]
        args += ["-l", username or DEFAULT_SSH_USER, "--", host.strip("[]"), remote_command]
        return args

    def run_command(
        self,
        host: str,
        command: bytes,
        username: str | None = None,
        port: int | None = None,
        password: str | None = None,
        key_filename: str | None = None,
        ssh_command: str | None = None,
        protocol_version: int | None = None,
    ) -> SubprocessWrapper:
        del password, key_filename, ssh_command  # ours come from the session, never these
        process = subprocess.Popen(
            self.command(host, command, username=username, port=port,
                         protocol_version=protocol_version),
            bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=_ssh_environment(),
        )
        self.processes.append(process)
        timer = threading.Timer(self.timeout, self._expire, args=(process,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)
        wrapper = _KeepingWrapper(process, keep=self._keep_stderr)
        if self.wrap_read is not None:
            wrapper.read = self.wrap_read(wrapper.read)
        return wrapper

    def _expire(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            self.timed_out.set()
            process.kill()

    def _keep_stderr(self, process: subprocess.Popen[bytes]) -> None:
        """Before dulwich closes a connection's pipes: what its ``ssh`` wrote to stderr, once it
        has ended (at most :data:`_STDERR_WAIT` seconds; at most :data:`_STDERR_BYTES`)."""
        # Nothing more is written or read on this connection: an ssh blocked on a full stdout (a
        # fetch cut short) ends at once instead of after the wait.
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        try:
            process.wait(timeout=_STDERR_WAIT)
        except subprocess.TimeoutExpired:
            return  # still running: reading its stderr could block; the pipe error stands alone
        if process.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stderr_kept.append(process.stderr.read(_STDERR_BYTES).decode("utf-8", "replace"))

    def hangup_reason(self) -> str:
        """What the ended ``ssh`` processes wrote to stderr.  A server that refuses a request
        (``git upload-pack: not our ref``) says why on stderr and hangs up; when the hangup reaches
        us while we are still writing the request, the broken pipe is all dulwich sees (and it has
        closed the pipes by the time the error reaches us), so the reason is only here."""
        for process in self.processes:
            if process.stderr is not None and not process.stderr.closed:
                self._keep_stderr(process)
        return "\n".join(r.strip() for r in self.stderr_kept if r.strip())

    def reap(self) -> None:
        """Stop every ``ssh`` this vendor started that is still running, and wait for it."""
        for timer in self._timers:
            timer.cancel()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def _ssh_environment() -> dict[str, str]:
    """A minimal environment: no agent socket, no askpass helpers, no display."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


@contextlib.contextmanager
def ssh_session(*, identity: bytes | None, known_hosts: bytes | None, passphrase: str | None,
                timeout: float, host: str, scratch_dir: Path | None,
                read_budget: Callable[[Callable[..., bytes]], Callable[..., bytes]] | None = None,
                ) -> Iterator[StrictSSHVendor]:
    """A vendor whose key files exist exactly as long as the ``with`` block."""
    if not known_hosts or not known_hosts.strip():
        raise HostKeyError(
            f"no known_hosts given for SSH host {host}: strict host key checking needs the "
            "server's public host key (the secret's 'known_hosts' key, e.g. from ssh-keyscan)"
        )
    key = _normalise_identity(identity, passphrase) if identity else None
    if scratch_dir is not None:
        scratch_dir.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=_SCRATCH_PREFIX, dir=scratch_dir))
    vendor: StrictSSHVendor | None = None
    try:
        known_hosts_file = directory / "known_hosts"
        _write_private(known_hosts_file, known_hosts.replace(b"\r\n", b"\n").rstrip() + b"\n")
        identity_file = None
        if key is not None:
            identity_file = directory / "identity"
            _write_private(identity_file, key)
        vendor = StrictSSHVendor(known_hosts_file=known_hosts_file, identity_file=identity_file,
                                 timeout=timeout, wrap_read=read_budget)
        yield vendor
    finally:
        if vendor is not None:
            vendor.reap()
        shutil.rmtree(directory, ignore_errors=True)


_HOST_KEY_CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
_FINGERPRINT = re.compile(r"(SHA256:[A-Za-z0-9+/=]+)")
_KEY_TYPE = re.compile(r"No (\S+) host key is known|The (\S+) key sent by the remote host")


def classify_ssh_failure(stderr: str, *, where: str, host: str,
                         has_identity: bool) -> Exception | None:
    """The error an ``ssh`` failure stands for, judged from its stderr; None if unknown.

    Messages are ours (they never repeat file names or key material); only the host key's
    public fingerprint is quoted, to help the user check it.
    """
    fingerprint = _FINGERPRINT.search(stderr)
    seen = f" (the server offered {fingerprint[1]})" if fingerprint else ""
    if _HOST_KEY_CHANGED in stderr:
        return HostKeyError(
            f"the SSH host key of {host} does not match known_hosts{seen}: refused. If the "
            "server's key really changed, update known_hosts"
        )
    if "host key is known" in stderr or "Host key verification failed" in stderr:
        return HostKeyError(
            f"the SSH host key of {host} is not in known_hosts{seen}: refused (unknown hosts "
            "are never accepted; add the server's key to known_hosts)"
        )
    if "Load key" in stderr or "invalid format" in stderr or "error in libcrypto" in stderr:
        return AuthenticationError(
            "the SSH identity could not be loaded (is it an OpenSSH or PEM private key? an "
            "encrypted key needs its passphrase in 'password')"
        )
    if "Permission denied" in stderr:
        hint = "" if has_identity else " (no identity was given)"
        return AuthenticationError(f"authentication failed for {where}{hint}")
    return None


def scrub(text: str, vendor: StrictSSHVendor | None) -> str:
    """``text`` without scratch file paths."""
    if vendor is not None:
        text = text.replace(str(vendor.known_hosts_file.parent), "<scratch>")
    return text
