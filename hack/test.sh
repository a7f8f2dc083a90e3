#!/usr/bin/env bash
# The whole test command: set-up, static checks, then every test (unit, real apiserver, e2e).
# Exits non-zero on any failure.  pytest's "no tests collected" (exit 5) is a failure too:
# a suite that ran nothing proves nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

UV="$(./hack/bootstrap.sh)"
run() { "$UV" run --frozen --no-sync "$@"; }

start=$(date +%s)
if [ "${1:-}" != "--lint-only" ]; then
    # Flux's source-controller (the Flux sources e2e test) is the heaviest Go build (~6.5 CPU-minutes
    # and ~2 GiB of modules when every cache is cold; a cache hit costs nothing): it starts now, in
    # the background, so its downloads and compiles overlap the static checks and the other builds.
    sc_log="$(mktemp)"
    ( sc_start=$(date +%s); run python -m stageset.envtest.sourcecontroller
      echo "built or found in $(( $(date +%s) - sc_start ))s" ) >"$sc_log" 2>&1 &
    sc_pid=$!
fi
echo "== ruff"; run ruff check stageset sources tests bench
echo "== mypy --strict"; run mypy
echo "== import contracts"; run lint-imports
echo "== CRDs are current"; run python -m stageset.api.crd --check
echo "== docs: generated pages current (API, CLI, Helm values, runbooks), site builds offline, no broken link"
run python -m stageset.envtest.docs --check
site="$(mktemp -d)"; run mkdocs build --strict --site-dir "$site"; rm -rf "$site"
[ "${1:-}" = "--lint-only" ] && exit 0

echo "== control plane (built once, cached in ~/.cache/stageset)"
run python -m stageset.envtest.build
echo "== kustomize and the SOPS helper (built once, cached in ~/.cache/stageset)"
run python -m stageset.build
echo "== sops and age-keygen (tests only; built once from the helper's module, cached in ~/.cache/stageset)"
run python -m stageset.envtest.sops
echo "== helm (built once, cached in ~/.cache/stageset)"
run python -m stageset.envtest.helm
echo "== toxiproxy (built once, cached in ~/.cache/stageset; the fault suite's proxy)"
run python -m stageset.envtest.toxiproxy
echo "== kubectl, actionlint, syft (built once, cached; the kubectl plugin, workflow and release tests)"
run python -m stageset.envtest.kubectl
run python -m stageset.envtest.actionlint
run python -m stageset.envtest.syft
echo "== container image (built daemonlessly, cached by content in ~/.cache/stageset/image)"
if [ "$(id -u)" -eq 0 ]; then
    step=$(date +%s)
    UV="$UV" run python -m stageset.envtest.image
    echo "   image step took $(( $(date +%s) - step ))s"
else
    echo "   skipped: needs root (mmdebstrap, chroot); tests/image skips too, and fails under CI=true"
fi

echo "== Flux source-controller (built in the background since the start, cached in ~/.cache/stageset)"
if ! wait "$sc_pid"; then
    cat "$sc_log" >&2
    echo "building source-controller failed" >&2
    exit 1
fi
echo "   $(tail -2 "$sc_log" | paste -sd ' ')"; rm -f "$sc_log"

echo "== pytest"
set +e
run pytest -n "${PYTEST_WORKERS:-auto}" --dist loadfile -q "$@"
status=$?
set -e
echo "== test command took $(( $(date +%s) - start ))s"
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    exit 1
fi
exit "$status"
