"""A live start refused after some partitions opened closes them.

The live merger opens the checkpoint's partitions one by one; a followed file's
partition holds a raw file descriptor (``os.open``, which no garbage collection ever
closes). Here the checkpoint knows two followed files, and the second was rotated
away and deleted while the job was stopped: the start is refused (one line, as it
should be), but before the fix the first file's descriptor stayed open for the rest
of the process (the API, notebooks, a service retrying the job). Fails on the old
code (``in/a.jsonl`` still open), passes now.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main
from sealstream.errors import SourceExpiredError
from sealstream.testing.specs import files_source, spec_text, tumbling


def _lines(first: int, last: int) -> str:
    return "".join(json.dumps({"user": f"u{i % 3}", "ts": i * 100}) + "\n"
                   for i in range(first, last))


def _open_inputs(d: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(str(d / "in")):
            out.append(target)
    return sorted(out)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_refused_live_start_closes_the_files_it_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / "in" / "a.jsonl").write_text(_lines(0, 100))
    (d / "in" / "b.jsonl").write_text(_lines(0, 100))
    source = files_source(["in/a.jsonl", "in/b.jsonl"]) + \
        '\nfollow = true\npoll_ms = 20\nstop = "end"'
    (d / "end.toml").write_text(spec_text(
        "fdleak", source, batch_size=50, max_delay_ms=500, window=tumbling(1000),
        aggregates={"n": "count"}, late=True, errors=True, every_events=40, keep=10))
    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.chdir(d)
    assert main(["run", "end.toml", "--quiet"]) == 0  # checkpointed: both files read
    # b is rotated away while the job is stopped, and the rotated file deleted
    os.rename(d / "in" / "b.jsonl", d / "in" / "b.jsonl.1")
    (d / "in" / "b.jsonl").write_text(_lines(100, 150))
    (d / "in" / "b.jsonl.1").unlink()
    assert _open_inputs(d) == []
    with pytest.raises(SourceExpiredError) as err:
        sealstream.Job(sealstream.load_spec(d / "end.toml")).run()
    message = str(err.value)
    assert "'in/b.jsonl'" in message and "rotated away" in message, message
    assert "\n" not in message, message
    assert _open_inputs(d) == [], "the refused start left a followed file open"
