"""Leader election when the apiserver does not answer (a connection refused on loopback, no mock):
a failed round, so a cut-off leader steps down after its renew deadline instead of its election
thread dying while it still believes it leads."""

from __future__ import annotations

import socket
import threading

from kubernetes import client as k8s

from stageset.controller.leader import LeaderElectionConfig, LeaderElector
from stageset.kube.client import Identity, KubeClient


def _unreachable() -> KubeClient:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    configuration = k8s.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    return KubeClient(api_client=k8s.ApiClient(configuration=configuration), identity=Identity(), timeout=1.0)


def test_an_unreachable_apiserver_is_a_failed_round_and_a_leader_steps_down() -> None:
    lost = threading.Event()
    stop = threading.Event()
    elector = LeaderElector(client=_unreachable(), stop=stop, on_lost=lost.set,
                            config=LeaderElectionConfig(namespace="n", name="l", identity="me",
                                                        lease_duration=3.0, renew_deadline=0.4,
                                                        retry_period=0.1))
    assert elector.try_acquire_or_renew() is False
    elector.leading.set()  # it led, then lost the apiserver
    elector.start()
    try:
        assert lost.wait(15), "a leader cut off from the apiserver never stepped down"
        assert not elector.leading.is_set()
    finally:
        stop.set()
