"""Helpers of the enrichment tests: a job over JSONL partitions enriched from a
reference table, run through ``sealstream.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sealstream.cli import main


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def spec_text(enrich: str, *, aggregates: str = 'n = "count"\nc = "last(country)"',
              transform: str = "", key: str = '"user"', errors: bool = False,
              paths: str = '["in/p0.jsonl"]', max_delay_ms: int = 0,
              lateness_ms: int = 0, every_events: int = 2, size_ms: int = 10000) -> str:
    return f"""
[pipeline]
name = "enr"
batch_size = 2

[source]
kind = "jsonl"
paths = {paths}
key = {key}
time = "ts"

[watermark]
max_delay_ms = {max_delay_ms}

[window]
kind = "tumbling"
size_ms = {size_ms}
allowed_lateness_ms = {lateness_ms}

{transform}

{enrich}

[aggregates]
{aggregates}

[sink]
kind = "jsonl"
path = "out"

[late]
kind = "jsonl"
path = "late"
{'[errors]' + chr(10) + 'kind = "jsonl"' + chr(10) + 'path = "errors"' if errors else ''}

[checkpoint]
path = "ckpt"
every_events = {every_events}
"""


def results(d: Path, sub: str = "out") -> list[dict[str, Any]]:
    rows = [json.loads(line) for f in sorted((d / sub).glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def run(spec: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``sealstream run SPEC -q ARGS``: (exit code, stderr)."""
    code = main(["run", str(spec), "-q", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    return code, err
