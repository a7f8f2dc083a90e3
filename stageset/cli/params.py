"""click parameter types: a bad flag value is a usage error (exit 2) naming the flag, never a traceback."""

from __future__ import annotations

import re
from typing import Any

import click

from stageset.api import duration_seconds
from stageset.api.common import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN
from stageset.controller.sharding import LabelSelector, SelectorError, parse_shard_keys
from stageset.kube.quantity import parse_quantity


def parse_size(value: str) -> int:
    """A Kubernetes quantity as whole bytes: ``2Gi``, ``500M``, ``1048576``.

    ``500m`` is 0.5 (milli), not 500 megabytes: a fraction of a byte is refused.
    """
    try:
        quantity = parse_quantity(value.strip())
    except ValueError as error:
        raise click.BadParameter(f"not a size: {value!r} (use e.g. 2Gi, 500Mi, 1000000)") from error
    if quantity < 0 or quantity != quantity.to_integral_value():
        raise click.BadParameter(f"not a whole number of bytes: {value!r} (m means milli; use M or Mi)")
    return int(quantity)


def parse_duration_option(value: str) -> float:
    """A duration flag (``30s``, ``5m``, ``1h30m``) in seconds."""
    try:
        return duration_seconds(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error


class SizeType(click.ParamType[int | None]):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if isinstance(value, int) or value is None:
            return value
        if value == "":
            return None
        try:
            return parse_size(str(value))
        except click.BadParameter as error:
            self.fail(error.message, param, ctx)


class DurationType(click.ParamType[float]):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration_option(str(value))
        except click.BadParameter as error:
            self.fail(error.message, param, ctx)


class NamespaceListType(click.ParamType[tuple[str, ...] | None]):
    """``a,b,c``: namespace names (RFC 1123 labels); empty means "all"."""

    name = "namespaces"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> tuple[str, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        names = tuple(n.strip() for n in str(value).split(",") if n.strip())
        bad = [n for n in names if len(n) > 63 or re.fullmatch(DNS_LABEL_PATTERN, n) is None]
        if bad:
            self.fail(f"not namespace names: {', '.join(repr(b) for b in bad)}", param, ctx)
        return names or None


class NamespaceType(click.ParamType[str | None]):
    """One namespace name (an RFC 1123 label); empty: none."""

    name = "namespace"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | None:
        text = str(value or "").strip()
        if not text:
            return None
        if len(text) > 63 or re.fullmatch(DNS_LABEL_PATTERN, text) is None:
            self.fail(f"not a namespace name: {text!r}", param, ctx)
        return text


class AccountNameType(click.ParamType[str | None]):
    """A ServiceAccount name (an RFC 1123 subdomain); empty: none."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | None:
        text = str(value or "").strip()
        if not text:
            return None
        if len(text) > 253 or re.fullmatch(DNS_SUBDOMAIN_PATTERN, text) is None:
            self.fail(f"not a ServiceAccount name: {text!r}", param, ctx)
        return text


class BaseUrlType(click.ParamType[str]):
    """An ``http(s)://`` URL, or empty (no links)."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if text and re.fullmatch(r"https?://[^\s/]+(/\S*)?", text) is None:
            self.fail(f"not an http(s) URL: {text!r}", param, ctx)
        return text


class HostListType(click.ParamType[tuple[str, ...]]):
    """``a.example.com,*.internal,10.0.0.7``: host names or IP literals, shell wildcards allowed; no
    scheme, port or path (``--allowed-action-hosts``)."""

    name = "hosts"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        hosts = tuple(h.strip().lower() for h in str(value or "").split(",") if h.strip())
        bad = [h for h in hosts if re.fullmatch(r"\[?[a-z0-9*?.:\-]+\]?", h) is None or len(h) > 253
               or h.count(":") == 1]  # one colon: a port (an IPv6 literal has more)
        if bad:
            self.fail(f"not host names (give hosts only, no scheme, port or path): "
                      f"{', '.join(repr(b) for b in bad)}", param, ctx)
        return hosts


class LabelSelectorType(click.ParamType[LabelSelector | None]):
    """A label selector in Kubernetes' syntax (``sharding.fluxcd.io/key=shard1``); empty: none."""

    name = "selector"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> LabelSelector | None:
        if value is None or isinstance(value, LabelSelector):
            return value
        if not str(value).strip():
            return None
        try:
            return LabelSelector.parse(str(value))
        except SelectorError as error:
            self.fail(str(error), param, ctx)


class ShardKeysType(click.ParamType[tuple[str, ...] | None]):
    """``shard1,shard2``: values of ``sharding.fluxcd.io/key``; empty means "not told"."""

    name = "keys"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> tuple[str, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        try:
            return parse_shard_keys(str(value)) or None
        except SelectorError as error:
            self.fail(str(error), param, ctx)


SIZE = SizeType()
DURATION = DurationType()
NAMESPACES = NamespaceListType()
NAMESPACE_OR_EMPTY = NamespaceType()
SERVICE_ACCOUNT_NAME = AccountNameType()
BASE_URL = BaseUrlType()
HOSTS = HostListType()
LABEL_SELECTOR = LabelSelectorType()
SHARD_KEYS = ShardKeysType()
