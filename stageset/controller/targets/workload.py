"""Workload identity: ``spec.kubeConfig.configMapRef`` — a remote cluster reached with tokens this
cluster issues for the tenant's own ServiceAccounts, and no stored credential.

The ConfigMap (Flux's format, :mod:`stageset.kube.federation`) names the cluster (``address``,
``ca.crt``), the provider (``generic`` only) and optionally the tokens' ``audiences`` (default: the
address) and ``serviceAccountName``.  The remote trusts this cluster's ServiceAccount issuer (its
structured authentication configuration: docs/workload-identity.md), so a token this cluster issues
for ``<namespace>/<account>`` with the remote's audience authenticates there as that account's
(prefixed) identity — and the remote's RBAC binds that identity.  Every request to the remote
carries the token of the identity it is made for, and **no impersonation header**: the remote needs
neither a kubeconfig Secret nor an ``impersonate`` grant.

Whose token, for a StageSet (:class:`WorkloadIdentity`):

- each request as the identity it would otherwise impersonate: a stage's ServiceAccount, the
  StageSet's, the one an inventory recorded — a token for that account, always of the StageSet's
  own namespace (any other is refused: :class:`Refused`);
- a request as the controller itself (discovery; a StageSet without ``serviceAccountName`` in
  cluster-admin mode): the ConfigMap's ``serviceAccountName``, else the StageSet's own;
- multi-tenant mode (``lockdown``): a ConfigMap whose ``serviceAccountName`` is not the StageSet's
  own ``serviceAccountName`` is refused, as Flux's lockdown refuses it — a tenant cannot borrow
  another account's identity through a ConfigMap;
- an audience that is this cluster's own (its ServiceAccount issuer, the in-cluster API names:
  :class:`LocalAudiences`) is refused: a token minted for it would be a credential for this
  cluster, sent to a server the tenant named.

Every refusal of the ConfigMap (missing, unreadable, a bad key, a provider not supported, another
account) is a :class:`~stageset.apply.errors.StageError` naming the field and key, raised before any
TokenRequest; nothing is written on any cluster.

Identity: the ConfigMap is read as the StageSet's identity (the client handed in); the
TokenRequests are the controller's own (:class:`~stageset.kube.tokens.TokenRequester`: ``create
serviceaccounts/token``, granted where the platform enabled workload identity); the issuer
discovery (:class:`LocalAudiences`) is the controller's own too.  Requests to the remote are made
as the federated identity of each request's ServiceAccount.

Invariants: no token in a key, a message, a log line, an event, status or a metric; keys name the
ConfigMap, the account and a digest of the checked ConfigMap only.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable

from stageset.api.stageset import KubeConfigRef
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.accounts import AccountCheck, read_named, service_account_of
from stageset.controller.targets.credentials import Credentials, Federation
from stageset.kube.client import (
    ApiError,
    Bearer,
    BearerFor,
    ClusterKey,
    CredentialUnavailable,
    Identity,
    KubeClient,
    UnreachableError,
)
from stageset.kube.federation import WorkloadConfig, WorkloadConfigError, parse_workload_config
from stageset.kube.tokens import Account, TokenRequester, TokenUnavailable

log = logging.getLogger(__name__)

IN_CLUSTER_AUDIENCES = frozenset({
    "https://kubernetes.default.svc", "https://kubernetes.default.svc.cluster.local",
    "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "https://kubernetes.default",
    "kubernetes.default", "kubernetes", "https://kubernetes"})
"""The names a cluster's own API audience commonly has (``--api-audiences``; EKS, kubeadm, ...)."""
DISCOVERY_RETRY = 300.0
"""Seconds between attempts to read this cluster's issuer after one failed."""


class LocalAudiences:
    """This cluster's own API audiences, as far as can be known: the well-known in-cluster names and
    the ServiceAccount issuer (``/.well-known/openid-configuration``, read once as the controller;
    the apiserver's default ``--api-audiences``).  A token with one of them would be valid here."""

    def __init__(self, *, client: KubeClient | None, clock: Callable[[], float] = time.monotonic):
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._issuer: str | None = None
        self._tried_at: float | None = None

    def issuer(self) -> str | None:
        """The issuer, read once.  The read holds the lock on purpose: a pass that checks audiences
        while the first read is in flight waits for its answer rather than skip the check."""
        with self._lock:
            if self._issuer is not None or self._client is None:
                return self._issuer
            if self._tried_at is not None and self._clock() - self._tried_at < DISCOVERY_RETRY:
                return None
            self._tried_at = self._clock()
            try:
                found = self._client.get("/.well-known/openid-configuration").get("issuer")
            except (ApiError, UnreachableError, ValueError) as error:
                log.info("this cluster's ServiceAccount issuer is not readable (%s); workload-identity "
                         "audiences are checked against the in-cluster names only",
                         error.status if isinstance(error, ApiError) else "unreachable")
                return None
            self._issuer = found if isinstance(found, str) and found else None
            return self._issuer

    def own(self, audiences: tuple[str, ...]) -> str | None:
        """The first of ``audiences`` that is this cluster's own, if any."""
        issuer = self.issuer()
        for audience in audiences:
            if audience in IN_CLUSTER_AUDIENCES or audience.rstrip("/") in IN_CLUSTER_AUDIENCES \
                    or (issuer is not None and audience.rstrip("/") == issuer.rstrip("/")):
                return audience
        return None


class AccountBearer:
    """One ServiceAccount's token for one cluster's audiences (a :class:`~stageset.kube.client.Bearer`),
    while ``allowed`` says the account may still act there (asked before every token is handed out:
    a namespace a StageTarget no longer allows gets none from its next request on)."""

    def __init__(self, *, tokens: TokenRequester, account: Account, audiences: tuple[str, ...], server: str,
                 allowed: Callable[[], str | None] = lambda: None):
        self._tokens = tokens
        self._account = account
        self._audiences = audiences
        self._server = server
        self._allowed = allowed

    def _check(self) -> None:
        refusal = self._allowed()
        if refusal is not None:
            raise CredentialUnavailable(server=self._server, why=refusal)

    def token(self) -> str:
        self._check()
        try:
            return self._tokens.token(self._account, self._audiences)
        except TokenUnavailable as error:
            raise CredentialUnavailable(server=self._server, why=f"no token: {error.message}") from None

    def renew(self, *, refused: str) -> str:
        self._check()
        log.info("the cluster at %s refused the token of ServiceAccount %s: requesting a new one",
                 self._server, self._account)
        try:
            return self._tokens.renew(self._account, self._audiences, refused=refused)
        except TokenUnavailable as error:
            raise CredentialUnavailable(server=self._server, why=f"no token: {error.message}") from None


class Refused:
    """An identity that may not be used on a workload-identity cluster: every request fails before it
    is sent (as an unreachable cluster does: nothing is pruned, the pass is retried)."""

    def __init__(self, *, server: str, why: str):
        self._server = server
        self._why = why

    def token(self) -> str:
        raise CredentialUnavailable(server=self._server, why=self._why)

    def renew(self, *, refused: str) -> str:  # noqa: ARG002 - refused whatever was sent
        raise CredentialUnavailable(server=self._server, why=self._why)


def bearers_for(*, tokens: TokenRequester, config: WorkloadConfig, own: Account,
                may_act: Callable[[str], bool], scope: str) -> BearerFor:
    """Each identity's token on ``config``'s cluster: the controller's own requests as ``own``; a
    ServiceAccount's as itself while ``may_act(its namespace)`` (asked before each token is handed
    out); anything else refused (``scope`` says which identities may be used, for the message)."""
    def bearer(identity: Identity) -> Bearer:
        if identity.user is None:
            return AccountBearer(tokens=tokens, account=own, audiences=config.audiences, server=config.server)
        found = service_account_of(identity)
        if found is None:
            return Refused(server=config.server, why=f"{identity.describe()} has no workload identity here "
                                                     f"({scope})")
        account = Account(*found)
        refusal = f"ServiceAccount {account} may not act there now ({scope})"
        return AccountBearer(tokens=tokens, account=account, audiences=config.audiences, server=config.server,
                             allowed=lambda: None if may_act(account.namespace) else refusal)
    return bearer


def digest(config: WorkloadConfig) -> str:
    """16 hex of what the checked ConfigMap says (equal content, one connection)."""
    parts = (config.provider, config.address, (config.ca or b"").decode(), "\n".join(config.audiences),
             config.service_account or "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def token_refusal(error: TokenUnavailable, *, field: str) -> StageError:
    """A failed TokenRequest as a StageSet (or StageTarget) reports it."""
    reason = Reason.RBAC_DENIED if error.missing or error.denied else Reason.CLUSTER_UNREACHABLE
    hint = ""
    if error.missing:
        hint = ": create it, or name an existing one"
    elif error.denied:
        hint = ": the platform grants it with the chart's targets.workloadIdentity"
    return StageError(reason, f"{field}: {error.message}{hint}")


class WorkloadIdentity:
    """``spec.kubeConfig.configMapRef`` of a StageSet (a :class:`~.credentials.CredentialSource`)."""

    def __init__(self, *, tokens: TokenRequester, lockdown: bool, audiences: LocalAudiences,
                 accounts: AccountCheck | None = None):
        self._tokens = tokens
        self._lockdown = lockdown
        self._audiences = audiences
        self._accounts = accounts

    def kept(self, *, namespace: str, ref: KubeConfigRef) -> str:
        assert ref.config_map_ref is not None
        return f"cm:{namespace}/{ref.config_map_ref.name}@"  # any of its accounts: the same namespace's

    def read(self, client: KubeClient, *, namespace: str, ref: KubeConfigRef) -> Credentials:
        assert ref.config_map_ref is not None
        name = ref.config_map_ref.name
        where = f"spec.kubeConfig.configMapRef: ConfigMap {namespace}/{name}"
        found = read_named(client, f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                           what=f"ConfigMap {namespace}/{name} (spec.kubeConfig.configMapRef)",
                           missing_reason=Reason.STAGE_FAILED, missing_message=f"{where} not found",
                           accounts=self._accounts)
        try:
            config = parse_workload_config(found.get("data"))
        except WorkloadConfigError as error:
            raise StageError(Reason.INVALID_SPEC, f"{where}: {error}") from error
        own = self._account(client, namespace=namespace, config=config, where=where)
        if (local := self._audiences.own(config.audiences)) is not None:
            raise StageError(Reason.INVALID_SPEC,
                             f"{where}: the audience {local!r} (key 'audiences', or 'address' when it is "
                             "not set) is this cluster's own API audience: a token for it would be a "
                             "credential for this cluster; name the remote's audience")
        try:
            self._tokens.token(own, config.audiences)  # before connecting: a missing account is said now
        except TokenUnavailable as error:
            raise token_refusal(error, field="spec.kubeConfig.configMapRef") from error
        bearers = bearers_for(tokens=self._tokens, config=config, own=own,
                              may_act=lambda ns: ns == namespace,
                              scope=f"only ServiceAccounts of namespace {namespace} may act there")
        version = str((found.get("metadata") or {}).get("resourceVersion", ""))
        return Credentials(cluster=ClusterKey(f"cm:{namespace}/{name}@{own.name}#{digest(config)}"),
                           version=version, federation=Federation(config=config, bearers=bearers))

    def _account(self, client: KubeClient, *, namespace: str, config: WorkloadConfig, where: str) -> Account:
        """Whose token the controller's own requests there carry (see the module docstring)."""
        acting = service_account_of(client.identity)
        own = acting[1] if acting is not None and acting[0] == namespace else None
        named = config.service_account
        if named is not None and self._lockdown and named != own:
            raise StageError(Reason.INVALID_SPEC,
                             f"{where}: key 'serviceAccountName' names ServiceAccount {named!r}, but this "
                             f"StageSet acts as {repr(own) if own else 'the controller'}: in multi-tenant "
                             "mode a StageSet requests tokens "
                             "only for its own spec.serviceAccountName; remove the key or make it that "
                             "account")
        account = named or own
        if account is None:
            raise StageError(Reason.INVALID_SPEC,
                             f"{where}: no ServiceAccount to request tokens for: set spec.serviceAccountName "
                             "(or the ConfigMap's key 'serviceAccountName')")
        return Account(namespace, account)
