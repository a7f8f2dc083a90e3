"""The platform's notification configuration: ``NotificationProvider``/``NotificationAlert`` objects
and the providers' Secrets, read from one namespace, and which providers an event goes to.

Identity: the controller's own, in the notification namespace (``--notification-namespace``; the
chart's Role there grants ``get``/``list`` of the two kinds and ``get`` of Secrets).  In a tenant's
namespace (``--tenant-notifications``, :mod:`~stageset.controller.notifications.tenants`) the two
kinds are listed as the controller, and a provider's Secret is read only as the provider's
``serviceAccountName`` (impersonated).  A provider's ``secretRef`` names a Secret beside it, and an
alert's ``providerRef`` a provider beside it.

Invariants: the configuration is read in the notifier's own thread, never in a reconcile; it is
cached for ``refresh`` seconds (a changed provider or alert takes effect within that time); an
object that does not parse is skipped and logged by name, never by content; a provider whose
Secret cannot be read sends nothing (counted as a failure when an event is due for it).  The
provider's credentials (``address``/``token`` keys) live in memory only, in :class:`Provider`.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from stageset.api.common import duration_seconds
from stageset.api.notification import (
    EventSource,
    NotificationAlert,
    NotificationAlertSpec,
    NotificationProvider,
    ProviderType,
    Severity,
)
from stageset.api.vocabulary import EventType
from stageset.kube.client import ApiError, KubeClient, UnreachableError

log = logging.getLogger(__name__)

GROUP_PATH = "/apis/stages.metio.wtf/v1/namespaces/{ns}"
MAX_OBJECTS = 256
"""Providers (and alerts) read at most; the rest are ignored (and logged)."""


@dataclass(frozen=True)
class Provider:
    """A provider ready to send: its spec with the Secret's ``address`` and ``token`` resolved.
    ``problem``: why it cannot send (its Secret is missing, no address ...)."""

    name: str
    type: ProviderType
    address: str = field(repr=False, default="")
    token: str = field(repr=False, default="")
    channel: str | None = None
    username: str | None = None
    timeout: float = 15.0
    suspended: bool = False
    problem: str = ""


@dataclass(frozen=True)
class Config:
    providers: Mapping[str, Provider] = field(default_factory=dict)
    alerts: tuple[tuple[str, NotificationAlertSpec], ...] = ()


@dataclass(frozen=True)
class Subject:
    """What an alert matches an event by."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    type: EventType
    reason: str


def _source_matches(source: EventSource, subject: Subject) -> bool:
    if source.namespace not in ("*", subject.namespace):
        return False
    if source.name not in ("*", subject.name):
        return False
    return all(subject.labels.get(k) == v for k, v in source.match_labels.items())


def matches(alert: NotificationAlertSpec, subject: Subject) -> bool:
    """Does the alert send this event? (Its suspension is the caller's concern.)"""
    if alert.event_severity is Severity.ERROR and subject.type is not EventType.WARNING:
        return False
    if alert.event_reasons and subject.reason not in alert.event_reasons:
        return False
    return any(_source_matches(source, subject) for source in alert.event_sources)


def routes(config: Config, subject: Subject) -> list[tuple[Provider, str]]:
    """``(provider, summary)`` per provider the event goes to, each provider once (the first
    matching alert's summary)."""
    found: dict[str, tuple[Provider, str]] = {}
    for _name, alert in config.alerts:
        if alert.suspend or not matches(alert, subject):
            continue
        provider = config.providers.get(alert.provider_ref.name)
        if provider is None or provider.suspended or provider.name in found:
            continue
        found[provider.name] = (provider, alert.summary or "")
    return list(found.values())


def _decoded(secret: Mapping[str, object], key: str) -> str:
    data = secret.get("data") or {}
    raw = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(raw, str):
        return ""
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8").strip()
    except (ValueError, UnicodeDecodeError):
        return ""


def _name(raw: Mapping[str, object]) -> str:
    meta = raw.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


class ConfigReader:
    """Reads (and caches) the configuration of one namespace; thread-safe."""

    def __init__(self, client: KubeClient, *, namespace: str, refresh: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 secrets_as: Callable[[str], KubeClient] | None = None):
        """``secrets_as``: a tenant's namespace (:mod:`~stageset.controller.notifications.tenants`):
        each provider's Secret is read with the client this gives for the provider's
        ``serviceAccountName`` (impersonating it), a provider without one reads none, and provider
        names are told as ``namespace/name``.  ``None``: the platform's namespace, read as the
        controller."""
        self._client = client
        self._secrets_as = secrets_as
        self._namespace = namespace
        self._refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, Config] | None = None

    def get(self) -> Config:
        now = self._clock()
        with self._lock:
            if self._cached is not None and now - self._cached[0] < self._refresh:
                return self._cached[1]
        config = self._read()
        with self._lock:
            self._cached = (now, config)
        return config

    def _list(self, plural: str) -> list[dict[str, object]]:
        path = f"{GROUP_PATH.format(ns=self._namespace)}/{plural}"
        try:
            items = self._client.request("GET", path, query={"limit": MAX_OBJECTS}).get("items") or []
        except (ApiError, UnreachableError) as error:
            log.warning("notifications: cannot list %s in %s: %s", plural, self._namespace, error)
            return []
        return [i for i in items if isinstance(i, dict)]

    def _read(self) -> Config:
        providers: dict[str, Provider] = {}
        for raw in self._list("notificationproviders"):
            name = _name(raw)
            try:
                spec = NotificationProvider.model_validate(raw).spec
            except ValidationError:
                log.warning("notifications: NotificationProvider %s/%s does not parse; ignored",
                            self._namespace, name)
                continue
            address, token, problem = spec.address or "", "", ""
            if spec.secret_ref is not None:
                secret = self._secret(spec.secret_ref.name, account=spec.service_account_name)
                if secret is None and self._secrets_as is not None and not spec.service_account_name:
                    problem = (f"its Secret {spec.secret_ref.name} is read as its serviceAccountName, and it "
                               "names none")
                elif secret is None:
                    problem = f"its Secret {spec.secret_ref.name} cannot be read"
                else:
                    address = _decoded(secret, "address") or address
                    token = _decoded(secret, "token")
            if not address and not problem:
                problem = "it has no address"
            told = name if self._secrets_as is None else f"{self._namespace}/{name}"
            providers[name] = Provider(name=told, type=spec.type, address=address, token=token,
                                       channel=spec.channel, username=spec.username,
                                       timeout=duration_seconds(spec.timeout), suspended=spec.suspend,
                                       problem=problem)
        alerts: list[tuple[str, NotificationAlertSpec]] = []
        for raw in self._list("notificationalerts"):
            name = _name(raw)
            try:
                alerts.append((name, NotificationAlert.model_validate(raw).spec))
            except ValidationError:
                log.warning("notifications: NotificationAlert %s/%s does not parse; ignored",
                            self._namespace, name)
        return Config(providers=providers, alerts=tuple(sorted(alerts, key=lambda a: a[0])))

    def _secret(self, name: str, *, account: str | None = None) -> dict[str, object] | None:
        client = self._client
        if self._secrets_as is not None:
            if not account:
                return None  # a tenant's Secret is read as its account, never as the controller
            client = self._secrets_as(account)
        try:
            return client.request("GET", f"/api/v1/namespaces/{self._namespace}/secrets/{name}")
        except (ApiError, UnreachableError) as error:
            log.warning("notifications: cannot read Secret %s/%s: %s", self._namespace, name,
                        getattr(error, "reason", type(error).__name__))
            return None
