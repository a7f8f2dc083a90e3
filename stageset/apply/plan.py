"""Order the objects of one stage into apply phases, as Flux's ssa package does.

Phase 1 holds cluster definitions other objects need (CRDs, Namespaces, cluster
RBAC); the engine waits for CRDs to be Established before phase 2.  ``*Class``
kinds come next, then everything else; admission webhooks last so they cannot
block the objects of their own stage.
"""

from __future__ import annotations

from stageset.kube.types import KubeObject

_DEFINITIONS = {"CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding"}
_WEBHOOKS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def phase_of(obj: KubeObject) -> int:
    kind = str(obj.get("kind", ""))
    if kind in _DEFINITIONS:
        return 0
    if kind.endswith("Class"):
        return 1
    if kind in _WEBHOOKS:
        return 3
    return 2


def phases(objects: list[KubeObject]) -> list[list[KubeObject]]:
    """Non-empty phases in apply order; file order is kept inside a phase."""
    grouped: list[list[KubeObject]] = [[], [], [], []]
    for obj in objects:
        grouped[phase_of(obj)].append(obj)
    return [group for group in grouped if group]

