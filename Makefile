# Warden's two commands: `make run` (the console, worker and beat on this machine) and `make test`.
# Needs only python3. Both create .venv on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin

# `make test` talks to real PostgreSQL and Redis; these defaults are the local servers.
TEST_DATABASE_URL := $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/warden)
TEST_HARMONY_DATABASE_URL := $(or $(HARMONY_DATABASE_URL),postgres://postgres@127.0.0.1:5432/warden_harmony)
TEST_REDIS_URL := $(or $(REDIS_URL),redis://127.0.0.1:6379/0)
# `make test` runs on this many pytest-xdist processes; worker N uses the test databases
# test_<name>_gwN and Redis db (REDIS_URL's db + N) (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

.PHONY: run test test-slow test-model venv venv-dev bootstrap stop lint vendor

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@ $(VENV)/.installed

venv: $(VENV)/.installed

venv-dev: $(VENV)/.installed-dev

bootstrap: venv
	$(BIN)/python manage.py bootstrap

# `make run`: supervisor (supervisord.conf) runs daphne, the worker and beat; a process that dies is
# restarted while the others keep serving; Ctrl-C (or SIGTERM) stops all three (docs/deploy.md).
RUN_VAR_DIR = $(abspath $(or $(WARDEN_VAR_DIR),var))

run: bootstrap
	mkdir -p "$(RUN_VAR_DIR)/supervisor"
	PATH="$(BIN):$$PATH" WARDEN_VAR_DIR="$(RUN_VAR_DIR)" WARDEN_PORT="$(or $(WARDEN_PORT),8000)" \
		WARDEN_CELERY_QUEUE="$(or $(WARDEN_CELERY_QUEUE),warden)" exec $(BIN)/supervisord -c supervisord.conf

test: venv-dev
	DATABASE_URL="$(TEST_DATABASE_URL)" HARMONY_DATABASE_URL="$(TEST_HARMONY_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
		$(BIN)/pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The tests marked slow (browsers, real worker processes, many hosts): CI runs them after `make test`.
test-slow: venv-dev
	DATABASE_URL="$(TEST_DATABASE_URL)" HARMONY_DATABASE_URL="$(TEST_HARMONY_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
		$(BIN)/pytest -m slow $(PYTEST_ARGS)

# A small real model in the tests (docs/model.md, "A real model in the tests"): builds its own
# virtual environment once (outside the clone, WARDEN_MODEL_VENV, default
# ~/.cache/warden/model-venv; llama.cpp from source, 8-15 minutes on 2 cores), serves
# SmolLM2-135M on a free loopback port, runs the tests marked `model` and evaluate-model against it.
test-model: venv-dev
	DATABASE_URL="$(TEST_DATABASE_URL)" HARMONY_DATABASE_URL="$(TEST_HARMONY_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" \
		PYTHON="$(PYTHON)" bash tests/test-model.sh

stop: venv
	$(BIN)/python manage.py bootstrap --stop-workers --stop-redis

# ruff, and import-linter's contracts (pyproject.toml [tool.importlinter]): console > agent > fleet, and the
# order of agent's rooms
lint: venv-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The browser libraries, pinned in package.json/package-lock.json, copied from the npm registry's
# packages into the tree (committed: nothing is fetched at run time or from a CDN). Needs npm.
vendor:
	npm ci --ignore-scripts --no-audit --no-fund
	mkdir -p static/vendor tests/vendor
	cp node_modules/chart.js/dist/chart.umd.min.js static/vendor/chart.umd.min.js
	cp node_modules/chart.js/LICENSE.md static/vendor/chart.js.LICENSE.md
	cp node_modules/chartjs-plugin-zoom/dist/chartjs-plugin-zoom.min.js static/vendor/chartjs-plugin-zoom.min.js
	cp node_modules/chartjs-plugin-zoom/LICENSE.md static/vendor/chartjs-plugin-zoom.LICENSE.md
	cp node_modules/axe-core/axe.min.js tests/vendor/axe.min.js
	cp node_modules/axe-core/LICENSE tests/vendor/axe-core.LICENSE
