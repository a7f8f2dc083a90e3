"""Our list/watch loop against the real apiserver, with a 410 injected at the HTTP boundary."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.watch import Reflector

pytestmark = pytest.mark.apiserver

CONFIGMAPS = Resource(group="", version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, event: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((event, obj["metadata"]["name"]))

    def wait_for(self, wanted: tuple[str, str], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if wanted in self.events:
                    return
            time.sleep(0.05)
        pytest.fail(f"no {wanted} in {self.events}")


class FlakyClient(KubeClient):
    """A real client whose next watch stream fails with 410 Gone once ``expire`` is set."""

    def __init__(self, real: KubeClient) -> None:
        self.__dict__.update(real.__dict__)
        self.expire = threading.Event()
        self.lists = 0

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == "GET" and not path.endswith("/status"):
            self.lists += 1
        return super().request(method, path, **kwargs)

    def stream(self, path: str, *, query: Mapping[str, str | int | bool],
               timeout: float) -> Iterator[dict[str, Any]]:
        if self.expire.is_set():
            self.expire.clear()
            raise ApiError(status=410, reason="Expired", message="too old resource version")
        # Short server-side timeouts so the injected 410 is reached quickly.
        yield from super().stream(path, query={**query, "timeoutSeconds": 1}, timeout=timeout)


def cm(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}


def test_namespace_scoped_watch_follows_changes_and_relists_after_410(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    namespace, elsewhere = make_namespace("watch"), make_namespace("other")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    admin.request("POST", base, body=cm(namespace, "before"))
    client = FlakyClient(admin)
    recorder = Recorder()
    stop = threading.Event()
    reflector = Reflector(client=client, resource=CONFIGMAPS, namespace=namespace, handler=recorder,
                          stop=stop)
    thread = reflector.start()
    try:
        assert reflector.synced.wait(20)
        recorder.wait_for(("ADDED", "before"))
        admin.request("POST", base, body=cm(namespace, "during"))
        recorder.wait_for(("ADDED", "during"))
        admin.request("POST", f"/api/v1/namespaces/{elsewhere}/configmaps", body=cm(elsewhere, "foreign"))

        lists_before = client.lists
        client.expire.set()
        admin.request("DELETE", f"{base}/before")
        admin.request("POST", base, body=cm(namespace, "after"))
        # Whether the watch or the relist sees them first, both changes must arrive.
        recorder.wait_for(("DELETED", "before"))
        recorder.wait_for(("ADDED", "after"))
        deadline = time.monotonic() + 20
        while client.lists == lists_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.lists > lists_before, "410 did not cause a relist"
        assert all(name != "foreign" for _, name in recorder.events)
    finally:
        stop.set()
        thread.join(timeout=10)


NAMESPACES = Resource(group="", version="v1", kind="Namespace", plural="namespaces", namespaced=False)


def test_a_metadata_only_watch_sees_metadata_and_nothing_else(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    namespace = make_namespace("meta")
    seen: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()
    reflector = Reflector(client=admin, resource=NAMESPACES, namespace=None, stop=stop, metadata_only=True,
                          handler=lambda event, obj: seen.append((event, obj)),
                          field_selector=f"metadata.name={namespace}")
    thread = reflector.start()
    try:
        assert reflector.synced.wait(20)
        admin.request("PATCH", f"/api/v1/namespaces/{namespace}", content_type="application/merge-patch+json",
                      body={"metadata": {"labels": {"stages.metio.wtf/tenant": "payments"}}})
        deadline = time.monotonic() + 20
        while not any((o["metadata"].get("labels") or {}).get("stages.metio.wtf/tenant") for _, o in seen):
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        # Listed and watched: metadata only, never a Namespace's spec or status.
        assert [event for event, _ in seen][:1] == ["ADDED"]
        assert {o.get("kind") for event, o in seen if event == "MODIFIED"} == {"PartialObjectMetadata"}
        assert all("spec" not in o and "status" not in o for _, o in seen)
    finally:
        stop.set()
        thread.join(timeout=10)
