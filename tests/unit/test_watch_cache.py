"""The manager's watch cache: private copies, our own status until the watch shows it, and the states
the watches compare (run under the manager: tests/inprocess/test_cached_objects.py)."""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from stageset.controller.cache import ObjectCache
from stageset.controller.keys import ObjectKey

KEY = ObjectKey("StageSet", "shop", "app")


def obj(version: int, *, status: str, generation: int = 1) -> dict[str, Any]:
    return {"kind": "StageSet", "status": {"phase": status},
            "metadata": {"namespace": "shop", "name": "app", "resourceVersion": str(version),
                         "generation": generation}}


def generation(o: dict[str, Any]) -> tuple[Any, ...]:
    return (o["metadata"]["generation"],)


def test_each_read_is_a_private_copy() -> None:
    cache = ObjectCache()
    cache.update(KEY, obj(1, status="old"), states=generation)
    first = cache.get(KEY)
    assert first is not None
    first["status"]["phase"] = "changed by a reconcile"
    assert cache.get(KEY) == obj(1, status="old")


def test_our_own_write_wins_until_the_watch_shows_it_never_after() -> None:
    cache = ObjectCache()
    cache.update(KEY, obj(1, status="old"), states=generation)
    cache.wrote(obj(5, status="ours"))
    seen = cache.get(KEY)
    assert seen is not None
    assert seen["status"] == {"phase": "ours"}
    assert seen["metadata"]["resourceVersion"] == "1"  # spec and metadata stay the cache's
    cache.update(KEY, obj(3, status="older event"), states=generation)
    assert (cache.get(KEY) or {})["status"] == {"phase": "ours"}
    cache.update(KEY, obj(6, status="newer"), states=generation)
    assert (cache.get(KEY) or {})["status"] == {"phase": "newer"}
    cache.update(KEY, obj(7, status="after"), states=generation)
    assert (cache.get(KEY) or {})["status"] == {"phase": "after"}  # the write was forgotten


def test_a_write_to_an_object_deleted_meanwhile_is_not_kept() -> None:
    cache = ObjectCache()
    cache.wrote(obj(5, status="ours"))
    cache.update(KEY, obj(1, status="old"), states=generation)
    assert (cache.get(KEY) or {})["status"] == {"phase": "old"}


def test_update_returns_the_states_before_and_now_and_a_deletion_forgets_them() -> None:
    cache = ObjectCache()
    assert cache.update(KEY, obj(1, status="s"), states=generation) == (None, (1,))
    assert cache.update(KEY, obj(2, status="s", generation=2), states=generation) == ((1,), (2,))
    assert cache.update(KEY, None, states=generation) == ((2,), None)
    assert cache.get(KEY) is None
    assert cache.update(KEY, obj(3, status="s"), states=generation) == (None, (1,))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def big(version: int, *, name: str = "app") -> dict[str, Any]:
    o = obj(version, status="Ready " * 200)
    o["metadata"]["name"] = name
    return o


def test_an_object_is_deflated_only_once_it_stops_changing() -> None:
    clock = Clock()
    cache = ObjectCache(monotonic=clock, settle_seconds=10.0)
    cache.update(KEY, big(1), states=generation)
    stored = cache.objects[KEY]
    assert zlib.decompress(stored) == orjson.dumps(big(1))  # kept as it is while it changes
    assert len(stored) > len(orjson.dumps(big(1)))
    clock.now = 9.0
    cache.update(KEY, big(2), states=generation)
    clock.now = 18.0
    assert cache.settle() == 0  # changed 9 s ago
    clock.now = 19.0
    assert cache.settle() == 1
    deflated = cache.objects[KEY]
    assert len(deflated) < len(orjson.dumps(big(2))) // 4
    assert cache.get(KEY) == big(2)
    assert cache.settle() == 0  # nothing left to deflate


def test_the_oldest_waiting_objects_are_deflated_past_the_bound_and_events_settle_a_few() -> None:
    clock = Clock()
    cache = ObjectCache(monotonic=clock, settle_seconds=10.0, max_unsettled=2)
    keys = [ObjectKey("StageSet", "shop", f"s{i}") for i in range(3)]
    for i, key in enumerate(keys):
        cache.update(key, big(i + 1, name=key.name), states=generation)
    sizes = [len(cache.objects[key]) for key in keys]
    assert sizes[0] < sizes[1] // 4  # past the bound: the oldest was deflated by the third event
    assert sizes[1] == sizes[2]
    clock.now = 11.0
    cache.update(ObjectKey("StageSet", "shop", "other"), big(9, name="other"), states=generation)
    assert all(len(cache.objects[key]) < sizes[2] // 4 for key in keys)  # due, settled by an event
    assert [cache.get(key) for key in keys] == [big(i + 1, name=key.name) for i, key in enumerate(keys)]


def test_a_deleted_object_is_not_deflated_back() -> None:
    clock = Clock()
    cache = ObjectCache(monotonic=clock, settle_seconds=10.0)
    cache.update(KEY, big(1), states=generation)
    cache.update(KEY, None, states=generation)
    clock.now = 20.0
    assert cache.settle() == 0
    assert KEY not in cache
    assert cache.get(KEY) is None
