"""Tokens for this cluster's ServiceAccounts, requested by the controller for a remote that trusts them.

Workload identity (``provider: generic``, :mod:`stageset.kube.federation`): a remote cluster whose
authentication configuration trusts this cluster's ServiceAccount issuer accepts a token this
cluster issues for a ServiceAccount, with the remote's audience, as that account's (prefixed)
identity.  :class:`TokenRequester` asks this cluster for such tokens — a ``TokenRequest``
(``POST .../serviceaccounts/<name>/token``), the verb ``create`` on ``serviceaccounts/token`` —
and keeps each one for the next requests:

- one token per (ServiceAccount, audiences), shared by every connection that needs it;
- re-requested once 80% of its lifetime has passed (well before it expires), and at once when the
  remote refused it (a 401: :meth:`TokenRequester.renew`, once per refused token, whichever thread
  saw it first);
- one request at a time per (ServiceAccount, audiences): the others wait for it and share it;
- a failed request is not remembered: a ServiceAccount deleted and created again is asked for again
  on the next use;
- at most :data:`MAX_KEPT` tokens kept (the least recently used go first; expired ones before).

Identity: the client handed in — the controller's own (its role grants ``create`` on
``serviceaccounts/token`` where the platform enabled workload identity).  Whose token may be asked
for is the caller's decision (:mod:`stageset.controller.targets.workload`), never this module's.

Invariants: a token is never logged, never part of an exception's message, a metric or a key of
anything but this cache; only its expiry is kept beside it.  A token asked for is bound to nothing
but its audiences and lifetime (:data:`EXPIRATION_SECONDS`, unless the apiserver shortens it).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from stageset.kube.client import ApiError, KubeClient, UnreachableError

EXPIRATION_SECONDS = 3600
"""The lifetime asked for; the apiserver may give less (``--service-account-max-token-expiration``)."""
RENEW_AT = 0.8
"""The fraction of a token's lifetime after which it is asked for again."""
MAX_KEPT = 4096


@dataclass(frozen=True, order=True)
class Account:
    """A ServiceAccount of this cluster."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


TokenKey = tuple[Account, tuple[str, ...]]


class TokenUnavailable(Exception):
    """No token could be had for an account: the message says why (never a token)."""

    def __init__(self, message: str, *, missing: bool = False, denied: bool = False):
        super().__init__(message)
        self.message = message
        self.missing = missing
        """The ServiceAccount does not exist."""
        self.denied = denied
        """The controller may not request its tokens."""


@dataclass(frozen=True)
class _Minted:
    token: str
    renew_at: float
    expires_at: float


def _expiry(status: dict[str, object], *, now: float, asked: int) -> float:
    """When the token expires: its ``expirationTimestamp``, else ``asked`` seconds from ``now``."""
    stamp = status.get("expirationTimestamp")
    if isinstance(stamp, str):
        try:
            return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return now + asked


class TokenRequester:
    """Tokens for ServiceAccounts, as ``client``'s identity, kept until they are due again."""

    def __init__(self, *, client: KubeClient, clock: Callable[[], float] = time.time,
                 expiration: int = EXPIRATION_SECONDS, max_kept: int = MAX_KEPT):
        self._client = client
        self._clock = clock
        self._expiration = expiration
        self._max_kept = max_kept
        self._lock = threading.Lock()
        self._kept: OrderedDict[TokenKey, _Minted] = OrderedDict()
        self._asking: dict[TokenKey, threading.Lock] = {}
        self.requested = 0
        """TokenRequests made so far (tests and metrics count them)."""

    def token(self, account: Account, audiences: tuple[str, ...]) -> str:
        """A token for ``account`` with ``audiences``: the one kept, or a new one when it is due;
        raises :class:`TokenUnavailable`."""
        key = (account, audiences)
        found = self._fresh(key)
        if found is not None:
            return found
        with self._one_at_a_time(key):
            found = self._fresh(key)  # another thread may have asked meanwhile
            return found if found is not None else self._request(key)

    def renew(self, account: Account, audiences: tuple[str, ...], *, refused: str) -> str:
        """After the remote refused ``refused`` (a 401): a new token — unless another thread has
        already replaced that one, whose replacement is then used."""
        key = (account, audiences)
        with self._one_at_a_time(key):
            with self._lock:
                kept = self._kept.get(key)
                if kept is not None and kept.token != refused and self._clock() < kept.renew_at:
                    return kept.token
                self._kept.pop(key, None)
            return self._request(key)

    def forget(self, account: Account) -> None:
        """Drop every token kept for ``account``."""
        with self._lock:
            for key in [k for k in self._kept if k[0] == account]:
                del self._kept[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def _fresh(self, key: TokenKey) -> str | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            if self._clock() >= kept.renew_at:
                return None
            self._kept.move_to_end(key)
            return kept.token

    def _one_at_a_time(self, key: TokenKey) -> threading.Lock:
        with self._lock:
            lock = self._asking.get(key)
            if lock is None:
                lock = self._asking[key] = threading.Lock()
                if len(self._asking) > 2 * self._max_kept:  # locks of keys long gone
                    for stale in [k for k in self._asking if k not in self._kept and k != key]:
                        del self._asking[stale]
            return lock

    def _request(self, key: TokenKey) -> str:
        account, audiences = key
        path = f"/api/v1/namespaces/{account.namespace}/serviceaccounts/{account.name}/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": list(audiences), "expirationSeconds": self._expiration}}
        now = self._clock()
        try:
            answer = self._client.request("POST", path, body=body)
        except ApiError as error:
            if error.not_found:
                raise TokenUnavailable(f"ServiceAccount {account} not found", missing=True) from None
            if error.forbidden:
                raise TokenUnavailable(f"the controller may not request tokens for ServiceAccount {account} "
                                       "(create serviceaccounts/token)", denied=True) from None
            raise TokenUnavailable(f"requesting a token for ServiceAccount {account} failed: HTTP "
                                   f"{error.status}") from None
        except UnreachableError as error:
            raise TokenUnavailable(f"requesting a token for ServiceAccount {account} failed: {error.why}") \
                from None
        finally:
            with self._lock:
                self.requested += 1
        status = answer.get("status")
        token = status.get("token") if isinstance(status, dict) else None
        if not isinstance(token, str) or not token or any(not 33 <= ord(c) < 127 for c in token):
            raise TokenUnavailable(f"the token requested for ServiceAccount {account} is not usable")
        assert isinstance(status, dict)
        expires = _expiry(status, now=now, asked=self._expiration)
        minted = _Minted(token=token, renew_at=now + RENEW_AT * max(0.0, expires - now), expires_at=expires)
        with self._lock:
            self._kept[key] = minted
            self._kept.move_to_end(key)
            self._evict()
        return token

    def _evict(self) -> None:
        """Expired tokens first, then the least recently used, down to ``max_kept`` (lock held)."""
        if len(self._kept) <= self._max_kept:
            return
        now = self._clock()
        for key in [k for k, m in self._kept.items() if m.expires_at <= now]:
            del self._kept[key]
        while len(self._kept) > self._max_kept:
            self._kept.popitem(last=False)
