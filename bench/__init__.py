"""sealstream's benchmark: ``python -m bench`` (``make bench``); see bench/README.md.

``bench.harness`` generates the workload, runs every configuration as a fresh
child process and writes ``bench/results/latest.{md,json}``; ``bench.runners``
holds the one-shot peers (polars, duckdb, optional bytewax) run by the children.
"""
