"""Which access reviews a stage needs before its first write (``preflight: AccessReview``): pure.

A server-side apply is a ``PATCH`` (``?fieldManager=...``): the apiserver authorizes the request
as ``patch`` and, when the object does not exist and the apply creates it, authorizes ``create``
as well (the patch handler checks the create attributes before creating; a ServiceAccount with
``patch`` alone is refused — ``tests/e2e/test_preflight.py`` shows it on the real apiserver).
So an object that may be new needs both; one known to exist needs only ``patch``.

RBAC rules name verbs, API groups, resources and namespaces, and (rarely) object names.  A review
is asked per distinct ``(verb, group, resource, namespace)``, without a name, so a stage of five
ConfigMaps in one namespace needs two reviews, not ten.  A review without a name can be refused
where a rule with ``resourceNames`` would let the write through: the caller then dry-runs the
objects behind that refusal (the apiserver's own answer), so nothing a dry-run would allow is
refused here.

No I/O: the request part is :mod:`stageset.apply.access`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verb(StrEnum):
    """The verbs a server-side apply is authorized for."""

    PATCH = "patch"
    CREATE = "create"


@dataclass(frozen=True)
class Write:
    """One object the stage will apply: where, and whether it may not exist yet."""

    group: str
    resource: str
    """The resource's plural name (``configmaps``), as RBAC rules name it."""
    namespace: str
    """``""`` for a cluster-scoped object."""
    may_create: bool
    """The object may not exist (new to the stage's inventory): its apply may create it."""


@dataclass(frozen=True)
class Review:
    """One question for the apiserver: may the identity ``verb`` ``resource`` in ``namespace``?"""

    verb: Verb
    group: str
    resource: str
    namespace: str

    def attributes(self) -> dict[str, str]:
        """The SelfSubjectAccessReview's ``spec.resourceAttributes`` (no name: any object there)."""
        found = {"verb": str(self.verb), "group": self.group, "resource": self.resource}
        if self.namespace:
            found["namespace"] = self.namespace
        return found


def needed(writes: list[Write]) -> dict[Review, list[int]]:
    """The reviews ``writes`` need, each once, in the order first needed, with the indices of the
    writes that need it (``patch`` for every write, ``create`` as well for one that may create)."""
    plan: dict[Review, list[int]] = {}
    for index, write in enumerate(writes):
        verbs = (Verb.PATCH, Verb.CREATE) if write.may_create else (Verb.PATCH,)
        for verb in verbs:
            plan.setdefault(Review(verb, write.group, write.resource, write.namespace), []).append(index)
    return plan
