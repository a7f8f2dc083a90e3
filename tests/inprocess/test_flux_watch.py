"""The manager with Flux sources, in process: kinds installed after start are watched, a new artifact
requeues exactly the StageSets that name its source, and downloads run in the source pool."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stageset.controller.manager import Manager
from stageset.controller.settings import ArtifactSettings, ControllerSettings
from tests.artifactserver import ArtifactServer
from tests.inprocess.conftest import TENANT, World, configmap
from tests.inprocess.test_flux_sources import FLUX, Flux, stage
from tests.inprocess.test_manager import eventually


@pytest.fixture
def manager(world: World, tmp_path: Path) -> Iterator[Manager]:
    world.cluster.controller_prefixes = ("/apis/stages.metio.wtf/", "/apis/source.toolkit.fluxcd.io/")
    world.cluster.unserved.add("source.toolkit.fluxcd.io/v1")  # Flux's CRDs come later
    running = Manager(clients=world.pool, store=world.sources, clock=world.clock, settings=ControllerSettings(
        readiness_slice=0.0, readiness_requeue=0.05, allow_insecure_sources=True,
        artifacts=ArtifactSettings(directory=tmp_path / "artifacts", discovery_interval=0.2)))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    yield running
    running.stop.set()
    thread.join(timeout=10)


def test_kinds_installed_later_are_watched_and_only_the_naming_stagesets_are_requeued(
        world: World, manager: Manager, tmp_path: Path) -> None:
    with ArtifactServer() as server:
        flux = Flux(world, server, tmp_path)
        for name in ("a", "b"):
            flux.publish("ExternalArtifact", name, {"cm.yaml": configmap(f"cm-{name}", "one")})
            world.stageset(name, [stage("app", kind="ExternalArtifact", name=name)])
        eventually(lambda: world.configmap("cm-a") and world.configmap("cm-b"), what="both applied")
        assert manager.wired.flux.watched() == {}

        def reads_of_b() -> int:
            return len([r for r in world.cluster.by(TENANT) if r.path.endswith("/externalartifacts/b")])

        before = reads_of_b()
        world.cluster.unserved.clear()  # Flux's CRDs are installed now
        eventually(lambda: "ExternalArtifact" in manager.wired.flux.watched(),
                   what="a watch on ExternalArtifacts")
        # The new watch's first list names every object once: their StageSets run once more.
        eventually(lambda: reads_of_b() > before, what="b requeued by the first list")
        settled = reads_of_b()
        flux.publish("ExternalArtifact", "a", {"cm.yaml": configmap("cm-a", "two")},
                     revision="latest@sha256:2")
        eventually(lambda: (world.configmap("cm-a") or {}).get("data") == {"k": "two"},
                   what="the new artifact applied with no spec change")
        eventually(lambda: len(manager.pools["StageSet"].queue) == 0, what="the queue drained")
        assert reads_of_b() == settled
        # The download ran as a job of the source pool, for the StageSet's namespace.
        assert manager.wired.artifacts.store.downloads == 3
        assert not [r for r in world.cluster.by(TENANT) if r.write and FLUX in r.path]

