"""The test node starts: kubelet registers and turns Ready, and a pod of a locally imported image
runs on the bridge network with its ServiceAccount token mounted (nothing pulled from anywhere).

Identity: the test acts as the control plane's ``system:masters`` admin; the pod as the ``default``
ServiceAccount of its namespace.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from stageset.envtest.node import PAUSE_IMAGE
from stageset.envtest.nodeplane import Node
from stageset.kube.client import ApiError, KubeClient

pytestmark = [pytest.mark.node]

_WAIT = 180.0
T = TypeVar("T")


def _until(what: str, check: Callable[[], T | None], *, node: Node) -> T:
    deadline = time.monotonic() + _WAIT
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what} not reached in {_WAIT:.0f}s; the node's logs are in {node.workdir}")


def test_node_registers_ready(node: Node, admin: KubeClient) -> None:
    obj = admin.get(f"/api/v1/nodes/{node.name}")
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
    assert addresses["InternalIP"] == node.host_ip
    assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert obj["status"]["nodeInfo"]["kubeletVersion"] == admin.get("/version")["gitVersion"]


def test_a_pod_of_a_local_image_runs_on_the_bridge(node: Node, admin: KubeClient) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "local-image", "namespace": "default"},
           "spec": {"containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
                    "terminationGracePeriodSeconds": 1}}

    def created() -> bool:
        # The ServiceAccount admission needs the `default` account the controller-manager makes.
        try:
            admin.request("POST", "/api/v1/namespaces/default/pods", body=pod)
        except ApiError as error:
            if error.forbidden or error.invalid:
                return False
            raise
        return True

    _until("the pod created", created, node=node)

    def running_pod() -> dict[str, Any] | None:
        pod = admin.get("/api/v1/namespaces/default/pods/local-image")
        return pod if pod["status"].get("phase") == "Running" else None

    running = _until("the pod Running", running_pod, node=node)
    assert running["spec"]["nodeName"] == node.name
    assert ipaddress.ip_address(running["status"]["podIP"]) in node.network
    mounts = running["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" for m in mounts)
    admin.delete("/api/v1/namespaces/default/pods/local-image")
    _until("the pod gone", lambda: _gone(admin, "/api/v1/namespaces/default/pods/local-image"), node=node)


def _gone(admin: KubeClient, path: str) -> bool:
    try:
        admin.get(path)
    except ApiError as error:
        if error.not_found:
            return True
        raise
    return False
