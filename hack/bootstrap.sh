#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, idempotently:
#   - uv (pinned, from PyPI) into the user cache, outside the checkout;
#   - the locked Python environment (.venv) from uv.lock;
# The control-plane binaries are built on first use by stageset.envtest.build.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
CACHE="${STAGESET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/stageset}"
UV_HOME="$CACHE/tools/uv-$UV_VERSION"
UV="$UV_HOME/bin/uv"

if [ ! -x "$UV" ]; then
    echo "bootstrap: installing uv $UV_VERSION into $UV_HOME" >&2
    python3 -m pip install --quiet --disable-pip-version-check --target "$UV_HOME" "uv==$UV_VERSION"
fi

"$UV" sync --frozen --quiet
echo "$UV"
