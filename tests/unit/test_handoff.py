"""When a hand-off record releases a StageSet a shard gained (stageset/controller/handoff.py)."""

from __future__ import annotations

from typing import Any

from stageset.controller.handoff import RELEASED_UID, RELEASED_VERSION, record_name, released


def record(*, uid: str = "u1", version: str = "10", own: str = "5") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": own,
                         "annotations": {RELEASED_UID: uid, RELEASED_VERSION: version}}}


def test_a_release_at_or_after_the_version_the_stageset_arrived_with() -> None:
    assert released(record(version="10"), uid="u1", version=10, seen=None, looked=False)
    assert released(record(version="12"), uid="u1", version=10, seen=None, looked=False)
    # An earlier move's release does not hand this one over.
    assert not released(record(version="9"), uid="u1", version=10, seen=None, looked=False)
    assert not released(None, uid="u1", version=10, seen=None, looked=True)


def test_a_release_of_another_stageset_of_that_name_is_not_one() -> None:
    assert not released(record(uid="old"), uid="u1", version=10, seen=None, looked=False)


def test_a_record_written_since_the_first_look_releases_even_without_a_version() -> None:
    relisted = record(version="", own="7")  # the losing shard learnt it from a relist: no version
    assert not released(relisted, uid="u1", version=10, seen=None, looked=False)
    assert not released(relisted, uid="u1", version=10, seen="7", looked=True)  # unchanged since
    assert released(relisted, uid="u1", version=10, seen="5", looked=True)
    assert released(relisted, uid="u1", version=10, seen=None, looked=True)  # absent at the first look


def test_record_names_are_valid_lease_names_and_tell_stagesets_apart() -> None:
    long = record_name("n" * 63, "s" * 253)
    assert len(long) <= 63
    assert long.startswith("stageset-handoff-")
    assert record_name("a", "b-c") != record_name("a-b", "c")
    assert record_name("a", "b") == record_name("a", "b")
