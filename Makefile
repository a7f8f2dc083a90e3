# The two commands a new machine needs (both install everything they use):
#   make run    the main job: the controller reconciling examples/ on a local control plane
#   make test   the whole test suite, linters and contracts included (what CI runs)
.PHONY: run demo-change test lint crds docs bench image helm release publish


run:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen stageset run $(ARGS)

# While `make run` runs: toggle the example ConfigMap's currency (EUR <-> USD) in examples/; the
# GitRepository's next poll (15s) fetches it as a new commit and the StageSet applies it.
# Run it again to switch back.
demo-change:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.cli.demo change

test:
	@./hack/test.sh

lint:
	@./hack/test.sh --lint-only

crds:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.api.crd

# The controller image as an OCI archive (daemonless: mmdebstrap + umoci, needs root); with a
# container engine use the Containerfile instead.  Prints the archive's path.
image:
	@uv=$$(./hack/bootstrap.sh) && UV=$$uv $$uv run --frozen python -m stageset.envtest.image --summary

# One version everywhere (pyproject.toml, Chart.yaml version/appVersion, uv.lock), then dist/$(VERSION)/:
# the chart package, the image archive (as `make image`, needs root), its SBOM (syft), the CLI's
# wheels (x86_64 and aarch64 with the Go helpers inside, and a pure one), the release notes from
# CHANGELOG.md and SHA256SUMS.  `make release VERSION=0.3.0`; docs/releasing.md.
release:
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z" >&2; exit 2; }
	@uv=$$(./hack/bootstrap.sh) && UV=$$uv $$uv run --frozen python -m stageset.envtest.release $(VERSION)

# Push dist/$(VERSION)/'s image archive (skopeo) and chart (helm push) to $(REGISTRY) (default: the
# chart's, ghcr.io): image <registry>/stageset/stageset:<version>, chart
# oci://<registry>/stageset/charts/stageset; prints both digests as JSON.  Log in first (skopeo login,
# helm registry login).  Install from there with `--set image.registry=<registry>`.
# `make publish VERSION=0.3.0 REGISTRY=registry.example.com`; the release workflow runs it on a tag.
publish:
	@test -n "$(VERSION)" || { echo "usage: make publish VERSION=x.y.z [REGISTRY=host]" >&2; exit 2; }
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.envtest.publish $(VERSION) \
		$(if $(REGISTRY),--registry $(REGISTRY)) $(ARGS)

# helm built from the Go module proxy into ~/.cache/stageset (prints its path).
helm:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.envtest.helm

# The generated docs pages (API, CLI, runbook index, Helm values from values.schema.json) and the
# site, built offline into site/ (mkdocs --strict: a broken link or anchor fails).  `make test`
# checks both.
docs:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.envtest.docs && \
		$$uv run --frozen mkdocs build --strict --site-dir site

# Benchmarks (numbers go to docs/benchmarks.md, docs/sources.md and docs/scale.md; bench.peers builds
# Flux's source-controller and kustomize-controller first, once, into ~/.cache/stageset)
bench:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m bench.apply && $$uv run --frozen python -m bench.git_fetch && \
		$$uv run --frozen python -m bench.flux_sources && $$uv run --frozen python -m bench.peers && \
		$$uv run --frozen python -m bench.memory
