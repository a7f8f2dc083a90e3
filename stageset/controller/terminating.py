"""Which namespaces are terminating: a Namespace whose ``deletionTimestamp`` is set.

Identity: the controller's own, through the one metadata-only list and watch of Namespaces the
tenant watches run for a cluster-wide release (:mod:`stageset.controller.namespaces`; the same
Reflector as :mod:`stageset.controller.tenants`; the chart's ClusterRole grants
``get``/``list``/``watch`` on namespaces).  Only metadata travels,
and only the names of terminating namespaces are kept.  A Namespace's ``status.phase`` is not in
its metadata; ``Terminating`` is exactly "``deletionTimestamp`` set", so the timestamp is the fact.

Used by the teardown (:mod:`stageset.controller.stageset.teardown`), which tells the one prune
decision (:func:`~stageset.controller.stageset.pruning.permission`) whether the StageSet's own
namespace is terminating: offboarding, where that namespace's deletion takes its objects.

Invariants: a namespace counts as terminating only once the apiserver says it is — nothing a
tenant writes into a namespace sets it, only deleting the Namespace does — and a namespace this
process has not seen (no watch: a release bound to some namespaces; not listed yet) is not
terminating, so the teardown behaves as before.  Thread-safe.
"""

from __future__ import annotations

import threading

from stageset.kube.types import KubeObject


class TerminatingNamespaces:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._terminating: set[str] = set()

    def handle(self, event: str, obj: KubeObject) -> None:
        """A Reflector handler for Namespaces (metadata only)."""
        metadata = obj.get("metadata") or {}
        namespace = str(metadata.get("name") or "")
        terminating = event != "DELETED" and bool(metadata.get("deletionTimestamp"))
        with self._lock:
            if terminating:
                self._terminating.add(namespace)
            else:
                self._terminating.discard(namespace)

    def __call__(self, namespace: str) -> bool:
        """Whether ``namespace`` is terminating, as last seen."""
        with self._lock:
            return namespace in self._terminating
