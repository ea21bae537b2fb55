"""``[source] fail_after_ms`` belongs to broker sources: a file source refuses it
(exit 2, one line) rather than accepting a setting that means nothing there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sealstream.errors import SpecError
from sealstream.pipeline.source import FileSource

SPEC = """
[pipeline]
name = "opts"

[source]
kind = "jsonl"
paths = ["in/*.jsonl"]
key = "user"
time = "ts"
{extra}

[window]
kind = "tumbling"
size_ms = 1000

[aggregates]
n = "count"

[sink]
kind = "jsonl"
path = "out"
"""


@pytest.mark.parametrize("follow", [False, True])
def test_a_file_source_refuses_fail_after_ms(follow: bool) -> None:
    with pytest.raises(SpecError, match="fail_after_ms"):
        FileSource(kind="jsonl", paths=("in/*.jsonl",), key="user", time="ts",
                   follow=follow, fail_after_ms=5000)


def test_the_cli_refuses_it_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"user":"a","ts":1}\n')
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(extra="follow = true\nfail_after_ms = 5000"))
    r = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "fail_after_ms" in r.stderr
