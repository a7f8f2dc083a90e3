"""Cluster targets, set up: the registry every StageSet pass asks for its cluster, and with
``--target-namespaces`` the platform's StageTargets.

:func:`clusters` builds the registry (:class:`~stageset.controller.targets.clusters.Targets`): this
cluster's apply engine, a bounded cache of remote ones (``--max-remote-targets``), the credential
seam reading ``spec.kubeConfig`` as the StageSet's identity, and — with ``--target-namespaces`` —
the platform's StageTargets (:class:`~stageset.controller.targets.platform.PlatformTargets`).
:func:`setup` adds what the manager runs for them: the StageTarget reconciler (``For`` StageTargets
in those namespaces only, one worker) and the metadata-only watch of the Secrets (and with
``--workload-identity`` the ConfigMaps) there (a runnable
counted as a cache: no worker starts before it has listed — a StageSet's pass compares the target
Secret's watched version with the one its connection read).  The StageSets' own watch of
StageTargets is the StageSet feature's (:mod:`stageset.controller.stageset.watches`).

Identity: none here; :mod:`.clusters`, :mod:`.credentials`, :mod:`.platform` and :mod:`.reconciler`
say whose identity their requests use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from stageset.apply.engine import StageApplier
from stageset.apply.rights import ShownRights
from stageset.controller.accounts import AccountCheck
from stageset.controller.kinds import STAGETARGETS
from stageset.controller.setup import Setup
from stageset.controller.shared import Shared
from stageset.controller.targets.clusters import Targets
from stageset.controller.targets.credentials import KubeconfigSecret, KubeConfigSources
from stageset.controller.targets.platform import PlatformTargets, TargetWorkload
from stageset.controller.targets.reconciler import StageTargetReconciler
from stageset.controller.targets.workload import LocalAudiences, WorkloadIdentity
from stageset.kube.mapping import RestMapper
from stageset.kube.tokens import TokenRequester


@dataclass(frozen=True)
class ClusterTargets:
    setup: Setup
    clusters: Targets
    """The registry the StageSet feature resolves each StageSet's cluster with."""


def clusters(shared: Shared) -> Targets:
    """The registry of clusters: this one (its apply engine, its shown rights aging by the injected
    clock), remote ones, and the platform's StageTargets with ``--target-namespaces``; with
    ``--workload-identity``, ``kubeConfig.configMapRef`` too (tokens requested as the controller, kept
    by the injected clock)."""
    clients, settings, clock = shared.clients, shared.settings, shared.clock
    # Shown rights age by the injected clock (a periodic pass trusts them for rights_max_age).
    rights = ShownRights(max_age=settings.apply.rights_max_age, clock=lambda: clock().timestamp())
    local = StageApplier(mapper=RestMapper(clients.client()), settings=settings.apply, rights=rights)
    accounts = AccountCheck(clients=clients, controller_reads_accounts=settings.cluster_admin)
    tokens = TokenRequester(client=clients.client(), clock=lambda: clock().timestamp()) \
        if settings.workload_identity else None
    audiences = LocalAudiences(client=clients.client())
    workload = TargetWorkload(tokens=tokens, audiences=audiences) if tokens is not None else None
    platform = PlatformTargets(admin=clients.client(), namespaces=settings.target_namespaces,
                               workload=workload) if settings.target_namespaces else None
    config_maps = WorkloadIdentity(tokens=tokens, lockdown=not settings.cluster_admin, audiences=audiences,
                                   accounts=accounts) if tokens is not None else None
    return Targets(clients=clients, settings=settings.apply, local=local, accounts=accounts,
                   capacity=settings.max_remote_targets, platform=platform,
                   credentials=KubeConfigSources(secrets=KubeconfigSecret(accounts=accounts),
                                                 config_maps=config_maps))


def setup(shared: Shared, *, stop: threading.Event) -> ClusterTargets:
    """The registry, and with ``--target-namespaces`` the StageTarget reconciler and its Secret watch."""
    registry = clusters(shared)
    settings = shared.settings
    if registry.platform is None:
        return ClusterTargets(setup=Setup(), clusters=registry)
    assert shared.enqueue is not None, "a changed Secret queues its StageTargets through the manager"
    # Watched unselected: every shard needs every target; its status is written by one shard (the
    # one its shard label names).  One worker: a target's connect is short.
    reconciler = StageTargetReconciler(clients=shared.clients, targets=registry, resource=STAGETARGETS,
                                       namespaces=settings.target_namespaces,
                                       interval=settings.default_interval, events=shared.events,
                                       clock=shared.clock, runbook_base_url=settings.runbook_base_url,
                                       on_write=shared.on_write, shard=settings.watch_label_selector)
    secrets = reconciler.secrets(enqueue=shared.enqueue, stop=stop, resync=settings.resync_period)
    return ClusterTargets(setup=Setup(controllers=(reconciler.controller(workers=1),), runnables=secrets,
                                      caches=secrets),
                          clusters=registry)
