"""The field paths a Warn StageSet names for drift (``stageset/apply/differ.py``)."""

from __future__ import annotations

from typing import Any

from stageset.apply.differ import differing_paths


def deployment(
    *, replicas: int = 1, image: str = "web:1", rv: str = "1", extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "resourceVersion": rv,
            "generation": int(rv),
            "managedFields": [{"manager": rv}],
            "labels": {"app": "web"},
        },
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "containers": [{"name": "app", "image": image}, {"name": "sidecar", "image": "proxy:1"}]
                }
            },
            **(extra or {}),
        },
        "status": {"replicas": int(rv)},
    }


def test_named_list_entries_are_compared_by_name_and_bookkeeping_is_ignored() -> None:
    live = deployment(replicas=3, image="web:hotfix", rv="7")
    wanted = deployment(rv="8")
    assert differing_paths(live, wanted) == ["spec.replicas", "spec.template.spec.containers[app].image"]


def test_equal_objects_differ_nowhere_and_a_missing_side_names_nothing() -> None:
    assert differing_paths(deployment(rv="3"), deployment(rv="4")) == []
    assert differing_paths(None, deployment()) == []


def test_values_are_never_named_and_the_count_is_bounded() -> None:
    live = {"kind": "Secret", "metadata": {"name": "s"}, "data": {f"k{i}": "c2VjcmV0" for i in range(30)}}
    wanted = {"kind": "Secret", "metadata": {"name": "s"}, "data": {f"k{i}": "b3RoZXI=" for i in range(30)}}
    found = differing_paths(live, wanted, limit=16)
    assert len(found) == 16
    assert all(path.startswith("data.k") for path in found)
    assert not any("c2VjcmV0" in path or "b3RoZXI=" in path for path in found)


def test_against_a_manifest_only_its_own_paths_are_compared() -> None:
    """Without a dry-run (an immutable change), what the server added is no drift."""
    live = deployment(replicas=2, extra={"strategy": {"type": "RollingUpdate"}})
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"replicas": 1},
    }
    assert differing_paths(live, manifest, only_wanted=True) == ["spec.replicas"]
