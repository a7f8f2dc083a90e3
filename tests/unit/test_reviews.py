"""Which access reviews a stage needs (``preflight: AccessReview``): each question once, in order."""

from __future__ import annotations

import pytest

from stageset.apply.reviews import Review, Verb, Write, needed

CM_A_NEW = Write(group="", resource="configmaps", namespace="a", may_create=True)
CM_A_OLD = Write(group="", resource="configmaps", namespace="a", may_create=False)
CM_B_NEW = Write(group="", resource="configmaps", namespace="b", may_create=True)
DEPLOY_A_NEW = Write(group="apps", resource="deployments", namespace="a", may_create=True)
ROLE_CLUSTER_NEW = Write(group="rbac.authorization.k8s.io", resource="clusterroles", namespace="",
                         may_create=True)


def review(verb: Verb, write: Write) -> Review:
    return Review(verb, write.group, write.resource, write.namespace)


@pytest.mark.parametrize(("writes", "expected"), [
    pytest.param([], {}, id="nothing to write, nothing to ask"),
    # Five new ConfigMaps in one namespace: two questions, not ten (nor five dry-runs).
    pytest.param([CM_A_NEW] * 5, {review(Verb.PATCH, CM_A_NEW): [0, 1, 2, 3, 4],
                                  review(Verb.CREATE, CM_A_NEW): [0, 1, 2, 3, 4]}, id="deduplicated"),
    # One known to exist needs only patch; the new one beside it needs create as well.
    pytest.param([CM_A_OLD, CM_A_NEW], {review(Verb.PATCH, CM_A_OLD): [0, 1],
                                        review(Verb.CREATE, CM_A_NEW): [1]}, id="create only where new"),
    pytest.param([CM_A_OLD], {review(Verb.PATCH, CM_A_OLD): [0]}, id="existing: patch alone"),
    # Namespaces and groups are separate questions: rights in one say nothing of another.
    pytest.param([CM_A_NEW, CM_B_NEW, DEPLOY_A_NEW], {
        review(Verb.PATCH, CM_A_NEW): [0], review(Verb.CREATE, CM_A_NEW): [0],
        review(Verb.PATCH, CM_B_NEW): [1], review(Verb.CREATE, CM_B_NEW): [1],
        review(Verb.PATCH, DEPLOY_A_NEW): [2], review(Verb.CREATE, DEPLOY_A_NEW): [2],
    }, id="per namespace and group"),
    pytest.param([ROLE_CLUSTER_NEW], {review(Verb.PATCH, ROLE_CLUSTER_NEW): [0],
                                      review(Verb.CREATE, ROLE_CLUSTER_NEW): [0]}, id="cluster-scoped"),
])
def test_each_question_is_asked_once_with_the_writes_that_need_it(
        writes: list[Write], expected: dict[Review, list[int]]) -> None:
    plan = needed(writes)
    assert plan == expected
    assert list(plan) == list(expected), "questions come in the order first needed"


@pytest.mark.parametrize(("question", "attributes"), [
    (Review(Verb.CREATE, "", "configmaps", "a"),
     {"verb": "create", "group": "", "resource": "configmaps", "namespace": "a"}),
    (Review(Verb.PATCH, "rbac.authorization.k8s.io", "clusterroles", ""),
     {"verb": "patch", "group": "rbac.authorization.k8s.io", "resource": "clusterroles"}),
])
def test_a_review_asks_about_any_object_of_its_kind_and_namespace(
        question: Review, attributes: dict[str, str]) -> None:
    assert question.attributes() == attributes
