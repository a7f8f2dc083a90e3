"""Label-selector shards: the selector a controller watches with, read as the apiserver reads it.

Flux's convention, which its users already know: shards are told apart by the label
``sharding.fluxcd.io/key``.  A shard controller runs with ``--watch-label-selector
sharding.fluxcd.io/key=shard1``; the main one with ``!sharding.fluxcd.io/key`` (everything not
labelled for a shard).  The selector is Kubernetes' label-selector syntax (``labels.Parse``:
``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k>1``, ``k<1``, joined
by commas); :meth:`LabelSelector.parse` refuses what the apiserver would refuse, so a bad flag is a
usage error at start, not a watch failing forever.  The selector is sent to the apiserver with
every list and watch of our kinds (never filtered here); :meth:`LabelSelector.matches` is only for
telling a user why something is not served (a source of another shard).

What is sharded (``docs/install.md#sharding-by-label``):

* StageSets and our GitRepositories, by the same selector, as Flux shards its sources and
  Kustomizations: the shard that reconciles a StageSet is the one that fetches the GitRepositories
  it names into its own mirror.  A StageSet naming a GitRepository of another shard is told so
  (:func:`foreign_source_message`), never served a commit its shard did not fetch.
* Not Flux's source kinds: Flux serves their artifacts over HTTP to any consumer, so a StageSet of
  any shard may use one; watching them is only a trigger.
* Not the platform's StageTargets: a StageSet of any shard may name one, so every shard watches them
  all (unselected) and connects to the ones its StageSets use; but only one shard writes a
  StageTarget's status — the one its own shard label names (:meth:`LabelSelector.names_shard_of`:
  unlabelled, the main shard) — so N shards are not N writers of the same values.

Moving a StageSet between shards (relabelling it) never leaves two writers: the losing shard's
pass stops writing when its watch says the StageSet left, and the gaining shard waits for its
release record (:mod:`stageset.controller.handoff`).

The main shard may be told the keys the other shards serve (``--shard-keys``): it then also
watches, label-selected, the objects whose key names none of them (:meth:`LabelSelector.unserved`)
and reports them (``NoShard``), so a typo in a label is never silently ignored.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

SHARD_LABEL = "sharding.fluxcd.io/key"
"""Flux's shard label: its value names the shard that reconciles the object."""

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_SPECIAL = "!=,()<>"
MAX_SELECTOR_LENGTH = 4096


class SelectorError(ValueError):
    """A label selector the apiserver would refuse; the message says what and where."""


class Operator(StrEnum):
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


def valid_key(key: str) -> bool:
    """A qualified name: ``[prefix/]name``, the prefix a DNS subdomain (≤ 253), the name ≤ 63."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or re.fullmatch(_PREFIX, prefix) is None):
        return False
    return 0 < len(name) <= 63 and re.fullmatch(_NAME, name) is not None


def valid_value(value: str) -> bool:
    """A label value: empty, or ≤ 63 characters of ``[A-Za-z0-9-_.]`` starting and ending alphanumeric."""
    return value == "" or (len(value) <= 63 and re.fullmatch(_NAME, value) is not None)


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """As the apiserver decides (``labels.Requirement.Matches``)."""
        has = self.key in labels
        value = labels.get(self.key, "")
        match self.operator:
            case Operator.EXISTS:
                return has
            case Operator.DOES_NOT_EXIST:
                return not has
            case Operator.EQUALS | Operator.IN:
                return has and value in self.values
            case Operator.NOT_EQUALS | Operator.NOT_IN:
                return not has or value not in self.values
            case Operator.GREATER_THAN | Operator.LESS_THAN:
                if not has or re.fullmatch(r"-?[0-9]+", value) is None:
                    return False
                bound = int(self.values[0])
                return int(value) > bound if self.operator is Operator.GREATER_THAN else int(value) < bound

    def __str__(self) -> str:
        match self.operator:
            case Operator.EXISTS:
                return self.key
            case Operator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Operator.EQUALS | Operator.NOT_EQUALS:
                return f"{self.key}{self.operator.value}{self.values[0]}"
            case Operator.IN | Operator.NOT_IN:
                return f"{self.key} {self.operator.value} ({','.join(self.values)})"
            case Operator.GREATER_THAN:
                return f"{self.key}>{self.values[0]}"
            case Operator.LESS_THAN:
                return f"{self.key}<{self.values[0]}"


def _tokens(text: str) -> list[str]:
    """The lexer of ``labels.Parse``: the special symbols, and identifiers between them and spaces."""
    found: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif char in _SPECIAL:
            pair = text[i:i + 2]
            if pair in ("!=", "=="):
                found.append(pair)
                i += 2
            else:
                found.append(char)
                i += 1
        else:
            start = i
            while i < len(text) and not text[i].isspace() and text[i] not in _SPECIAL:
                i += 1
            found.append(text[start:i])
    return found


_OPERATORS = {"=": Operator.EQUALS, "==": Operator.EQUALS, "!=": Operator.NOT_EQUALS, "in": Operator.IN,
              "notin": Operator.NOT_IN, ">": Operator.GREATER_THAN, "<": Operator.LESS_THAN}


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.symbols = _tokens(text)
        self.at = 0

    def peek(self) -> str | None:
        return self.symbols[self.at] if self.at < len(self.symbols) else None

    def take(self) -> str | None:
        symbol = self.peek()
        self.at += 1
        return symbol

    def fail(self, what: str) -> SelectorError:
        return SelectorError(f"not a label selector: {self.text!r}: {what}")

    def identifier(self, what: str) -> str:
        symbol = self.take()
        if symbol is None or symbol in _SPECIAL or symbol in ("!=", "==") or symbol in ("in", "notin"):
            raise self.fail(f"{what} expected, found {'the end' if symbol is None else repr(symbol)}")
        return symbol

    def key(self) -> str:
        key = self.identifier("a label key")
        if not valid_key(key):
            raise self.fail(f"{key!r} is not a label key (a qualified name: [DNS subdomain/]name, the "
                            "name at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric)")
        return key

    def value(self, key: str) -> str:
        symbol = self.peek()
        if symbol is None or symbol in (",", ")"):
            return ""  # ``k=`` selects the empty value, as the apiserver reads it
        value = self.identifier(f"a value for {key!r}")
        if not valid_value(value):
            raise self.fail(f"{value!r} is not a label value (at most 63 characters of [A-Za-z0-9-_.], "
                            "starting and ending alphanumeric)")
        return value

    def values(self, key: str) -> tuple[str, ...]:
        if self.take() != "(":
            raise self.fail(f"'(' expected after 'in'/'notin' of {key!r}")
        found: list[str] = []
        while True:
            found.append(self.value(key))
            symbol = self.take()
            if symbol == ")":
                return tuple(sorted(set(found)))
            if symbol != ",":
                raise self.fail(f"',' or ')' expected in the values of {key!r}")

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            return Requirement(self.key(), Operator.DOES_NOT_EXIST)
        key = self.key()
        symbol = self.peek()
        if symbol is None or symbol == ",":
            return Requirement(key, Operator.EXISTS)
        operator = _OPERATORS.get(self.take() or "")
        if operator is None:
            raise self.fail(f"an operator (=, ==, !=, in, notin, >, <) expected after {key!r}, "
                            f"found {symbol!r}")
        if operator in (Operator.IN, Operator.NOT_IN):
            return Requirement(key, operator, self.values(key))
        value = self.value(key)
        numeric = re.fullmatch(r"-?[0-9]+", value) is not None
        if operator in (Operator.GREATER_THAN, Operator.LESS_THAN) and not numeric:
            raise self.fail(f"{key!r}: '>' and '<' need a whole number, not {value!r}")
        return Requirement(key, operator, (value,))

    def selector(self) -> tuple[Requirement, ...]:
        found: list[Requirement] = []
        while self.peek() is not None:
            found.append(self.requirement())
            symbol = self.take()
            if symbol is None:
                break
            if symbol != ",":
                raise self.fail(f"',' expected between requirements, found {symbol!r}")
            if self.peek() is None:
                raise self.fail("a requirement expected after the last ','")
        return tuple(found)


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; ``str()`` is its canonical text (what is sent to the apiserver)."""

    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        if len(text) > MAX_SELECTOR_LENGTH:
            raise SelectorError(f"a label selector of {len(text)} characters is longer than "
                                f"{MAX_SELECTOR_LENGTH}")
        requirements = _Parser(text).selector()
        if not requirements:
            raise SelectorError("an empty label selector selects everything; leave the flag out instead")
        # Sorted by key, as the apiserver's parser does, so equal selectors print equally.
        return cls(tuple(sorted(requirements, key=lambda r: r.key)))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    @property
    def shard(self) -> str | None:
        """The shard this selector serves in Flux's convention: its key (``sharding.fluxcd.io/key=x``
        or ``in (x)``), ``""`` for the main shard (``!sharding.fluxcd.io/key``), ``None`` when the
        selector says nothing (or nothing this simple) about the shard label."""
        mine = [r for r in self.requirements if r.key == SHARD_LABEL]
        if len(mine) != 1:
            return None
        only = mine[0]
        if only.operator is Operator.DOES_NOT_EXIST:
            return ""
        if only.operator in (Operator.EQUALS, Operator.IN) and len(only.values) == 1 and only.values[0]:
            return only.values[0]
        return None

    def names_shard_of(self, labels: Mapping[str, str] | None) -> bool:
        """Whether ``labels`` name this selector's shard: only its requirements on :data:`SHARD_LABEL`
        count (so an unlabelled object is the main shard's), and a selector with none of them (no
        label shards, or a team selector alone) names every object.  For the kinds every shard
        watches unselected but one shard writes (StageTargets' status)."""
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements if r.key == SHARD_LABEL)

    def unserved(self, shard_keys: Iterable[str]) -> LabelSelector:
        """For the main shard: the objects carrying a shard key that none of ``shard_keys`` names
        (the rest of this selector kept, e.g. a team label every shard shares)."""
        keys = tuple(sorted(set(shard_keys)))
        rest = [r for r in self.requirements if r.key != SHARD_LABEL]
        mine = [Requirement(SHARD_LABEL, Operator.EXISTS)]
        if keys:
            mine.append(Requirement(SHARD_LABEL, Operator.NOT_IN, keys))
        return LabelSelector(tuple(sorted([*rest, *mine], key=lambda r: r.key)))


def parse_shard_keys(text: str) -> tuple[str, ...]:
    """``shard1,shard2``: the values of ``sharding.fluxcd.io/key`` the other shards serve."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in keys if not valid_value(k)]
    if bad:
        raise SelectorError(f"not label values: {', '.join(repr(b) for b in bad)}")
    return tuple(sorted(set(keys)))


def foreign_source_message(*, what: str, selector: LabelSelector, cross_namespace: bool) -> str:
    """Why a StageSet's GitRepository is not served to it: the source is another shard's.

    Names the selector (the platform's flag, not a secret) but, for a source in another namespace,
    nothing of that source (its labels are another namespace's)."""
    if cross_namespace:
        return (f"{what} does not match this controller's --watch-label-selector {str(selector)!r}: another "
                "shard fetches it; use a GitRepository of this StageSet's shard (label "
                f"{SHARD_LABEL})")
    return (f"{what} does not match this controller's --watch-label-selector {str(selector)!r}, so another "
            f"shard fetches it into that shard's mirror: give it this StageSet's {SHARD_LABEL} label, or "
            "use a GitRepository of this shard (several GitRepositories of one URL share one mirror)")


def unserved_message(*, kind: str, key: str, shard_keys: tuple[str, ...]) -> str:
    """What the main shard tells a StageSet or GitRepository no shard serves."""
    known = ", ".join(shard_keys) if shard_keys else "none"
    return (f"label {SHARD_LABEL}={key!r} names no shard of this controller's release (shards: {known}), "
            f"so no controller reconciles this {kind}: use one of those keys, remove the label for the "
            "main shard, or add the shard (controller.shards)")
