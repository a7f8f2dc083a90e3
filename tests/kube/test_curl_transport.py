"""The libcurl transport (``stageset/kube/curl.py``) against the real apiserver: every verb as the
identity a client names (read back from the audit log), one connection pool per cluster shared by
its identities, no header line added by input, and failures in urllib3's words."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import certifi
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient, UnreachableError
from stageset.kube.curl import CurlPool, supports
from tests.conftest import Tenant

pytestmark = pytest.mark.apiserver


def _configuration(kubeconfig: Path) -> k8s.Configuration:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration)
    return configuration


def _client(configuration: k8s.Configuration, identity: Identity | None = None) -> KubeClient:
    return KubeClient(api_client=k8s.ApiClient(configuration=configuration), identity=identity or Identity(),
                      timeout=5.0)


def test_every_verb_travels_over_libcurl_as_the_named_identity(
    kube_pool: ClientPool, installed: KubeClient, control_plane: ControlPlane,
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("curl")
    tenant.bind_cluster_role("edit")
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{tenant.namespace}", "system:authenticated")
    client = kube_pool.client(Identity(user=tenant.username, groups=groups))
    assert client.transport == "libcurl"
    path = f"/api/v1/namespaces/{tenant.namespace}/configmaps/c"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": tenant.namespace},
            "data": {"k": "v" * 900_000}}
    seen = len(control_plane.audit_events())
    # A body past libcurl's 1 MiB "Expect: 100-continue" threshold goes at once and is answered
    # (here refused: a ConfigMap holds at most 1 MiB).
    with pytest.raises(ApiError) as large:
        client.apply(path, {**body, "data": {"k": "v" * 1_500_000}}, field_manager="curl", dry_run=True)
    assert large.value.invalid, large.value
    client.apply(path, body, field_manager="curl", dry_run=True)
    created: list[int] = []
    client.apply(path, body, field_manager="curl", status=created)
    assert created == [201]
    read = client.get(path)
    assert len(read["data"]["k"]) == 900_000
    listed = client.request("GET", f"/api/v1/namespaces/{tenant.namespace}/configmaps",
                            query={"labelSelector": "absent=true"})
    assert listed["items"] == []
    client.request("PATCH", path, body={"metadata": {"labels": {"a": "b"}}},
                   content_type="application/merge-patch+json")
    with pytest.raises(ApiError) as stale:
        client.delete(path, resource_version="1")
    assert stale.value.conflict
    client.delete(path, resource_version=client.get(path)["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as gone:
        client.get(path)
    assert gone.value.not_found
    with pytest.raises(ApiError) as denied:
        client.get("/api/v1/namespaces/kube-system/secrets")
    assert denied.value.forbidden

    time.sleep(1)  # the audit log is written after the answers
    mine = [e for e in control_plane.audit_events()[seen:] if e.get("stage") == "ResponseComplete"
            and (e.get("impersonatedUser") or {}).get("username") == tenant.username]
    verbs = sorted(e["verb"] for e in mine)
    assert verbs == ["delete", "delete", "get", "get", "get", "list", "list",
                     "patch", "patch", "patch", "patch"], verbs
    # Each Impersonate-Group line arrived as one group (repeated lines, not one comma-joined value).
    assert all(list(e["impersonatedUser"]["groups"]) == list(groups) for e in mine), \
        mine[0]["impersonatedUser"]


def test_identities_of_one_cluster_share_its_connections(kubeconfig: Path, installed: KubeClient) -> None:
    pool = ClientPool.from_kubeconfig(str(kubeconfig))
    try:
        clients = [pool.client(Identity(user=f"system:serviceaccount:nowhere:sa-{i}")) for i in range(20)]
        for client in clients:
            with pytest.raises(ApiError) as denied:
                client.get("/api/v1/namespaces/nowhere/configmaps")
            assert denied.value.forbidden
        shared = {id(client._curl) for client in clients}
        assert len(shared) == 1
        curl = clients[0]._curl
        assert isinstance(curl, CurlPool)
        assert curl.idle == 1, "one thread's requests, one after the other, need one connection"
    finally:
        pool.close()


def test_a_header_line_break_is_refused_before_anything_is_sent(kubeconfig: Path) -> None:
    smuggled = _client(_configuration(kubeconfig),
                       Identity(user="system:serviceaccount:a:b\r\nImpersonate-Group: system:masters"))
    assert smuggled.transport == "libcurl"
    with pytest.raises(ValueError, match="line break"):
        smuggled.get("/api/v1/namespaces")


def test_inline_ca_data_is_trusted_as_urllib3_trusts_it(kubeconfig: Path) -> None:
    """A remote cluster's kubeconfig carries its CA inline (``stageset/kube/remote.py`` sets
    ``ca_cert_data``, no file): libcurl must verify the server against exactly that."""
    inline = _configuration(kubeconfig)
    inline.ca_cert_data = Path(str(inline.ssl_ca_cert)).read_text()
    inline.ssl_ca_cert = None
    client = _client(inline)
    assert client.transport == "libcurl"
    assert client.get("/api")["kind"] == "APIVersions"
    inline.ca_cert_data = Path(certifi.where()).read_text()  # trusted: public CAs only
    with pytest.raises(UnreachableError) as untrusted:
        _client(inline).get("/api")
    assert untrusted.value.why == "TLS failed (certificate or protocol)"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield int(server.getsockname()[1])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_failures_are_told_in_the_words_of_the_urllib3_path(kubeconfig: Path, silent_port: int) -> None:
    refused = _configuration(kubeconfig)
    refused.host = f"https://127.0.0.1:{_free_port()}"
    with pytest.raises(UnreachableError) as no_server:
        _client(refused).get("/api")
    assert no_server.value.why == "connection refused"

    strange_ca = _configuration(kubeconfig)
    strange_ca.ssl_ca_cert = certifi.where()  # public CAs: none signed the control plane's certificate
    with pytest.raises(UnreachableError) as untrusted:
        _client(strange_ca).get("/api")
    assert untrusted.value.why == "TLS failed (certificate or protocol)"

    silent = _configuration(kubeconfig)
    silent.host = f"https://127.0.0.1:{silent_port}"
    with pytest.raises(UnreachableError) as quiet:
        _client(silent).request("GET", "/api", timeout=1.0)
    assert quiet.value.why == "no answer in time"


@pytest.mark.parametrize(("change", "served"), [
    ({}, True),
    ({"tls_server_name": "kubernetes.default"}, False),
    ({"assert_hostname": False}, False),
    ({"proxy_headers": {"Proxy-Authorization": "Basic x"}}, False),
    ({"host": "unix:///var/run/x.sock"}, False),
])
def test_a_configuration_libcurl_is_not_given_in_full_keeps_urllib3(
    kubeconfig: Path, change: dict[str, object], served: bool,
) -> None:
    configuration = _configuration(kubeconfig)
    for name, value in change.items():
        setattr(configuration, name, value)
    assert supports(configuration) is served
    assert _client(configuration).transport == ("libcurl" if served else "urllib3")
