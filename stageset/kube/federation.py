"""Workload identity for remote clusters: the ``kubeConfig.configMapRef`` ConfigMap, read and kept harmless.

A ConfigMap in Flux's format (RFC-0010) names a remote cluster without holding a credential:

- ``provider`` — who issues the identity the remote trusts.  ``generic``: this cluster's own
  ServiceAccount issuer (a TokenRequest, :mod:`stageset.kube.tokens`); ``aws``, ``azure`` and
  ``gcp`` are refused by name (nothing here can verify them yet);
- ``address`` — the remote API server, an ``https://`` URL with a host and nothing else (no
  ``user:password@``, query or fragment);
- ``ca.crt`` — the PEM certificates the remote's serving certificate is checked against (optional:
  the system's trust store without it);
- ``audiences`` — the tokens' audiences, one per line (default: ``address`` exactly as written);
- ``serviceAccountName`` — whose token (the caller decides what it may be).

:func:`parse_workload_config` is pure: every key is checked where it is read, and a refusal is a
:class:`WorkloadConfigError` naming the key — a value is quoted only where it is short and plain
(a provider's name), never a certificate or an address.  :func:`federated_remote` builds the client
configuration: the address and CA only, no credential — the caller's client pool adds a token per
identity (:meth:`~stageset.kube.client.ClientPool.register`).

Identity: none — nothing here makes a request.  A cluster is identified as a kubeconfig's is
(:func:`~stageset.kube.remote.cluster_id`: server URL and CA fingerprint), so a cluster reached
through a Secret and through a ConfigMap with the same address and CA is the same cluster.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from stageset.kube.remote import RemoteConfig, UrlProblem, cluster_id, https_url_problem

GENERIC = "generic"
"""The one provider implemented: tokens of this cluster's ServiceAccount issuer."""
NOT_YET = ("aws", "azure", "gcp")
"""Providers of Flux's format refused by name: nothing here can verify them yet."""

MAX_ADDRESS = 2048
MAX_CA = 64 * 1024
"""Bytes of ``ca.crt`` at most (a bundle of a few dozen certificates)."""
MAX_AUDIENCES = 16
MAX_AUDIENCE = 1024
KEYS = ("provider", "address", "ca.crt", "audiences", "serviceAccountName")
"""The keys read; any other (Flux's ``cluster``, for the cloud providers) is left alone."""

_PLAIN = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class WorkloadConfigError(ValueError):
    """A key of the ConfigMap is missing or unusable; the message names the key (never a long value)."""


@dataclass(frozen=True)
class WorkloadConfig:
    """A workload-identity ConfigMap, checked."""

    provider: str
    address: str
    """As written (the default audience); the server URL is :attr:`server`."""
    ca: bytes | None
    """PEM, normalised (one trailing newline, LF line ends); ``None``: the system's trust store."""
    audiences: tuple[str, ...]
    """The tokens' audiences: ``audiences``, else ``(address,)``."""
    service_account: str | None
    """``serviceAccountName``, if set."""

    @property
    def server(self) -> str:
        """The URL requests go to: the address without a trailing ``/``."""
        return self.address.rstrip("/")

    @property
    def cluster_id(self) -> str:
        return cluster_id(server=self.server, ca_data=self.ca)


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise WorkloadConfigError(f"key {key!r} is not a string")
    return value


def _printable(value: str) -> bool:
    return all(33 <= ord(c) < 127 for c in value)


def check_provider(value: str | None) -> str:
    if value is None or not value.strip():
        raise WorkloadConfigError("key 'provider' is missing: set it to 'generic' (a cluster that trusts "
                                  "this cluster's ServiceAccount issuer)")
    provider = value.strip()
    if provider in NOT_YET:
        raise WorkloadConfigError(f"provider {provider!r} is not supported yet: only 'generic' (a cluster "
                                  "that trusts this cluster's ServiceAccount issuer) can be used; "
                                  f"{', '.join(NOT_YET)} are planned")
    if provider != GENERIC:
        shown = repr(provider) if _PLAIN.fullmatch(provider) else "(the value given)"
        raise WorkloadConfigError(f"provider {shown} is not known: use 'generic' ({', '.join(NOT_YET)} "
                                  "are not supported yet)")
    return provider


def check_address(value: str | None) -> str:
    """``address`` as the client and the default audience use it, or :class:`WorkloadConfigError`
    (the rules of a kubeconfig's ``cluster.server``: :func:`~stageset.kube.remote.https_url_problem`)."""
    if value is None or not value.strip():
        raise WorkloadConfigError("key 'address' is missing: the remote API server's https:// URL")
    address = value.strip()
    problem = https_url_problem(address, limit=MAX_ADDRESS)
    if problem is not None:
        extra = {UrlProblem.NOT_HTTPS: " (a token is never sent in clear)",
                 UrlProblem.NOT_ONE_LINE: f" (at most {MAX_ADDRESS} characters)"}
        raise WorkloadConfigError(f"key 'address' {problem.value}{extra.get(problem, '')}")
    return address


def check_ca(value: str | None) -> bytes | None:
    """``ca.crt`` as PEM bytes (normalised), ``None`` when absent, or :class:`WorkloadConfigError`."""
    if value is None or not value.strip():
        return None
    if len(value) > MAX_CA:
        raise WorkloadConfigError(f"key 'ca.crt' is larger than {MAX_CA // 1024} KiB")
    pem = value.replace("\r\n", "\n").strip() + "\n"
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise WorkloadConfigError("key 'ca.crt' holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, ValueError) as error:
        raise WorkloadConfigError("key 'ca.crt' does not parse as PEM certificates") from error
    return pem.encode()


def check_audiences(value: str | None, *, address: str) -> tuple[str, ...]:
    """``audiences``, one per line (blank lines ignored); ``(address,)`` when none is given."""
    if value is None:
        return (address,)
    found = tuple(dict.fromkeys(line.strip() for line in value.splitlines() if line.strip()))
    if len(found) > MAX_AUDIENCES:
        raise WorkloadConfigError(f"key 'audiences' lists more than {MAX_AUDIENCES} audiences")
    for audience in found:
        if len(audience) > MAX_AUDIENCE or not _printable(audience):
            raise WorkloadConfigError("key 'audiences': each line must be printable ASCII without spaces "
                                      f"(at most {MAX_AUDIENCE} characters)")
    return found or (address,)


def check_service_account(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    name = value.strip()
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise WorkloadConfigError("key 'serviceAccountName' is not a valid ServiceAccount name")
    return name


def parse_workload_config(data: Any) -> WorkloadConfig:
    """A ConfigMap's ``data``, checked key by key (in :data:`KEYS`' order: the first problem is named)."""
    if not isinstance(data, Mapping):
        data = {}
    provider = check_provider(_text(data, "provider"))
    address = check_address(_text(data, "address"))
    ca = check_ca(_text(data, "ca.crt"))
    audiences = check_audiences(_text(data, "audiences"), address=address)
    account = check_service_account(_text(data, "serviceAccountName"))
    return WorkloadConfig(provider=provider, address=address, ca=ca, audiences=audiences,
                          service_account=account)


def federated_remote(config: WorkloadConfig) -> RemoteConfig:
    """The client configuration of ``config``'s cluster: its address and CA, and no credential."""
    configuration = k8s.Configuration()
    configuration.host = config.server
    configuration.connection_pool_maxsize = 32
    if config.ca is not None:
        configuration.ca_cert_data = config.ca.decode()
    return RemoteConfig(fingerprint=config.cluster_id.partition("#")[2], configuration=configuration,
                        server=config.server, cluster_id=config.cluster_id)
