"""The address guard: which IP addresses an artifact download (or an ``http`` action) may connect to.

Identity: none.  The pure part (:func:`refusal`) decides on one address; :class:`AddressGuard`
resolves a host name once and hands back only addresses it admits, so the caller connects to
exactly the address that was checked (no second look-up a rebinding DNS server could answer
differently).  :mod:`sources.download` calls it for every connection, so every redirect hop is
checked at connect time too.

An artifact URL comes from a source object's status, which a tenant can often write (an
``ExternalArtifact`` is just an object in their namespace).  Without a guard the controller would
fetch whatever the tenant names from inside the cluster network: its own node's services on
loopback, the cloud's metadata service (credentials), link-local neighbours.  Refused:

* **loopback** — ``127.0.0.0/8``, ``::1``;
* **unspecified** — ``0.0.0.0/8`` (on Linux ``0.0.0.0`` reaches the local host), ``::``;
* **link-local** — ``169.254.0.0/16`` (which holds the ``169.254.169.254`` metadata service of
  AWS, GCP, Azure, OpenStack), ``fe80::/10``;
* **cloud metadata** outside those: ``fd00:ec2::254`` (AWS, IPv6), ``100.100.100.200``
  (Alibaba), ``192.0.0.192`` (Oracle);
* **multicast** and **broadcast** — ``224.0.0.0/4``, ``255.255.255.255``, ``ff00::/8``;
* IPv6 forms that embed a refused IPv4 address (``::ffff:127.0.0.1``, ``::127.0.0.1``,
  6to4 ``2002:7f00:1::``, NAT64 ``64:ff9b::7f00:1``) are judged by the embedded address.

Private ranges (``10/8``, ``172.16/12``, ``192.168/16``, ``100.64/10``, ``fc00::/7``) are
allowed: in a cluster, that is where source-controller serves its artifacts.
``allow_insecure`` (``--allow-insecure-sources``, development on one machine) admits everything.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sources.errors import TransferError, UrlPolicyError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_METADATA = {
    ipaddress.ip_address("fd00:ec2::254"): "the AWS metadata service",
    ipaddress.ip_address("100.100.100.200"): "the Alibaba Cloud metadata service",
    ipaddress.ip_address("192.0.0.192"): "the Oracle Cloud metadata service",
    ipaddress.ip_address("169.254.169.254"): "the cloud metadata service",
    ipaddress.ip_address("169.254.170.2"): "the AWS ECS credentials service",
}
_UNSPECIFIED_V4 = ipaddress.ip_network("0.0.0.0/8")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPAT = ipaddress.ip_network("::/96")
_BROADCAST = ipaddress.ip_address("255.255.255.255")


class AddressRefusedError(UrlPolicyError):
    """A download would connect to an address the guard refuses."""


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries (mapped, compatible, 6to4, NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _COMPAT and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: IPAddress) -> str | None:
    """Why ``address`` is refused (``"loopback"``, ``"link-local"``...), or ``None`` when allowed."""
    if address in _METADATA:
        return _METADATA[address]
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            why = refusal(embedded)
            return f"{why} (as {embedded} inside an IPv6 address)" if why else None
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified or (isinstance(address, ipaddress.IPv4Address) and address in _UNSPECIFIED_V4):
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address == _BROADCAST:
        return "broadcast"
    return None


Resolver = Callable[[str, int], Sequence[str]]
"""``(host, port) -> addresses`` (text form); the guard's one DNS look-up per connection."""


def system_resolver(host: str, port: int) -> list[str]:
    """The system's resolver (``getaddrinfo``), TCP addresses in the order it returns them."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        text = str(sockaddr[0]).split("%", 1)[0]
        if text not in seen:
            seen.append(text)
    return seen


@dataclass(frozen=True)
class AddressGuard:
    """Resolve once, refuse what :func:`refusal` refuses, connect only to what was checked."""

    allow_insecure: bool = False
    resolver: Resolver = field(default=system_resolver)
    purpose: str = "artifacts"
    """What the connections are for, as refusals say it (``artifacts``, ``actions``)."""
    verb: str = "download from"
    """What a refusal says was refused (``download from``, ``call``)."""

    def check(self, address: IPAddress, *, host: str) -> None:
        """Raise :class:`AddressRefusedError` for a refused address (a literal, or the peer of a
        connected socket)."""
        if self.allow_insecure:
            return
        why = refusal(address)
        if why is not None:
            shown = host if host == str(address) else f"{host} ({address})"
            raise AddressRefusedError(
                f"refusing to {self.verb} {shown}: {why} addresses are not allowed for {self.purpose} "
                "(only a development controller started with --allow-insecure-sources may)")

    def addresses(self, host: str, port: int) -> list[IPAddress]:
        """Every address of ``host``, each checked; refused as a whole when any one is refused (a
        name that also points at loopback or metadata is not trusted for its other addresses)."""
        literal = _literal(host)
        if literal is not None:
            self.check(literal, host=host)
            return [literal]
        try:
            found = [ipaddress.ip_address(a) for a in self.resolver(host, port)]
        except (OSError, UnicodeError, ValueError) as error:
            raise AddressLookupError(f"cannot resolve {host}: {error}") from None
        if not found:
            raise AddressLookupError(f"cannot resolve {host}: no address")
        for address in found:
            self.check(address, host=host)
        return found


class AddressLookupError(TransferError):
    """The host name of an artifact URL does not resolve (retried: DNS may come back)."""


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
