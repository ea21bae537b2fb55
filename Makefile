# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m sealstream.demo

# The PostgreSQL tests use the server scripts/pg-test-server starts (best effort:
# without PostgreSQL they skip, unless SEALSTREAM_REQUIRE_PG=1 as in CI).
test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy
	SEALSTREAM_TEST_PG="$${SEALSTREAM_TEST_PG:-$$(scripts/pg-test-server)}" \
	  $(PY) -m pytest -W error -p no:cacheprovider -n 2 --dist worksteal

bench: $(STAMP)
	$(PY) -m bench
	$(PY) -m bench.store_cost
	$(PY) -m bench.incremental

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) demo-run bench/data bench/work
