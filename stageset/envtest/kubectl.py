"""Build ``kubectl`` from the Go module proxy, cached outside the checkout, for the plugin test.

``kubectl stageset ...`` runs the ``kubectl-stageset`` entry point through kubectl's own plugin
mechanism; ``tests/helm/test_install.py`` proves it with the real kubectl of the control plane's
Kubernetes version.  Like the kube-apiserver (:mod:`stageset.envtest.build`), ``cmd/kubectl``
lives in ``k8s.io/kubernetes``, so the checked-in wrapper ``hack/kubectl`` requires it with every
staging module replaced by the published ``v0.x.y`` (the same replace list, derived by
``--update``); it is built once into ``<cache>/tools/kubectl-<version>/kubectl``
(:class:`~stageset.envtest.gotool.GoTool`).  ``STAGESET_KUBECTL`` naming an executable wins.

Identity: none.  Building touches no cluster; the test runs kubectl with a user's kubeconfig.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stageset.build.kustomize import run_go
from stageset.envtest.build import KUBERNETES_VERSION, staging_modules, wrapper_go_mod
from stageset.envtest.gotool import GoTool

KUBECTL = GoTool(name="kubectl", version=KUBERNETES_VERSION, module="k8s.io/kubernetes",
                 package="k8s.io/kubernetes/cmd/kubectl", binary="kubectl", env_override="STAGESET_KUBECTL",
                 ldflags=f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
                 nosumdb="k8s.io")


def ensure_kubectl(*, log: bool = True) -> Path:
    return KUBECTL.ensure(log=log)


def update_wrapper() -> None:
    """Regenerate ``hack/kubectl`` for :data:`KUBERNETES_VERSION` (go.mod with the replace list)."""
    wrapper = KUBECTL.wrapper
    wrapper.mkdir(parents=True, exist_ok=True)
    (wrapper / "go.mod").write_text("module stageset.local/tools/kubectl\n\ngo 1.24\n")
    info = json.loads(run_go(["mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
                             cwd=wrapper))
    text = wrapper_go_mod(kubernetes_version=KUBERNETES_VERSION, modules=staging_modules(
        Path(info["GoMod"]).read_text()))
    text = text.replace("stageset.envtest.build", "stageset.envtest.kubectl").replace(
        "stageset.local/controlplane/kube-apiserver", "stageset.local/tools/kubectl")
    (wrapper / "go.mod").write_text(text)
    (wrapper / "tools.go").write_text(
        "//go:build tools\n\n"
        "// Package tools pins the command this module builds, so `go mod tidy` keeps go.sum whole.\n"
        "package tools\n\n"
        f'import _ "{KUBECTL.package}"\n')
    run_go(["mod", "tidy"], cwd=wrapper)


def main(argv: list[str]) -> int:
    if "--update" in argv:
        update_wrapper()
    print(ensure_kubectl())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
