"""Tokens for workload identity (:mod:`stageset.kube.tokens`), on a stub apiserver and an injected
clock: one TokenRequest per (ServiceAccount, audiences) until 80% of its lifetime has passed, one
more after a refusal (401) however many threads saw it, failures never remembered, and no token in
any message.  Pure units: the stub answers as the TokenRequest API does."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest

from stageset.kube.client import ApiError, UnreachableError
from stageset.kube.tokens import Account, TokenRequester, TokenUnavailable

DEPLOYER = Account("payments", "deployer")
AUDIENCE = ("https://prod.example:6443",)


class StubApiserver:
    """``POST .../serviceaccounts/<name>/token`` as the apiserver answers it; ``accounts`` exist."""

    def __init__(self, *, lifetime: int = 3600, clock: list[float]):
        self.accounts = {DEPLOYER, Account("payments", "other")}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lifetime = lifetime
        self.clock = clock
        self.denied = False
        self.down = False
        self.lock = threading.Lock()

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append((path, body))
            serial = len(self.calls)
        assert method == "POST"
        if self.down:
            raise UnreachableError(server="https://local", why="connection refused")
        if self.denied:
            raise ApiError(status=403, reason="Forbidden", message="cannot create serviceaccounts/token")
        parts = path.split("/")
        account = Account(parts[4], parts[6])
        if account not in self.accounts:
            raise ApiError(status=404, reason="NotFound",
                           message=f'serviceaccounts "{account.name}" not found')
        expires = datetime.datetime.fromtimestamp(self.clock[0] + self.lifetime, tz=datetime.UTC)
        return {"kind": "TokenRequest", "spec": body["spec"],
                "status": {"token": f"token-{account.name}-{serial}",
                           "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}


@pytest.fixture
def clock() -> list[float]:
    return [1_800_000_000.0]


@pytest.fixture
def stub(clock: list[float]) -> StubApiserver:
    return StubApiserver(clock=clock)


@pytest.fixture
def tokens(stub: StubApiserver, clock: list[float]) -> TokenRequester:
    return TokenRequester(client=stub, clock=lambda: clock[0])  # type: ignore[arg-type]


def test_one_request_per_account_and_audience_until_it_is_due(
        tokens: TokenRequester, stub: StubApiserver, clock: list[float]) -> None:
    first = tokens.token(DEPLOYER, AUDIENCE)
    assert [tokens.token(DEPLOYER, AUDIENCE) for _ in range(20)] == [first] * 20
    assert len(stub.calls) == 1
    path, body = stub.calls[0]
    assert path == "/api/v1/namespaces/payments/serviceaccounts/deployer/token"
    assert body["spec"] == {"audiences": list(AUDIENCE), "expirationSeconds": 3600}
    # Another audience, another account: tokens of their own.
    assert tokens.token(DEPLOYER, ("other-audience",)) != first
    assert tokens.token(Account("payments", "other"), AUDIENCE) != first
    assert len(stub.calls) == 3
    # Re-requested once 80% of the lifetime has passed, never later.
    clock[0] += 0.8 * 3600 - 1
    assert tokens.token(DEPLOYER, AUDIENCE) == first
    clock[0] += 1
    renewed = tokens.token(DEPLOYER, AUDIENCE)
    assert renewed != first
    assert len(stub.calls) == 4


def test_the_lifetime_the_apiserver_gave_counts(stub: StubApiserver, clock: list[float]) -> None:
    """A shorter lifetime than asked for (--service-account-max-token-expiration): due sooner."""
    stub.lifetime = 600
    tokens = TokenRequester(client=stub, clock=lambda: clock[0])  # type: ignore[arg-type]
    first = tokens.token(DEPLOYER, AUDIENCE)
    clock[0] += 480
    assert tokens.token(DEPLOYER, AUDIENCE) != first


def test_a_refused_token_is_renewed_once_whoever_saw_the_refusal(
        tokens: TokenRequester, stub: StubApiserver) -> None:
    refused = tokens.token(DEPLOYER, AUDIENCE)
    results: list[str] = []
    def renew() -> None:
        results.append(tokens.renew(DEPLOYER, AUDIENCE, refused=refused))

    threads = [threading.Thread(target=renew) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    assert refused not in results
    assert len(stub.calls) == 2, "eight threads saw the 401: one new token"
    # A later refusal of the new one renews again.
    assert tokens.renew(DEPLOYER, AUDIENCE, refused=results[0]) != results[0]
    assert len(stub.calls) == 3


def test_failures_name_the_account_and_are_not_remembered(
        tokens: TokenRequester, stub: StubApiserver) -> None:
    stub.accounts.discard(DEPLOYER)
    with pytest.raises(TokenUnavailable) as missing:
        tokens.token(DEPLOYER, AUDIENCE)
    assert missing.value.missing
    assert missing.value.message == "ServiceAccount payments/deployer not found"
    stub.accounts.add(DEPLOYER)  # created again: the next use asks again, and gets one
    assert tokens.token(DEPLOYER, AUDIENCE).startswith("token-deployer-")
    stub.denied = True
    with pytest.raises(TokenUnavailable) as denied:
        tokens.token(Account("payments", "other"), AUDIENCE)
    assert denied.value.denied
    assert "create serviceaccounts/token" in denied.value.message
    stub.denied, stub.down = False, True
    with pytest.raises(TokenUnavailable, match="connection refused"):
        tokens.token(Account("payments", "other"), AUDIENCE)
    assert tokens.requested == len(stub.calls) == 4


def test_a_renewal_that_fails_leaves_no_token_behind(tokens: TokenRequester, stub: StubApiserver) -> None:
    """A ServiceAccount deleted while its token is kept: the refusal's renewal fails, and the refused
    token is not handed out again."""
    refused = tokens.token(DEPLOYER, AUDIENCE)
    stub.accounts.discard(DEPLOYER)
    with pytest.raises(TokenUnavailable):
        tokens.renew(DEPLOYER, AUDIENCE, refused=refused)
    with pytest.raises(TokenUnavailable):
        tokens.token(DEPLOYER, AUDIENCE)
    stub.accounts.add(DEPLOYER)
    assert tokens.token(DEPLOYER, AUDIENCE) not in (refused,)


def test_an_unusable_answer_is_refused_without_quoting_it(stub: StubApiserver, clock: list[float]) -> None:
    class Garbled(StubApiserver):
        def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            answer = super().request(method, path, **kwargs)
            answer["status"]["token"] = "line\r\nbreak-secret"
            return answer

    tokens = TokenRequester(client=Garbled(clock=clock), clock=lambda: clock[0])  # type: ignore[arg-type]
    with pytest.raises(TokenUnavailable) as refused:
        tokens.token(DEPLOYER, AUDIENCE)
    assert "secret" not in str(refused.value)


def test_the_cache_is_bounded(stub: StubApiserver, clock: list[float]) -> None:
    tokens = TokenRequester(client=stub, clock=lambda: clock[0], max_kept=4)  # type: ignore[arg-type]
    for i in range(10):
        tokens.token(DEPLOYER, (f"aud-{i}",))
    assert len(tokens) == 4
    tokens.forget(DEPLOYER)
    assert len(tokens) == 0
