"""sealstream's benchmark: ``python -m bench`` (``make bench``); see bench/README.md.

``bench.harness`` generates the workload, runs every configuration as a fresh
child process and writes ``bench/results/latest.{md,json}``; ``bench.runners``
holds the one-shot peers (polars, duckdb, optional bytewax) run by the children.
"""

from pathlib import Path as _Path


def _compile_sources() -> None:
    """Byte-compile ``src/sealstream`` once per benchmark, as ``pip install`` does for a
    wheel (and did for Polars, DuckDB and every peer we compare with). This machine sets
    ``PYTHONDONTWRITEBYTECODE=1`` and an editable checkout has no ``__pycache__``, so
    without it every sealstream process a benchmark starts compiles ~150 modules again
    (about 0.3 CPU s a run, charged to sealstream alone). Every ``python -m bench.*``
    imports this package first, so each benchmark gets it."""
    import compileall

    src = _Path(__file__).resolve().parents[1] / "src" / "sealstream"
    if src.is_dir():
        compileall.compile_dir(str(src), quiet=1)


_compile_sources()
