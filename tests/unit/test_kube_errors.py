"""What the client says about failing clusters: short, and nothing the server sent unless it is a Status."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from stageset.kube.client import Identity, KubeClient, UnreachableError, _api_error


def test_a_status_body_is_read() -> None:
    error = _api_error(
        403, b'{"kind": "Status", "reason": "Forbidden", "message": "configmaps is forbidden"}'
    )
    assert (error.status, error.reason, error.message) == (403, "Forbidden", "configmaps is forbidden")


@pytest.mark.parametrize("body", [b"<html>SECRET page</html>", b'{"message": "SECRET json"}', b"[1]", b""])
def test_anything_else_is_not_shown(body: bytes) -> None:
    error = _api_error(502, body)
    assert "SECRET" not in str(error)
    assert (
        error.message
        == f"HTTP 502 with an answer that is not a Kubernetes Status ({len(body)} bytes, not shown)"
    )


def test_a_reason_that_is_not_a_word_is_dropped() -> None:
    assert _api_error(500, b'{"kind": "Status", "reason": "x\\ny", "message": "m"}').reason == ""


def client_for(port: int) -> KubeClient:
    configuration = k8s.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.retries = False
    return KubeClient(api_client=k8s.ApiClient(configuration), identity=Identity(), timeout=0.5)


@pytest.fixture
def tarpit() -> Iterator[int]:
    """A loopback server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_closed_port_is_connection_refused() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(UnreachableError) as caught:
        client_for(port).get("/api/v1")
    assert caught.value.why == "connection refused"
    assert str(caught.value) == f"https://127.0.0.1:{port}: connection refused"


def test_a_server_that_never_answers_times_out(tarpit: int) -> None:
    with pytest.raises(UnreachableError) as caught:
        client_for(tarpit).get("/api/v1")
    assert caught.value.why == "no answer in time"
