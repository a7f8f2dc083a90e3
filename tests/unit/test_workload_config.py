"""The workload-identity ConfigMap (``kubeConfig.configMapRef``), key by key: what is accepted, and a
refusal naming the key for everything else — never quoting a long value.  Pure units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stageset.envtest.certs import write_pki
from stageset.kube.federation import (
    MAX_AUDIENCES,
    WorkloadConfigError,
    federated_remote,
    parse_workload_config,
)
from stageset.kube.remote import cluster_id

ADDRESS = "https://prod.example:6443"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_pki(tmp_path_factory.mktemp("pki")).ca_cert.read_text()


def data(pem: str, **changes: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"provider": "generic", "address": ADDRESS, "ca.crt": pem}
    for key, value in changes.items():
        key = {"crt": "ca.crt"}.get(key, key)
        if value is None:
            found.pop(key, None)
        else:
            found[key] = value
    return found


def test_a_generic_configmap_reads_as_flux_writes_it(ca: str) -> None:
    config = parse_workload_config(data(ca, audiences="aud-a\n\n  aud-b  \naud-a\n",
                                        serviceAccountName="deployer",
                                        cluster="ignored: the cloud providers' key"))
    assert config.provider == "generic"
    assert config.address == ADDRESS
    assert config.audiences == ("aud-a", "aud-b"), "one per line, trimmed, blank lines and repeats dropped"
    assert config.service_account == "deployer"
    assert config.ca is not None
    assert config.ca.endswith(b"-----END CERTIFICATE-----\n")


def test_the_audience_defaults_to_the_address_as_written(ca: str) -> None:
    assert parse_workload_config(data(ca)).audiences == (ADDRESS,)
    assert parse_workload_config(data(ca, audiences="\n \n")).audiences == (ADDRESS,)
    slashed = parse_workload_config(data(ca, address=ADDRESS + "/"))
    assert slashed.audiences == (ADDRESS + "/",), "the audience is the address exactly as written"
    assert slashed.server == ADDRESS, "requests go to the URL without its trailing slash"


def test_the_cluster_is_identified_as_a_kubeconfig_names_it(ca: str, tmp_path: Path) -> None:
    """Server URL and CA fingerprint, as for a kubeconfig whose certificate-authority-data is the same PEM:
    the same cluster reached through a Secret and a ConfigMap is one cluster (a move between them is none)."""
    config = parse_workload_config(data(ca))
    assert config.cluster_id == cluster_id(server=ADDRESS, ca_data=ca.encode())
    crlf = parse_workload_config(data(ca, crt=ca.replace("\n", "\r\n").strip()))
    assert crlf.cluster_id == config.cluster_id, "line ends, a missing last newline: not another cluster"
    remote = federated_remote(config)
    assert (remote.server, remote.cluster_id) == (ADDRESS, config.cluster_id)
    assert remote.configuration.host == ADDRESS
    assert not remote.configuration.api_key, "no credential: each identity's token is added per request"
    assert remote.configuration.cert_file is None
    no_ca = parse_workload_config(data(ca, crt=None))
    assert no_ca.ca is None
    assert no_ca.cluster_id == f"{ADDRESS}#insecure"


REFUSED = [
    ({"provider": None}, "key 'provider' is missing"),
    ({"provider": "aws"}, "provider 'aws' is not supported yet"),
    ({"provider": "azure"}, "provider 'azure' is not supported yet"),
    ({"provider": "gcp"}, "provider 'gcp' is not supported yet"),
    ({"provider": "vault"}, "provider 'vault' is not known"),
    ({"provider": "A" * 500}, "provider (the value given) is not known"),
    ({"address": None}, "key 'address' is missing"),
    ({"address": ""}, "key 'address' is missing"),
    ({"address": "http://prod.example:6443"}, "key 'address' must be an https:// URL"),
    ({"address": "prod.example:6443"}, "key 'address' must be an https:// URL"),
    ({"address": "https://user:pw@prod.example"}, "must not carry user:password@"),
    ({"address": "https://prod.example/?x=1"}, "must not carry a query or fragment"),
    ({"address": "https://prod.example/#frag"}, "must not carry a query or fragment"),
    ({"address": "https://prod.example:port"}, "key 'address' is not a valid URL"),
    ({"address": "https://"}, "key 'address' names no host"),
    ({"address": "https://prod.example\r\nX-Evil: 1"}, "key 'address' must be one line"),
    ({"address": "https://" + "a" * 3000}, "key 'address' must be one line"),
    ({"address": 6443}, "key 'address' is not a string"),
    ({"crt": "not a certificate"}, "key 'ca.crt' holds no PEM certificate"),
    ({"crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
     "key 'ca.crt' does not parse"),
    ({"crt": "x" * (65 * 1024)}, "key 'ca.crt' is larger than 64 KiB"),
    ({"audiences": "\n".join(f"a{i}" for i in range(MAX_AUDIENCES + 1))}, "more than 16 audiences"),
    ({"audiences": "one two"}, "key 'audiences': each line must be printable ASCII without spaces"),
    ({"serviceAccountName": "Not_A_Name"}, "key 'serviceAccountName' is not a valid ServiceAccount name"),
]


@pytest.mark.parametrize(("changes", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_every_bad_key_is_refused_naming_it(ca: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadConfigError) as refused:
        parse_workload_config(data(ca, **changes))
    assert message in str(refused.value)
    for value in changes.values():
        if isinstance(value, str) and len(value) > 40:
            assert value not in str(refused.value), "a long value is never quoted"


def test_no_data_at_all_names_the_first_key() -> None:
    for nothing in (None, {}, "text", []):
        with pytest.raises(WorkloadConfigError, match="key 'provider' is missing"):
            parse_workload_config(nothing)
