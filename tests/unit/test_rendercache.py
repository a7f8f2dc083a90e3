from __future__ import annotations

from stageset.controller.rendercache import RenderCache, render_key


def key(tree: str = "t1", variables: dict[str, str] | None = None, ignore: str | None = None) -> str:
    return render_key(url="https://git.example/x.git", tree=tree, ignore=ignore, variables=variables)


def test_key_changes_with_every_input_and_hides_values() -> None:
    base = key()
    assert key() == base
    assert key(tree="t2") != base
    assert key(ignore="*.md") != base
    assert key(variables={}) != base  # a postBuild with no variables is not "no postBuild"
    assert key(variables={"a": "1"}) != key(variables={"a": "2"})
    secret = key(variables={"token": "hunter2-secret"})
    assert "hunter2" not in secret
    assert len(secret) == 64  # a digest, not the values


def test_least_recently_used_entries_go_first() -> None:
    cache = RenderCache(max_entries=2)
    cache.put("a", [{"kind": "A"}])
    cache.put("b", [{"kind": "B"}])
    assert cache.get("a") == [{"kind": "A"}]
    cache.put("c", [{"kind": "C"}])
    assert cache.get("b") is None
    assert cache.get("a") is not None
    assert cache.get("c") is not None
    assert (cache.hits, cache.misses) == (3, 1)
