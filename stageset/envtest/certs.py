"""Throw-away PKI for a local control plane: a CA, a serving cert, an admin client cert, the
controller manager's client cert, SA keys."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public: Path
    sa_private: Path
    controller_manager_cert: Path
    """``system:kube-controller-manager``, the user the bootstrap RBAC policy grants the controller
    manager's own rights (it then acts as one ServiceAccount per controller, as on a real cluster)."""
    controller_manager_key: Path
    ca_key: Path | None = None
    """The CA's key: more client certificates may be issued (:func:`issue_client_certificate`)."""


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name,
             public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def write_pki(directory: Path) -> Pki:
    """Create every key and certificate a local apiserver and its admin need, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("stageset-envtest-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = _key()
    serving = (
        _builder(_name("kube-apiserver"), ca_name, serving_key.public_key())
        .add_extension(
            x509.SubjectAlternativeName([
                x509.DNSName("localhost"),
                x509.DNSName("kubernetes.default.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
            ]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    admin_key = _key()
    admin = (
        _builder(_name("stageset-admin", "system:masters"), ca_name, admin_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    manager_key = _key()
    manager = (
        _builder(_name("system:kube-controller-manager"), ca_name, manager_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_public=directory / "sa.pub",
        sa_private=directory / "sa.key",
        controller_manager_cert=directory / "controller-manager.crt",
        controller_manager_key=directory / "controller-manager.key",
        ca_key=directory / "ca.key",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    assert pki.ca_key is not None
    pki.ca_key.write_bytes(_pem_key(ca_key))
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    pki.serving_key.write_bytes(_pem_key(serving_key))
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    pki.admin_key.write_bytes(_pem_key(admin_key))
    pki.controller_manager_cert.write_bytes(manager.public_bytes(serialization.Encoding.PEM))
    pki.controller_manager_key.write_bytes(_pem_key(manager_key))
    pki.sa_private.write_bytes(_pem_key(sa_key))
    pki.sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for private in (pki.serving_key, pki.admin_key, pki.controller_manager_key, pki.sa_private):
        private.chmod(0o600)
    return pki


def issue_client_certificate(pki: Pki, *, user: str, groups: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """A new client certificate (PEM) and its key for ``user`` in ``groups``, signed by the plane's
    CA: what a cluster's own tooling hands out (e.g. a rotated kubeconfig credential)."""
    if pki.ca_key is None:
        raise ValueError("this PKI keeps no CA key")
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user),
                         *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups)])
    certificate = (
        _builder(subject, ca.subject, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return certificate.public_bytes(serialization.Encoding.PEM), _pem_key(key)
