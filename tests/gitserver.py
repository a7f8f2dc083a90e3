"""A real smart-HTTP Git server on loopback, for tests.

Why a real server: the behaviour that matters when fetching — protocol v2 negotiation,
shallow fetches, which objects a server agrees to send, how it answers a wrong password —
lives in Git itself, so mocking it would test our idea of Git rather than Git.  The server
runs ``git http-backend`` (shipped with the ``git`` CLI) as a CGI program behind a small
threaded ``http.server`` bound to 127.0.0.1 on a free port.

Repositories are bare repositories under a temporary directory.  They are changed with Git
plumbing (``hash-object``, ``update-index`` with a private index file, ``write-tree``,
``commit-tree``, ``update-ref``) run by the ``git`` CLI, which is what a push would leave
behind, without needing a work tree or a second transport.

Every request is logged (method, repository, service, protocol-v2 command), so tests can
count real pack fetches: ``server.fetch_count("app")``.

Usage::

    with GitServer(username="u", password="p") as server:
        url = server.create_repo("app", {"deploy/app.yaml": "kind: ConfigMap\\n"})
        sha = server.commit("app", {"deploy/app.yaml": "changed"}, message="change")
        server.tag("app", "v1.0.0", annotated=True)

Several users (``accounts={"alice": "pw-a", "bob": "pw-b"}``) can see different things, as on
a real Git host: ``restrict(name, {"alice"})`` makes a repository private to some of them
(others get 404, as GitHub answers for a private repository), ``user_config("bob", key,
value)`` gives one user's requests extra ``git`` configuration (``uploadpack.hideRefs``
hides refs from that user; git's own per-request configuration, not a fake), and
``user_protocol_v0("bob")`` makes the server speak protocol version 0 to that user (which,
unlike version 2, only sends advertised commits unless ``uploadpack.allowAnySHA1InWant``
or ``allowReachableSHA1InWant`` is set).

Import it from any test package as ``from tests.gitserver import GitServer, Symlink``
(``tests`` is a namespace package: the checkout's root is on ``sys.path`` through the
editable install, and pytest puts it there too).
"""

from __future__ import annotations

import base64
import datetime
import hmac
import ipaddress
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

GIT_IDENTITY = (
    "-c", "user.name=Test Author",
    "-c", "user.email=author@example.test",
    "-c", "init.defaultBranch=main",
)
"""Passed to every ``git`` call so commits never depend on the machine's configuration."""

FIXED_DATE = "2024-01-01T00:00:00+00:00"


@dataclass(frozen=True)
class Symlink:
    """A file value that makes the path a symbolic link to ``target``."""

    target: str


@dataclass(frozen=True)
class Submodule:
    """A file value that makes the path a gitlink (submodule) to ``commit``."""

    commit: str = "1" * 40


@dataclass(frozen=True)
class Zeros:
    """A file value of ``size`` zero bytes, hashed by ``git`` from a sparse file (so a
    100 MB blob costs the test neither memory nor much disk; it packs to ~100 KB)."""

    size: int


FileValue = str | bytes | Symlink | Submodule | Zeros | None
"""``None`` deletes the path in :meth:`GitServer.commit`."""


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request the server answered."""

    method: str
    repo: str
    service: str  # "git-upload-pack", "git-receive-pack", or "" for other paths
    command: str  # protocol v2 command ("ls-refs", "fetch"); "fetch" for v0 POSTs; "" for GETs
    status: int


@dataclass
class _Auth:
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None

    def required(self) -> bool:
        return self.username is not None or self.bearer_token is not None

    def accepts(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        if self.bearer_token is not None and scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip(), self.bearer_token)
        if self.username is not None and scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip()).decode()
            except ValueError:
                return False
            expected = f"{self.username}:{self.password or ''}"
            return hmac.compare_digest(decoded, expected)
        return False

    def challenge(self) -> str:
        return 'Bearer realm="git"' if self.bearer_token is not None else 'Basic realm="git"'


@dataclass
class _State:
    project_root: Path
    auth: _Auth
    log: list[RequestRecord] = field(default_factory=list)
    tips_only: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    accounts: dict[str, str] = field(default_factory=dict)
    restricted: dict[str, set[str]] = field(default_factory=dict)  # directory -> users
    user_config: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    protocol_v0: set[str] = field(default_factory=set)

    def account(self, header: str | None) -> str | None:
        """The account a Basic ``Authorization`` header proves, if any."""
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except ValueError:
            return None
        expected = self.accounts.get(user)
        if expected is not None and hmac.compare_digest(password, expected):
            return user
        return None

    def directory(self, repo_path: str) -> str:
        """The repository directory ``git http-backend`` serves for a request path (it tries
        the path itself, then with ``.git``)."""
        relative = repo_path.strip("/")
        for candidate in (relative, relative + ".git"):
            if (self.project_root / candidate / "HEAD").is_file():
                return candidate
        return relative


class _Handler(BaseHTTPRequestHandler):
    """Authenticates, then hands the request to ``git http-backend`` as CGI."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes
    server: _Server

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read :attr:`GitServer.requests` instead."""

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        state = self.server.state
        path, _, query = self.path.partition("?")
        body = self._read_body() if self.command == "POST" else b""
        repo, service, command = _classify(path, query, body, self.headers.get("Git-Protocol"))

        user = state.account(self.headers.get("Authorization"))
        allowed = state.restricted.get(state.directory(_repo_path(path)))
        if allowed is not None and user not in allowed:
            status = 404 if user is not None else 401
            self._record(state, self.command, repo, service, command, status)
            payload = b"repository not found\n" if user else b"authentication required\n"
            self.send_response(status)
            if user is None:
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return

        if state.auth.required() and not state.auth.accepts(self.headers.get("Authorization")):
            self._record(state, self.command, repo, service, command, 401)
            payload = b"authentication required\n"
            self.send_response(401)
            self.send_header("WWW-Authenticate", state.auth.challenge())
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return

        refused = _unadvertised_want(state, repo, body) if command == "fetch" else None
        if refused is not None:
            # Like a server that only sends advertised tips (uploadpack defaults over ssh).
            self._record(state, self.command, repo, service, command, 200)
            payload = _pkt_line(f"ERR upload-pack: not our ref {refused}\n") + b"0000"
            self.send_response(200)
            self.send_header("Content-Type", f"application/x-{service}-result")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return

        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(state.project_root),
            "GIT_PROJECT_ROOT": str(state.project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "REMOTE_USER": user or state.auth.username or "",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        extra = state.user_config.get(user or "", [])
        if extra:
            env["GIT_CONFIG_COUNT"] = str(len(extra))
            for index, (key, value) in enumerate(extra):
                env[f"GIT_CONFIG_KEY_{index}"] = key
                env[f"GIT_CONFIG_VALUE_{index}"] = value
        if self.headers.get("Git-Protocol") and (user or "") not in state.protocol_v0:
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
            env["HTTP_GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        result = subprocess.run(
            ["git", "http-backend"], input=body, capture_output=True, env=env, check=False
        )
        head, _, payload = result.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = result.stdout.partition(b"\n\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name.strip(), value.strip()))
        if result.returncode != 0 and not result.stdout:
            status, payload = 500, result.stderr
        self._record(state, self.command, repo, service, command, status)
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    @staticmethod
    def _record(state: _State, method: str, repo: str, service: str, command: str,
                status: int) -> None:
        with state.lock:
            state.log.append(RequestRecord(method=method, repo=repo, service=service,
                                           command=command, status=status))


def _pkt_line(text: str) -> bytes:
    data = text.encode()
    return f"{len(data) + 4:04x}".encode() + data


def _unadvertised_want(state: _State, repo: str, body: bytes) -> str | None:
    """The first wanted object that is no ref tip, if the repository refuses those."""
    if repo not in state.tips_only:
        return None
    listing = subprocess.run(
        ["git", "-C", str(state.project_root / f"{repo}.git"), "for-each-ref",
         "--format=%(objectname)"], capture_output=True, check=True,
    ).stdout.decode().split()
    wants: list[bytes] = re.findall(rb"want ([0-9a-f]{40})", body)
    return next((w.decode() for w in wants if w.decode() not in listing), None)


def _repo_path(path: str) -> str:
    """The repository part of a request path (without ``/info/refs`` or the service)."""
    for suffix in ("/info/refs", "/git-upload-pack", "/git-receive-pack"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _classify(path: str, query: str, body: bytes, git_protocol: str | None) -> tuple[str, str, str]:
    """Which repository, service and protocol command a request is for."""
    service = ""
    repo_path = path
    for name in ("git-upload-pack", "git-receive-pack"):
        if path.endswith("/" + name):
            service, repo_path = name, path[: -len(name) - 1]
        elif path.endswith("/info/refs") and f"service={name}" in query:
            service, repo_path = name, path[: -len("/info/refs")]
    repo = repo_path.strip("/").removesuffix(".git")
    command = ""
    if body:
        if git_protocol and "version=2" in git_protocol:
            for token in (b"command=fetch", b"command=ls-refs"):
                if token in body[:200]:
                    command = token.decode().split("=", 1)[1]
        else:
            command = "fetch"
    return repo, service, command


def _tls_context(directory: Path, *, addresses: Iterable[str] = ()) -> tuple[bytes, ssl.SSLContext]:
    """A throw-away CA and a certificate for 127.0.0.1 (and ``addresses``) signed by it; returns
    (CA PEM, ctx)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
              signer: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))
                                             for address in ("127.0.0.1", *addresses)]),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = build("gitserver test CA", ca_key, "gitserver test CA", ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build("127.0.0.1", key, "gitserver test CA", ca_key, ca=False)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return ca_cert.public_bytes(serialization.Encoding.PEM), context


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # 200 concurrent clients must not overflow the listen backlog

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that hang up (e.g. after refusing our TLS certificate) are no error."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, ssl.SSLError, TimeoutError)):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]

    def __init__(self, state: _State) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


class GitServer:
    """A smart-HTTP Git server on 127.0.0.1 with helpers to build repositories.

    ``username``/``password`` require HTTP basic auth; ``bearer_token`` requires
    ``Authorization: Bearer <token>``.  Without either, anonymous access is allowed.
    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        *,
        root: Path | None = None,
        username: str | None = None,
        password: str | None = None,
        bearer_token: str | None = None,
        tls: bool = False,
        accounts: Mapping[str, str] | None = None,
        tls_addresses: Iterable[str] = (),
    ) -> None:
        """``tls_addresses``: more IP addresses the certificate names (a relay's, such as the test
        node's bridge address that carries the server's port to pods)."""
        self._owned_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="gitserver-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self._state = _State(project_root=self.root,
                             auth=_Auth(username=username, password=password,
                                        bearer_token=bearer_token),
                             accounts=dict(accounts or {}))
        self._dirs: dict[str, str] = {}
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.tls = tls
        self.tls_addresses = tuple(tls_addresses)
        self.ca_pem: bytes | None = None
        """With ``tls=True``: the PEM of the private CA that signed the server's certificate."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> GitServer:
        self._httpd = _Server(self._state)
        if self.tls:
            self.ca_pem, context = _tls_context(self.root / ".tls", addresses=self.tls_addresses)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="gitserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._owned_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> GitServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the Git server is not running")
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host!s}:{port}"

    def url(self, name: str) -> str:
        """The clone URL of repository ``name`` (no credentials in it)."""
        return f"{self.base_url}/{self._dirs.get(name, f'{name}.git')}"

    def repo_path(self, name: str) -> Path:
        return self.root / self._dirs.get(name, f"{name}.git")

    # -- who sees what -----------------------------------------------------------------

    def restrict(self, name: str, users: Iterable[str]) -> None:
        """Only ``users`` (of ``accounts``) may read repository ``name``; others get 404
        (401 without credentials)."""
        with self._state.lock:
            self._state.restricted[self.repo_path(name).name] = set(users)

    def user_config(self, user: str, key: str, value: str) -> None:
        """Extra ``git`` configuration for ``user``'s requests (e.g. ``uploadpack.hideRefs``)."""
        with self._state.lock:
            self._state.user_config.setdefault(user, []).append((key, value))

    def user_protocol_v0(self, user: str) -> None:
        """Speak Git protocol version 0 to ``user`` (``""``: anonymous requests)."""
        with self._state.lock:
            self._state.protocol_v0.add(user)

    # -- request log -------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        with self._state.lock:
            return list(self._state.log)

    def fetch_count(self, name: str | None = None) -> int:
        """How many pack fetches (upload-pack ``fetch`` commands) were answered with 200."""
        return sum(1 for r in self.requests
                   if r.command == "fetch" and r.status == 200 and name in (None, r.repo))

    def reset_log(self) -> None:
        with self._state.lock:
            self._state.log.clear()

    # -- repository helpers ------------------------------------------------------------

    def git(self, name: str, *args: str, input: bytes | None = None,
            env: Mapping[str, str] | None = None) -> str:
        """Run ``git`` in the bare repository ``name``; returns stripped stdout."""
        full_env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1",
                    "GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE,
                    **(env or {})}
        result = subprocess.run(
            ["git", *GIT_IDENTITY, "-C", str(self.repo_path(name)), *args],
            input=input, capture_output=True, env=full_env, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.decode()}")
        return result.stdout.decode().strip()

    def create_repo(
        self,
        name: str,
        files: Mapping[str, FileValue] | None = None,
        *,
        branch: str = "main",
        message: str = "initial",
        directory: str | None = None,
    ) -> str:
        """Create bare repository ``name`` (HEAD -> ``branch``), commit ``files``; returns URL.

        It lives in ``<name>.git`` unless ``directory`` names another directory (e.g.
        ``"vault"`` next to a ``"vault.git"``: two repositories).
        """
        if directory is not None:
            self._dirs[name] = directory
        path = self.repo_path(name)
        subprocess.run(["git", *GIT_IDENTITY, "init", "--bare", "--quiet",
                        f"--initial-branch={branch}", str(path)], check=True)
        self.git(name, "config", "http.receivepack", "true")
        # Like GitHub and GitLab: partial clone filters (blob:limit) are honoured.
        self.git(name, "config", "uploadpack.allowFilter", "true")
        if files is not None:
            self.commit(name, files, message=message, branch=branch)
        return self.url(name)

    def head(self, name: str, ref: str = "main") -> str:
        """The commit ``ref`` (branch, tag or full ref name) points to, peeled."""
        return self.git(name, "rev-parse", f"{ref}^{{commit}}")

    def commit(
        self,
        name: str,
        files: Mapping[str, FileValue],
        *,
        message: str = "update",
        branch: str = "main",
        parent: str | None = "branch",
        replace: bool = False,
    ) -> str:
        """Commit ``files`` on ``branch``; returns the new commit id.

        By default the commit builds on the branch tip (``parent="branch"``) and ``files``
        are changes: a ``None`` value deletes that path.  ``replace=True`` makes ``files`` the
        whole tree.  ``parent`` may be a commit id, or ``None`` for a root commit; a parent
        that is not the current tip rewrites history, as a force-push would.
        """
        ref = branch if branch.startswith("refs/") else f"refs/heads/{branch}"
        current = self._resolve(name, ref)
        base = current if parent == "branch" else parent
        with tempfile.TemporaryDirectory(prefix="gitserver-index-") as tmp:
            index_env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if base is not None and not replace:
                self.git(name, "read-tree", base, env=index_env)
            lines = []
            for path, value in files.items():
                if value is None:
                    lines.append(f"0 {'0' * 40}\t{path}")
                    continue
                mode, sha = self._object_for(name, value)
                lines.append(f"{mode} {sha}\t{path}")
            self.git(name, "update-index", "--index-info",
                     input=("\n".join(lines) + "\n").encode(), env=index_env)
            tree = self.git(name, "write-tree", env=index_env)
        parents = ["-p", base] if base is not None else []
        sha = self.git(name, "commit-tree", tree, *parents, "-m", message)
        self.git(name, "update-ref", ref, sha)
        return sha

    def import_files(self, name: str, files: Iterable[tuple[str, bytes]], *,
                     branch: str = "main", message: str = "import") -> str:
        """Commit many files at once with ``git fast-import`` (one process, streamed).

        Builds on the tip of ``branch``; ``files`` may be a generator, so 100 000 files cost
        neither 100 000 processes nor the whole set in memory.  Returns the new commit.
        """
        ref = f"refs/heads/{branch}"
        parent = self._resolve(name, ref)
        env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
        process = subprocess.Popen(
            ["git", *GIT_IDENTITY, "-C", str(self.repo_path(name)), "fast-import", "--quiet",
             "--done"],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        assert process.stdin is not None
        write = process.stdin.write
        data = message.encode()
        write(f"commit {ref}\ncommitter Test Author <author@example.test> 1704067200 +0000\n"
              f"data {len(data)}\n".encode() + data + b"\n")
        if parent is not None:
            write(f"from {parent}\n".encode())
        for path, content in files:
            write(f"M 100644 inline {path}\ndata {len(content)}\n".encode() + content + b"\n")
        write(b"\ndone\n")
        _, stderr = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"git fast-import failed: {stderr.decode()}")
        return self.head(name, branch)

    def force_push(self, name: str, files: Mapping[str, FileValue], *, branch: str = "main",
                   message: str = "rewritten") -> str:
        """Replace the tip of ``branch`` with a commit on its parent (history rewritten)."""
        tip = self._resolve(name, f"refs/heads/{branch}")
        parent = self._resolve(name, f"{tip}^") if tip is not None else None
        return self.commit(name, files, message=message, branch=branch, parent=parent)

    def branch(self, name: str, branch: str, *, start: str = "main") -> str:
        """Create (or move) ``branch`` at ``start``; returns its commit."""
        sha = self.head(name, start)
        self.git(name, "update-ref", f"refs/heads/{branch}", sha)
        return sha

    def delete_branch(self, name: str, branch: str) -> None:
        self.git(name, "update-ref", "-d", f"refs/heads/{branch}")

    def set_ref(self, name: str, ref: str, commit: str) -> None:
        """Point any ref (e.g. ``refs/pull/7/head``) at ``commit``."""
        self.git(name, "update-ref", ref, commit)

    def set_head(self, name: str, branch: str) -> None:
        """Make the remote HEAD a symbolic ref to ``branch``."""
        self.git(name, "symbolic-ref", "HEAD", f"refs/heads/{branch}")

    def tag(self, name: str, tag: str, *, ref: str = "main", annotated: bool = False,
            message: str | None = None) -> str:
        """Tag ``ref``; returns the tagged commit."""
        sha = self.head(name, ref)
        if annotated:
            self.git(name, "tag", "-a", tag, sha, "-m", message or tag)
        else:
            self.git(name, "tag", tag, sha)
        return sha

    def configure(self, name: str, key: str, value: str) -> None:
        """Set a config key in the served repository (e.g. ``uploadpack.allowAnySHA1InWant``)."""
        self.git(name, "config", key, value)

    def refuse_unadvertised_wants(self, name: str, refuse: bool = True) -> None:
        """Make ``name`` send only ref tips, like servers that do not allow fetching any
        reachable commit by id (git over HTTP itself always allows it)."""
        with self._state.lock:
            if refuse:
                self._state.tips_only.add(name)
            else:
                self._state.tips_only.discard(name)

    def _resolve(self, name: str, rev: str) -> str | None:
        result = subprocess.run(
            ["git", "-C", str(self.repo_path(name)), "rev-parse", "--verify", "--quiet", rev],
            capture_output=True, check=False,
        )
        return result.stdout.decode().strip() or None

    def _object_for(self, name: str,
                    value: str | bytes | Symlink | Submodule | Zeros) -> tuple[str, str]:
        if isinstance(value, Submodule):
            return "160000", value.commit
        if isinstance(value, Zeros):
            with tempfile.TemporaryDirectory(prefix="gitserver-zeros-") as tmp:
                path = Path(tmp) / "zeros"
                with path.open("wb") as handle:
                    handle.truncate(value.size)
                return "100644", self.git(name, "hash-object", "-w", str(path))
        if isinstance(value, Symlink):
            return "120000", self._hash(name, value.target.encode())
        data = value.encode() if isinstance(value, str) else value
        return "100644", self._hash(name, data)

    def _hash(self, name: str, data: bytes) -> str:
        return self.git(name, "hash-object", "-w", "--stdin", input=data)


def make_files(count: int, *, prefix: str = "deploy", size: int = 16) -> dict[str, str]:
    """``count`` small distinct files under ``prefix`` (for limit tests)."""
    return {f"{prefix}/f{i:05d}.yaml": f"n: {i}\n".ljust(size, "#") for i in range(count)}


__all__ = ["GitServer", "RequestRecord", "Submodule", "Symlink", "Zeros", "make_files"]
