"""Shown rights: when a routine pass may skip asking whether an identity may still write."""

from __future__ import annotations

import pytest

from stageset.apply.rights import ShownRights

CM_A = ("local", "system:serviceaccount:a:deployer", "/api/v1/namespaces/a/configmaps")


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("max_age", "shown_ago", "fresh"), [
    (3600.0, None, False),  # never shown: ask
    (3600.0, 0.0, True),
    (3600.0, 3599.0, True),
    (3600.0, 3600.0, False),  # due again
    (3600.0, 7200.0, False),
    (0.0, 0.0, False),  # 0: every pass asks
])
def test_rights_are_fresh_for_max_age_after_they_were_shown(
        max_age: float, shown_ago: float | None, fresh: bool) -> None:
    ticks = Ticks()
    rights = ShownRights(max_age=max_age, clock=ticks)
    if shown_ago is not None:
        rights.shown(CM_A)
        ticks.now += shown_ago
    assert rights.fresh(CM_A) is fresh


@pytest.mark.parametrize("other", [
    ("local", "system:serviceaccount:b:deployer", "/api/v1/namespaces/a/configmaps"),  # another identity
    ("local", "system:serviceaccount:a:deployer", "/api/v1/namespaces/b/configmaps"),  # another namespace
    ("local", "system:serviceaccount:a:deployer", "/api/v1/namespaces/a/secrets"),  # another kind
    ("remote-1", "system:serviceaccount:a:deployer", "/api/v1/namespaces/a/configmaps"),  # another cluster
])
def test_rights_shown_by_one_identity_kind_namespace_and_cluster_say_nothing_of_another(
        other: tuple[str, str, str]) -> None:
    rights = ShownRights(clock=Ticks())
    rights.shown(CM_A)
    assert rights.fresh(CM_A)
    assert not rights.fresh(other)


def test_a_denial_makes_the_next_pass_ask_again() -> None:
    rights = ShownRights(clock=Ticks())
    rights.shown(CM_A)
    rights.denied(CM_A)
    assert not rights.fresh(CM_A)
    rights.denied(CM_A)  # twice: no error
    assert len(rights) == 0


def test_the_least_recently_shown_are_forgotten_past_the_bound() -> None:
    rights = ShownRights(max_entries=2, clock=Ticks())
    keys = [("local", "u", f"/api/v1/namespaces/{n}/configmaps") for n in "abc"]
    rights.shown(keys[0])
    rights.shown(keys[1])
    rights.shown(keys[0])  # shown again: the most recent
    rights.shown(keys[2])
    assert len(rights) == 2
    assert [rights.fresh(k) for k in keys] == [True, False, True]


def test_with_max_age_zero_nothing_is_kept() -> None:
    rights = ShownRights(max_age=0.0, clock=Ticks())
    rights.shown(CM_A)
    assert len(rights) == 0
