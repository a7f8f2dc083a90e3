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
- the store is bounded per identity and in all (:class:`LoginStore`): an identity holds at most
  :attr:`LoginStore.per_identity` logins — a new one of an identity at its bound ends that
  identity's own least recently used login — and past :attr:`LoginStore.limit` logins in all a
  new sign-in is refused: **one identity never ends another's login**.  An identity is the
  apiserver's username, except that every ServiceAccount of one namespace counts as one identity
  (``system:serviceaccount:<namespace>``): whoever can mint tokens for one of them can for all;
- every login expires: after ``idle`` seconds unused, after ``lifetime`` seconds in any
  case, and no later than the token's own ``exp`` when it carries one (read, not trusted: the
  apiserver checks the token on every request anyway);
- sign-ins are throttled (:class:`SignInThrottle`) per client address and per identity, and
  failed ones more strictly: a client past its bound is refused before the apiserver is asked
  anything (each sign-in costs a review request there);
- ending a login (logout, expiry, eviction) stops its watches and drops its token.
"""

from __future__ import annotations

import base64
import json
import secrets
import sys
import threading
import time
from collections import OrderedDict
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
    THROTTLED = "too many sign-ins; wait a minute and try again"
    FULL = "the dashboard keeps as many logins as it may; try again when one has ended"


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


def identity_of(user: str) -> str:
    """Whose logins are bounded together: the username, or for a ServiceAccount its namespace's
    accounts as one (``system:serviceaccount:<namespace>``)."""
    prefix = "system:serviceaccount:"
    if user.startswith(prefix):
        return prefix + user.removeprefix(prefix).partition(":")[0]
    return user


def sign_in(cluster: Cluster, *, token: str, namespace: str | None
            ) -> SignedIn | tuple[Refusal, str] | tuple[Refusal, str, str]:
    """Check ``token`` with the apiserver, as itself: who it is (``SelfSubjectReview``), then whether
    it may list StageSets in ``namespace`` (``None``: every namespace).  The session returned talks
    as that token only; a refusal says why (and the apiserver's words, never the token) and, once
    the apiserver said who it is, whose it was (the third item)."""
    token = token.strip()
    if not token:
        return Refusal.EMPTY, ""
    if not well_formed(token):
        return Refusal.NOT_A_TOKEN, ""
    session = Session(namespace_flag=namespace, all_namespaces=namespace is None, kubeconfig=None)
    session._pool = cluster.pool(token)
    session._resolved = True  # no kubeconfig: the pool above is the only way to the cluster
    client = session.client()
    user = ""
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
            return Refusal.FORBIDDEN_SCOPE, f"{where}: {error.message}", user
        return Refusal.UNREACHABLE, f"{error.message} ({error.status})"
    except UnreachableError as error:
        session.close()
        return Refusal.UNREACHABLE, error.why
    except CliError as error:
        session.close()
        return Refusal.UNREACHABLE, error.message
    return SignedIn(user=user, session=session)


class LoginStore:
    """The logins of one dashboard process: bounded per identity and in all, expiring, each ended
    exactly once."""

    def __init__(self, *, limit: int, idle: float, lifetime: float, per_identity: int | None = None):
        self.limit, self.idle, self.lifetime = limit, idle, lifetime
        wanted = per_identity if per_identity is not None else DEFAULT_PER_IDENTITY
        self.per_identity = max(1, min(limit, wanted))
        self._lock = threading.Lock()
        self._logins: dict[str, Login] = {}

    def expiry(self, token: str) -> float:
        """When a login made now with ``token`` ends at the latest (monotonic clock)."""
        ends = time.monotonic() + self.lifetime
        exp = token_expiry(token)
        if exp is not None:
            ends = min(ends, time.monotonic() + (exp - time.time()))
        return ends

    def add(self, login: Login) -> bool:
        """Keep ``login``: an identity at :attr:`per_identity` logins first ends its own least recently
        used one; past :attr:`limit` in all, ``login`` is not kept (``False``): nobody else's ends."""
        ended: list[Login] = []
        with self._lock:
            ended.extend(self._expired_locked())
            whose = identity_of(login.user)
            own = sorted((known for known in self._logins.values() if identity_of(known.user) == whose),
                         key=lambda known: known.seen)
            while own and (len(own) >= self.per_identity or len(self._logins) >= self.limit):
                ended.append(self._logins.pop(own.pop(0).id))
            kept = len(self._logins) < self.limit
            if kept:
                login.seen = time.monotonic()
                self._logins[login.id] = login
        self._end(ended, why="evicted (a newer login of the same identity)")
        return kept

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


DEFAULT_PER_IDENTITY = 5
"""Logins one identity keeps at once unless told (``--max-logins-per-identity``)."""


@dataclass
class _Bucket:
    tokens: float
    at: float


class _Buckets:
    """Token buckets by key: ``burst`` at most, refilled at ``rate`` per second; at most ``keys``
    keys remembered (the least recently touched forgotten: a forgotten key starts full again)."""

    def __init__(self, *, burst: float, rate: float, keys: int, clock: Callable[[], float]):
        self.burst, self.rate, self.keys, self._clock = burst, rate, keys, clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def _get(self, key: str) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.pop(key, None) or _Bucket(tokens=self.burst, at=now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        self._buckets[key] = bucket
        while len(self._buckets) > self.keys:
            self._buckets.popitem(last=False)
        return bucket

    def available(self, key: str) -> bool:
        return self._get(key).tokens >= 1.0

    def take(self, key: str) -> bool:
        """Spend a token of ``key``; ``False`` (nothing spent) when there is none."""
        bucket = self._get(key)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def spend(self, key: str) -> None:
        """Spend a token of ``key`` whether or not there is one (a failure already made)."""
        bucket = self._get(key)
        bucket.tokens = max(-self.burst, bucket.tokens - 1.0)


class SignInThrottle:
    """How often sign-ins may be tried: per client address (every attempt, and failed ones more
    strictly; checked before the apiserver is asked anything) and per identity (sign-ins, and
    failed ones: an identity refused a namespace).  By default 20 attempts at once and 20 a minute,
    10 failures at once and 2 a minute after that.  Bounded memory: at most ``keys`` addresses and
    identities remembered each."""

    def __init__(self, *, attempts: int = 20, failures: int = 10, per_minute: float = 20.0,
                 failures_per_minute: float = 2.0, keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        def buckets(burst: int, per_min: float) -> _Buckets:
            return _Buckets(burst=burst, rate=per_min / 60.0, keys=keys, clock=clock)
        self._lock = threading.Lock()
        self._client = buckets(attempts, per_minute)
        self._client_failures = buckets(failures, failures_per_minute)
        self._identity = buckets(attempts, per_minute)
        self._identity_failures = buckets(failures, failures_per_minute)

    def client(self, address: str) -> bool:
        """May ``address`` try a sign-in now (one attempt spent when it may)?"""
        with self._lock:
            return self._client_failures.available(address) and self._client.take(address)

    def identity(self, user: str) -> bool:
        """May ``user``'s identity sign in now (one spent when it may)?"""
        key = identity_of(user)
        with self._lock:
            return self._identity_failures.available(key) and self._identity.take(key)

    def failed(self, address: str, user: str | None) -> None:
        """A sign-in from ``address`` (as ``user``, once known) was refused."""
        with self._lock:
            self._client_failures.spend(address)
            if user:
                self._identity_failures.spend(identity_of(user))


def note(line: str) -> None:
    """One line on the dashboard's stderr (logins, refusals); never a token."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

