"""``python -m stageset.build [--update]``: build the runtime binaries once; print the builder's path.

Builds ``kustomize`` (the tests' upstream command), the ``stageset-kustomize`` builder and the
``stageset-sops`` decryption helper.  ``--update`` first regenerates the wrapper module
``hack/kustomize`` (go.mod, go.sum) for the pinned version.  ``STAGESET_KUSTOMIZE`` /
``STAGESET_KUSTOMIZE_BUILDER`` / ``STAGESET_SOPS_HELPER`` naming a binary skips its build.
"""

import contextlib
import sys

from stageset.build.decrypt import ensure_helper
from stageset.build.kustomize import main

status = main(sys.argv[1:])
with contextlib.redirect_stdout(sys.stderr):
    ensure_helper()
sys.exit(status)
