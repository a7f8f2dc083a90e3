"""The access-review preflight (``preflight: AccessReview``): rights asked of RBAC, not dry-runs.

With the default preflight (``DryRun``) every object a stage writes is server-side dry-run first, so
a denial, a schema error or an admission refusal fails the stage before anything is written.  A
stage that opts into ``AccessReview`` asks only what RBAC would say: one SelfSubjectAccessReview
per distinct ``(verb, group, resource, namespace)`` its new objects need
(:func:`stageset.apply.reviews.needed`), then writes them (:mod:`stageset.apply.write`).

Identity: every review is created through the ``client`` handed in, which the controller binds to
the stage's identity — the stage's ServiceAccount, impersonated, the very identity its writes use
(or the controller itself in single-tenant mode).  A *self* subject access review answers for
whoever makes the request, so the answer is about that identity and no other; asking needs no
right beyond what every authenticated user has (``system:basic-user``).

Invariants:
- Asked before the stage's first write; nothing here writes (a review is not stored).
- Each distinct question once per call: five ConfigMaps new to one namespace cost two reviews
  (``patch`` and ``create``), not five dry-runs.
- A refused review fails nothing by itself: the objects behind it are returned to the dry-run
  path, whose answer is the apiserver's own — a denial there fails the stage before any write,
  with the dry-run's message (the object, the verb, the namespace; never another tenant's names),
  and a right granted only by ``resourceNames`` (which a review without a name cannot see) passes.
  A review that cannot be asked at all is treated the same way.
- Reviews carry only the stage's own verbs, kinds and namespaces; their answers are not logged.
"""

from __future__ import annotations

from collections.abc import Mapping

from stageset.api import InventoryEntry
from stageset.apply.core import AppliedObject, ApplyCore, namespace_of
from stageset.apply.inventory import ObjectId
from stageset.apply.reviews import Review, Write, needed
from stageset.kube.client import ApiError, KubeClient

SELF_SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def reviewed(core: ApplyCore, *, client: KubeClient, items: list[AppliedObject],
             previous: Mapping[ObjectId, InventoryEntry]) -> list[AppliedObject]:
    """The ``items`` whose every review ``client``'s identity was allowed (in order); the others
    are the caller's to dry-run.  An item new to the inventory needs ``patch`` and ``create``, one
    in it ``patch`` (its apply may still create it if someone deleted it: the write then says so)."""
    writes = [Write(group=item.resource.group, resource=item.resource.plural,
                    namespace=namespace_of(item) or "", may_create=item.id not in previous)
              for item in items]
    plan = needed(writes)
    answers: dict[Review, bool] = {}

    def ask(question: Review) -> None:
        answers[question] = allowed(client, question)

    core.each(list(plan), ask)
    refused = {index for question, indices in plan.items() if not answers[question] for index in indices}
    return [item for index, item in enumerate(items) if index not in refused]


def allowed(client: KubeClient, question: Review) -> bool:
    """One SelfSubjectAccessReview as ``client``'s identity; ``False`` when refused or not answered."""
    try:
        answer = client.request("POST", SELF_SUBJECT_ACCESS_REVIEWS, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": question.attributes()}})
    except ApiError:
        return False  # not asked: the dry-run asks instead
    status = answer.get("status") or {}
    return bool(status.get("allowed")) and not status.get("denied")
