# The two commands a new machine needs (both install everything they use):
#   make run    the main job: the controller reconciling examples/ on a local control plane
#   make test   the whole test suite, linters and contracts included (what CI runs)
.PHONY: run test lint crds bench


run:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen stageset run $(ARGS)

test:
	@./hack/test.sh

lint:
	@./hack/test.sh --lint-only

crds:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m stageset.api.crd

# Benchmarks (numbers go to docs/benchmarks.md and docs/sources.md)
bench:
	@uv=$$(./hack/bootstrap.sh) && $$uv run --frozen python -m bench.apply && $$uv run --frozen python -m bench.git_fetch
