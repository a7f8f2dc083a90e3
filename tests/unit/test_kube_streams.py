"""The client's two streaming readers — :meth:`KubeClient.stream` (a watch's JSON lines) and
:meth:`KubeClient.text_lines` (a pod's log) — against a loopback HTTP server that sends its body
in chunks which split lines (and a multi-byte character) in the middle, as a real connection may."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from stageset.kube.client import ApiError, Identity, KubeClient, UnreachableError


class ChunkServer:
    """Answers each connection with ``status`` and the given chunks (HTTP/1.1 chunked encoding),
    then closes it; remembers the request heads it read."""

    def __init__(self) -> None:
        self.status = 200
        self.chunks: list[bytes] = []
        self.heads: list[bytes] = []
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(4)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def _serve(self) -> None:
        self._socket.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                self.heads.append(head)
                reason = b"OK" if self.status < 300 else b"Forbidden"
                conn.sendall(b"HTTP/1.1 %d %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                             % (self.status, reason))
                for chunk in self.chunks:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


@pytest.fixture
def server() -> Iterator[ChunkServer]:
    serving = ChunkServer()
    yield serving
    serving.close()


def client_for(port: int) -> KubeClient:
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = False
    return KubeClient(api_client=k8s.ApiClient(configuration), identity=Identity(), timeout=5.0)


def test_watch_lines_are_joined_across_chunks_and_blank_lines_skipped(server: ChunkServer) -> None:
    server.chunks = [b'{"type": "ADDED", "object": {"a"', b': 1}}\n\n{"type": "MOD', b'IFIED"}\n',
                     b'{"type": "unterminated"']
    events = list(client_for(server.port).stream("/api/v1/pods", query={"watch": True}, timeout=5.0))
    # A line the server never finished (a connection that broke mid-event) is not an event.
    assert events == [{"type": "ADDED", "object": {"a": 1}}, {"type": "MODIFIED"}]
    assert b"accept: application/json\r\n" in server.heads[0].lower()
    assert b"watch=true" in server.heads[0]


def test_a_watch_asks_for_the_form_it_was_given(server: ChunkServer) -> None:
    server.chunks = [b"{}\n"]
    list(client_for(server.port).stream("/api/v1/pods", query={}, timeout=5.0, accept="application/x"))
    assert b"accept: application/x\r\n" in server.heads[0].lower()


def test_text_lines_keep_blank_lines_the_tail_and_split_characters(server: ChunkServer) -> None:
    snowman = "☃".encode()
    server.chunks = [b"first\n\nsec", b"ond " + snowman[:1], snowman[1:] + b"\nlast without newline"]
    lines = list(client_for(server.port).text_lines("/api/v1/namespaces/n/pods/p/log", query={}, timeout=5.0))
    assert lines == ["first", "", "second ☃", "last without newline"]
    assert b"accept: */*\r\n" in server.heads[0].lower()


@pytest.mark.parametrize("reader", ["stream", "text_lines"])
def test_an_error_status_is_an_api_error(server: ChunkServer, reader: str) -> None:
    server.status = 403
    server.chunks = [b'{"kind": "Status", "reason": "Forbidden", "message": "pods is forbidden"}']
    client = client_for(server.port)
    lines = client.stream("/x", query={}, timeout=5.0) if reader == "stream" \
        else client.text_lines("/x", query={}, timeout=5.0)
    with pytest.raises(ApiError) as caught:
        list(lines)
    assert (caught.value.status, caught.value.reason, caught.value.message) == (
        403, "Forbidden", "pods is forbidden")


@pytest.mark.parametrize("reader", ["stream", "text_lines"])
def test_a_closed_port_is_unreachable(reader: str) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    client = client_for(port)
    lines = client.stream("/x", query={}, timeout=5.0) if reader == "stream" \
        else client.text_lines("/x", query={}, timeout=5.0)
    with pytest.raises(UnreachableError) as caught:
        list(lines)
    assert caught.value.why == "connection refused"


def test_while_a_cluster_does_not_answer_one_held_watch_probes_it_and_the_others_wait() -> None:
    """The held watches of one cluster share a gate: an outage costs one watch's retries."""
    import threading

    from stageset.kube.watch import ClusterGate

    gate, stop = ClusterGate(), threading.Event()
    a, b = object(), object()
    assert gate.admit(a, stop)
    assert gate.admit(b, stop)  # nothing is down: everyone goes
    gate.failed(a)
    gate.failed(b)
    assert gate.admit(a, stop), "the first to fail probes"
    admitted = threading.Event()
    waiter = threading.Thread(target=lambda: gate.admit(b, stop) and admitted.set(), daemon=True)
    waiter.start()
    assert not admitted.wait(1.5), "b waits while a probes"
    gate.answered()
    assert admitted.wait(5), "the cluster answered: b goes on"
    # The prober that goes away hands the probing to a waiter.
    gate.failed(a)
    admitted.clear()
    waiter = threading.Thread(target=lambda: gate.admit(b, stop) and admitted.set(), daemon=True)
    waiter.start()
    assert not admitted.wait(1.5)
    gate.leave(a)
    assert admitted.wait(5)
    # A stop ends the wait.
    c, d = object(), object()
    gate.failed(c)
    stop.set()
    assert not gate.admit(d, stop)
