"""Flux-format revisions: pure formatting and parsing."""

from __future__ import annotations

import pytest

from sources.revision import format_revision, parse_revision

SHA1 = "0123456789abcdef0123456789abcdef01234567"
SHA256 = "ab" * 32


@pytest.mark.parametrize(
    ("ref_name", "commit", "revision"),
    [
        ("main", SHA1, f"main@sha1:{SHA1}"),
        ("v1.2.3", SHA1, f"v1.2.3@sha1:{SHA1}"),
        ("refs/pull/7/head", SHA1, f"refs/pull/7/head@sha1:{SHA1}"),
        ("feature/x@y", SHA1, f"feature/x@y@sha1:{SHA1}"),
        (None, SHA1, f"sha1:{SHA1}"),
        ("main", SHA256, f"main@sha256:{SHA256}"),
        (None, SHA256, f"sha256:{SHA256}"),
    ],
)
def test_round_trip(ref_name: str | None, commit: str, revision: str) -> None:
    assert format_revision(ref_name, commit) == revision
    assert parse_revision(revision) == (ref_name, commit)


def test_legacy_flux_form_is_parsed() -> None:
    assert parse_revision(f"main/{SHA1}") == ("main", SHA1)
    assert parse_revision(f"feature/x/{SHA1}") == ("feature/x", SHA1)


@pytest.mark.parametrize("commit", ["abc", SHA1.upper(), SHA1 + "0", "g" * 40, ""])
def test_format_refuses_bad_commits(commit: str) -> None:
    with pytest.raises(ValueError, match="not a full lowercase hex commit id"):
        format_revision("main", commit)


@pytest.mark.parametrize("revision", [
    "", "main", f"@sha1:{SHA1}", f"main@sha1:{SHA1[:-1]}", f"main@sha256:{SHA1}",
    f"sha1:{SHA256}", "main/abc", f"/{SHA1}",
])
def test_parse_refuses_non_revisions(revision: str) -> None:
    with pytest.raises(ValueError, match="revision"):
        parse_revision(revision)
