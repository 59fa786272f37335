# The two commands that must work on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test test-under-load test-unit chromium screenshots typecheck lint chaos bench eval ladder dashboard schemas client install clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

# `make bench` also needs the `bench` extra (LangGraph, the peer it compares with); `make test` does not.
BENCH_STAMP := $(VENV)/.bench-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	@rm -f $(VENV)/.bench-*
	@touch $(BENCH_STAMP)

## Start the fleet on the embedded servers (or CTX_NATS_URL / CTX_DATABASE_URL), replay the bundled sample, serve.
run: $(STAMP)
	$(VENV)/bin/ctxfleet up

## The whole suite against real servers (embedded by default, CTX_*_URL when set).
test: $(STAMP) chromium
	$(PY) -m pytest

## Debian's chromium for the console's browser test (tests/browser): installed once, a no-op after.
## Without apt or root it says why and the browser test skips (or fails, under CI=true).
CHROMIUM := /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
		&& { apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
		     || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }; } \
		|| echo "make chromium: cannot install Debian's chromium here (needs apt-get as root)"; }

## Screenshots of the console's pages in docs/screenshots/: the browser tests walk a real fleet that
## replayed a bundled sample, and their screenshots (out/console/) are copied.
SCREENSHOTS := sessions timeline context served served-step compaction
screenshots: $(STAMP) chromium
	$(PY) -m pytest -q tests/browser/test_console.py tests/browser/test_served_pages.py
	@mkdir -p docs/screenshots
	for name in $(SCREENSHOTS); do cp out/console/$$name.png docs/screenshots/$$name.png; done

## The timing-sensitive tests (tests/under_load.py), each UNDER_LOAD_COUNT times in a row beside one
## busy process per core: a laptop or CI runner is a busy machine. CI runs them twice each.
UNDER_LOAD_COUNT ?= 20
test-under-load: $(STAMP)
	$(PY) -m tests.under_load --count $(UNDER_LOAD_COUNT)

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

## mypy --strict over contracts, services, workers and infra.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

## ruff over the whole tree: the checks of [tool.ruff.lint] in pyproject.toml, and the formatting.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## Every chaos scenario at full scale (kills, restarts, duplicates, poison; bounded to about 10 minutes).
chaos: $(STAMP)
	$(PY) -m tests.chaos --scale full --json out/chaos.json

## Throughput and latency figures (see docs/measurements.md); one part: make bench BENCH_ARGS="--only eval".
bench: $(BENCH_STAMP)
	$(PY) -m benchmarks.run $(BENCH_ARGS)

## What the model sees at 4k/8k/16k/32k on the bundled samples, beside full/window/masking (see docs/eval.md).
## Then again with a 4.7k-token system prompt, at the budgets where it fits. In this process, on servers of its own:
## a running fleet is left alone ('ctxfleet eval --fleet running' uses it, as the tenant 'eval').
eval: $(STAMP)
	$(VENV)/bin/ctxfleet eval --budget 4000 8000 16000 32000 --json out/eval.json
	$(VENV)/bin/ctxfleet eval --budget 8000 16000 32000 --system-prompt infra/samples/system-prompt-large.txt --json out/eval-large-prompt.json

## The ablation ladder (rungs A-G, docs/eval.md) on the samples and the synthetic traces: 8k with the
## 4.7k-token system prompt, then 32k. In this process, no fleet needed; about 15 minutes each on 2 shared cores.
ladder: $(STAMP)
	$(VENV)/bin/ctxfleet eval --ladder --budget 8000 --system-prompt infra/samples/system-prompt-large.txt --json out/ladder-8k.json
	$(VENV)/bin/ctxfleet eval --ladder --budget 32000 --json out/ladder-32k.json

## The dashboard picture of docs/operating.md: a real replay, /metrics scraped every second, plotted.
dashboard: $(STAMP)
	$(PY) -m benchmarks.dashboard_png --out docs/dashboard.png

## A JSON Schema (draft 2020-12) per wire message + the AsyncAPI 3.0.0 document, into schemas/ (docs/wire.md).
schemas: $(STAMP)
	$(VENV)/bin/ctxfleet schemas schemas

## The client distribution's wheel (clients/python: ctxfleet_client + contracts, nats-py and pydantic) into dist/.
client: $(STAMP)
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation clients/python -w dist

clean:
	rm -rf $(VENV) .ctxfleet schemas
