# The two commands a newcomer needs:  make demo  and  make test
# Both create .venv with Python 3.12+ and install the project into it.

PYTHON ?= $(shell command -v python3.12 >/dev/null 2>&1 && echo python3.12 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINT_PATHS := django_dispatch tests example_project $(wildcard benchmarks)

.PHONY: demo worker test test-fast test-fast-sqlite test-fast-postgres test-postgres test-pgbouncer test-chaos test-sqlite test-matrix docs package-check lint typecheck bench bench-quick bench-fleet bench-fleet-quick clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), "django_dispatch needs Python 3.12+; run with PYTHON=/path/to/python3.12"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

## demo: migrate the example project (SQLite), enqueue demo jobs, run a worker until they are done
demo: $(STAMP)
	cd example_project && ../$(PY) manage.py migrate -v0
	cd example_project && ../$(PY) manage.py enqueue_demo
	cd example_project && ../$(PY) manage.py rundispatch --burst
	cd example_project && ../$(PY) manage.py show_demo

## worker: run the example project's worker until Ctrl-C
worker: $(STAMP)
	cd example_project && ../$(PY) manage.py rundispatch

## test: the whole suite on a throwaway PostgreSQL, again through PgBouncer (the
## `pgbouncer` tier), the chaos suite in its bounded form, on SQLite, the docs
## site and the package check, then lint and type checks. What CI runs (.ci/run).
test: $(STAMP)
	scripts/ensure-chromium
	scripts/with-postgres $(MAKE) --no-print-directory test-postgres test-pgbouncer
	$(MAKE) --no-print-directory test-chaos CHAOS_ROUNDS=1
	$(MAKE) --no-print-directory check-rules test-prometheus
	$(MAKE) --no-print-directory test-replica
	$(MAKE) --no-print-directory test-sqlite
	$(MAKE) --no-print-directory test-matrix
	$(MAKE) --no-print-directory docs package-check
	$(MAKE) --no-print-directory lint typecheck

## test-fast: the unit and store tests, in about two minutes: no worker or other process
## (`slow`), browser, chaos or PgBouncer run. Two runs side by side: the pure
## tests and the store tests on SQLite; the store tests on PostgreSQL, that of
## DATABASE_URL or a throwaway one when PostgreSQL is installed (else skipped).
FAST_PURE := tests/unit
FAST_DB := tests/store tests/acceptance/test_backend.py
FAST_PYTEST = $(PY) -m pytest -q -m "not slow and not browser and not chaos" $(PYTEST_ARGS)
test-fast: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-fast-sqlite test-fast-postgres

test-fast-sqlite: $(STAMP)
	DISPATCH_TEST_DB=sqlite $(FAST_PYTEST) $(FAST_PURE) $(FAST_DB)

test-fast-postgres: $(STAMP)
	@if [ -n "$${DATABASE_URL:-}" ]; then \
		echo "DISPATCH_TEST_DB=postgres $(FAST_PYTEST) $(FAST_DB)"; \
		DISPATCH_TEST_DB=postgres $(FAST_PYTEST) $(FAST_DB); \
	elif ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null; then \
		echo "scripts/with-postgres env DISPATCH_TEST_DB=postgres $(FAST_PYTEST) $(FAST_DB)"; \
		scripts/with-postgres env DISPATCH_TEST_DB=postgres $(FAST_PYTEST) $(FAST_DB); \
	else \
		echo "test-fast: no PostgreSQL (set DATABASE_URL, or install postgresql): SQLite only"; \
	fi

## test-postgres, test-pgbouncer: run under scripts/with-postgres (DATABASE_URL, PGBOUNCER_URL)
test-postgres: $(STAMP)
	DISPATCH_TEST_DB=postgres $(PY) -m pytest $(PYTEST_ARGS)

## test-pgbouncer: the tier marked `pgbouncer`, through PgBouncer in transaction mode, LISTEN off
test-pgbouncer: $(STAMP)
	DISPATCH_TEST_DB=pgbouncer $(PY) -m pytest -m pgbouncer $(PYTEST_ARGS)

## test-chaos: workers SIGKILLed and frozen, PostgreSQL crashed, PgBouncer restarted, low
## server timeouts, on servers of its own (tests/chaos/); CHAOS_ROUNDS faults per scenario
## (`make test` runs it with 1), CHAOS_SEED to replay the random choices
CHAOS_ROUNDS ?= 3
test-chaos: $(STAMP)
	scripts/ensure-postgres
	DISPATCH_TEST_DB=chaos CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(PY) -m pytest tests/chaos $(PYTEST_ARGS)

## check-rules: contrib/prometheus/alerts.yml is valid (promtool check rules) and its
## unit tests pass (promtool test rules contrib/prometheus/alerts_test.yml)
## test-prometheus: the tier marked `prometheus` (tests/prometheus/): a real Prometheus
## scrapes real workers and the metrics view, runs the dashboard's queries and the
## alerts; Debian's prometheus is installed when missing (scripts/ensure-prometheus)
.PHONY: check-rules test-prometheus test-replica
check-rules:
	scripts/ensure-prometheus
	promtool check rules contrib/prometheus/alerts.yml
	promtool test rules contrib/prometheus/alerts_test.yml

test-prometheus: $(STAMP)
	scripts/ensure-prometheus
	scripts/with-postgres env DISPATCH_TEST_DB=prometheus $(PY) -m pytest tests/prometheus $(PYTEST_ARGS)

## test-replica: the tier marked `replica` (tests/replica/): the console, the admin's change
## lists and the list functions read from a real streaming replica (scripts/with-replica:
## pg_basebackup of the throwaway server), and from the primary when it is stopped or lags
test-replica: $(STAMP)
	scripts/with-postgres scripts/with-replica env DISPATCH_TEST_DB=replica $(PY) -m pytest --ds=tests.replica.settings tests/replica $(PYTEST_ARGS)

test-sqlite: $(STAMP)
	DISPATCH_TEST_DB=sqlite $(PY) -m pytest $(PYTEST_ARGS)

## test-matrix: the other supported Djangos (the full suite runs on 6.1): the Tasks API
## conformance, backend and worker tests on Django 5.2 LTS + django-tasks and 6.0, on SQLite
## and PostgreSQL (.venv-django52, .venv-django60), then the wheel installed beside each of
## 5.2, 6.0 and 6.1 runs the example project's demo jobs (scripts/test-matrix)
test-matrix:
	PYTHON=$(PYTHON) scripts/test-matrix $(MATRIX)

## docs: build the documentation site into site/ (MkDocs, mkdocs.yml); any warning,
## such as a broken link or anchor, fails the build
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

## package-check: build the sdist and the wheel, twine check them, install the wheel
## into a fresh virtualenv and run the example project's jobs on it (scripts/check-package)
package-check: $(STAMP)
	PYTHON=$(PY) scripts/check-package

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

typecheck: $(STAMP)
	DISPATCH_TEST_DB=sqlite $(VENV)/bin/mypy

## bench: the benchmark against peer queues (each at its defaults and slot-matched), with
## every django_dispatch check (flatness, partitions, scale, fleet, rss); about an hour;
## then history at scale (benchmarks/history.py: the operators' reads and a purge beside
## 10,000,000 finished jobs, about 15 minutes); results in benchmarks/results/
bench: $(STAMP)
	$(PY) benchmarks/run.py --flatness --partitions --concurrency-limits --mixed-sizes --scale --fleet --rss --async-sleep --atomic --map
	$(PY) benchmarks/history.py

bench-quick: $(STAMP)
	$(PY) benchmarks/run.py --quick
	$(PY) benchmarks/history.py --quick

## bench-fleet: the fleet curve alone (1, 2, 5, 10, 25, 50 processes x 4 slots through
## PgBouncer, 3 rounds each, about 15 minutes); bench-fleet-quick: a smoke run of it
bench-fleet: $(STAMP)
	$(PY) benchmarks/run.py --systems dispatch --checks-only --fleet --tag fleet

bench-fleet-quick: $(STAMP)
	$(PY) benchmarks/run.py --systems dispatch --checks-only --fleet --quick --tag fleet-quick

clean:
	rm -rf $(VENV) .venv-django52 .venv-django60 example_project/db.sqlite3* tests/.sqlite site dist
