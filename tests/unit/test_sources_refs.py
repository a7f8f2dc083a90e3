"""Resolving a RefSelector against a remote's ref listing (no server needed)."""

from __future__ import annotations

import pytest

from sources import InvalidRefError, RefNotFoundError, RefSelector
from sources.refs import Resolution, resolve

C1, C2, C3, T2, PR = ("1" * 40, "2" * 40, "3" * 40, "a" * 40, "7" * 40)
REFS = {
    "HEAD": C1,
    "refs/heads/main": C1,
    "refs/heads/dev": C3,
    "refs/tags/v1.0.0": C1,
    "refs/tags/v2.0.0": T2,
    "refs/tags/v2.0.0^{}": C2,
    "refs/tags/v3.0.0-rc.1": C3,
    "refs/tags/nightly": C3,
    "refs/pull/7/head": PR,
}
SYMREFS = {"HEAD": "refs/heads/main"}
URL = "https://example.com/r.git"


def _resolve(selector: RefSelector, refs: dict[str, str] | None = None,
             symrefs: dict[str, str] | None = None) -> Resolution:
    return resolve(selector, REFS if refs is None else refs,
                   SYMREFS if symrefs is None else symrefs, url=URL)


def test_branch() -> None:
    assert _resolve(RefSelector(branch="dev")) == Resolution("dev", "refs/heads/dev", C3, C3)


def test_annotated_tag_wants_the_tag_object_and_knows_its_commit() -> None:
    assert _resolve(RefSelector(tag="v2.0.0")) == Resolution("v2.0.0", "refs/tags/v2.0.0", T2,
                                                             C2)


def test_semver() -> None:
    assert _resolve(RefSelector(semver=">=1")).ref_name == "v2.0.0"
    assert _resolve(RefSelector(semver=">=3.0.0-0")).ref_name == "v3.0.0-rc.1"


def test_name() -> None:
    assert _resolve(RefSelector(name="refs/pull/7/head")) == Resolution(
        "refs/pull/7/head", "refs/pull/7/head", PR, PR)


def test_default_follows_head_symref_even_if_the_branch_is_not_listed() -> None:
    assert _resolve(RefSelector(), refs={"HEAD": C1}) == Resolution(
        "main", "refs/heads/main", C1, C1)


def test_detached_head() -> None:
    assert _resolve(RefSelector(), symrefs={}) == Resolution("HEAD", "HEAD", C1, C1)


def test_malformed_head_symref_from_a_hostile_server_is_not_trusted() -> None:
    assert _resolve(RefSelector(), symrefs={"HEAD": "refs/heads/../../x"}) == Resolution(
        "HEAD", "HEAD", C1, C1)


def test_commit_alone_and_with_branch() -> None:
    assert _resolve(RefSelector(commit=C2)) == Resolution(None, None, C2, C2)
    assert _resolve(RefSelector(branch="main", commit=C2)) == Resolution("main", None, C2, C2)
    with pytest.raises(RefNotFoundError, match="branch 'gone' not found in https://"):
        _resolve(RefSelector(branch="gone", commit=C2))


def test_precedence_follows_flux() -> None:
    everything = RefSelector(branch="main", tag="v1.0.0", semver="*", name="refs/pull/7/head")
    assert _resolve(everything).ref_name == "refs/pull/7/head"
    assert _resolve(RefSelector(branch="main", tag="v1.0.0", semver="^2")).ref_name == "v2.0.0"
    assert _resolve(RefSelector(branch="dev", tag="v1.0.0")).ref_name == "v1.0.0"


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (RefSelector(branch="nope"), "branch 'nope' not found in https://example.com/r.git"),
        (RefSelector(tag="v9"), "tag 'v9' not found"),
        (RefSelector(name="refs/pull/8/head"), "ref 'refs/pull/8/head' not found"),
        (RefSelector(semver="^9"), "no tag in https://example.com/r.git matches semver "
                                   "constraint '^9'"),
    ],
)
def test_not_found(selector: RefSelector, message: str) -> None:
    with pytest.raises(RefNotFoundError) as caught:
        _resolve(selector)
    assert message in str(caught.value)


def test_empty_repository() -> None:
    with pytest.raises(RefNotFoundError, match=r"r\.git has no HEAD \(is the repository empty\?\)"):
        _resolve(RefSelector(), refs={}, symrefs={})


@pytest.mark.parametrize(
    "kwargs",
    [{"commit": "abc"}, {"commit": "A" * 40}, {"semver": "latest"}, {"name": "main"},
     {"branch": "refs/heads/main"}, {"branch": ""}, {"tag": "refs/tags/v1"},
     {"branch": "../../etc"}, {"branch": "a..b"}, {"tag": "v1 "}, {"name": "refs/heads/a/../b"},
     {"branch": "x.lock"}, {"tag": "a~1"}],
)
def test_invalid_selectors(kwargs: dict[str, str]) -> None:
    with pytest.raises(InvalidRefError):
        RefSelector(**kwargs)


def test_ref_prefixes_ask_only_for_what_is_needed() -> None:
    assert RefSelector(branch="main").ref_prefixes() == ["refs/heads/main"]
    assert RefSelector(semver="^1").ref_prefixes() == ["refs/tags/"]
    assert RefSelector().ref_prefixes() == ["HEAD"]
    assert RefSelector(commit=C1).ref_prefixes() == ["HEAD"]
    assert RefSelector(commit=C1, branch="dev").ref_prefixes() == ["refs/heads/dev"]
