# kbpg — make help lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
export ORT_DISABLE_TELEMETRY := 1

.DEFAULT_GOAL := help
.PHONY: help install dev browser demo test test-fast lint format typecheck docs reference check bench clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

# what running kbpg needs (the CLI, the HTTP server and page, `kbpg mcp`), without the test
# and lint toolchain (1.1 GB with it); a venv with the dev tools already has it
$(RUN_STAMP): pyproject.toml
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then :; else \
		$(PYTHON) -m venv $(VENV) && \
		$(BIN)/pip install --quiet --upgrade pip && \
		$(BIN)/pip install --quiet -e '.[mcp]'; \
	fi
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install kbpg with dev tools (tests, lint, types)

dev: install ## the same as install

demo: $(RUN_STAMP) ## start the embedded PostgreSQL, migrate, ingest the sample KB and search it
	$(BIN)/kbpg db upgrade
	$(BIN)/kbpg db status
	$(BIN)/kbpg ingest samples/kb --recursive
	$(BIN)/kbpg search "how do I renew a parking permit"
	@echo
	@echo "kbpg is installed in $(VENV)/bin; to type kbpg in this shell, run:"
	@echo "  . $(VENV)/bin/activate"

browser: ## Debian's chromium + chromedriver for the search page's browser test (when missing)
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		sudo_cmd=""; if [ "$$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi; \
		$$sudo_cmd apt-get update && \
		$$sudo_cmd apt-get install -y --no-install-recommends chromium chromium-driver; \
	fi

# -n auto: a worker per core, each with its own embedded PostgreSQL (the session fixtures);
# loadscope keeps a module on one worker, so a module-scoped fixture (a quality gate's ingest)
# runs once
PYTEST := $(BIN)/pytest -q -n auto --dist loadscope

test: $(STAMP) browser ## run the whole test suite against a real PostgreSQL (what CI runs)
	$(PYTEST) --durations=30

test-fast: $(STAMP) ## the suite without the NPL quality gate
	$(PYTEST) -m "not slow"

lint: $(STAMP) ## ruff lint + format check + the import contracts (layers, no cycles)
	$(BIN)/ruff check kbpg tests benchmarks migrations
	$(BIN)/ruff format --check kbpg tests benchmarks migrations
	$(BIN)/lint-imports --no-cache

format: $(STAMP) ## ruff format + autofix
	$(BIN)/ruff format kbpg tests benchmarks migrations
	$(BIN)/ruff check --fix kbpg tests benchmarks migrations

typecheck: $(STAMP) ## mypy --strict on kbpg/
	$(BIN)/mypy

docs: $(STAMP) ## build the documentation site (docs/ -> site/) with mkdocs --strict
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

reference: $(STAMP) ## write the generated pages again: docs/reference-cli.md, reference-sql.md, changelog.md
	$(BIN)/python -m tests.docs_reference

check: lint typecheck docs test ## lint, types, docs and tests

bench: $(STAMP) ## run the retrieval benchmarks (not tests; prints numbers)
	$(BIN)/python benchmarks/bench_search.py

clean: ## remove the venv, caches and build output (not your KBPG_HOME data)
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
