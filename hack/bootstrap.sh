#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine, idempotently:
#   - uv (pinned, from PyPI) into the user cache, outside the checkout;
#   - the locked Python environment (.venv) from uv.lock;
#   - OpenSSH's server and client (Debian packages) for the SSH Git tests, when sshd is missing;
#   - mmdebstrap, umoci and binutils (Debian packages) for the daemonless image build, when missing;
#   - chromium (Debian's, with a font) for the dashboard's browser tests, when missing;
#   - gnupg (Debian) for the SOPS tests' OpenPGP key, when gpg is missing;
#   - containerd, runc, the CNI plugins, iptables, conntrack and ipset (Debian packages) for the test
#     node (stageset.envtest.nodeplane; ipset for its NetworkPolicy enforcer, kube-router), when
#     missing; no system containerd is started;
#   - skopeo (Debian) that pushes the release's image archive to a registry (the loopback registry
#     of the tests, the real ones in the release workflow: stageset.envtest.publish), when missing;
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

# The SSH transport is tested against a real sshd that tests/sshserver.py starts on loopback.
# Only stdout's last line is read by callers (the uv path), so everything here goes to stderr.
# Debian packages, installed with apt-get as root (or through password-less sudo), idempotently.
apt_install() {
    local why="$1"; shift
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "bootstrap: not root: install $* yourself ($why)" >&2
            return 0
        fi
    fi
    echo "bootstrap: installing $* ($why)" >&2
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@")
    if ! $sudo "${apt[@]}" >/dev/null 2>&1; then
        $sudo apt-get update -qq >/dev/null 2>&1 || true
        $sudo "${apt[@]}" >/dev/null
    fi
}

install_openssh() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "bootstrap: /usr/sbin/sshd is missing and we are not root: install" \
                 "openssh-server and openssh-client (the SSH Git tests need them)" >&2
            return 0
        fi
    fi
    echo "bootstrap: installing openssh-server and openssh-client (for the SSH Git tests)" >&2
    # Keep the package from starting a system sshd on port 22: the tests start their own.
    local policy=/usr/sbin/policy-rc.d made_policy=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
        made_policy=1
    fi
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
               openssh-server openssh-client)
    local status=0
    if ! $sudo "${apt[@]}" >/dev/null 2>&1; then
        # The package lists are missing or stale: refresh them once, then try again.
        $sudo apt-get update -qq >/dev/null 2>&1 || true
        $sudo "${apt[@]}" >/dev/null || status=$?
    fi
    [ -n "$made_policy" ] && $sudo rm -f "$policy"
    return "$status"
}
if [ ! -x /usr/sbin/sshd ] && command -v apt-get >/dev/null; then
    install_openssh >&2
fi
# The container image is built without a container engine (stageset.envtest.image).
if { ! command -v mmdebstrap >/dev/null || ! command -v umoci >/dev/null || ! command -v strip >/dev/null; } \
        && command -v apt-get >/dev/null; then
    apt_install "the daemonless image build" mmdebstrap umoci binutils >&2
fi
# The dashboard's browser tests drive Debian's headless Chromium through Playwright: never a browser
# that downloads itself.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    apt_install "the dashboard's browser tests" chromium fonts-dejavu-core >&2
fi

# The SOPS tests make an OpenPGP key with gpg and encrypt for it with the real sops.
if ! command -v gpg >/dev/null && command -v apt-get >/dev/null; then
    apt_install "the SOPS tests' OpenPGP key" gnupg >&2
fi
# The release's image archive is pushed by skopeo (stageset.envtest.publish): on loopback by the
# tests, to the real registries by the release workflow.
if ! command -v skopeo >/dev/null && command -v apt-get >/dev/null; then
    apt_install "pushing the release's image to a registry" skopeo >&2
fi
# The test node (tests/node) runs Debian's containerd and runc with the CNI plugins, its own
# instance only: policy-rc.d keeps the package from starting a system containerd.
if { ! command -v containerd >/dev/null || ! command -v runc >/dev/null || [ ! -x /usr/lib/cni/bridge ] \
        || ! command -v iptables >/dev/null || ! command -v conntrack >/dev/null \
        || ! command -v ipset >/dev/null; } \
        && command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    apt_install "the test node" containerd runc containernetworking-plugins iptables conntrack ipset >&2
    if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
echo "$UV"
