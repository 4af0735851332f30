# The single entry point. `make demo` and `make test` create the virtualenv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.keel-installed

.PHONY: demo test lint typecheck bench chaos soak clean

# compat: a plain path in a .pth file, which mypy follows (PEP 660's default import hook it does
# not), so a project beside this checkout type-checks against it.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]" \
	  --config-settings editable_mode=compat
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/keel demo

# One pytest run over tests/, cheapest tier first; it ends with a line per tier (tests/README.md):
# "tier unit: 158 passed in 9.8 s". Exit status 5 (no test collected) fails a full run, but
# only means "nothing matched" when PYTEST_ARGS narrows it (e.g. PYTEST_ARGS='-k fencing').
# TEST_JOBS processes share the tests (pytest-xdist; most tests wait, on fsyncs, leases and
# subprocesses, rather than compute); TEST_JOBS=0 runs them in this one process, in tier order.
NO_TESTS_OK := $(if $(strip $(PYTEST_ARGS)),true,false)
TEST_JOBS ?= 3
test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal $(PYTEST_ARGS) \
	  || { status=$$?; [ $$status -eq 5 ] && $(NO_TESTS_OK); }

lint: $(STAMP)
	$(BIN)/ruff check keel examples tests bench
	$(BIN)/ruff format --check keel examples tests bench
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

BENCH_STAMP := $(VENV)/.keel-bench-installed
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev,bench]" \
	  --config-settings editable_mode=compat
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf .keel .pytest_cache .mypy_cache .ruff_cache

# The crash matrix on both examples, on SQLite and (when $KEEL_TEST_POSTGRES_URL is set) on
# PostgreSQL; CHAOS_ARGS may cap occurrences per point (e.g. --max-occurrences 3). CHAOS_JOBS
# cells run at once, each on its own database and sinks: the same cells, in less time.
CHAOS_ARGS ?=
CHAOS_JOBS ?= 2
CHAOS_OUT := .keel/chaos
CHAOS_TICKET := keel.demo.support_ticket:app --workflow support-ticket \
	--input keel/demo/support_ticket/sample-ticket.json \
	--env 'SUPPORT_SMTP_URL={smtp_url}' --env 'SUPPORT_MAIL_SPOOL={smtp_spool}'
CHAOS_NEWSLETTER := examples.newsletter:app --workflow newsletter \
	--input examples/newsletter/sample-issue.json \
	--env 'NEWSLETTER_SMTP_URL={smtp_url}' --env 'NEWSLETTER_MAIL_SPOOL={smtp_spool}'

chaos: $(STAMP)
	mkdir -p $(CHAOS_OUT)
	$(BIN)/keel chaos $(CHAOS_TICKET) --backend sqlite --jobs $(CHAOS_JOBS) $(CHAOS_ARGS) --junit $(CHAOS_OUT)/ticket-sqlite.xml
	$(BIN)/keel chaos $(CHAOS_NEWSLETTER) --backend sqlite --jobs $(CHAOS_JOBS) $(CHAOS_ARGS) --junit $(CHAOS_OUT)/newsletter-sqlite.xml
	if [ -n "$$KEEL_TEST_POSTGRES_URL" ]; then \
	  $(BIN)/keel chaos $(CHAOS_TICKET) --backend postgres --db "$$KEEL_TEST_POSTGRES_URL" --jobs $(CHAOS_JOBS) $(CHAOS_ARGS) --junit $(CHAOS_OUT)/ticket-postgres.xml && \
	  $(BIN)/keel chaos $(CHAOS_NEWSLETTER) --backend postgres --db "$$KEEL_TEST_POSTGRES_URL" --jobs $(CHAOS_JOBS) $(CHAOS_ARGS) --junit $(CHAOS_OUT)/newsletter-postgres.xml; \
	else echo "PostgreSQL chaos matrix SKIPPED: set KEEL_TEST_POSTGRES_URL"; fi

# Many runs at once, workers killed (and on PostgreSQL frozen) at random moments.
SOAK_RUNS ?= 30
soak: $(STAMP)
	$(BIN)/keel chaos $(CHAOS_TICKET) --backend sqlite --no-matrix --soak $(SOAK_RUNS)
	if [ -n "$$KEEL_TEST_POSTGRES_URL" ]; then \
	  $(BIN)/keel chaos $(CHAOS_TICKET) --backend postgres --db "$$KEEL_TEST_POSTGRES_URL" --no-matrix --soak $(SOAK_RUNS); \
	fi
