# Two commands do all the set-up on a fresh machine:
#   make demo   - install, start a local Kafka, serve the demo site, crawl it, show the store
#   make test   - install, lint, type-check, and run unit + integration tests on real Kafka/chDB
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: sysdeps setup demo test lint bench clean-cache

# System tools: Java + Maven run the local Kafka.
sysdeps:
	@command -v java >/dev/null && command -v mvn >/dev/null || \
	  (echo "installing Java and Maven (apt-get)"; apt-get update -qq && \
	   apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: sysdeps $(STAMP)

demo: setup
	$(BIN)/crawlfleet demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -p no:cacheprovider tests

bench: setup
	$(BIN)/python -m bench.crawl_bench --pages 10000

clean-cache:
	rm -rf .crawlfleet
