"""Flux sources, set up: the watches of Flux's source kinds and the artifact downloads, both waking
StageSets through the source index they are handed.

- :class:`~stageset.controller.fluxwatch.FluxWatches` — watches of the Flux source kinds this
  cluster serves (found by discovery, asked again when a StageSet names a kind no watch covers): a
  runnable, triggers only;
- :class:`~stageset.controller.artifacts.ArtifactFetcher` — artifacts downloaded as jobs of the
  GitRepository pool (its per-namespace cap with Git fetches), a tree handed only for the digest a
  stage's own read named.

Identity: the controller's own for the watches (the chart's ClusterRole may list and watch Flux's
source kinds); downloads reach the artifact URL through the address guard, with no credentials.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from sources.addresses import AddressGuard
from sources.artifacts import ArtifactStore
from stageset.controller.artifacts import JOB_KIND, ArtifactFetcher
from stageset.controller.fluxwatch import FluxWatches
from stageset.controller.keys import JobKey
from stageset.controller.kinds import GITREPOSITORIES
from stageset.controller.setup import Jobs, Setup
from stageset.controller.shared import Shared
from stageset.controller.sourcekinds import SourceObject


@dataclass(frozen=True)
class FluxSources:
    setup: Setup
    watches: FluxWatches
    artifacts: ArtifactFetcher


def setup(shared: Shared, *, wake: Callable[[set[SourceObject]], None], stop: threading.Event) -> FluxSources:
    """The Flux source watches and the artifact downloads; ``wake`` requeues the StageSets naming
    the source objects it is given."""
    settings, enqueue = shared.settings, shared.enqueue
    assert enqueue is not None, "downloads run as jobs of the manager's source pool"
    artifacts = ArtifactFetcher(
        store=ArtifactStore(root=settings.artifacts.directory, limits=settings.artifacts.limits,
                            guard=AddressGuard(allow_insecure=settings.allow_insecure_sources),
                            max_bytes=settings.artifacts.max_bytes,
                            max_tenant_bytes=settings.artifacts.max_tenant_bytes),
        timeout=settings.artifacts.timeout, wake=wake, stop=stop,
        schedule=lambda namespace, job: enqueue(JobKey(JOB_KIND, namespace, job)))
    watches = FluxWatches(client=shared.clients.client(), namespaces=settings.watch_namespaces, stop=stop,
                          on_change=wake, resync=settings.resync_period,
                          interval=settings.artifacts.discovery_interval)
    # Artifact downloads share the source pool (and its per-namespace cap) with Git fetches.
    downloads = Jobs(runner=JOB_KIND, pool=GITREPOSITORIES.kind, run=artifacts.job)
    return FluxSources(setup=Setup(jobs=(downloads,), runnables=(watches,)), watches=watches,
                       artifacts=artifacts)
