"""Held watches of the shared pool against the real apiserver (``stageset/kube/watches.py``): started
from a known resourceVersion without a list, shared by holders of one key, closed at once when the last
lets go, metadata only, and as the identity that opened them (a denial is retried, and said)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from stageset.kube.client import ClientPool, Identity, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.watches import WatchPool
from tests.conftest import Tenant
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.apiserver

CONFIGMAPS = Resource(group="", version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)
SELECTOR = "stages.metio.wtf/name"


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, event: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((event, obj["metadata"]["name"], obj))

    def names(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(e, n) for e, n, _ in self.events]


def cm(name: str, value: str = "v", labelled: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {SELECTOR: "x"} if labelled else {}},
        "data": {"k": value},
    }


def held_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("held-configmaps"))


def test_a_held_watch_starts_where_it_is_told_is_shared_and_closes_at_once(
    admin: KubeClient,
    make_namespace: Callable[..., str],
) -> None:
    namespace = make_namespace("held")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    before = admin.apply(
        f"{base}/before",
        {**cm("before"), "metadata": {**cm("before")["metadata"], "namespace": namespace}},
        field_manager="test",
    )
    pool = WatchPool()
    first, second = Heard(), Heard()
    listed: list[set[tuple[str, str]]] = []
    threads = held_threads()
    key = pool.hold(
        "a",
        admin,
        CONFIGMAPS,
        namespace,
        handler=first,
        label_selector=SELECTOR,
        resource_version=before["metadata"]["resourceVersion"],
        listed=listed.append,
    )
    assert pool.hold("b", admin, CONFIGMAPS, namespace, handler=second, label_selector=SELECTOR) == key
    assert pool.held() == 1
    assert held_threads() == threads + 1
    admin.request("POST", base, body=cm("after"))
    admin.request("POST", base, body=cm("unlabelled", labelled=False))
    wait_for(
        lambda: ("ADDED", "after") in first.names() and ("ADDED", "after") in second.names(),
        what="both holders told of the new object",
    )
    # From the version it was told: nothing before it, no list, nothing outside the selector.
    assert ("ADDED", "before") not in first.names()
    assert listed == []
    assert not any(name == "unlabelled" for _, name in first.names())
    # Metadata only: no data reaches the holders.
    assert all("data" not in obj for _, _, obj in first.events)
    pool.release("a", key)
    assert pool.held() == 1
    pool.release("b", key)
    assert pool.held() == 0
    # Its stream is shut down now, not at the end of its half-hour timeout.
    wait_for(lambda: held_threads() == threads, timeout=20, what="the held watch's thread ended")
    admin.request("DELETE", f"{base}/after")
    assert ("DELETED", "after") not in first.names()


def test_a_label_removed_is_a_delete_and_a_watch_the_identity_may_not_open_is_retried_unhealthy(
    admin: KubeClient,
    kube_pool: ClientPool,
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("held-rbac")
    base = f"/api/v1/namespaces/{tenant.namespace}/configmaps"
    made = admin.request("POST", base, body=cm("a"))
    pool = WatchPool()
    heard = Heard()
    key = pool.hold(
        "h",
        admin,
        CONFIGMAPS,
        tenant.namespace,
        handler=heard,
        label_selector=SELECTOR,
        resource_version=made["metadata"]["resourceVersion"],
    )
    admin.request(
        "PATCH",
        f"{base}/a",
        content_type="application/merge-patch+json",
        body={"metadata": {"labels": {SELECTOR: None}}},
    )
    wait_for(lambda: ("DELETED", "a") in heard.names(), what="the unlabelled object told as DELETED")
    assert pool.healthy(key) is True
    # The tenant may not list ConfigMaps there: its watch fails, says so, and stays held (retried).
    denied = kube_pool.client(
        Identity.service_account(namespace=tenant.namespace, name=tenant.service_account)
    )
    refused = pool.hold("t", denied, CONFIGMAPS, tenant.namespace, handler=Heard(), label_selector=SELECTOR)
    assert refused != key
    wait_for(lambda: pool.healthy(refused) is False, what="the denied watch reported unhealthy")
    assert pool.held() == 2
    pool.close()
    assert pool.held() == 0


def test_a_drained_watch_tells_nobody_and_sends_nothing_until_the_server_ends_it(
    admin: KubeClient, make_namespace: Callable[..., str],
) -> None:
    """A watch of a namespace being deleted is drained: its holder hears nothing more, no request is
    made again, and its stream is left to end when the server ends it (not shut by us)."""
    namespace = make_namespace("drain")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    made = admin.request("POST", base, body=cm("a"))
    pool = WatchPool()
    heard = Heard()
    threads = held_threads()
    key = pool.hold("h", admin, CONFIGMAPS, namespace, handler=heard, label_selector=SELECTOR,
                    resource_version=made["metadata"]["resourceVersion"])
    admin.request("POST", base, body=cm("b"))
    wait_for(lambda: ("ADDED", "b") in heard.names(), what="the watch streaming")
    pool.release("h", key, drain=True)
    assert pool.held() == 0
    admin.request("POST", base, body=cm("c"))
    time.sleep(2)
    assert ("ADDED", "c") not in heard.names()
    assert held_threads() == threads + 1, "still reading its stream to the server's end"
