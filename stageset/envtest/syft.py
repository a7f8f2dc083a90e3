"""Build ``syft`` from the Go module proxy, cached outside the checkout, for the release's SBOM.

``syft`` reads the image archive itself and finds what is in it: the Debian packages (dpkg's
database), the Python packages of the virtualenv (their ``dist-info``) and the Go modules of the
kustomize builder (its build information); ``make release`` writes that as CycloneDX JSON
(:mod:`stageset.envtest.release`).  Chosen over a Python SBOM tool (``cyclonedx-bom``), which sees
only a Python environment, not the Debian packages or the Go builder (docs/releasing.md has the
measurements).  Built like every Go tool (:class:`~stageset.envtest.gotool.GoTool`, wrapper
``hack/syft``); ``STAGESET_SYFT`` naming an executable wins; ``--update`` regenerates the wrapper.

Identity: none.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stageset.envtest.gotool import GoTool

SYFT_VERSION = "v1.57.0"
SYFT = GoTool(name="syft", version=SYFT_VERSION, module="github.com/anchore/syft",
              package="github.com/anchore/syft/cmd/syft", binary="syft", env_override="STAGESET_SYFT",
              ldflags=f"-X main.version={SYFT_VERSION}", nosumdb="github.com/anchore")


def ensure_syft(*, log: bool = True) -> Path:
    return SYFT.ensure(log=log)


if __name__ == "__main__":
    sys.exit(SYFT.main(sys.argv[1:], generator="python -m stageset.envtest.syft"))
