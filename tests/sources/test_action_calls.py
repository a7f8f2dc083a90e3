"""``http`` actions' calls (:func:`sources.download.call`) against real servers on loopback, the
address guard ON where it is the subject.

Test servers can only listen on loopback, which the guard refuses, so a case that needs one hop to
pass uses ``PretendPublic`` (the real guard, except that ``127.0.0.2`` counts as public), as the
artifact tests do: every refusal is then the real rule at the real place (connect time, each hop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from sources.addresses import AddressGuard, AddressRefusedError
from sources.download import call
from sources.errors import TransferError, UrlPolicyError
from tests.actionserver import ActionServer
from tests.sources.test_artifact_fetch import PUBLIC, PretendPublic

INSECURE = AddressGuard(allow_insecure=True, purpose="actions", verb="call")
GUARD = AddressGuard(purpose="actions", verb="call")


@pytest.fixture
def server() -> Iterator[ActionServer]:
    with ActionServer() as running:
        yield running


@pytest.fixture
def public() -> Iterator[ActionServer]:
    with ActionServer(host=str(PUBLIC)) as running:
        yield running


def test_a_call_sends_method_headers_and_body_and_reads_a_bounded_answer(server: ActionServer) -> None:
    url = server.answer("/hook", 202, body=b"x" * 100_000)
    answer = call(
        url,
        method="PUT",
        guard=INSECURE,
        timeout=5,
        headers={"Authorization": "Bearer t"},
        body=b'{"a": 1}',
        max_body=1000,
    )
    assert (answer.status, len(answer.body)) == (202, 1000)
    (received,) = server.received("/hook")
    assert (received.method, received.body, received.headers["Authorization"]) == (
        "PUT",
        b'{"a": 1}',
        "Bearer t",
    )


def test_redirects_303_turn_into_get_307_keeps_the_method(server: ActionServer) -> None:
    server.answer("/done")
    server.answer("/see-other", 303, redirect="/done")
    server.answer("/temporary", 307, redirect="/done")
    assert call(server.url("/see-other"), method="POST", guard=INSECURE, timeout=5, body=b"b").status == 200
    assert call(server.url("/temporary"), method="POST", guard=INSECURE, timeout=5, body=b"b").status == 200
    assert [(r.method, r.body) for r in server.received("/done")] == [("GET", b""), ("POST", b"b")]


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("127.0.0.1", "loopback"),
        ("localhost", "loopback"),
        ("[::1]", "loopback"),
        ("2130706433", "loopback"),
        ("169.254.169.254", "cloud metadata"),
        ("[fe80::1]", "link-local"),
        ("0.0.0.0", "unspecified"),  # noqa: S104
    ],
)
def test_refused_addresses_are_never_called(server: ActionServer, host: str, says: str) -> None:
    server.answer("/hook")
    with pytest.raises(AddressRefusedError, match=f"refusing to call .*{says}.* not allowed for actions"):
        call(f"http://{host}:{server.port}/hook", method="POST", guard=GUARD, timeout=3)
    assert server.received("/hook") == []


def test_a_redirect_to_loopback_is_refused_at_the_second_hop(
    public: ActionServer, server: ActionServer
) -> None:
    target = server.answer("/internal")
    public.answer("/hook", 302, redirect=target)
    public.answer("/ok")
    guard = PretendPublic(purpose="actions", verb="call")
    assert call(public.url("/ok"), method="GET", guard=guard, timeout=5).status == 200
    with pytest.raises(AddressRefusedError, match="loopback"):
        call(public.url("/hook"), method="GET", guard=guard, timeout=5)
    assert len(public.received("/hook")) == 1
    assert server.received("/internal") == []


def test_every_hop_passes_the_callers_check(server: ActionServer) -> None:
    server.answer("/elsewhere")
    server.answer("/hook", 302, redirect=f"http://localhost:{server.port}/elsewhere")

    def only_127(url: str) -> None:
        if "127.0.0.1" not in url:
            raise UrlPolicyError(f"{url}: host not allowed")

    with pytest.raises(UrlPolicyError, match="host not allowed"):
        call(server.url("/hook"), method="GET", guard=INSECURE, timeout=5, check=only_127)
    assert server.received("/elsewhere") == []


def test_secrets_never_follow_a_redirect_to_another_origin(server: ActionServer) -> None:
    server.answer("/elsewhere")
    server.answer("/same", 307, redirect="/elsewhere")
    server.answer("/other", 307, redirect=f"http://localhost:{server.port}/elsewhere")
    # The same origin keeps the request (and its headers)...
    call(
        server.url("/same"),
        method="POST",
        guard=INSECURE,
        timeout=5,
        headers={"X-Token": "t"},
        same_origin=True,
    )
    # ...another one (here: another host name) does not receive it.
    with pytest.raises(UrlPolicyError, match="carries values from Secrets"):
        call(
            server.url("/other"),
            method="POST",
            guard=INSECURE,
            timeout=5,
            headers={"X-Token": "t"},
            same_origin=True,
        )
    assert len(server.received("/elsewhere")) == 1


def test_a_tarpit_is_cut_at_the_deadline() -> None:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    started = time.monotonic()
    with pytest.raises(TransferError, match="took longer than 1s"):
        call(f"http://127.0.0.1:{listener.getsockname()[1]}/slow", method="GET", guard=INSECURE, timeout=1)
    assert time.monotonic() - started < 5
    listener.close()
    for sock in accepted:
        sock.close()
