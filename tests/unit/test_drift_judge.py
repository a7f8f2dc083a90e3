"""Is a watch event drift?  The rule, case by case (``stageset/controller/drift/judge.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from stageset.apply.ownership import FIELD_MANAGER
from stageset.controller.drift.judge import Verdict, fingerprint, judge, owned_fields

OURS = {"f:data": {"f:k": {}, "f:j": {}}, "f:metadata": {"f:labels": {"f:stages.metio.wtf/name": {}}}}


def obj(
    *,
    uid: str = "u1",
    rv: str = "10",
    ours: dict[str, Any] | None = None,
    others: list[dict[str, Any]] = (),
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    fields = [
        {
            "manager": FIELD_MANAGER,
            "operation": "Apply",
            "apiVersion": "v1",
            "time": "t0",
            "fieldsType": "FieldsV1",
            "fieldsV1": OURS if ours is None else ours,
        },
        *others,
    ]
    return {
        "metadata": {
            "name": "a",
            "namespace": "shop",
            "uid": uid,
            "resourceVersion": rv,
            "managedFields": fields,
        },
        **({"status": status} if status else {}),
    }


KNOWN = fingerprint(obj())
EDIT = {
    "manager": "kubectl-edit",
    "operation": "Update",
    "apiVersion": "v1",
    "time": "t1",
    "fieldsType": "FieldsV1",
    "fieldsV1": {"f:data": {"f:k": {}}},
}
STATUS = {
    "manager": "kube-controller-manager",
    "operation": "Update",
    "apiVersion": "apps/v1",
    "subresource": "status",
    "time": "t1",
    "fieldsType": "FieldsV1",
    "fieldsV1": {"f:status": {}},
}


@pytest.mark.parametrize(
    ("event", "seen", "verdict"),
    [
        # Our own write, as the pass left it: nothing.
        ("MODIFIED", obj(), Verdict.OURS),
        # An event the pass outran (older than what it left): nothing.
        ("MODIFIED", obj(rv="9", ours={}), Verdict.OURS),
        # Status written by a controller (its own manager, the status subresource): nothing.
        ("MODIFIED", obj(rv="11", others=[STATUS], status={"replicas": 3}), Verdict.UNMANAGED),
        # Another manager's annotation, a defaulted field: our set is as we left it.
        (
            "MODIFIED",
            obj(
                rv="12",
                others=[
                    {
                        "manager": "other",
                        "operation": "Update",
                        "fieldsV1": {"f:metadata": {"f:annotations": {"f:x": {}}}},
                    }
                ],
            ),
            Verdict.UNMANAGED,
        ),
        # Our time stamp moving alone is no change of what we own.
        (
            "MODIFIED",
            {
                **obj(rv="12"),
                "metadata": {
                    **obj(rv="12")["metadata"],
                    "managedFields": [{**obj()["metadata"]["managedFields"][0], "time": "t9"}],
                },
            },
            Verdict.UNMANAGED,
        ),
        # kubectl edit of a field we manage: it moved to the editor's set.
        (
            "MODIFIED",
            obj(rv="13", ours={"f:data": {"f:j": {}}, "f:metadata": OURS["f:metadata"]}, others=[EDIT]),
            Verdict.DRIFT,
        ),
        # Deleted, or unlabelled (a label-selected watch says DELETED): drift.
        ("DELETED", obj(rv="14"), Verdict.DRIFT),
        # ... unless it is about an earlier incarnation (another uid).
        ("DELETED", obj(uid="u0", rv="8"), Verdict.STALE),
        # Re-created by someone else (another uid, newer): drift; an older incarnation's event: stale.
        ("ADDED", obj(uid="u2", rv="15"), Verdict.DRIFT),
        ("MODIFIED", obj(uid="u0", rv="5"), Verdict.STALE),
    ],
)
def test_an_event_is_drift_only_when_someone_else_changed_what_we_manage(
    event: str, seen: dict[str, Any], verdict: Verdict
) -> None:
    assert judge(event, seen, KNOWN) is verdict


def test_an_object_known_without_a_fingerprint_takes_any_event_as_drift() -> None:
    assert judge("MODIFIED", obj(), None) is Verdict.DRIFT
    assert fingerprint(None) is None


def test_only_our_applied_sets_count() -> None:
    """Our manager's Update (a label patch on release) or a status subresource is not what we applied."""
    mine = obj()
    ours_update = {"manager": FIELD_MANAGER, "operation": "Update", "fieldsV1": {"f:metadata": {}}}
    ours_status = {"manager": FIELD_MANAGER, "operation": "Apply", "subresource": "status", "fieldsV1": {}}
    more = obj(others=[ours_update, ours_status])
    assert owned_fields(mine) == owned_fields(more)
    assert owned_fields(mine) != owned_fields(obj(ours={}))
    assert len(owned_fields(mine)) == 8
