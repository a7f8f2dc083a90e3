"""The test node (stageset.envtest.nodeplane): one per module that asks for it, skipped with the
reason printed where it cannot run (not root, a missing Debian package, no cgroup controllers) --
and failed instead under ``CI=true``, where ``hack/bootstrap.sh`` has installed what it needs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stageset.envtest import nodeplane
from stageset.kube.client import ClientPool, KubeClient


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the test node cannot run under CI: {reason}", pytrace=False)
    pytest.skip(f"no test node here: {reason}")


@pytest.fixture(scope="module")
def node() -> Iterator[nodeplane.Node]:
    reason = nodeplane.unavailable()
    if reason:
        _unavailable(reason)
    started = nodeplane.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def admin(node: nodeplane.Node) -> Iterator[KubeClient]:
    pool = ClientPool.from_kubeconfig(str(node.plane.kubeconfig))
    try:
        yield pool.client()
    finally:
        pool.close()
