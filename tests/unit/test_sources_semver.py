"""Semver constraints as Flux (Masterminds/semver) users write them."""

from __future__ import annotations

import pytest

from sources.semver import Constraint, Version, highest_match

TAGS = ["v0.0.3", "v0.0.4", "v0.1.0", "v0.2.5", "v1.0.0", "v1.2.0", "v1.2.3", "v1.10.0",
        "v1.11.0-beta.2", "v1.11.0-beta.10", "v2.0.0-rc.1", "v2.0.0", "latest", "release-3",
        "v3", "2024.01"]


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (">=1.0.0 <2.0.0", "v1.10.0"),
        (">=1.0.0, <2.0.0", "v1.10.0"),
        (">= 1.0.0 < 2.0.0", "v1.10.0"),
        ("~1.2", "v1.2.3"),
        ("~1.2.0", "v1.2.3"),
        ("~>1.2", "v1.2.3"),
        ("~1", "v1.10.0"),
        ("^1", "v1.10.0"),
        ("^1.2.3", "v1.10.0"),
        ("^0.2.3", "v0.2.5"),
        ("^0.0.3", "v0.0.3"),
        ("^0", "v0.2.5"),
        ("1.x", "v1.10.0"),
        ("1.2.x", "v1.2.3"),
        ("1.2.*", "v1.2.3"),
        ("1.2", "v1.2.3"),
        ("=1.2.0", "v1.2.0"),
        ("v1.2.0", "v1.2.0"),
        ("*", "v3"),
        ("x", "v3"),
        (">1.2", "v3"),
        ("<=1.2", "v1.2.3"),
        ("<1.2", "v1.0.0"),
        ("<1.2.3", "v1.2.0"),
        (">1.2.3 <2", "v1.10.0"),
        ("!=1.10.0 ^1", "v1.2.3"),
        ("!=1.x", "v3"),
        ("1.0 - 1.2", "v1.2.3"),
        ("1.0.0 - 1.2.0", "v1.2.0"),
        ("<1 || ^2", "v2.0.0"),
        (">=2.0.0-0 <3", "v2.0.0"),
        (">=1.11.0-0 <1.12", "v1.11.0-beta.10"),
        ("=2.0.0-rc.1", "v2.0.0-rc.1"),
        ("^4", None),
        ("<0.0.1", None),
    ],
)
def test_highest_match(constraint: str, expected: str | None) -> None:
    assert highest_match(constraint, TAGS) == expected


def test_prereleases_are_excluded_unless_the_constraint_has_one() -> None:
    tags = ["v1.0.0", "v1.1.0-rc.1"]
    assert highest_match(">=1.0.0", tags) == "v1.0.0"
    assert highest_match(">=1.0.0-0", tags) == "v1.1.0-rc.1"
    # Only the alternative that mentions a prerelease admits them.
    assert highest_match("^1 || =0.9.0-rc.1", tags) == "v1.0.0"


def test_equal_versions_pick_a_stable_name() -> None:
    assert highest_match("^1", ["1.0.0", "v1.0.0"]) == "v1.0.0"
    assert highest_match("^1", ["v1.0.0", "1.0.0"]) == "v1.0.0"


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("1.0.0-alpha", "1.0.0-alpha.1"),
        ("1.0.0-alpha.1", "1.0.0-alpha.beta"),
        ("1.0.0-alpha.beta", "1.0.0-beta"),
        ("1.0.0-beta.2", "1.0.0-beta.11"),
        ("1.0.0-rc.1", "1.0.0"),
        ("1.9.0", "1.10.0"),
    ],
)
def test_semver_precedence(lower: str, higher: str) -> None:
    assert Version.parse(lower) < Version.parse(higher)
    assert Version.parse(higher) > Version.parse(lower)


def test_build_metadata_is_ignored_in_precedence() -> None:
    assert Version.parse("1.0.0+a").same_precedence(Version.parse("v1.0.0+b"))
    assert str(Version.parse("v1.2.3-rc.1+b.5")) == "1.2.3-rc.1+b.5"
    assert Version.parse("v1") == Version(1, 0, 0)


@pytest.mark.parametrize("text", ["latest", "1.2.3.4", "01.2.3", "1.2.3-", "v", ""])
def test_non_versions(text: str) -> None:
    with pytest.raises(ValueError, match="not a semantic version"):
        Version.parse(text)


@pytest.mark.parametrize("text", ["", "   ", ">=1.0 ||", "latest", ">=a.b", "1.x-rc.1", "1.2 -"])
def test_invalid_constraints(text: str) -> None:
    with pytest.raises(ValueError, match="semver constraint"):
        Constraint.parse(text)
