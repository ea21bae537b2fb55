# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

FLINK_VENV := bench/.flink-venv
QUIX_VENV  := bench/.quix-venv

.PHONY: demo test bench bench-flink bench-quix lint typecheck clean

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
	-@scripts/install-chromium >/dev/null  # the console's browser tests (tests/console)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy
	@# byte-compile once: with PYTHONDONTWRITEBYTECODE=1 (or a read-only checkout) every
	@# sealstream process a test starts would compile ~150 modules again (~0.3 CPU s)
	$(PY) -m compileall -q src/sealstream
	SEALSTREAM_TEST_PG="$${SEALSTREAM_TEST_PG:-$$(scripts/pg-test-server)}" \
	  $(PY) -m pytest -W error -p no:cacheprovider -n 2 --dist worksteal --durations=25

bench: $(STAMP) bench-flink bench-quix
	$(PY) -m bench
	$(PY) -m bench.store_cost
	$(PY) -m bench.s3_store
	$(PY) -m bench.archive
	$(PY) -m bench.s3_results
	$(PY) -m bench.incremental
	$(PY) -m bench.transforms
	$(PY) -m bench.joins
	$(PY) -m bench.flink_joins
	$(PY) -m bench.scaleout
	$(PY) -m bench.live
	$(PY) -m bench.speed
	$(PY) -m bench.live_soak
	$(PY) -m bench.nats
	$(PY) -m bench.kafka_eos
	$(PY) -m bench.agents
	$(PY) -m bench.receipts

# The PyFlink peer runs in its own venv (apache-flink pins its own pyarrow, numpy
# and pandas). Best effort: without Java or the package the peer is skipped.
bench-flink:
	@if ! command -v java >/dev/null; then \
	  echo "bench-flink: no java on PATH; the PyFlink peer will be skipped"; \
	elif ! $(FLINK_VENV)/bin/python -c "import pyflink" 2>/dev/null; then \
	  echo "bench-flink: installing apache-flink into $(FLINK_VENV) (a few minutes, once)"; \
	  ( $(PYTHON) -m venv $(FLINK_VENV) && \
	    $(FLINK_VENV)/bin/python -m pip install --quiet "apache-flink>=2.0,<3" ) || \
	  echo "bench-flink: could not install apache-flink; the PyFlink peer will be skipped"; \
	fi

# The Quix Streams peer runs in its own venv: quixstreams 3.28 pins confluent-kafka
# below 2.13, older than the project's. Best effort: without it the peer is skipped.
bench-quix:
	@if ! $(QUIX_VENV)/bin/python -c "import quixstreams" 2>/dev/null; then \
	  echo "bench-quix: installing quixstreams into $(QUIX_VENV) (once)"; \
	  ( $(PYTHON) -m venv $(QUIX_VENV) && \
	    $(QUIX_VENV)/bin/python -m pip install --quiet "quixstreams>=3.28,<4" ) || \
	  echo "bench-quix: could not install quixstreams; the Quix Streams peer will be skipped"; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(FLINK_VENV) $(QUIX_VENV) demo-run bench/data bench/work
