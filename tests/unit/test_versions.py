"""The resourceVersions remembered for warm passes: bounded in bytes, least recently used first out."""

from __future__ import annotations

from stageset.apply.versions import LiveVersions, Seen


def key(i: int) -> tuple[str, str, str]:
    return "local", "system:serviceaccount:shop:deployer", f"/api/v1/namespaces/shop/configmaps/c{i:03d}"


def test_bounded_in_bytes_least_recently_used_first_out() -> None:
    versions = LiveVersions(max_bytes=4000)
    for i in range(100):
        versions.put(key(i), Seen(version=str(i), digest="d" * 64))
    assert 0 < versions.bytes <= 4000
    kept = len(versions)
    assert 5 < kept < 100
    assert versions.get(key(0)) is None, "the oldest went first"
    assert versions.get(key(99)) == Seen(version="99", digest="d" * 64)
    versions.put(key(99), Seen(version="100", digest="e" * 64))  # replaced, not counted twice
    assert len(versions) == kept
    versions.drop(key(99))
    assert versions.get(key(99)) is None
    assert len(versions) == kept - 1
