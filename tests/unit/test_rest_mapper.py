"""The discovery cache: one discovery per group-version, even when passes miss it at once."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from stageset.kube.client import KubeClient
from stageset.kube.mapping import RestMapper, UnknownKindError


class SlowDiscovery:
    """Answers discovery after every caller has arrived (so a cache without a single flight would
    let each of them ask), counting the requests."""

    def __init__(self, *, callers: int, kinds: list[str]):
        self.calls: list[str] = []
        self.kinds = kinds
        self._arrived = threading.Barrier(callers, timeout=5)
        self._lock = threading.Lock()

    def get(self, path: str) -> dict[str, Any]:
        with self._lock:
            self.calls.append(path)
        time.sleep(0.2)  # an answer slow enough that every caller has missed the cache meanwhile
        return {"resources": [{"name": f"{k.lower()}s", "kind": k, "namespaced": True} for k in self.kinds]}

    def arrive(self) -> None:
        self._arrived.wait()


def test_passes_that_miss_a_group_version_together_make_one_discovery() -> None:
    discovery = SlowDiscovery(callers=8, kinds=["ConfigMap", "Secret"])
    mapper = RestMapper(cast(KubeClient, discovery))
    found: list[str] = []

    def resolve() -> None:
        discovery.arrive()  # all eight miss the empty cache at the same moment
        found.append(mapper.resolve("v1", "ConfigMap").plural)
    threads = [threading.Thread(target=resolve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert found == ["configmaps"] * 8
    assert discovery.calls == ["/api/v1"]


def test_a_kind_not_known_yet_is_discovered_again_and_an_unserved_one_refused() -> None:
    discovery = SlowDiscovery(callers=1, kinds=["ConfigMap"])
    mapper = RestMapper(cast(KubeClient, discovery))
    assert mapper.resolve("v1", "ConfigMap").plural == "configmaps"
    discovery.kinds = ["ConfigMap", "Widget"]  # a CRD installed since
    assert mapper.resolve("v1", "Widget").plural == "widgets"
    with pytest.raises(UnknownKindError):
        mapper.resolve("v1", "Gadget")
    assert discovery.calls == ["/api/v1"] * 3
