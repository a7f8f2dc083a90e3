"""URL policy and normalisation: what may be fetched, and which URLs share a mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from sources import Credentials, UrlPolicy, UrlPolicyError
from sources.urls import parse_url, redact

STRICT = UrlPolicy()
LAX = UrlPolicy(allow_http=True, allow_file=True)


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://github.com/org/repo", "https://github.com/org/repo"),
        ("https://GitHub.com/org/repo.git", "https://github.com/org/repo.git"),
        ("https://github.com/org/repo/", "https://github.com/org/repo"),
        ("https://github.com:443/org/repo.git/", "https://github.com/org/repo.git"),
        ("https://user@github.com/org/repo", "https://user@github.com/org/repo"),
        ("https://git.example:8443/org/Repo", "https://git.example:8443/org/Repo"),
        ("ssh://git@github.com/org/repo.git", "ssh://git@github.com/org/repo.git"),
        ("ssh://github.com/org/repo.git", "ssh://git@github.com/org/repo.git"),
        ("ssh://git@github.com:22/org/repo", "ssh://git@github.com/org/repo"),
        ("git@github.com:org/repo.git", "ssh://git@github.com:org/repo.git"),
        ("github.com:org/repo", "ssh://git@github.com:org/repo"),
        ("git@github.com:/org/repo", "ssh://git@github.com/org/repo"),
        ("ssh://git@host:2222/x.git", "ssh://git@host:2222/x.git"),
        ("git+ssh://git@host/x", "ssh://git@host/x"),
        ("https://[::1]:8443/x", "https://[::1]:8443/x"),
    ],
)
def test_always_allowed_and_normalised(url: str, key: str) -> None:
    assert parse_url(url, STRICT).key == key


@pytest.mark.parametrize(
    ("one", "other"),
    [
        # Different repositories on many servers (git http-backend serves both).
        ("https://host/org/vault", "https://host/org/vault.git"),
        # Different users see different repositories.
        ("team-a@host:app.git", "team-b@host:app.git"),
        ("ssh://team-a@host/app.git", "ssh://host/app.git"),
        ("https://alice@host/app", "https://host/app"),
        # Relative to the login's home vs absolute.
        ("git@host:app.git", "ssh://git@host/app.git"),
        ("https://host/app", "http://host/app"),
        ("https://host/app", "https://host:8443/app"),
    ],
)
def test_what_can_change_the_answer_is_kept_in_the_key(one: str, other: str) -> None:
    assert parse_url(one, LAX).key != parse_url(other, LAX).key


def test_display_and_transport_urls_never_carry_userinfo_except_ssh_user() -> None:
    https = parse_url("https://alice@Example.com/r.git", STRICT)
    assert https.display == "https://example.com/r.git"
    assert https.transport_url == "https://example.com/r.git"
    assert https.username == "alice"
    ssh = parse_url("ssh://git@example.com/r.git", STRICT)
    assert ssh.display == "ssh://example.com/r.git"
    assert ssh.transport_url == "ssh://git@example.com/r.git"
    scp = parse_url("git@example.com:org/r.git", STRICT)
    assert (scp.kind, scp.display, scp.transport_url) == (
        "ssh", "example.com:org/r.git", "git@example.com:org/r.git")


def test_http_needs_allow_http() -> None:
    with pytest.raises(UrlPolicyError, match="URL scheme 'http' is not allowed"):
        parse_url("http://example.com/r.git", STRICT)
    assert parse_url("http://example.com/r.git", LAX).key == "http://example.com/r.git"


@pytest.mark.parametrize("url", ["file:///srv/git/r.git", "/srv/git/r.git", "./r", "../r"])
def test_local_repositories_need_allow_file(url: str) -> None:
    with pytest.raises(UrlPolicyError, match="is not allowed"):
        parse_url(url, STRICT)
    assert parse_url(url, LAX).kind == "file"


def test_local_path_and_file_url_share_a_key() -> None:
    assert parse_url("/srv/git/r.git", LAX).key == parse_url("file:///srv/git/r.git", LAX).key
    assert parse_url("/srv/git/r.git", LAX).key != parse_url("file:///srv/git/r", LAX).key


def test_local_paths_are_resolved_and_refused_inside_forbidden_paths(tmp_path: Path) -> None:
    mirrors = tmp_path / "mirrors"
    (mirrors / "abc").mkdir(parents=True)
    (tmp_path / "innocent").symlink_to(mirrors / "abc")
    policy = LAX.forbidding(mirrors)
    for url in (f"file://{mirrors}/abc", str(mirrors / "abc"), f"{tmp_path}/innocent",
                f"file://{tmp_path}/x/../mirrors/abc", "file:///proc/self/root" + str(mirrors),
                "/var/run/secrets/kubernetes.io/serviceaccount", "/proc/1/cwd", "/dev/shm/x"):
        with pytest.raises(UrlPolicyError, match="never serves"):
            parse_url(url, policy)
    assert parse_url(str(tmp_path / "elsewhere.git"), policy).path == str(
        tmp_path / "elsewhere.git")


def test_file_urls_name_no_host() -> None:
    with pytest.raises(UrlPolicyError, match="must not name a host"):
        parse_url("file://evil.example/srv/r.git", LAX)


@pytest.mark.parametrize("url", [
    "ssh://-oProxyCommand=touch%20/tmp/pwned/x.git",
    "ssh://-oProxyCommand=x@host/x.git",
    "-oProxyCommand=touch /tmp/pwned:x.git",
    "git@-oProxyCommand=x:repo.git",
    "-u:x",
    "--upload-pack=touch /tmp/pwned",
    "https://-host.example/x",
    "https://host.example/x\n--upload-pack=evil",
    "https://host.example/x\x00y",
])
def test_option_injection_is_refused(url: str) -> None:
    with pytest.raises(UrlPolicyError):
        parse_url(url, LAX)


@pytest.mark.parametrize(
    ("url", "scheme"),
    [("git://example.com/r.git", "git"), ("ftp://example.com/r", "ftp"),
     ("ext::sh -c touch% /tmp/pwned", "ext"), ("FTP://x/y", "ftp")],
)
def test_other_schemes_are_refused_by_name(url: str, scheme: str) -> None:
    with pytest.raises(UrlPolicyError, match=f"URL scheme '{scheme}'"):
        parse_url(url, LAX)


def test_password_in_url_is_refused_and_not_repeated() -> None:
    with pytest.raises(UrlPolicyError) as caught:
        parse_url("https://alice:hunter2@example.com/r.git", STRICT)
    assert "hunter2" not in str(caught.value)
    assert "password" in str(caught.value)


@pytest.mark.parametrize("url", ["", "https:///r.git", "https://example.com/r?x=1",
                                 "https://example.com/r#frag", "https://example.com:99999/r"])
def test_malformed(url: str) -> None:
    with pytest.raises(UrlPolicyError):
        parse_url(url, STRICT)


def test_redact_and_credentials_repr() -> None:
    creds = Credentials(username="u", password="p4ss", bearer_token="t0ken", ca_pem=b"PEM",
                        identity=b"KEY", known_hosts=b"host")
    assert "p4ss" not in repr(creds)
    assert "t0ken" not in repr(creds)
    assert "KEY" not in repr(creds)
    assert "present=['password', 'bearer_token', 'ca_pem', 'identity', 'known_hosts']" in repr(
        creds)
    assert redact("x p4ss y t0ken", creds.secrets()) == "x *** y ***"
