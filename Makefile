# Two commands matter: `make run` and `make test`. Everything else is for developers.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test lint bench clean browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,local]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m gateway serve

test: $(STAMP) browser
	$(PY) -m pytest

# The status-page test drives Debian's headless Chromium; install it when we can (CI is root).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	  >/dev/null) || echo "chromium not installed: the browser test will be skipped"; }

lint: $(STAMP)
	$(VENV)/bin/ruff check gateway providers tests bench
	$(VENV)/bin/mypy gateway providers

# Fails (bench/run.py exits non-zero) when the gateway's req/s at 50 clients is under 0.75x the
# minimal proxy's measured in the same run: the benchmark's regression guard.
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
