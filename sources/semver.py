"""Semantic versions and version constraints, for ``ref.semver``.

Why our own: Flux resolves ``ref.semver`` with Go's Masterminds/semver, whose constraint
language (npm-like: ``>=1.0.0 <2.0.0``, ``~1.2``, ``^1``, ``1.x``, ``1.2 - 1.4``, ``||``)
neither ``packaging`` (PEP 440) nor ``semver`` (no ranges) speaks.  The grammar is small
enough to keep here, pure and unit-tested.

Rules, following Masterminds where users would notice:

* Versions are SemVer 2.0 with an optional ``v`` prefix; missing minor/patch read as 0
  (``v1`` is 1.0.0).  Tags that do not parse are not versions and are ignored.
* Comparators within a group are ANDed (separated by spaces or commas); groups are ORed
  with ``||``.  ``A - B`` is an inclusive range.
* Partial versions are wildcards: ``1.2`` and ``1.2.x`` mean ``>=1.2.0 <1.3.0``, ``>1.2``
  means ``>=1.3.0``, ``<=1.2`` means ``<1.3.0``, and ``*``/``x`` match any version.
* ``~1.2.3`` is ``>=1.2.3 <1.3.0``; ``~1`` is ``>=1.0.0 <2.0.0``.  ``^1.2.3`` is
  ``>=1.2.3 <2.0.0``; ``^0.2.3`` is ``<0.3.0``; ``^0.0.3`` is ``<0.0.4``.
* Prereleases (``1.2.0-rc.1``) are excluded unless the group mentions a prerelease itself
  (``>=1.2.0-0``), and then compared by SemVer precedence.  Build metadata is ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

_VERSION = re.compile(
    r"v?(?P<major>0|[1-9]\d*)(?:\.(?P<minor>0|[1-9]\d*))?(?:\.(?P<patch>0|[1-9]\d*))?"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
_PARTIAL = re.compile(
    r"v?(?P<major>\d+|[xX*])(?:\.(?P<minor>\d+|[xX*]))?(?:\.(?P<patch>\d+|[xX*]))?"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
_OPERATOR = re.compile(r"(?P<op>~>|!=|>=|=>|<=|=<|>|<|=|~|\^)?(?P<rest>.*)")
_HYPHEN = re.compile(r"(\S+)\s+-\s+(\S+)")
_WILDCARDS = {"x", "X", "*"}


def _prerelease_key(identifiers: tuple[str, ...]) -> tuple[tuple[int, int, str], ...]:
    return tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in identifiers)


@dataclass(frozen=True)
class Version:
    """A SemVer 2.0 version; ordering is SemVer precedence (build metadata ignored)."""

    major: int
    minor: int = 0
    patch: int = 0
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, text: str) -> Version:
        """Parse ``1.2.3``, ``v1.2.3-rc.1+build``, ``v1``; raise ValueError otherwise."""
        match = _VERSION.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not a semantic version: {text!r}")
        pre, build = match["pre"], match["build"]
        return cls(
            major=int(match["major"]),
            minor=int(match["minor"] or 0),
            patch=int(match["patch"] or 0),
            prerelease=tuple(pre.split(".")) if pre else (),
            build=tuple(build.split(".")) if build else (),
        )

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        return (self.major, self.minor, self.patch, 0 if self.prerelease else 1,
                _prerelease_key(self.prerelease))

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Version) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Version) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Version) -> bool:
        return self._key() >= other._key()

    def same_precedence(self, other: Version) -> bool:
        return self._key() == other._key()

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


_Predicate = Callable[[Version], bool]


@dataclass(frozen=True)
class _Partial:
    """A version in a constraint, where trailing parts may be wildcards (None)."""

    major: int | None
    minor: int | None
    patch: int | None
    prerelease: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, *, constraint: str) -> _Partial:
        match = _PARTIAL.fullmatch(text)
        if match is None:
            raise ValueError(f"invalid version {text!r} in semver constraint {constraint!r}")
        parts: list[int | None] = []
        wildcard = False
        for name in ("major", "minor", "patch"):
            value = match[name]
            if value is None or value in _WILDCARDS or wildcard:
                wildcard = True
                parts.append(None)
            else:
                parts.append(int(value))
        pre = tuple(match["pre"].split(".")) if match["pre"] else ()
        if pre and wildcard:
            raise ValueError(f"a prerelease needs a full version in semver constraint "
                             f"{constraint!r}")
        return cls(parts[0], parts[1], parts[2], pre)

    @property
    def is_any(self) -> bool:
        return self.major is None

    @property
    def lower(self) -> Version:
        """The smallest version the partial covers (``1.2`` -> ``1.2.0``)."""
        return Version(self.major or 0, self.minor or 0, self.patch or 0, self.prerelease)

    @property
    def upper(self) -> Version | None:
        """The smallest version above what the partial covers, or None if it is exact."""
        if self.major is None:
            return None
        if self.minor is None:
            return Version(self.major + 1, 0, 0, ("0",))
        if self.patch is None:
            return Version(self.major, self.minor + 1, 0, ("0",))
        return None


def _comparator(op: str, partial: _Partial) -> _Predicate:
    """One comparator as a predicate on versions."""
    lower, upper = partial.lower, partial.upper
    if partial.is_any:
        everything = op in ("", "=", ">=", "<=", "~", "^")
        return lambda _version: everything
    if op in ("", "="):
        if upper is None:
            return lambda v: v.same_precedence(lower)
        return lambda v: lower <= v < upper
    if op == "!=":
        if upper is None:
            return lambda v: not v.same_precedence(lower)
        return lambda v: not lower <= v < upper
    if op == ">":
        return (lambda v: v > lower) if upper is None else (lambda v: v >= upper)
    if op == ">=":
        return lambda v: v >= lower
    if op == "<":
        bound = lower if upper is None else Version(lower.major, lower.minor, lower.patch, ("0",))
        return lambda v: v < bound
    if op == "<=":
        return (lambda v: v <= lower) if upper is None else (lambda v: v < upper)
    if op == "~":
        if partial.minor is None:
            ceiling = Version(lower.major + 1, 0, 0, ("0",))
        else:
            ceiling = Version(lower.major, lower.minor + 1, 0, ("0",))
        return lambda v: lower <= v < ceiling
    if op == "^":
        specified = [p for p in (partial.major, partial.minor, partial.patch) if p is not None]
        position = next((i for i, p in enumerate(specified) if p != 0), len(specified) - 1)
        bumped = [lower.major, lower.minor, lower.patch]
        bumped[position] += 1
        for i in range(position + 1, 3):
            bumped[i] = 0
        ceiling = Version(bumped[0], bumped[1], bumped[2], ("0",))
        return lambda v: lower <= v < ceiling
    raise AssertionError(op)  # pragma: no cover - _OPERATOR only yields the ops above


@dataclass(frozen=True)
class _Group:
    """Comparators that must all hold."""

    comparators: tuple[_Predicate, ...]
    mentions_prerelease: bool

    def matches(self, version: Version) -> bool:
        if version.prerelease and not self.mentions_prerelease:
            return False
        return all(check(version) for check in self.comparators)


@dataclass(frozen=True)
class Constraint:
    """A parsed semver constraint; :meth:`matches` tells whether a version satisfies it."""

    text: str
    groups: tuple[_Group, ...]

    @classmethod
    def parse(cls, text: str) -> Constraint:
        """Parse a constraint; raise ValueError naming the bad part."""
        if not text.strip():
            raise ValueError("empty semver constraint")
        groups = []
        for raw in text.split("||"):
            groups.append(cls._parse_group(raw, constraint=text))
        return cls(text=text, groups=tuple(groups))

    @staticmethod
    def _parse_group(raw: str, *, constraint: str) -> _Group:
        expanded = _HYPHEN.sub(r">=\1 <=\2", raw)
        # Allow a space between an operator and its version (">= 1.2").
        expanded = re.sub(r"(~>|!=|>=|=>|<=|=<|>|<|=|~|\^)\s+", r"\1", expanded)
        tokens = [t for t in re.split(r"[\s,]+", expanded) if t]
        if not tokens:
            raise ValueError(f"empty alternative in semver constraint {constraint!r}")
        comparators: list[_Predicate] = []
        mentions_prerelease = False
        for token in tokens:
            match = _OPERATOR.fullmatch(token)
            assert match is not None  # the pattern accepts any string
            op = {"=>": ">=", "=<": "<=", "~>": "~"}.get(match["op"] or "", match["op"] or "")
            partial = _Partial.parse(match["rest"], constraint=constraint)
            mentions_prerelease = mentions_prerelease or bool(partial.prerelease)
            comparators.append(_comparator(op, partial))
        return _Group(tuple(comparators), mentions_prerelease)

    def matches(self, version: Version) -> bool:
        return any(group.matches(version) for group in self.groups)


def highest_match(constraint: str | Constraint, names: Iterable[str]) -> str | None:
    """The name (e.g. a tag) with the highest version matching ``constraint``, or None.

    Names that are not versions are ignored.  Among names of equal precedence
    (``v1.0.0`` and ``1.0.0``) the lexically greatest wins, so the answer is stable.
    """
    parsed = constraint if isinstance(constraint, Constraint) else Constraint.parse(constraint)
    best: tuple[Version, str] | None = None
    for name in names:
        try:
            version = Version.parse(name)
        except ValueError:
            continue
        if not parsed.matches(version):
            continue
        if best is None or version > best[0] or (
            version.same_precedence(best[0]) and name > best[1]
        ):
            best = (version, name)
    return None if best is None else best[1]
