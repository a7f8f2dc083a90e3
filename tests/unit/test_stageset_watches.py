"""The StageSet reconciler's declaration: which events requeue which StageSets, and the indexes its
watch keeps (the manager runs it; tests/inprocess/test_manager.py runs both together)."""

from __future__ import annotations

from typing import Any

from stageset.controller.dependencies import DependencyIndex
from stageset.controller.keys import ObjectKey, WorkKey
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.result import Result
from stageset.controller.setup import ANY_CHANGE, CHANGED_OR_GONE, Event
from stageset.controller.sourcekinds import FLUX_GROUP, OUR_GROUP, DefaultSourceKind, SourceObject
from stageset.controller.sourcekinds import trigger as source_trigger
from stageset.controller.stageset.watches import SourceIndex, StageSetWatches, as_dependency, trigger
from stageset.kube.types import KubeObject

NS = "shop"


class Reconciler:
    def __init__(self) -> None:
        self.forgotten: list[tuple[str, str]] = []

    def reconcile(self, raw: KubeObject) -> Result:
        del raw
        return Result()

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten.append((namespace, name))


class Declared:
    def __init__(self, *, no_cross_namespace_refs: bool = False) -> None:
        self.queued: list[WorkKey] = []
        self.poked: list[str] = []
        self.reconciler = Reconciler()
        self.index = DependencyIndex()
        self.sources = SourceIndex(enqueue=self.queued.append)
        self.watches = StageSetWatches(reconciler=self.reconciler, resource=STAGESETS,
                                       source_kind=GITREPOSITORIES.kind, index=self.index,
                                       sources=self.sources, poke=self.poked.append,
                                       default_source_kind=DefaultSourceKind.GIT_REPOSITORY,
                                       no_cross_namespace_refs=no_cross_namespace_refs)
        self.controller = self.watches.controller(workers=2)

    def event(self, event: Event, obj: KubeObject) -> ObjectKey:
        key = ObjectKey.of(obj, kind="StageSet")
        assert self.controller.indexed is not None
        self.controller.indexed(event, key, obj)
        return key


def stageset(name: str, *, namespace: str = NS, depends_on: list[dict[str, str]] | None = None,
             sources: list[dict[str, str]] | None = None) -> KubeObject:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": {"dependsOn": depends_on or [],
                     "stages": [{"name": f"s{i}", "sourceRef": ref} for i, ref in enumerate(sources or [])]}}


def test_the_declaration_is_for_stagesets_and_watches_dependencies_and_gitrepositories() -> None:
    declared = Declared()
    controller = declared.controller
    assert (controller.kind, controller.workers, controller.trigger) == ("StageSet", 2, trigger)
    assert [(w.kind, w.state, w.fires) for w in controller.watches] == [
        ("StageSet", as_dependency, ANY_CHANGE), ("GitRepository", source_trigger, CHANGED_OR_GONE)]


def test_a_request_annotation_triggers_a_reconcile_and_a_status_write_does_not() -> None:
    obj = stageset("app")
    assert trigger({**obj, "status": {"lastAppliedRevision": "x"}}) == trigger(obj)
    promoted = {**obj, "metadata": {**obj["metadata"], "annotations": {"stages.metio.wtf/promote": "web"}}}
    assert trigger(promoted) != trigger(obj)


def test_a_dependency_maps_to_its_dependents_and_a_refused_reference_is_no_edge() -> None:
    declared = Declared(no_cross_namespace_refs=True)
    declared.event(Event.ADDED, stageset("web", depends_on=[{"name": "db"},
                                                            {"name": "x", "namespace": "other"}]))
    dependents = declared.controller.watches[0].keys
    assert list(dependents(ObjectKey("StageSet", NS, "db"))) == [ObjectKey("StageSet", NS, "web")]
    assert list(dependents(ObjectKey("StageSet", "other", "x"))) == []


def test_a_gitrepository_maps_to_exactly_the_stagesets_naming_it_and_a_deleted_one_names_none() -> None:
    declared = Declared()
    declared.event(Event.ADDED, stageset("a", sources=[{"name": "repo"}]))
    declared.event(Event.ADDED, stageset("b", sources=[{"name": "other"}]))
    naming = declared.controller.watches[1].keys
    assert list(naming(ObjectKey("GitRepository", NS, "repo"))) == [ObjectKey("StageSet", NS, "a")]
    declared.event(Event.DELETED, stageset("a"))
    assert list(naming(ObjectKey("GitRepository", NS, "repo"))) == []
    assert declared.reconciler.forgotten == [(NS, "a")]
    assert declared.index.dependents((NS, "a")) == []


def test_a_new_revision_and_a_flux_change_wake_the_stagesets_naming_the_source() -> None:
    declared = Declared()
    declared.event(Event.ADDED, stageset("a", sources=[{"name": "repo"}]))
    declared.event(Event.ADDED, stageset(
        "b", sources=[{"name": "art", "kind": "ExternalArtifact", "apiVersion": f"{FLUX_GROUP}/v1"}]))
    declared.watches.revised(NS, "repo", "main@sha1:abc")
    assert declared.queued == [ObjectKey("StageSet", NS, "a")]
    declared.sources.wake({SourceObject(FLUX_GROUP, "ExternalArtifact", NS, "art"),
                           SourceObject(OUR_GROUP, "GitRepository", NS, "nobody's")})
    assert declared.queued[1:] == [ObjectKey("StageSet", NS, "b")]
    # A Flux kind named: discovery is asked for it (the watch covering it may be new).
    assert declared.poked == ["ExternalArtifact"]


def test_a_stageset_naming_another_source_drops_out_of_the_old_sources_index() -> None:
    declared = Declared()
    declared.event(Event.ADDED, stageset("a", sources=[{"name": "old"}]))
    declared.event(Event.MODIFIED, stageset("a", sources=[{"name": "new"}]))
    assert declared.sources.naming({SourceObject(OUR_GROUP, "GitRepository", NS, "old")}) == []
    assert declared.sources.naming({SourceObject(OUR_GROUP, "GitRepository", NS, "new")}) == \
        [ObjectKey("StageSet", NS, "a")]


def test_as_dependency_sees_readiness_applied_revision_and_a_held_update() -> None:
    ready: dict[str, Any] = {"observedGeneration": 1,
                             "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}]}
    obj = {**stageset("db"), "status": ready}
    base = as_dependency(obj)
    assert as_dependency({**obj, "status": {**ready, "lastAppliedRevision": "v2"}}) != base
    assert as_dependency({**obj, "status": {**ready, "pendingUpdate": {"revisions": ["v3"]}}}) != base
    assert as_dependency({**obj, "status": {**ready, "lastHandledReconcileAt": "t"}}) == base
