"""``python -m bench``: run the benchmark (``--help`` for options)."""

from bench.harness import main
from bench.startup import after_bench

raise SystemExit(main() or after_bench())
