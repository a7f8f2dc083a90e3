"""The manager in process: watches, the work queue and both reconcilers over the fake cluster."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stageset.controller.manager import Manager
from stageset.controller.settings import ControllerSettings
from stageset.kube.client import ApiError
from tests.inprocess.conftest import NS, TENANT, URL, World, configmap, deployment, stageset_path
from tests.inprocess.fakes import CONTROLLER


def eventually(check: Callable[[], Any], *, timeout: float = 20.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def running(world: World) -> Iterator[Callable[..., Manager]]:
    started: list[tuple[Manager, threading.Thread]] = []

    def start(**settings: Any) -> Manager:
        manager = Manager(
            clients=world.pool,
            store=world.sources,
            clock=world.clock,
            settings=ControllerSettings(**{"readiness_slice": 0.0, "readiness_requeue": 0.05, **settings}),
        )
        thread = threading.Thread(target=manager.run, daemon=True)
        thread.start()
        started.append((manager, thread))
        return manager

    yield start
    for manager, thread in started:
        manager.stop.set()
        thread.join(timeout=10)


def is_ready(world: World, name: str) -> bool:
    obj = world.get(name)
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions", [])
    )


def test_sources_and_stagesets_reconcile_to_ready(world: World, running: Callable[..., Manager]) -> None:
    world.sources.commit(URL, {"app/cm.json": configmap("hello")})
    world.cluster.put(
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": NS},
            "spec": {"url": URL},
        }
    )
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    running()
    eventually(lambda: is_ready(world, "shop"), what="StageSet Ready")
    assert world.configmap("hello") is not None
    assert len(world.sources.fetches) == 1
    applies = [r for r in world.cluster.requests if r.verb == "apply" and not r.dry_run]
    assert [(r.user, r.path) for r in applies] == [(TENANT, f"/api/v1/namespaces/{NS}/configmaps/hello")]


def test_a_dependency_turning_ready_wakes_its_dependent(
    world: World, running: Callable[..., Manager]
) -> None:
    world.commit({"db/web.json": deployment("db"), "app/cm.json": configmap("app")})
    world.stageset("db", [{"name": "db", "path": "./db"}])
    # Retried only every 10 minutes: Ready in seconds proves the dependency woke it.
    world.stageset("app", [{"name": "app", "path": "./app"}], dependsOn=[{"name": "db"}], retryInterval="10m")
    running()
    eventually(lambda: world.ready("app")["reason"] == "DependencyNotReady", what="app waiting for db")
    eventually(lambda: world.phases("db") == {"db": "Waiting"}, what="db waiting for its Deployment")
    world.roll_out("db")
    eventually(lambda: is_ready(world, "app"), what="app woken by db turning Ready")


def test_only_watched_namespaces_are_listed_and_watched(
    world: World, running: Callable[..., Manager]
) -> None:
    running(watch_namespaces=(NS,))
    eventually(
        lambda: len({r.path.split("?")[0] for r in world.cluster.requests if r.verb == "watch"}) == 2,
        what="both watches",
    )
    scoped = [r for r in world.cluster.requests if r.verb in ("list", "watch")]
    assert scoped
    assert all(r.user == CONTROLLER and f"/namespaces/{NS}/" in r.path for r in scoped)


def test_a_failing_reconcile_backs_off_logs_one_traceback_and_recovers(
    world: World,
    running: Callable[..., Manager],
    caplog: pytest.LogCaptureFixture,
) -> None:
    world.commit({"app/cm.json": configmap("x")})
    source = f"/apis/stages.metio.wtf/v1/namespaces/{NS}/gitrepositories/app"
    world.cluster.failures[("get", source, None)] = ApiError(
        status=500, reason="InternalError", message="boom"
    )
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    caplog.set_level(logging.INFO, logger="stageset.controller.manager")
    running(backoff_base=0.01, backoff_cap=0.04)
    attempts = eventually(
        lambda: (n := len([r for r in world.cluster.by(TENANT) if r.path == source])) >= 6 and n,
        what="retries",
    )
    failures = [r for r in caplog.records if "reconciling StageSet" in r.getMessage()]
    assert len(failures) >= attempts - 1
    assert len([r for r in failures if r.exc_info]) == 1, "one traceback per failure streak"
    assert "failed again" in failures[-1].getMessage()
    del world.cluster.failures[("get", source, None)]
    eventually(lambda: is_ready(world, "shop"), what="recovery after the failure cleared")


def test_one_namespaces_blocked_sources_cannot_hold_every_worker(
    world: World, running: Callable[..., Manager]
) -> None:
    released = threading.Event()
    fetch = world.sources.fetch
    blocked: list[str] = []

    def tarpit(url: str, **kwargs: Any) -> Any:
        if "tarpit" in url:
            blocked.append(url)
            released.wait(60)  # a Git server that accepts and never answers, until its deadline
        return fetch(url, **kwargs)

    world.sources.fetch = tarpit  # type: ignore[method-assign]
    for i in range(4):
        url = f"https://tarpit.example/{i}.git"
        world.sources.commit(url, {"cm.json": configmap(f"t{i}")})
        world.cluster.put(
            {
                "apiVersion": "stages.metio.wtf/v1",
                "kind": "GitRepository",
                "metadata": {"name": f"slow-{i}", "namespace": "tarpit"},
                "spec": {"url": url},
            }
        )
    try:
        running(source_workers=4)
        # The slow sources are queued first and take every worker they may have...
        eventually(lambda: len(blocked) >= 2, what="tarpit fetches started")
        # ...and then another tenant arrives.
        world.sources.commit(URL, {"app/cm.json": configmap("fair")})
        world.cluster.put(
            {
                "apiVersion": "stages.metio.wtf/v1",
                "kind": "GitRepository",
                "metadata": {"name": "app", "namespace": NS},
                "spec": {"url": URL},
            }
        )
        world.stageset("shop", [{"name": "app", "path": "./app"}])
        eventually(lambda: is_ready(world, "shop"), timeout=10, what="the other namespace's StageSet Ready")
        assert len(blocked) == 2, "the tarpit namespace holds half the source workers, no more"
    finally:
        released.set()


def test_a_lagging_watch_does_not_make_passes_rewrite_the_status_they_already_wrote(
    world: World, running: Callable[..., Manager]
) -> None:
    # A loaded apiserver's watch delivers our own status writes late: each re-check pass starts
    # before the cache has seen what the last pass wrote.  It must start from what was written.
    world.commit({"web/d.json": deployment("web"), "config/cm.json": configmap("config")})
    world.stageset("shop", [{"name": "config", "path": "./config", "dependsOn": []},
                            {"name": "web", "path": "./web", "dependsOn": []}])
    # Events of a pass's first writes arrive while it waits (0.3 s); its last one arrives only
    # after the next pass (0.05 s later) has begun.
    world.cluster.watch_lag = 0.2
    running(readiness_slice=0.3, max_readiness_watches=0)  # polled re-checks, one after another
    eventually(lambda: world.ready("shop").get("message", "").startswith("waiting for readiness"),
               what="the first pass concluded: web waits")
    status = f"{stageset_path('shop')}/status"
    deployment_path = f"/apis/apps/v1/namespaces/{NS}/deployments/web"
    start = len(world.cluster.requests)
    time.sleep(2.0)
    window = world.cluster.requests[start:]
    rechecks = [r for r in window if r.user == TENANT and r.verb == "get" and r.path == deployment_path]
    assert len(rechecks) >= 5, "re-check passes ran meanwhile"  # the evidence for what follows
    writes = [r.path for r in window if r.user == CONTROLLER and r.path == status and r.verb != "get"]
    assert writes == [], "nothing changed, yet the status was written again"
    assert world.phases("shop") == {"config": "Ready", "web": "Waiting"}


def test_a_waiting_stage_is_woken_by_a_watch_as_the_tenant_and_reads_nothing_meanwhile(
    world: World, running: Callable[..., Manager]
) -> None:
    world.commit({"web/d.json": deployment("web")})
    world.stageset("shop", [{"name": "web", "path": "./web"}])
    # Re-checks only every 10 minutes: reaching Ready soon can only be the watch's doing.
    manager = running(readiness_slice=0.3, readiness_requeue=600.0, watched_requeue=600.0)
    eventually(lambda: world.phases("shop") == {"web": "Waiting"}, what="web Waiting")
    deployments = f"/apis/apps/v1/namespaces/{NS}/deployments"
    eventually(lambda: [r for r in world.cluster.requests
                        if r.verb == "watch" and r.path.startswith(deployments)],
               what="a watch of the Deployments")
    time.sleep(0.5)  # the first pass's wait is over
    start = len(world.cluster.requests)
    time.sleep(1.5)
    # (The fake ends a quiet watch after half a second, so it is opened again meanwhile; a real
    # apiserver keeps it for its timeout.)
    reads = [r for r in world.cluster.requests[start:] if r.user == TENANT and r.verb != "watch"]
    assert reads == [], "no reads while nothing changes"
    watches = [r for r in world.cluster.requests if r.verb == "watch" and r.path.startswith(deployments)]
    # As the tenant, in its namespace, only the stage's own objects.
    assert {r.user for r in watches} == {TENANT}
    assert all(r.path.startswith(f"{deployments}?") and "labelSelector=stages.metio.wtf" in r.path
               for r in watches), watches
    assert "stageset_readiness_watches 1.0" in manager.metrics.exposition().decode()
    world.roll_out("web")
    eventually(lambda: is_ready(world, "shop"), timeout=5, what="Ready, woken by the watch")
    assert manager.watches is not None
    assert len(manager.watches) >= 1


def test_past_the_bound_a_waiting_stage_polls_and_the_refusal_is_counted(
    world: World, running: Callable[..., Manager]
) -> None:
    world.commit({"web/d.json": deployment("web"), "api/d.json": deployment("api")})
    world.stageset("shop", [{"name": "web", "path": "./web"}])
    world.stageset("cart", [{"name": "api", "path": "./api"}])
    # One watch for two waiting stages (each selects its own StageSet's objects): one polls.
    manager = running(readiness_slice=0.3, max_readiness_watches=1)
    waiting = ({"web": "Waiting"}, {"api": "Waiting"})
    eventually(lambda: (world.phases("shop"), world.phases("cart")) == waiting, what="both stages Waiting")
    refused = "stageset_readiness_watches_refused_total 0.0"
    eventually(lambda: refused not in manager.metrics.exposition().decode(), what="a refusal counted")
    exposition = manager.metrics.exposition().decode()
    assert "stageset_readiness_watches 1.0" in exposition
    assert manager.watches is not None
    assert manager.watches.refused >= 1
    world.roll_out("web")
    world.roll_out("api")
    eventually(lambda: is_ready(world, "shop") and is_ready(world, "cart"), timeout=10,
               what="both Ready: one woken by its watch, the other by polling")


def test_the_stagetargets_secret_watch_counts_as_a_cache_no_worker_starts_before_it_listed(
    world: World, running: Callable[..., Manager]
) -> None:
    """A StageSet's pass compares a target Secret's watched version with the one its connection read:
    the Secret watch of the target namespaces is waited for like the kinds' caches (and ``/readyz``)."""
    platform = "platform-targets"
    secrets = f"/api/v1/namespaces/{platform}/secrets"
    prefixes = world.cluster.controller_prefixes or ()
    world.cluster.controller_prefixes = (*prefixes, secrets)  # the chart's Role in a target namespace
    world.cluster.failures[("list", secrets, None)] = ApiError(status=503, reason="ServiceUnavailable",
                                                               message="etcd is slow")
    world.sources.commit(URL, {"app/cm.json": configmap("hello")})
    world.cluster.put({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "metadata": {"name": "app", "namespace": NS}, "spec": {"url": URL}})
    world.stageset("shop", [{"name": "app", "path": "./app"}])
    manager = running(target_namespaces=(platform,))
    kinds = manager._reflectors  # which watches have listed is the point
    eventually(lambda: all(r.synced.is_set() for r in kinds), what="every kind's watch listed")
    eventually(lambda: [r for r in world.cluster.requests if r.verb == "list" and r.path == secrets],
               what="the Secret watch trying to list")
    assert "stageset_caches_synced 0.0" in manager.metrics.exposition().decode()
    assert not (world.get("shop").get("status") or {}).get("conditions"), "no pass before the Secrets listed"

    del world.cluster.failures[("list", secrets, None)]
    eventually(lambda: is_ready(world, "shop"), what="StageSet Ready once the Secret watch listed")
    assert "stageset_caches_synced 1.0" in manager.metrics.exposition().decode()
