"""A read as a tenant's ServiceAccount: a missing object, a denial explained.

Every read of an object a StageSet names is made as the tenant (:mod:`stageset.controller.identity`
picks the identity; the caller binds the client).  What such a read answers is said the same
everywhere — the render's reads (:mod:`stageset.controller.render.reads`), the kubeConfig Secret
(:mod:`stageset.controller.targets.credentials`), the decryption keys — so it lives here, below
all of them:

- :func:`read_optional` / :func:`read_named` — a 403 is ``RBACDenied`` naming only what the user
  wrote; a 404 is ``None`` (or the caller's reason), reported the same whether or not the tenant
  could have read the object, since the apiserver authorizes before it looks;
- :class:`AccountCheck` — after a denial, whether the ServiceAccount exists: read as the controller
  where its role allows (single-tenant mode), else as the ServiceAccount itself (its own object, in
  its own namespace); when neither may tell, the message asks the user to check both the account
  and its rights.

Identity: the client handed in (the tenant's); :class:`AccountCheck` as described above.
"""

from __future__ import annotations

from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from stageset.kube.types import KubeObject

_SA_PREFIX = "system:serviceaccount:"


def service_account_of(identity: Identity) -> tuple[str, str] | None:
    """``(namespace, name)`` of an impersonated ServiceAccount; ``None`` for the controller itself."""
    if not identity.user or not identity.user.startswith(_SA_PREFIX):
        return None
    namespace, _, name = identity.user.removeprefix(_SA_PREFIX).partition(":")
    return (namespace, name) if namespace and name else None


class AccountCheck:
    """After a denial: does the ServiceAccount exist?  Two reads at most, only on the failure path.

    Identity: the controller's own (``/api/v1/.../serviceaccounts/<name>``) only where its role
    allows it (``controller_reads_accounts``: single-tenant mode); otherwise the ServiceAccount
    itself, reading its own object.  A denied look-up says nothing either way.
    """

    def __init__(self, *, clients: ClientPool | None, controller_reads_accounts: bool):
        self._clients = clients
        self._controller = controller_reads_accounts

    def explain(self, denied: KubeClient) -> str:
        """A clause to append to a denial of ``denied``'s identity ("" when it adds nothing)."""
        account = service_account_of(denied.identity)
        if account is None:
            return ""
        namespace, name = account
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        asker = self._clients.client() if self._controller and self._clients is not None else denied
        try:
            asker.get(path)
        except ApiError as error:
            if error.not_found:
                return (f"; ServiceAccount {namespace}/{name} does not exist: create it, or name an "
                        "existing one in serviceAccountName")
            return (f"; check that ServiceAccount {namespace}/{name} exists and that a RoleBinding or "
                    "ClusterRoleBinding grants it these rights")
        return f"; ServiceAccount {namespace}/{name} exists but is not granted these rights"


def read_optional(client: KubeClient, path: str, *, what: str,
                  accounts: AccountCheck | None = None) -> KubeObject | None:
    """Read an object the StageSet names as ``client``'s identity; ``None`` if absent."""
    try:
        return client.get(path)
    except ApiError as error:
        if error.forbidden:
            why = accounts.explain(client) if accounts is not None else ""
            raise StageError(Reason.RBAC_DENIED,
                             f"{client.identity.describe()} may not read {what}{why}") from error
        if error.not_found:
            return None
        raise


def read_named(client: KubeClient, path: str, *, what: str, missing_reason: Reason,
               missing_message: str = "", accounts: AccountCheck | None = None) -> KubeObject:
    """As :func:`read_optional`, but a missing object is a :class:`StageError` with ``missing_reason``."""
    found = read_optional(client, path, what=what, accounts=accounts)
    if found is None:
        raise StageError(missing_reason, missing_message or f"{what} not found")
    return found
