"""Logins of the shared dashboard (``stageset dashboard --login``): a person's bearer token behind a
session cookie.

Identity: **the person's own token**, for every request about tenant data.  A person pastes a
bearer token the apiserver accepts (a ServiceAccount token, an OIDC id token); :func:`sign_in`
asks the apiserver who it is (a ``SelfSubjectReview`` made *with that token*) and whether it may
list StageSets where asked, and only then makes a :class:`Login`: a client pool whose only
credential is that token, a :class:`~stageset.cli.dashboard.hub.Hub` (its watches, as that
person) and the pages over it.  The served process has no credentials of its own for the
cluster: no kubeconfig, and the chart mounts no ServiceAccount token into its Pod — so there is
no other identity a request *could* use.

Invariants:

- the token lives only in that login's client configuration, in memory: never in the cookie (which
  holds a random session id), a page, a log line or an error message;
- the store is bounded (:attr:`LoginStore.limit` logins; past it the least recently used is
  ended) and every login expires: after ``idle`` seconds unused, after ``lifetime`` seconds in any
  case, and no later than the token's own ``exp`` when it carries one (read, not trusted: the
  apiserver checks the token on every request anyway);
- ending a login (logout, expiry, eviction) stops its watches and drops its token.
"""

from __future__ import annotations

import base64
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from starlette.types import ASGIApp

from stageset.cli.session import CliError, Session
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError, ClientPool, UnreachableError

COOKIE = "stageset-dashboard-login"
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
MAX_TOKEN = 16384  # bytes of a pasted token (an OIDC id token with many groups stays well below)


class Refusal(StrEnum):
    """Why a sign-in was refused (shown on the login page; never the token)."""

    EMPTY = "paste a bearer token"
    NOT_A_TOKEN = "that is not a bearer token (one line of printable characters)"  # noqa: S105 - a reason
    UNAUTHENTICATED = "the cluster did not accept this token (401): it is wrong or expired"
    FORBIDDEN_SCOPE = "this identity may not list StageSets there"
    UNREACHABLE = "the cluster cannot be reached; try again"


@dataclass(frozen=True)
class Cluster:
    """Where the apiserver is and how its certificate is checked (no credentials here)."""

    server: str
    certificate_authority: str | None

    def pool(self, token: str) -> ClientPool:
        """Clients whose one credential is ``token``."""
        return ClientPool.from_token(server=self.server, certificate_authority=self.certificate_authority,
                                     token=token)


def token_expiry(token: str) -> float | None:
    """The ``exp`` of a JWT (seconds since the epoch), unverified; ``None``: not a JWT, or none."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    expiry = payload.get("exp") if isinstance(payload, dict) else None
    return float(expiry) if isinstance(expiry, int | float) and not isinstance(expiry, bool) else None


def well_formed(token: str) -> bool:
    """One line of visible ASCII (what a bearer token is); anything else is never sent anywhere."""
    return 0 < len(token) <= MAX_TOKEN and all(33 <= ord(c) < 127 for c in token)


@dataclass
class Login:
    """One person's session: who the apiserver says they are, and the pages made as them."""

    user: str
    namespace: str | None
    app: ASGIApp
    close: Callable[[], None]
    expires: float
    id: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    seen: float = 0.0  # when last used (monotonic clock); set when stored


@dataclass(frozen=True)
class SignedIn:
    user: str
    session: Session


def sign_in(cluster: Cluster, *, token: str, namespace: str | None) -> SignedIn | tuple[Refusal, str]:
    """Check ``token`` with the apiserver, as itself: who it is (``SelfSubjectReview``), then whether
    it may list StageSets in ``namespace`` (``None``: every namespace).  The session returned talks
    as that token only; a refusal says why (and the apiserver's words, never the token)."""
    token = token.strip()
    if not token:
        return Refusal.EMPTY, ""
    if not well_formed(token):
        return Refusal.NOT_A_TOKEN, ""
    session = Session(namespace_flag=namespace, all_namespaces=namespace is None, kubeconfig=None)
    session._pool = cluster.pool(token)
    session._resolved = True  # no kubeconfig: the pool above is the only way to the cluster
    client = session.client()
    try:
        review = client.request("POST", SELF_SUBJECT_REVIEWS, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        user = str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "?")
        client.request("GET", STAGESETS.collection_path(namespace), query={"limit": 1})
    except ApiError as error:
        session.close()
        if error.status == 401:
            return Refusal.UNAUTHENTICATED, ""
        if error.forbidden:
            where = f"namespace {namespace}" if namespace else "every namespace (name one)"
            return Refusal.FORBIDDEN_SCOPE, f"{where}: {error.message}"
        return Refusal.UNREACHABLE, f"{error.message} ({error.status})"
    except UnreachableError as error:
        session.close()
        return Refusal.UNREACHABLE, error.why
    except CliError as error:
        session.close()
        return Refusal.UNREACHABLE, error.message
    return SignedIn(user=user, session=session)


class LoginStore:
    """The logins of one dashboard process: bounded, expiring, each ended exactly once."""

    def __init__(self, *, limit: int, idle: float, lifetime: float):
        self.limit, self.idle, self.lifetime = limit, idle, lifetime
        self._lock = threading.Lock()
        self._logins: dict[str, Login] = {}

    def expiry(self, token: str) -> float:
        """When a login made now with ``token`` ends at the latest (monotonic clock)."""
        ends = time.monotonic() + self.lifetime
        exp = token_expiry(token)
        if exp is not None:
            ends = min(ends, time.monotonic() + (exp - time.time()))
        return ends

    def add(self, login: Login) -> None:
        """Keep ``login``; past :attr:`limit`, the least recently used login is ended."""
        ended: list[Login] = []
        with self._lock:
            ended.extend(self._expired_locked())
            while len(self._logins) >= self.limit:
                oldest = min(self._logins.values(), key=lambda known: known.seen)
                ended.append(self._logins.pop(oldest.id))
            login.seen = time.monotonic()
            self._logins[login.id] = login
        self._end(ended, why="evicted (too many logins)")

    def get(self, login_id: str | None) -> Login | None:
        """The live login of this cookie value (and marks it used); ``None``: none, or expired."""
        if not login_id:
            return None
        ended: list[Login] = []
        with self._lock:
            ended.extend(self._expired_locked())
            login = self._logins.get(login_id)
            if login is not None:
                login.seen = time.monotonic()
        self._end(ended, why="expired")
        return login

    def remove(self, login_id: str) -> Login | None:
        with self._lock:
            login = self._logins.pop(login_id, None)
        if login is not None:
            self._end([login], why="logged out")
        return login

    def sweep(self) -> None:
        with self._lock:
            ended = self._expired_locked()
        self._end(ended, why="expired")

    def __len__(self) -> int:
        with self._lock:
            return len(self._logins)

    def close(self) -> None:
        with self._lock:
            ended = list(self._logins.values())
            self._logins.clear()
        self._end(ended, why="dashboard stopped")

    def _expired_locked(self) -> list[Login]:
        now = time.monotonic()
        gone = [known for known in self._logins.values()
                if now >= known.expires or now - known.seen >= self.idle]
        for known in gone:
            del self._logins[known.id]
        return gone

    @staticmethod
    def _end(logins: list[Login], *, why: str) -> None:
        for login in logins:
            login.close()
            note(f"login of {login.user} ended: {why}")


def note(line: str) -> None:
    """One line on the dashboard's stderr (logins, refusals); never a token."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

