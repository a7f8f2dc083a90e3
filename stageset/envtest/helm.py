"""Build ``helm`` from the Go module proxy, cached outside the checkout, for the chart tests.

As every Go tool of the tests (:mod:`stageset.envtest.gotool`): the checked-in wrapper module
``hack/helm`` requires ``helm.sh/helm/v4`` at :data:`HELM_VERSION`, and ``cmd/helm`` is built
into ``<cache>/tools/helm-<version>/helm`` once.  Nothing prebuilt is downloaded.
``--update`` regenerates the wrapper after a version bump.

``STAGESET_HELM`` naming an executable uses that binary instead (nothing is built).

Identity: none.  Building touches no cluster; the tests that run the binary hand it a
kubeconfig of their own (the control plane's ``system:masters`` admin, as a platform
engineer installing a chart would be).
"""

from __future__ import annotations

import sys
from pathlib import Path

from stageset.envtest.gotool import GoTool

HELM_VERSION = "v4.3.1"
HELM_MODULE = "helm.sh/helm/v4"
HELM = GoTool(name="helm", version=HELM_VERSION, module=HELM_MODULE, package=f"{HELM_MODULE}/cmd/helm",
              binary="helm", env_override="STAGESET_HELM",
              ldflags=f"-X {HELM_MODULE}/internal/version.version={HELM_VERSION}", nosumdb="helm.sh")


def cached_binary() -> Path:
    return HELM.cached_binary()


def ensure_helm(*, log: bool = True) -> Path:
    """The helm binary, building it once into the cache if needed (honours ``STAGESET_HELM``)."""
    return HELM.ensure(log=log)


if __name__ == "__main__":
    sys.exit(HELM.main(sys.argv[1:], generator="python -m stageset.envtest.helm"))
