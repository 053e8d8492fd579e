# The two commands of the README: `make serve` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
REPO ?= examples/model_repository

.PHONY: install models serve test lint system-deps clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,llm,pytorch,fil,openvino,analyze,gpu]'
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

# Services the tests start themselves: redis-server for the Redis response cache; chromium renders the analyze report.
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
	@ldconfig -p | grep -q libb64.so.0d || { apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null; }

test: system-deps models lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
