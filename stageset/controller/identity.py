"""Who acts for whom: the one identity policy of every read and write made for a tenant.

- A stage acts as ``stage.serviceAccountName``, else ``spec.serviceAccountName``.
- A StageSet's own reads (``spec.dependsOn``, ``spec.kubeConfig``) act as
  ``spec.serviceAccountName``.
- An inventory is deleted (prune, teardown) as the ServiceAccount it was applied as,
  which the inventory records.
- A GitRepository's ``secretRef`` is read as its ``serviceAccountName``.

With no ServiceAccount named:

- with ``--default-service-account NAME``, the object acts as ``NAME`` of its own namespace
  (a StageSet, each of its stages, a GitRepository alike), in either mode; the inventory then
  records ``NAME``, so prune and teardown use it too.  If that account lacks the rights (or does
  not exist), the write is denied and the stage fails ``RBACDenied`` naming it;
- otherwise only single-tenant (cluster-admin) mode acts as the controller itself; multi-tenant
  mode fails closed with ``RBACDenied`` and never makes the request.

An inventory that recorded no account was applied as the controller, and only cluster-admin mode
may delete it (the default account never stands in for the controller's past writes).  Every
rule lives here; nothing else builds an :class:`Identity` for a tenant.
"""

from __future__ import annotations

from stageset.api import GitRepository, Stage, StageInventory, StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.kube.client import Identity

_REQUIRED = ("spec.serviceAccountName is required: the controller runs in multi-tenant mode and never "
             "acts as itself for a tenant")


class IdentityPolicy:
    def __init__(self, *, cluster_admin: bool, default_service_account: str | None = None):
        self._cluster_admin = cluster_admin
        self._default = default_service_account or None

    def _account(self, account: str | None, namespace: str) -> Identity | None:
        if account:
            return Identity.service_account(namespace=namespace, name=account)
        return Identity() if self._cluster_admin else None

    def _named(self, account: str | None) -> str | None:
        """The account an object acts as: its own, else the default (``None``: neither)."""
        return account or self._default

    def _required(self, account: str | None, namespace: str, *, what: str) -> Identity:
        identity = self._account(account, namespace)
        if identity is None:
            raise StageError(Reason.RBAC_DENIED, f"{what}: {_REQUIRED}")
        return identity

    def stage_account(self, stageset: StageSet, stage: Stage) -> str | None:
        """The ServiceAccount a stage applies as (recorded in its inventory); ``None``: the controller."""
        return self._named(stage.service_account_name or stageset.spec.service_account_name)

    def for_stage(self, stageset: StageSet, stage: Stage) -> Identity:
        namespace = str(stageset.metadata["namespace"])
        return self._required(self.stage_account(stageset, stage), namespace, what=f"stage {stage.name!r}")

    def for_stageset(self, stageset: StageSet, *, what: str) -> Identity:
        namespace = str(stageset.metadata["namespace"])
        return self._required(self._named(stageset.spec.service_account_name), namespace, what=what)

    def for_inventory(self, account: str | None, namespace: str) -> Identity | None:
        """``None``: the objects were applied as the controller, which this mode forbids."""
        return self._account(account, namespace)

    def for_inventory_of(self, inventory: StageInventory, namespace: str) -> Identity | None:
        return self.for_inventory(inventory.service_account_name, namespace)

    def for_gitrepository(self, repo: GitRepository) -> Identity:
        namespace = str(repo.metadata["namespace"])
        secret = repo.spec.secret_ref.name if repo.spec.secret_ref else ""
        return self._required(self._named(repo.spec.service_account_name), namespace,
                              what=f"reading secretRef {secret}")
