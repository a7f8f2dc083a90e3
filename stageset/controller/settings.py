"""Controller settings, grouped and injected (never global)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sources import Limits


@dataclass(frozen=True)
class ControllerSettings:
    # None watches every namespace; otherwise one namespace-scoped watch per entry.
    watch_namespaces: tuple[str, ...] | None = None
    # Single-tenant mode: StageSets without serviceAccountName apply as the controller.
    cluster_admin: bool = False
    no_cross_namespace_refs: bool = False
    workers: int = 4
    mirror_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "stageset-mirrors")
    # Bound on the Git mirrors' disk use; least recently used mirrors are evicted past it.
    mirror_max_bytes: int | None = None
    # Development only: allow plain http:// Git URLs.
    allow_insecure_sources: bool = False
    # Single-tenant only: allow file:// Git URLs and local paths.
    allow_local_sources: bool = False
    # What one fetch or read of a Git source may cost (sizes, counts).
    source_limits: Limits = field(default_factory=Limits)
    poll_interval: float = 0.5
    # Independent stages of one StageSet applied at once.
    stage_parallelism: int = 4
    # A reconcile waits this long for readiness, then frees its worker and comes back after
    # ``readiness_requeue``; the stage timeout spans reconciles.
    readiness_slice: float = 3.0
    readiness_requeue: float = 1.0
    # After this long, a deleted StageSet whose objects cannot be removed is released anyway.
    max_teardown_wait: float = 300.0
