"""The manager's watch cache: private copies, our own status until the watch shows it, and the states
the watches compare (run under the manager: tests/inprocess/test_cached_objects.py)."""

from __future__ import annotations

from typing import Any

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
