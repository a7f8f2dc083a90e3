"""The test node's wrapper module (``hack/node``) builds the control plane's Kubernetes release: its
``require`` and ``replace`` lines match ``hack/controlplane/kube-apiserver`` (a version bump that
regenerates one and not the other fails here, not as a kubelet that skews from its apiserver)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from stageset.envtest import nodeplane
from stageset.envtest.build import KUBERNETES_VERSION, WRAPPERS
from stageset.envtest.node import COMMANDS, WRAPPER


def _lines(text: str, pattern: str) -> list[str]:
    return sorted(re.findall(pattern, text, re.MULTILINE))


def test_the_node_wrapper_pins_the_apiserver_s_release_and_staging_modules() -> None:
    node = (WRAPPER / "go.mod").read_text()
    apiserver = (WRAPPERS / "kube-apiserver" / "go.mod").read_text()
    assert re.search(rf"^require k8s\.io/kubernetes {re.escape(KUBERNETES_VERSION)}$", node, re.MULTILINE)
    replaces = _lines(node, r"^replace .*$")
    assert replaces
    assert replaces == _lines(apiserver, r"^replace .*$")


def test_the_node_wrapper_names_every_command_it_builds() -> None:
    tools = (WRAPPER / "tools.go").read_text()
    assert sorted(re.findall(r'_ "k8s\.io/kubernetes/cmd/([\w-]+)"', tools)) == sorted(COMMANDS)


def test_a_machine_that_cannot_run_the_node_is_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reason the node tests print when they skip: root first, then the packages by name."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert nodeplane.unavailable() == "the test node needs root (containerd, cgroups, a bridge, iptables)"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which",
                        lambda tool: None if tool == "runc" else f"/usr/bin/{tool}")
    monkeypatch.setattr(nodeplane, "CNI_BIN", Path("/nonexistent"))
    reason = nodeplane.unavailable()
    assert reason is not None
    assert "containernetworking-plugins, runc" in reason
    assert "hack/bootstrap.sh installs them" in reason
