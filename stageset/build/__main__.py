"""``python -m stageset.build [--update]``: build kustomize into the cache once and print its path.

``--update`` first regenerates the wrapper module ``hack/kustomize`` (go.mod, go.sum) for
the pinned version.  ``STAGESET_KUSTOMIZE`` naming a binary skips the build.
"""

import sys

from stageset.build.kustomize import main

sys.exit(main(sys.argv[1:]))
