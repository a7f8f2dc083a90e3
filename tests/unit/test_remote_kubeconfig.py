from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.kube.remote import KubeconfigError, parse_remote_kubeconfig


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(*, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> bytes:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster or {
            "server": "https://prod.example:6443", "certificate-authority-data": b64(b"CA PEM")}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }).encode()


def test_token_and_inline_ca_are_used() -> None:
    remote = parse_remote_kubeconfig(kubeconfig(user={"token": "t0ken"}))
    assert remote.server == "https://prod.example:6443"
    assert remote.configuration.api_key == {"authorization": "Bearer t0ken"}
    assert remote.configuration.ca_cert_data == "CA PEM"
    assert len(remote.fingerprint) == 16


def test_client_certificates_go_to_private_files(tmp_path: Path) -> None:
    remote = parse_remote_kubeconfig(kubeconfig(user={"client-certificate-data": b64(b"CERT"),
                                                      "client-key-data": b64(b"KEY")}), scratch=tmp_path)
    key = Path(remote.configuration.key_file)
    assert key.read_bytes() == b"KEY"
    assert key.stat().st_mode & 0o077 == 0
    assert key.parent.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(("user", "cluster", "field"), [
    ({"exec": {"command": "/bin/sh", "args": ["-c", "id"]}}, None, "exec"),
    ({"auth-provider": {"name": "gcp"}}, None, "auth-provider"),
    ({"client-certificate": "/etc/shadow", "client-key": "/etc/shadow"}, None, "client-certificate"),
    ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, None, "tokenFile"),
    ({"token": "t", "as": "system:admin"}, None, "as"),
    ({"token": "t"}, {"server": "https://x", "certificate-authority": "/etc/ssl/ca.pem"},
     "certificate-authority"),
    ({"token": "t"}, {"server": "https://x", "proxy-url": "http://attacker:3128"}, "proxy-url"),
    ({"token": "t"}, {"server": "http://plain:8080"}, "https://"),
    ({}, None, "needs a token"),
])
def test_commands_files_and_proxies_are_refused(user: dict[str, Any], cluster: dict[str, Any] | None,
                                               field: str) -> None:
    with pytest.raises(KubeconfigError, match=field):
        parse_remote_kubeconfig(kubeconfig(user=user, cluster=cluster))


def test_garbage_is_refused_clearly() -> None:
    with pytest.raises(KubeconfigError, match="not a mapping"):
        parse_remote_kubeconfig(b"just text")
    with pytest.raises(KubeconfigError, match="current-context"):
        parse_remote_kubeconfig(b"apiVersion: v1\n")


# -- every value checked where it is read (issue 43 item 7) ------------------------------------------

@pytest.mark.parametrize(("server", "said"), [
    ("https://user:pass@prod.example:6443", "must not carry user:password@"),
    ("https://token@prod.example:6443", "must not carry user:password@"),
    ("https://prod.example:6443\r\nX-Injected: 1", "one line of printable ASCII"),
    ("https://prod.example :6443", "one line of printable ASCII"),
    ("https://prod.example:99999", "not a valid URL"),
    ("https://prod.example:6443?x=1", "query or fragment"),
    ("https://prod.example:6443#frag", "query or fragment"),
    ("https://", "names no host"),
    ("https://[::1", "not a valid URL"),
    (6443, "must be an https:// URL"),
])
def test_a_server_url_is_refused_naming_the_field(server: Any, said: str) -> None:
    with pytest.raises(KubeconfigError, match=r"cluster\.server") as refused:
        parse_remote_kubeconfig(kubeconfig(user={"token": "t0ken"}, cluster={
            "server": server, "certificate-authority-data": b64(b"CA")}))
    assert said in str(refused.value)
    assert "pass" not in str(refused.value).replace("password", ""), "the value is never quoted"


@pytest.mark.parametrize("token", ["t0ken\r\nX-Injected: 1", "t0ken\n", "a b", "", "é", "x" * 20000, 12,
                                   ["t"]])
def test_a_token_that_is_not_one_printable_line_is_refused_unquoted(token: Any) -> None:
    with pytest.raises(KubeconfigError, match="user field 'token'") as refused:
        parse_remote_kubeconfig(kubeconfig(user={"token": token}))
    assert "t0ken" not in str(refused.value)


@pytest.mark.parametrize("document", [
    {"current-context": "c", "contexts": 7},
    {"current-context": ["c"], "contexts": [{"name": "c", "context": {}}]},
    {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
     "clusters": [{"name": "k", "cluster": {"server": "https://x", "certificate-authority-data": 5}}],
     "users": [{"name": "u", "user": {"token": "t"}}]},
])
def test_odd_shapes_are_refused_not_raised(document: Any) -> None:
    with pytest.raises(KubeconfigError):
        parse_remote_kubeconfig(yaml.safe_dump(document).encode())
    with pytest.raises(KubeconfigError):
        parse_remote_kubeconfig(b"[" * 100000)


def test_a_path_on_the_server_is_kept() -> None:
    server = "https://prod.example:6443/k8s/clusters/c-1"
    parsed = parse_remote_kubeconfig(kubeconfig(user={"token": "t"}, cluster={"server": server}))
    assert parsed.server == server
