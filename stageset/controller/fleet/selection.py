"""Which StageSets a FleetRollout selects, which wave each belongs to, and which are contested.
Pure: no I/O; everything comes in as values read from the watch cache.

Invariants:

- a member is a StageSet whose labels match ``spec.selector`` and whose namespace's labels match
  ``spec.namespaceSelector`` (a namespace the controller has no labels for matches only when no
  namespace selector is set: fail closed);
- a member belongs to a wave when its labels match that wave's ``selector``; it must match exactly
  one (none, or several, leaves it *unassigned*);
- a StageSet two rollouts select is *contested* for both; which rollouts select it is computed from
  every rollout in the cache, so both sides reach the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stageset.api.actions import LabelSelector
from stageset.api.fleet import FleetRollout, FleetWave

Labels = Mapping[str, str]


def matches(selector: LabelSelector, labels: Labels) -> bool:
    """``metav1.LabelSelector`` semantics: every ``matchLabels`` pair and every expression holds."""
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for term in selector.match_expressions:
        present = term.key in labels
        value = labels.get(term.key)
        if term.operator == "In" and value not in term.values:
            return False
        if term.operator == "NotIn" and present and value in term.values:
            return False
        if term.operator == "Exists" and not present:
            return False
        if term.operator == "DoesNotExist" and present:
            return False
    return True


def selects(rollout: FleetRollout, *, labels: Labels, namespace_labels: Labels | None) -> bool:
    """Does ``rollout`` select a StageSet with ``labels`` in a namespace with ``namespace_labels``
    (``None``: the namespace's labels are unknown)?"""
    if not matches(rollout.spec.selector, labels):
        return False
    wanted = rollout.spec.namespace_selector
    if wanted is None:
        return True
    return namespace_labels is not None and matches(wanted, namespace_labels)


def waves_of(waves: Sequence[FleetWave], labels: Labels) -> list[str]:
    """The waves whose selector matches ``labels`` (exactly one: assigned)."""
    return [wave.name for wave in waves if matches(wave.selector, labels)]


@dataclass(frozen=True)
class Candidate:
    """A StageSet as selection sees it."""

    namespace: str
    name: str
    labels: Labels
    namespace_labels: Labels | None


def selecting(rollouts: Iterable[FleetRollout], candidate: Candidate) -> list[str]:
    """The names of every rollout selecting ``candidate``, sorted."""
    return sorted(str(r.metadata.get("name", "")) for r in rollouts
                  if selects(r, labels=candidate.labels, namespace_labels=candidate.namespace_labels))
