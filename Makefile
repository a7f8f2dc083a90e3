# The two commands a new machine needs (both install everything they use):
#   make run    the main job: the controller reconciling examples/ on a local control plane
#   make test   the whole test suite, linters and contracts included (what CI runs)
.PHONY: run test lint crds bench image helm docs


run:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen stageset run $(ARGS)

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

# helm built from the Go module proxy into ~/.cache/stageset (prints its path).
helm:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.envtest.helm

# docs/install.md's value reference, from helm/stageset/values.schema.json.
docs:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.envtest.chartdocs

# Benchmarks (numbers go to docs/benchmarks.md and docs/sources.md)
bench:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m bench.apply && $$uv run --frozen python -m bench.git_fetch
