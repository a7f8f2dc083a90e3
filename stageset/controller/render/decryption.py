"""A StageSet's ``spec.decryption`` for one pass: the key Secret, read as the tenant, once, when needed.

How the render service (:mod:`stageset.controller.render.service`) reads keys, in the
controller and in ``stageset build``/``diff`` alike: the CLI builds the same
:class:`PassDecryption` over its session (which first checks that the user may impersonate the
ServiceAccount), so both read the same Secret as the same identity and fail with the same
message.  Only a CLI given a local age key file (``--sops-age-key-file``) reads no Secret.

Identity: the key Secret (``spec.decryption.secretRef``, always in the StageSet's own
namespace: the API has no way to name another) is read as the **StageSet's**
``serviceAccountName`` (:meth:`~stageset.controller.identity.IdentityPolicy.for_stageset`; the
controller itself only in cluster-admin mode), as the reference does — never as a stage's
override, so a stage cannot widen whose keys decrypt it.  A 403 is ``RBACDenied`` (with the
ServiceAccount check of :class:`~stageset.controller.accounts.AccountCheck`), a missing
Secret ``StageFailed``.

The Secret is read lazily: only when a stage's build reads a SOPS file, or a decrypted render
is about to be served from the cache (so a revoked read fails the stage and a rotated key is
used on the next pass).  It is read at most once per pass (:class:`PassDecryption` is built
per pass and shared by its stages).  Decrypted values go to the StageSet's redactor
(:meth:`PassDecryption.reveal`) before any build or apply can echo them.
"""

from __future__ import annotations

import threading

from stageset.api import StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.build import BuildError
from stageset.build.decrypt import DecryptionKeys
from stageset.controller.accounts import AccountCheck, read_named
from stageset.controller.identity import IdentityPolicy
from stageset.controller.redact import Redactor
from stageset.controller.render.reads import Clients


class PassDecryption:
    """One StageSet's ``spec.decryption`` during one pass (implements
    :class:`~stageset.controller.render.cache.StageDecryption`)."""

    def __init__(self, *, stageset: StageSet, policy: IdentityPolicy, clients: Clients,
                 accounts: AccountCheck, redactor: Redactor):
        assert stageset.spec.decryption is not None
        assert stageset.spec.decryption.secret_ref is not None
        self._stageset = stageset
        self._policy = policy
        self._clients = clients
        self._accounts = accounts
        self._redactor = redactor
        self._namespace = str(stageset.metadata["namespace"])
        self._secret = stageset.spec.decryption.secret_ref.name
        self._lock = threading.Lock()
        self._keys: DecryptionKeys | None = None

    @property
    def scope(self) -> str:
        return f"{self._namespace}/{self._stageset.metadata['name']}"

    def keys(self) -> DecryptionKeys:
        with self._lock:
            if self._keys is None:
                self._keys = self._read()
            return self._keys

    def _read(self) -> DecryptionKeys:
        what = f"Secret {self._namespace}/{self._secret} (spec.decryption.secretRef)"
        identity = self._policy.for_stageset(self._stageset, what=f"reading {what}")
        client = self._clients.client(identity)
        name = f"{self._namespace}/{self._secret}"
        secret = read_named(client, f"/api/v1/namespaces/{self._namespace}/secrets/{self._secret}", what=what,
                            missing_reason=Reason.STAGE_FAILED,
                            missing_message=f"spec.decryption: Secret {name} not found",
                            accounts=self._accounts)
        try:
            return DecryptionKeys.from_secret_data(name, secret.get("data") or {})
        except BuildError as error:
            raise StageError(Reason.STAGE_FAILED, f"spec.decryption: {error}") from error

    def reveal(self, values: frozenset[str]) -> None:
        self._redactor.add(values)


def for_pass(stageset: StageSet, *, policy: IdentityPolicy, clients: Clients, accounts: AccountCheck,
             redactor: Redactor) -> PassDecryption | None:
    """The pass's decryption, or ``None`` when the StageSet has no ``spec.decryption``."""
    decryption = stageset.spec.decryption
    if decryption is None or decryption.secret_ref is None:
        return None
    return PassDecryption(stageset=stageset, policy=policy, clients=clients, accounts=accounts,
                          redactor=redactor)
