"""Ignore rules (sources.ignore): Flux's defaults and .sourceignore rule, pattern syntax, and
linear-time matching of hostile patterns."""

from __future__ import annotations

import time

import pytest

from sources import LimitExceededError
from sources.ignore import (
    DEFAULT_PATTERNS,
    MAX_PATTERNS,
    VCS_PATTERNS,
    Matcher,
    read_patterns,
    source_matcher,
)


def _defaults() -> Matcher:
    return source_matcher(spec_ignore=None, sourceignore_files=[])


@pytest.mark.parametrize(("path", "excluded"), [
    ("deploy/app.yaml", False),
    ("README.md", False),
    ("logo.png", True),
    ("docs/img/diagram.jpeg", True),
    ("dist/chart.tar.gz", True),
    ("release.zip", True),
    ("clip.wmv", True),
    (".github/workflows/ci.yml", True),
    (".circleci/config.yml", True),
    (".gitlab-ci.yml", True),
    ("sub/.travis.yml", True),  # a name pattern matches at any depth
    ("cloudbuild.yaml", True),
    (".sops.yaml", True),
    ("clusters/prod/.sops.yaml", True),
    ("apps/.flux.yaml", True),
    (".goreleaser.yml", True),
    (".gitignore", True),
    ("deploy/.gitattributes", True),
    ("vendor/.git/config", True),
    ("deploy/sops.yaml", False),
    ("deploy/png", False),
])
def test_flux_defaults(path: str, excluded: bool) -> None:
    assert _defaults().excluded(path, is_dir=False) is excluded


def test_any_pattern_replaces_the_defaults_but_not_vcs() -> None:
    with_spec = source_matcher(spec_ignore="*.md\n", sourceignore_files=[])
    assert with_spec.excluded("README.md", is_dir=False)
    assert not with_spec.excluded("logo.png", is_dir=False)  # defaults dropped, as in Flux
    assert with_spec.excluded(".git/config", is_dir=False)  # VCS patterns always apply
    with_file = source_matcher(spec_ignore=None, sourceignore_files=[(("docs",), "*.txt\n")])
    assert not with_file.excluded("logo.png", is_dir=False)
    assert with_file.excluded("docs/a.txt", is_dir=False)
    assert not with_file.excluded("a.txt", is_dir=False)  # outside the file's directory
    # Blank or comment-only input is no pattern: the defaults stay.
    for empty in ("", "\n# only a comment\n   \n"):
        assert source_matcher(spec_ignore=empty, sourceignore_files=[]).excluded(
            "logo.png", is_dir=False)


def test_sources_without_patterns_share_one_compiled_matcher() -> None:
    # A compiled RE2 set is ~22 KiB outside Python's heap: one per process, not one per source.
    first = source_matcher(spec_ignore=None, sourceignore_files=[])
    assert source_matcher(spec_ignore="\n# nothing\n", sourceignore_files=[]) is first
    own = source_matcher(spec_ignore="*.md\n", sourceignore_files=[])
    assert own is not first


@pytest.mark.parametrize(("patterns", "path", "excluded"), [
    # Anchoring: a pattern with a slash is relative to its file's directory.
    ("/deploy/secret.yaml", "deploy/secret.yaml", True),
    ("/deploy/secret.yaml", "x/deploy/secret.yaml", False),
    ("deploy/secret.yaml", "x/deploy/secret.yaml", False),
    ("secret.yaml", "x/deploy/secret.yaml", True),
    # A match on a directory covers everything below it.
    ("deploy/local", "deploy/local/a/b.yaml", True),
    ("local/", "deploy/local/a.yaml", True),
    ("local/", "deploy/local", False),  # a file named local is not a directory
    ("/docs", "docs/x/y.md", True),
    # ** spans directories, exactly.
    ("**/tmp", "a/b/tmp", True),
    ("a/**/b", "a/b", True),
    ("a/**/b", "a/x/y/b", True),
    ("**/a/b", "a/a/b", True),
    ("a/**", "a/x", True),
    ("a**b", "aXXb", True),  # ** inside a component is *
    # Globs within one component.
    ("*.yaml", "dir.yaml/file", True),
    ("d?ploy/*.yaml", "deploy/a.yaml", True),
    ("d?ploy/*.yaml", "deploy/sub/a.yaml", False),
    ("[a-c]x", "bx", True),
    ("[a-c]x", "dx", False),
    ("[!a-c]x", "dx", True),
    ("[^a-c]x", "ax", False),
    ("x[/]y", "x/y", False),  # a class never matches a separator
    ("\\*.md", "*.md", True),
    ("\\*.md", "a.md", False),
    ("trailing\\ ", "trailing ", True),
    ("spaces   ", "spaces", True),
    ("[unclosed", "[unclosed", False),  # malformed: matches nothing, as in Flux
    # The last matching pattern wins; ! re-includes, even inside an excluded directory.
    ("*.yaml\n!keep.yaml", "keep.yaml", False),
    ("!keep.yaml\n*.yaml", "keep.yaml", True),
    ("deploy/\n!deploy/keep.yaml", "deploy/keep.yaml", False),
    ("#*.yaml", "a.yaml", False),
])
def test_pattern_syntax(patterns: str, path: str, excluded: bool) -> None:
    matcher = source_matcher(spec_ignore=patterns, sourceignore_files=[])
    assert matcher.excluded(path, is_dir=False) is excluded


def test_sourceignore_files_are_scoped_and_ordered() -> None:
    matcher = source_matcher(
        spec_ignore="!apps/keep.md\n",
        sourceignore_files=[((), "*.md\n"), (("apps",), "!*.md\n/local/\n")])
    assert matcher.excluded("README.md", is_dir=False)
    assert not matcher.excluded("apps/a.md", is_dir=False)  # the deeper file comes later
    assert matcher.excluded("apps/local/x.yaml", is_dir=False)
    assert not matcher.excluded("local/x.yaml", is_dir=False)
    assert not matcher.excluded("apps/keep.md", is_dir=False)


def test_directories_are_pruned_only_without_inclusions() -> None:
    assert _defaults().prunes(".github")
    assert not _defaults().prunes("deploy")
    reinclude = source_matcher(spec_ignore="docs/\n!docs/keep.yaml\n", sourceignore_files=[])
    assert not reinclude.prunes("docs")


@pytest.mark.timeout(30)
def test_catastrophic_patterns_match_in_linear_time() -> None:
    """``*a*a*…a b`` against a long name takes exponential time with a backtracking matcher
    (Python's re would not finish); RE2 answers at once."""
    evil = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a b\n" * 20
    matcher = source_matcher(spec_ignore=evil + "**/x*x*x*x*x*x*x*x*x*x*y/**/z", sourceignore_files=[])
    name = "a" * 20_000
    started = time.monotonic()
    for _ in range(100):
        assert not matcher.excluded(f"deploy/{name}", is_dir=False)
        assert not matcher.excluded("x" * 20_000 + "/q/z", is_dir=False)
    assert time.monotonic() - started < 20  # generous: it takes milliseconds


def test_pattern_count_and_size_are_bounded() -> None:
    with pytest.raises(LimitExceededError, match=f"more than {MAX_PATTERNS} ignore patterns"):
        source_matcher(spec_ignore="\n".join(f"f{i}" for i in range(MAX_PATTERNS + 1)),
                       sourceignore_files=[])
    with pytest.raises(LimitExceededError, match="add up to more than"):
        source_matcher(spec_ignore=None, sourceignore_files=[((), "x" * 2_000_000)])


def test_pattern_lists_match_flux() -> None:
    # fluxcd/pkg sourceignore: ExcludeVCS, ExcludeExt, ExcludeCI, ExcludeExtra.
    assert ",".join(VCS_PATTERNS) == ".git/,.gitignore,.gitmodules,.gitattributes"
    assert ",".join(DEFAULT_PATTERNS) == (
        "*.jpg,*.jpeg,*.gif,*.png,*.wmv,*.flv,*.tar.gz,*.zip,"
        ".github/,.circleci/,.travis.yml,.gitlab-ci.yml,appveyor.yml,.drone.yml,"
        "cloudbuild.yaml,codeship-services.yml,codeship-steps.yml,"
        "**/.goreleaser.yml,**/.sops.yaml,**/.flux.yaml")
    assert [p.text for p in read_patterns("a\n\n# c\n!b\n")] == ["a", "!b"]
