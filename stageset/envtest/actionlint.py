"""Build ``actionlint`` from the Go module proxy, cached outside the checkout, to check the workflows.

The GitHub Actions workflows (``.github/workflows/``) cannot run here; ``actionlint`` checks what
can be checked without running them: their syntax, expressions, contexts, action inputs and
permissions (``tests/release/test_workflows.py``).  Built like every Go tool of the tests
(:class:`~stageset.envtest.gotool.GoTool`, wrapper ``hack/actionlint``); ``STAGESET_ACTIONLINT``
naming an executable wins.  ``--update`` regenerates the wrapper after a version bump.

Identity: none.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stageset.envtest.gotool import GoTool

ACTIONLINT_VERSION = "v1.7.12"
ACTIONLINT = GoTool(name="actionlint", version=ACTIONLINT_VERSION, module="github.com/rhysd/actionlint",
                    package="github.com/rhysd/actionlint/cmd/actionlint", binary="actionlint",
                    env_override="STAGESET_ACTIONLINT",
                    ldflags=f"-X github.com/rhysd/actionlint.version={ACTIONLINT_VERSION}",
                    nosumdb="github.com/rhysd")


def ensure_actionlint(*, log: bool = True) -> Path:
    return ACTIONLINT.ensure(log=log)


if __name__ == "__main__":
    sys.exit(ACTIONLINT.main(sys.argv[1:], generator="python -m stageset.envtest.actionlint"))
