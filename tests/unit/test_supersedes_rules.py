"""``spec.supersedes`` (issue 46): the hand-over record and the rules around it, as pure tables.

The record a successor writes on its predecessor (:mod:`stageset.apply.handover`): its format, how it
grows, when an entry holds, when a StageSet refrains from taking objects back, and what a
predecessor's inventory is without what it handed over; and the controller's rules
(:mod:`stageset.controller.stageset.succession`): may a successor take over, which action ledger a
stage starts with, what a predecessor and a successor say.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stageset.api import THIS_CLUSTER, AppliedTarget, InventoryEntry, StageInventory
from stageset.api.actions import ActionLedger, ActionRun
from stageset.api.vocabulary import Reason
from stageset.apply.handover import (
    ANNOTATION,
    UNREADABLE,
    Entry,
    HandOver,
    Seen,
    handed,
    in_force,
    parse,
    refrains,
    released,
)
from stageset.apply.inventory import ObjectId
from stageset.controller.stageset import succession
from stageset.controller.stageset.succession import Reading, carried, note, verdict

OLD, NEW = ("team-a", "app"), ("team-a-system", "app")
REMOTE = "https://b.example:6443#bbbbbbbbbbbbbbbb"
CM_A = ObjectId(namespace="team-a", name="a", group="", kind="ConfigMap")
CM_B = ObjectId(namespace="team-a", name="b", group="", kind="ConfigMap")
WEB = ObjectId(namespace="team-a", name="web", group="apps", kind="Deployment")
CRD = ObjectId(namespace="", name="widgets.example.com", group="apiextensions.k8s.io",
               kind="CustomResourceDefinition")
NOW, LATER = "2026-03-01T12:00:00Z", "2026-03-01T13:00:00Z"


def entry(*objects: ObjectId, successor: tuple[str, str] = NEW, uid: str = "u-new", generation: int = 1,
          target: str = THIS_CLUSTER) -> Entry:
    return Entry(successor=successor, uid=uid, generation=generation, since=NOW, target=target,
                 objects=frozenset(objects))


def annotated(value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {ANNOTATION: value}} if value is not None else {}}


# -- the record ---------------------------------------------------------------------------------

def test_the_record_round_trips_grouped_by_kind_and_namespace() -> None:
    record = HandOver((entry(CM_A, CM_B, WEB, CRD),
                       entry(CM_A, target=REMOTE, successor=("x", "y"), uid="u-x")))
    value = record.encode()
    assert value is not None
    body = json.loads(value)
    assert body["v"] == 1
    here = next(e for e in body["to"] if e["ns"] == "team-a-system")
    assert here["o"] == {"/ConfigMap": {"team-a": ["a", "b"]}, "apps/Deployment": {"team-a": ["web"]},
                         "apiextensions.k8s.io/CustomResourceDefinition": {"": ["widgets.example.com"]}}
    assert "t" not in here, "this cluster is the default"
    assert parse(annotated(value)) == HandOver(tuple(sorted(record.entries, key=lambda e: e.successor)))


@pytest.mark.parametrize("value", [
    None, "", "not json", "[]", '{"v": 2, "to": []}', '{"v": 1, "to": [{"ns": "x"}]}',
    '{"v": 1, "to": [{"ns": "x", "name": "y", "uid": "u", "gen": "many", "since": "t"}]}',
    '{"v": 1, "to": [{"ns": "x", "name": "y", "uid": "u", "gen": 1, "since": "t", "o": {"/ConfigMap": 3}}]}',
])
def test_an_absent_or_broken_record_hands_nothing_over(value: str | None) -> None:
    assert parse(annotated(value)) == HandOver()
    assert parse(None) == HandOver()


def test_nothing_handed_over_is_no_annotation_at_all() -> None:
    assert HandOver().encode() is None


@pytest.mark.parametrize(("before", "uid", "target", "expected_objects", "expected_since", "entries"), [
    # A first hand-over: a new entry.
    ((), "u-new", THIS_CLUSTER, {CM_A}, LATER, 1),
    # More objects to the same successor: one entry, the union, its first time kept.
    ((entry(CM_B),), "u-new", THIS_CLUSTER, {CM_A, CM_B}, NOW, 1),
    # The same name re-created (another UID): the old entry is replaced, not merged.
    ((entry(CM_B, uid="u-old"),), "u-new", THIS_CLUSTER, {CM_A}, LATER, 1),
    # Another cluster is another entry.
    ((entry(CM_B),), "u-new", REMOTE, {CM_A}, LATER, 2),
])
def test_the_record_grows(before: tuple[Entry, ...], uid: str, target: str, expected_objects: set[ObjectId],
                          expected_since: str, entries: int) -> None:
    grown = HandOver(before).grown(successor=NEW, uid=uid, generation=3, target=target, since=LATER,
                                   objects=[CM_A])
    assert len(grown.entries) == entries
    found = next(e for e in grown.entries if e.target == target and e.successor == NEW)
    assert found.objects == expected_objects
    assert found.since == expected_since
    assert found.generation == 3, "the predecessor's generation when it was last written"


@pytest.mark.parametrize(("objects", "uid", "target", "covered"), [
    ([CM_A], "u-new", THIS_CLUSTER, True),
    ([CM_A, CM_B], "u-new", THIS_CLUSTER, True),
    ([CM_A, WEB], "u-new", THIS_CLUSTER, False),
    ([CM_A], "u-other", THIS_CLUSTER, False),
    ([CM_A], "u-new", REMOTE, False),
])
def test_a_record_that_covers_the_objects_is_not_written_again(objects: list[ObjectId], uid: str, target: str,
                                                               covered: bool) -> None:
    record = HandOver((entry(CM_A, CM_B),))
    assert record.covers(successor=NEW, uid=uid, target=target, objects=objects) is covered


# -- when an entry holds --------------------------------------------------------------------------

def seen(*, uid: str = "u-new", generation: int = 1, supersedes: frozenset[tuple[str, str]] = frozenset()
         ) -> Seen:
    return Seen(uid=uid, generation=generation, supersedes=supersedes)


@pytest.mark.parametrize(("successor", "predecessor", "holds"), [
    # The successor exists, with the UID that took the objects: the hand-over stands.
    (seen(), seen(uid="u-old", generation=1), True),
    # ...whatever the predecessor's spec does meanwhile, unless it names the successor itself.
    (seen(), seen(uid="u-old", generation=5), True),
    # The successor is gone, or another StageSet now has its name: void, the predecessor manages them.
    (None, seen(uid="u-old"), False),
    (seen(uid="u-again"), seen(uid="u-old"), False),
    # Cannot be read now: holds (what cannot be judged is never taken back).
    (UNREADABLE, seen(uid="u-old"), True),
    # The predecessor names the successor in its own supersedes at a newer generation: taken back.
    (seen(), seen(uid="u-old", generation=2, supersedes=frozenset({NEW})), False),
    (UNREADABLE, seen(uid="u-old", generation=2, supersedes=frozenset({NEW})), False),
    # ...but not at the generation the entry was written at (both named each other from the start).
    (seen(), seen(uid="u-old", generation=1, supersedes=frozenset({NEW})), True),
    # Naming some other StageSet takes nothing back.
    (seen(), seen(uid="u-old", generation=2, supersedes=frozenset({("x", "y")})), True),
])
def test_an_entry_holds_while_its_successor_does(successor: Seen | None, predecessor: Seen,
                                                 holds: bool) -> None:
    assert in_force(entry(CM_A, generation=1), successor=successor, predecessor=predecessor) is holds


def test_what_a_stageset_is_seen_as() -> None:
    obj = {"metadata": {"namespace": "team-a", "name": "app", "uid": "u", "generation": 4},
           "spec": {"supersedes": [{"name": "old"}, {"namespace": "elsewhere", "name": "x"}]}}
    assert Seen.of(obj) == Seen(uid="u", generation=4,
                                supersedes=frozenset({("team-a", "old"), ("elsewhere", "x")}))


@pytest.mark.parametrize(("own", "uid", "generation", "refrain"), [
    # It took these objects from us, and our spec has not changed since: the latest hand-over stands.
    ((entry(CM_A, successor=OLD, uid="u-old", generation=3),), "u-old", 3, True),
    # Our spec changed since (it names the other anew): take them back.
    ((entry(CM_A, successor=OLD, uid="u-old", generation=3),), "u-old", 4, False),
    # Another StageSet of that name: not the one that took them.
    ((entry(CM_A, successor=OLD, uid="u-old", generation=3),), "u-again", 3, False),
    # Nothing handed over: nothing to refrain from.
    ((), "u-old", 3, False),
    ((entry(CM_A, successor=("x", "y"), uid="u-old", generation=3),), "u-old", 3, False),
])
def test_a_stageset_does_not_take_back_what_was_just_taken_from_it(
        own: tuple[Entry, ...], uid: str, generation: int, refrain: bool) -> None:
    assert refrains(HandOver(own), predecessor=OLD, predecessor_uid=uid, generation=generation) is refrain


# -- what a predecessor keeps -----------------------------------------------------------------------

def inventory(name: str, *ids: ObjectId, target: str | None = None) -> StageInventory:
    return StageInventory(name=name, service_account_name="deployer",
                          entries=[InventoryEntry(id=oid.encode(), v="v1") for oid in ids],
                          target=AppliedTarget(id=target) if target else None)


def test_a_predecessor_lists_nothing_it_handed_over_on_that_cluster_only() -> None:
    inventories = {"app": inventory("app", CM_A, WEB, CM_B), "keep": inventory("keep", CM_B),
                   "there": inventory("there", CM_A, target=REMOTE)}
    gone = handed([entry(CM_A, WEB), entry(CM_B, successor=("x", "y"), uid="u-x")])
    assert gone == {THIS_CLUSTER: frozenset({CM_A, WEB, CM_B})}
    kept = released(inventories, gone)
    assert [e.id for e in kept["app"].entries] == []
    assert kept["keep"].entries == []
    assert kept["there"] == inventories["there"], "a hand-over on this cluster takes nothing on another"
    assert released(inventories, {}) == inventories


# -- the controller's rules -------------------------------------------------------------------------

@pytest.mark.parametrize(("ref", "reading", "may_patch", "reason", "says", "never"), [
    (NEW, Reading.READ, True, None, "", ""),
    (OLD, Reading.GONE, None, None, "", ""),
    (OLD, Reading.READ, False, Reason.SUPERSEDE_DENIED,
     "spec.supersedes[1]: system:serviceaccount:team-b:deployer may not patch StageSet team-a/app", ""),
    # Not readable: the message names the entry of the spec, nothing about the StageSet.
    (OLD, Reading.UNREADABLE, None, Reason.SUPERSEDE_DENIED,
     "spec.supersedes[1]: system:serviceaccount:team-b:deployer may not read the StageSet it names",
     "team-a"),
    (("team-b", "mine"), Reading.READ, True, Reason.INVALID_SPEC,
     "spec.supersedes[1] names this StageSet itself", ""),
])
def test_may_a_successor_take_over(ref: tuple[str, str], reading: Reading, may_patch: bool | None,
                                   reason: Reason | None, says: str, never: str) -> None:
    refusal = verdict(index=1, ref=ref, ours=("team-b", "mine"), seen=reading, may_patch=may_patch,
                      who="system:serviceaccount:team-b:deployer")
    if reason is None:
        assert refusal is None
        return
    assert refusal is not None
    assert refusal.reason is reason
    assert says in refusal.message
    if never:
        assert never not in refusal.message


KEY = ("main@sha1:" + "a" * 40, "sha256:0123456789abcdef", THIS_CLUSTER)


def ledger(*executed: str, revision: str = KEY[0], target: str | None = None, running: bool = False
           ) -> ActionLedger:
    return ActionLedger(revision=revision, inputs=KEY[1], executed=list(executed), target=target,
                        running=ActionRun(hook="post", name="smoke", since=NOW) if running else None)


@pytest.mark.parametrize(("own", "theirs", "expected"), [
    # The predecessor ran the pre action for this revision here: it does not run again.
    (None, (ledger("migrate"),), ledger("migrate")),
    # Our own ledger for this revision wins (we acted for it already).
    (ledger("migrate", "smoke"), (ledger("migrate"),), ledger("migrate", "smoke")),
    # Ours is for an older revision: theirs for this one is carried.
    (ledger("migrate", revision="main@sha1:" + "b" * 40), (ledger("migrate"),), ledger("migrate")),
    # Theirs is for another revision or another cluster: nothing carried (a new revision runs them).
    (None, (ledger("migrate", revision="main@sha1:" + "b" * 40),), None),
    (None, (ledger("migrate", target=REMOTE),), None),
    (None, (None,), None),
    # An action in progress there is not carried: it starts here.
    (None, (ledger("migrate", running=True),), ledger("migrate")),
    # Two predecessors: what either ran.
    (None, (ledger("migrate"), ledger("migrate", "smoke")), ledger("migrate", "smoke")),
])
def test_the_ledger_travels_with_the_hand_over(own: ActionLedger | None,
                                               theirs: tuple[ActionLedger | None, ...],
                                               expected: ActionLedger | None) -> None:
    assert carried(own, theirs, key=KEY) == expected


def test_what_a_predecessor_and_a_successor_say() -> None:
    said = note([entry(CM_A, WEB), entry(CM_B, successor=("x", "y"), uid="u-x")])
    assert said.startswith(
        "handed over 2 object(s) to StageSet team-a-system/app, 1 object(s) to StageSet x/y")
    assert "no longer applies, prunes or deletes them" in said
    assert note([]) == ""
    assert succession.taken(stage="app", ref=OLD, objects=3) == (
        "stage 'app' took over 3 object(s) of StageSet team-a/app in place (spec.supersedes): same objects, "
        "new owner labels, nothing deleted or created")
