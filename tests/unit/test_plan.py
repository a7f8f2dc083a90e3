from __future__ import annotations

from stageset.apply.plan import phases


def obj(kind: str, name: str = "x") -> dict[str, object]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}


def test_definitions_first_classes_next_webhooks_last_file_order_kept_inside() -> None:
    objects = [obj("ValidatingWebhookConfiguration"), obj("Deployment", "a"), obj("StorageClass"),
               obj("Widget"), obj("CustomResourceDefinition"), obj("Namespace"), obj("Deployment", "b"),
               obj("ClusterRole"), obj("IngressClass")]
    kinds = [[(o["kind"], o["metadata"]["name"]) for o in phase] for phase in phases(objects)]  # type: ignore[index]
    assert kinds == [
        [("CustomResourceDefinition", "x"), ("Namespace", "x"), ("ClusterRole", "x")],
        [("StorageClass", "x"), ("IngressClass", "x")],
        [("Deployment", "a"), ("Widget", "x"), ("Deployment", "b")],
        [("ValidatingWebhookConfiguration", "x")],
    ]


def test_empty_phases_are_left_out() -> None:
    assert phases([obj("ConfigMap")]) == [[obj("ConfigMap")]]
