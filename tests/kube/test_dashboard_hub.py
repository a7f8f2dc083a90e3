"""The dashboard hub's watches against the real apiserver: a page's objects are looked up from
memory, the pages are told only when what they show changed, and a kind the viewer may not list
is ``Unknown`` with that reason (never guessed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from stageset.api import API_VERSION
from stageset.apply.inventory import ObjectId
from stageset.cli.dashboard.hub import Hub
from stageset.cli.dashboard.views import ObjectState, Ref
from stageset.kube.client import ClientPool, Identity, KubeClient
from stageset.kube.types import KubeObject

pytestmark = pytest.mark.apiserver


class Changes:
    """Counts the hub's change notifications."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.count += 1


def page(namespace: str, *names: str) -> KubeObject:
    """A StageSet whose inventory names the ConfigMaps ``names`` (what its page looks up)."""
    entries = [{"id": ObjectId(namespace=namespace, name=name, group="", kind="ConfigMap").encode(),
                "v": "v1"} for name in names]
    return {"apiVersion": API_VERSION, "kind": "StageSet",
            "metadata": {"name": "shop", "namespace": namespace},
            "status": {"inventory": [{"name": "app", "entries": entries}]}}


def eventually(hub: Hub, ref: Ref, wanted: ObjectState, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (found := hub.lookup(ref)) != wanted:
        if time.monotonic() > deadline:
            pytest.fail(f"{ref.describe()}: {found}, not {wanted}")
        time.sleep(0.05)


@pytest.fixture
def hubs() -> Iterator[Callable[[KubeClient, str], Hub]]:
    started: list[Hub] = []

    def make(client: KubeClient, namespace: str) -> Hub:
        hub = Hub(client=client, namespace=namespace)
        started.append(hub)
        hub.start()
        return hub

    yield make
    for hub in started:
        hub.close()


def test_pages_hear_of_a_change_only_when_what_they_show_changed(
    installed: KubeClient, make_namespace: Callable[..., str], hubs: Callable[[KubeClient, str], Hub],
) -> None:
    namespace = make_namespace("hub")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    installed.request("POST", base, body={"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "kept", "namespace": namespace}})
    hub = hubs(installed, namespace)
    changes = Changes()
    hub.on_change(changes)
    kept, later = (Ref("v1", "ConfigMap", namespace, name) for name in ("kept", "later"))
    lease = hub.lease(page(namespace, "kept", "later"))
    eventually(hub, kept, ObjectState("Current"))
    assert hub.lookup(later) == ObjectState("NotFound")
    before = changes.count

    # Two writes that leave the ConfigMap Current: nothing a page shows changed, nobody is told.
    for value in ("a", "b"):
        installed.request("PATCH", f"{base}/kept", body={"metadata": {"labels": {"touched": value}}},
                          content_type="application/merge-patch+json")
    # One watch delivers in order: once "later" is seen, both patches were handled before it.
    installed.request("POST", base, body={"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "later", "namespace": namespace}})
    eventually(hub, later, ObjectState("Current"))
    assert changes.count == before + 1

    installed.request("DELETE", f"{base}/kept")
    eventually(hub, kept, ObjectState("NotFound"))
    assert changes.count == before + 2
    hub.release(lease)


def test_a_kind_the_viewer_may_not_list_is_unknown_with_the_reason(
    installed: KubeClient, kube_pool: ClientPool, make_namespace: Callable[..., str],
    hubs: Callable[[KubeClient, str], Hub],
) -> None:
    namespace = make_namespace("hub-denied")
    viewer = kube_pool.client(Identity(user="dashboard-viewer-without-rights"))
    hub = hubs(viewer, namespace)
    ref = Ref("v1", "ConfigMap", namespace, "anything")
    hub.release(hub.lease(page(namespace, "anything")))
    assert hub.lookup(ref) == ObjectState("Unknown", f"you may not list configmaps in namespace {namespace}")
    assert f"you may not list configmaps in namespace {namespace}" in hub.problems()
