"""The test node's wrapper module (``hack/node``) builds the control plane's Kubernetes release: its
``require`` and ``replace`` lines match ``hack/controlplane/kube-apiserver`` (a version bump that
regenerates one and not the other fails here, not as a kubelet that skews from its apiserver)."""

from __future__ import annotations

import re

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
