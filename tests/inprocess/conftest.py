"""In-process reconciler tests: the real reconcilers, apply engine and manager over recording fakes.

Between the pure unit tests and the end-to-end tests (a real apiserver, the controller
as a process): fast (no processes, no sleeping — time is an injected clock) and precise
(every request, with its identity, is recorded).
"""

from __future__ import annotations

import datetime
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from stageset.api.fleet import FleetRelease, FleetView
from stageset.controller.consumers import artifact_consumer
from stageset.controller.dependencies import DependencyIndex
from stageset.controller.events import EventRecorder
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.metrics import Metrics
from stageset.controller.render.stores import ArtifactTrees
from stageset.controller.result import Result
from stageset.controller.settings import ControllerSettings
from stageset.controller.shared import Shared
from stageset.controller.stageset.awaited import names_stageset
from stageset.controller.stageset.reconciler import StageSetReconciler
from stageset.controller.stageset.setup import stageset_reconciler
from stageset.controller.targets.setup import clusters
from stageset.controller.terminating import TerminatingNamespaces
from stageset.kube.types import KubeObject
from tests.inprocess.fakes import FakeClientPool, FakeCluster, FakeSources

NS = "shop"
SA = "deployer"
TENANT = f"system:serviceaccount:{NS}:{SA}"
URL = "https://git.example/shop.git"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


def configmap(name: str, value: str = "v", **metadata: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, **metadata},
            "data": {"k": value},
        }
    )


def deployment(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}},
            },
        }
    )


def stageset_path(name: str, namespace: str = NS) -> str:
    return STAGESETS.object_path(name=name, namespace=namespace)


@dataclass
class World:
    """A fake cluster with one tenant (``shop``/``deployer``, edit there), a Git repository,
    and the StageSet reconciler wired as the manager wires it."""

    cluster: FakeCluster
    sources: FakeSources
    clock: Clock
    # One reconcile, one conclusion: no readiness wait, and a first wait for a source said at once
    # (tests/inprocess/test_first_wait.py holds it, as the controller does).
    settings: ControllerSettings = field(default_factory=lambda: ControllerSettings(readiness_slice=0.0,
                                                                                    first_wait_grace=0.0))
    stop: threading.Event = field(default_factory=threading.Event)
    index: DependencyIndex = field(default_factory=DependencyIndex)
    terminating: TerminatingNamespaces = field(default_factory=TerminatingNamespaces)
    """The namespaces the Namespace watch would report terminating (fed by the test)."""
    rollouts: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """The FleetRollouts that select each StageSet, as the rollout watch would tell (fed by the test)."""
    fleet_records: dict[tuple[str, str], dict[str, FleetRelease]] = field(default_factory=dict)
    """What each rollout's ``status.releases`` records for each StageSet (fed by the test)."""

    def selected_by(self, namespace: str, name: str) -> FleetView:
        return FleetView(selected_by=tuple(self.rollouts.get((namespace, name), [])),
                         records=self.fleet_records.get((namespace, name), {}))

    def __post_init__(self) -> None:
        self.pool = FakeClientPool(self.cluster)
        self.reconciler = self.make_reconciler()

    def make_reconciler(self, *, artifacts: ArtifactTrees | None = None,
                        **settings: Any) -> StageSetReconciler:
        if settings:
            self.settings = ControllerSettings(**{**self.settings.__dict__, **settings})
        shared = Shared(clients=self.pool, settings=self.settings, metrics=Metrics(), clock=self.clock,
                        events=EventRecorder(self.pool.client(), clock=self.clock),
                        terminating=self.terminating)
        identities = IdentityPolicy(cluster_admin=self.settings.cluster_admin)
        return stageset_reconciler(shared, identities=identities,
                                   store=self.sources, resource=STAGESETS, source_resource=GITREPOSITORIES,
                                   index=self.index, stop=self.stop, artifacts=artifacts,
                                   selected_by=self.selected_by, targets=clusters(shared))

    # -- Git --------------------------------------------------------------------------------

    def commit(self, files: dict[str, str], *, url: str = URL, name: str = "app", namespace: str = NS) -> str:
        """Commit ``files`` and report the new artifact on GitRepository ``name``."""
        sha = self.sources.commit(url, files)
        path = GITREPOSITORIES.object_path(name=name, namespace=namespace)
        if self.cluster.get(path) is None:
            self.cluster.put(
                {
                    "apiVersion": "stages.metio.wtf/v1",
                    "kind": "GitRepository",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"url": url},
                }
            )
        self.cluster.set_status(path, {"artifact": {"revision": self.sources.revision(url)}})
        # As the GitRepository reconciler's fetch would: the commit is served to this object.
        metadata = (self.cluster.get(path) or {})["metadata"]
        self.sources.served.add((url, sha, artifact_consumer(metadata)))
        return sha

    # -- StageSets --------------------------------------------------------------------------

    def stageset(self, name: str, stages: list[dict[str, Any]], namespace: str = NS, **spec: Any) -> str:
        spec = {"serviceAccountName": SA, **spec}
        if spec["serviceAccountName"] is None:
            del spec["serviceAccountName"]
        path = stageset_path(name, namespace)
        existing = self.cluster.get(path)
        body = {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"stages": [{"sourceRef": {"name": "app"}, **s} for s in stages], **spec},
        }
        if existing is None:
            self.cluster.put(body)
        else:
            with self.cluster._lock:
                live = self.cluster.objects[path]
                live["spec"] = body["spec"]
                live["metadata"]["generation"] = int(live["metadata"]["generation"]) + 1
        self.index.update(  # as the StageSet watch keeps it: StageSet entries only
            (namespace, name),
            [(d.get("namespace") or namespace, d["name"]) for d in spec.get("dependsOn", [])
             if names_stageset(d)],
        )
        return path

    def reconcile(self, name: str, namespace: str = NS) -> Result:
        """One reconcile of the StageSet as the watch cache would hand it over."""
        live = self.cluster.get(stageset_path(name, namespace))
        assert live is not None
        return self.reconciler.reconcile(live)

    def get(self, name: str, namespace: str = NS) -> KubeObject:
        found = self.cluster.get(stageset_path(name, namespace))
        assert found is not None
        return found

    def ready(self, name: str, namespace: str = NS) -> dict[str, Any]:
        conditions = (self.get(name, namespace).get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Ready"), {"status": "", "reason": ""})

    def phases(self, name: str) -> dict[str, str]:
        return {s["name"]: s["phase"] for s in (self.get(name).get("status") or {}).get("stages", [])}

    def roll_out(self, name: str, namespace: str = NS) -> None:
        self.cluster.set_status(
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            {
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "readyReplicas": 1,
                "availableReplicas": 1,
            },
        )

    def configmap(self, name: str, namespace: str = NS) -> KubeObject | None:
        return self.cluster.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")


@pytest.fixture
def world() -> Iterator[World]:
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    # The chart's multi-tenant controller: our kinds, events; nothing else.
    cluster.controller_prefixes = ("/apis/stages.metio.wtf/",)
    world = World(cluster=cluster, sources=FakeSources(), clock=Clock())
    try:
        yield world
    finally:
        world.stop.set()
