# Two commands do all the set-up on a fresh machine:
#   make demo   - install, start a local Kafka, serve the demo site, crawl it, show the store
#   make test   - install, lint, type-check, and run unit + integration tests on real Kafka/chDB
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
DEV_STAMP := $(VENV)/.dev-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# setuptools explains editable installs in a ten-line warning on every install: not news.
QUIET_PIP := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q

.PHONY: help sysdeps setup demo test lint bench soak clean-cache dashboard-screenshot

PACKAGES := crawlfleet chaos schemas producers consumers streams infra core sites

# `make` alone, or `make help`: every target with its one-line description (the `##` text).
help: ## List the targets.
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  make %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# System tools: Java + Maven run the local Kafka; Debian's Chromium is the browser the
# dashboard's test drives (Playwright on /usr/bin/chromium: no browser download).
sysdeps: ## Install Java, Maven and Chromium (apt-get) if missing.
	@command -v java >/dev/null && command -v mvn >/dev/null || \
	  (echo "installing Java and Maven (apt-get)"; apt-get update -qq && \
	   apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null)
	@test -x /usr/bin/chromium && command -v chromedriver >/dev/null || \
	  (echo "installing Chromium (apt-get)"; apt-get update -qq && \
	   apt-get install -y -qq chromium chromium-driver >/dev/null)

# The demo needs the package alone; the tests add the dev extra (pytest, linters, manifest
# validators); the benchmark's peer (Scrapy) is installed by `make bench` alone.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(QUIET_PIP) --upgrade pip
	$(QUIET_PIP) -e .
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(QUIET_PIP) -e '.[dev]'
	@rm -f $(VENV)/.dev-* && touch $(DEV_STAMP)

$(BENCH_STAMP): $(DEV_STAMP)
	$(QUIET_PIP) -e '.[dev,bench]'
	@rm -f $(VENV)/.bench-* && touch $(BENCH_STAMP)

# Byte-compiled once here, as pip does for an installed package: the editable install
# leaves that to the first import, and where PYTHONDONTWRITEBYTECODE is set (as on this
# machine) every stage process compiled ~60 modules from source at each start (0.1 s of CPU
# each, five at a time). Up-to-date files are skipped.
setup: sysdeps $(STAMP) ## Make the venv and install crawlfleet (once per pyproject change).
	@$(BIN)/python -m compileall -q -j0 $(PACKAGES) bench >/dev/null

demo: setup ## Start a local Kafka, serve the demo site, crawl it, show the store.
	$(BIN)/crawlfleet demo

lint: setup $(DEV_STAMP) ## ruff and mypy.
	$(BIN)/ruff check .
	$(BIN)/mypy

# A crash of the test process itself (a C library's abort) names the test it was running.
# Python's own fault dump is off so the C library's assertion line ends the output.
test: lint ## Lint, then the unit and integration tests on real Kafka and chDB (~40 min).
	@rm -f .crawlfleet/current-test
	@$(BIN)/python -m pytest -p no:cacheprovider -p no:faulthandler --durations=40 tests || { rc=$$?; \
	  test -f .crawlfleet/current-test && \
	    echo "the test process died while running $$(cat .crawlfleet/current-test)"; \
	  exit $$rc; }

# README's picture of the dashboard: the browser test's screenshot after its demo crawls.
dashboard-screenshot: lint ## Regenerate docs/dashboard.png from the browser test.
	DASHBOARD_SCREENSHOT=docs/dashboard.png $(BIN)/python -m pytest -p no:cacheprovider \
	  tests/integration/test_dashboard_browser.py

bench: setup $(BENCH_STAMP) ## The 10,000-page crawl benchmark against Scrapy.
	$(BIN)/python -m bench.crawl_bench --pages 10000

# The fault soak: rounds of the 3-broker chaos scenario with mixed faults, each appended to
# bench/soak_results.jsonl (commit it); stops at the first round that loses or duplicates
# anything and leaves its evidence. Run it with nothing else on the machine, in pieces of at
# most 60 minutes: rounds on one commit add up (`crawlfleet chaos --summary`).
MINUTES ?= 60
soak: setup ## The fault soak for MINUTES (default 60) minutes.
	$(BIN)/crawlfleet chaos --soak $(MINUTES)

clean-cache: ## Remove .crawlfleet (local Kafka, stores, logs).
	rm -rf .crawlfleet
