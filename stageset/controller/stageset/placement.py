"""``spec.targetNamespace``: every namespaced object of every stage goes into one namespace.

Flux's meaning: the namespace a manifest names (or leaves out) is overridden for every namespaced
kind; a cluster-scoped object is left as it is.  A kind the cluster does not serve yet (its CRD is
in the same stage) is taken as namespaced, as :func:`~stageset.controller.stageset.rendering.identify`
takes it; the engine drops the namespace again if it turns out cluster-scoped.

Applied to a stage as rendered, before anything else looks at its objects — the clash check, the
durable record, the apply, a rollback's re-render — so each sees the objects where they will be.
Nothing here widens what a tenant may do: the stage's identity writes there only where its RBAC
lets it, like any write.  Changing the field moves the objects: the new namespace's are created, the
old ones are no longer rendered and are pruned (as the identity that applied them) once every
stage is Ready.

Identity: no request; discovery (whether a kind is namespaced) is the target's cached mapper.
"""

from __future__ import annotations

from dataclasses import replace

from stageset.api import StageSet
from stageset.controller.stageset.rendering import Rendered, identify
from stageset.controller.targets.clusters import Target
from stageset.kube.types import KubeObject


def place(obj: KubeObject, namespace: str, target: Target) -> KubeObject:
    """``obj`` in ``namespace`` when its kind is namespaced (or not served yet); else as it is."""
    _, resource = target.applier.resolve(obj, namespace)
    if resource is not None and not resource.namespaced:
        return obj
    if obj["metadata"].get("namespace") == namespace:
        return obj
    return {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}


def placed(rendered: Rendered, stageset: StageSet) -> Rendered:
    """The stage's objects where ``spec.targetNamespace`` puts them (unchanged without it)."""
    namespace = stageset.spec.target_namespace
    if not namespace:
        return rendered
    objects = [place(obj, namespace, rendered.target) for obj in rendered.objects]
    return replace(rendered, objects=objects,
                   ids={identify(obj, namespace, rendered.target) for obj in objects})
