"""How KubeClient builds a request: what the generated client's ``param_serialize`` built, and the
bearer token asked of the configuration's refresh hook at most once a second (issue 38, item 3).

Pure units: a real ``kubernetes.client.Configuration`` and ``ApiClient``, nothing sent.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from stageset.kube import client as kube_client
from stageset.kube.client import Identity, KubeClient

TOKEN = "Bearer one"  # a made-up value, nothing is sent
NOBODY = Identity()


def _configuration(token: str | None = TOKEN) -> k8s.Configuration:
    configuration = k8s.Configuration()
    configuration.host = "https://apiserver.example:6443"
    if token is not None:
        configuration.api_key = {"authorization": token}
    return configuration


def _client(configuration: k8s.Configuration, identity: Identity = NOBODY) -> KubeClient:
    return KubeClient(api_client=k8s.ApiClient(configuration=configuration), identity=identity)


@pytest.mark.parametrize("token", [TOKEN, None])
@pytest.mark.parametrize("identity", [NOBODY, Identity.service_account(namespace="team-a", name="deployer")])
def test_headers_and_url_are_what_the_generated_client_built(token: str | None, identity: Identity) -> None:
    configuration = _configuration(token)
    client = _client(configuration, identity)
    extra = {"Content-Type": "application/apply-patch+yaml"}
    url, headers = client._prepare("PATCH", "/api/v1/namespaces/a/configmaps/b", {"force": True}, dict(extra))
    _, generated_url, generated, _, _ = k8s.ApiClient(configuration=configuration).param_serialize(
        "PATCH", "/api/v1/namespaces/a/configmaps/b",
        header_params={"Accept": "application/json", **client._headers, **extra},
        auth_settings=["BearerToken"])
    assert url == f"{generated_url}?force=true"
    assert headers == generated
    assert ("authorization" in headers) is (token is not None)


def test_repeated_impersonate_group_lines_survive() -> None:
    client = _client(_configuration(), Identity(user="alice", groups=("g1", "g2")))
    _, headers = client._prepare("GET", "/api", None, {})
    assert headers.getlist("Impersonate-Group") == ["g1", "g2"]  # type: ignore[attr-defined]
    assert headers["Impersonate-User"] == "alice"


def test_the_token_is_refreshed_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    configuration = _configuration()
    calls: list[int] = []

    def rotate(c: k8s.Configuration) -> None:  # what a rotated ServiceAccount token looks like
        calls.append(1)
        c.api_key = {"authorization": f"Bearer token-{len(calls)}"}

    configuration.refresh_api_key_hook = rotate
    client = _client(configuration)
    now = [1000.0]
    monkeypatch.setattr(kube_client.time, "monotonic", lambda: now[0])
    for _ in range(50):
        _, headers = client._prepare("GET", "/api", None, {})
    assert len(calls) == 1
    assert headers["authorization"] == "Bearer token-1"
    now[0] += kube_client.AUTH_REFRESH_SECONDS
    _, headers = client._prepare("GET", "/api", None, {})
    assert len(calls) == 2
    assert headers["authorization"] == "Bearer token-2"
