"""The apply engine's façade: :class:`StageApplier`, the shared core with one method per verb.

The engine is split by verb, as Flux's ``ssa`` package splits its ResourceManager; this class
only names the verbs for its callers (the controller, the CLI, prune, teardown, rebuild):

=================  ==========================================================================
``apply``          :mod:`stageset.apply.write` — warm check, dry-run (or access reviews), pilot,
                   writes, CRD waits
``preview``        :mod:`stageset.apply.preview` — the dry-run alone (``stageset diff``)
``wait_ready``     :mod:`stageset.apply.wait` — readiness, over :mod:`stageset.apply.watching`
``bind``           the stage's objects bound to paths, untouched (:mod:`stageset.apply.core`)
``resolve``,       discovery and binding, inherited from :class:`~stageset.apply.core.ApplyCore`
``reference``
=================  ==========================================================================

(the warm check is :mod:`stageset.apply.warm`, deletion for recreation :mod:`stageset.apply.delete`).

Identity: every verb's requests go through the ``client`` it is handed, which the controller binds
to the stage's identity (the tenant's ServiceAccount, or the controller itself in single-tenant
mode); discovery is the only read made with the controller's identity (or, on a remote cluster,
the kubeconfig's).  The invariants of each verb are stated in its module.

Invariants: one instance is shared by all workers of a cluster: it holds settings, discovery and
the two bounded warm-pass maps (``versions``, ``rights``), never a stage's state.  Each method
adds nothing to its verb — no request, no per-object work — so the façade costs what the verbs do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence

from stageset.api import InventoryEntry
from stageset.api.stageset import Preflight
from stageset.apply import preview as _preview
from stageset.apply import wait as _wait
from stageset.apply import write as _write
from stageset.apply.claims import Claims
from stageset.apply.conflicts import ConflictResolver
from stageset.apply.core import AppliedObject, ApplyCore, StageResult
from stageset.apply.inventory import ObjectId
from stageset.apply.ownership import StageOwner, label_object
from stageset.apply.preview import Preview
from stageset.apply.readiness import Readiness
from stageset.apply.wait import HealthJudge
from stageset.apply.watching import WatchSource
from stageset.kube.client import KubeClient
from stageset.kube.types import KubeObject

__all__ = ["AppliedObject", "HealthJudge", "Preview", "StageApplier", "StageResult", "WatchSource"]


class StageApplier(ApplyCore):
    """Applies stages; one instance is shared by all workers (it holds only settings)."""

    def bind(self, *, owner: StageOwner, objects: list[KubeObject], default_namespace: str
             ) -> StageResult | None:
        """The stage's objects bound to their paths without touching them (for re-checking
        readiness of a stage applied earlier); ``None`` if a kind is not served."""
        bound = [self.bind_object(label_object(obj, owner), default_namespace) for obj in objects]
        if any(item is None for item in bound):
            return None
        return StageResult(objects=[item for item in bound if item is not None])

    def apply(self, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
              default_namespace: str, claims: Claims, force: bool = False,
              conflicts: ConflictResolver | None = None,
              previous: Mapping[ObjectId, InventoryEntry] | None = None,
              recheck_rights: bool = True, preflight: Preflight = Preflight.DRY_RUN,
              warn_drift: bool = False) -> StageResult:
        """Apply ``objects`` as ``client``'s identity (:func:`stageset.apply.write.apply`)."""
        return _write.apply(self, client=client, owner=owner, objects=objects,
                            default_namespace=default_namespace, claims=claims, force=force,
                            conflicts=conflicts, previous=previous, recheck_rights=recheck_rights,
                            preflight=preflight, warn_drift=warn_drift)

    def preview(self, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
                default_namespace: str, conflicts: ConflictResolver | None = None) -> Preview:
        """What :meth:`apply` would change, writing nothing (:func:`stageset.apply.preview.preview`)."""
        return _preview.preview(self, client=client, owner=owner, objects=objects,
                                default_namespace=default_namespace, conflicts=conflicts)

    def wait_ready(self, *, client: KubeClient, applied: list[AppliedObject], timeout: float,
                   stop: threading.Event, progress: Callable[[Readiness], None] | None = None,
                   health: HealthJudge | None = None, references: Sequence[KubeObject] = (),
                   default_namespace: str = "", watches: WatchSource | None = None,
                   wake: tuple[Hashable, Callable[[], None]] | None = None) -> Readiness:
        """Wait until every object is Current, one Failed, or ``timeout`` passes
        (:func:`stageset.apply.wait.wait_ready`)."""
        return _wait.wait_ready(self, client=client, applied=applied, timeout=timeout, stop=stop,
                                progress=progress, health=health, references=references,
                                default_namespace=default_namespace, watches=watches, wake=wake)
