"""Story: a JetStream backfill (stop = "end") fires every window; more messages are
published; the job runs again. The second run continues from the watermark the data
reached: its new windows are computed, a message for a window the backfill emitted is
late (semantics section 10), and the whole equals the same two runs over files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import committed, write_spec  # noqa: E402

BASE = 1_700_000_000_000
WINDOW = 'kind = "tumbling"\nsize_ms = 2000'


def _part(n: int, p: int) -> list[dict[str, Any]]:
    """Part n of partition p: part 2 starts 1.5 s before part 1's end, so its first
    events belong to windows part 1's flush emitted."""
    start = BASE if n == 1 else BASE + 300 * 40 - 1500
    return [{"user": f"u{(i + p) % 3}", "ts": start + 300 * i, "amount": i + p, "i": i}
            for i in range(40)]


def _run(spec: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


def test_a_second_backfill_computes_new_windows_and_late_events(
    jet: Any, tmp_path: Path
) -> None:
    names = ["in/p0.jsonl", "in/p1.jsonl"]
    files, d = tmp_path / "files", tmp_path / "nats"
    for where in (files, d):
        (where / "in").mkdir(parents=True)
        for name in names:
            (where / name).write_text("")
    spec = write_spec(d, names, window=WINDOW, every_events=25, batch_size=7)
    subjects = json.dumps([jet.s(f"p{i}") for i in range(2)])
    source = (f'kind = "nats"\nservers = "{jet.url}"\nstream = "{jet.stream}"\n'
              f'subjects = {subjects}\nstop = "end"')
    spec.write_text(re.sub(r'kind = "jsonl"\npaths = \[[^\]]*\]', source, spec.read_text(),
                           count=1))
    fspec = write_spec(files, names, window=WINDOW, every_events=25, batch_size=7)
    jet.create(["p0", "p1"])
    for n in (1, 2):
        items: list[tuple[str, bytes | dict[str, Any]]] = []
        for i in range(40):  # interleaved as the file run reads them
            for p in range(2):
                rec = _part(n, p)[i]
                items.append((f"p{p}", json.dumps(rec).encode()))
                with (files / names[p]).open("a") as f:
                    f.write(json.dumps(rec) + "\n")
        jet.publish(items)
        _run(spec)
        _run(fspec)
    def by_id(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {(r["key"], r["window_start"], r["window_end"]): r for r in rows}

    assert by_id(committed(d, "out")) == by_id(committed(files, "out"))
    # part 2's events at or before part 1's newest time (BASE + 11_700) are late
    want = sorted((p, t) for p in range(2) for t in range(10_500, 11_701, 300))
    for where, parts in ((d, [jet.s("p0"), jet.s("p1")]), (files, names)):
        late = committed(where, "late")
        assert sorted((parts.index(r["_partition"]), r["ts"] - BASE) for r in late) == want
    newest = BASE + 300 * 39
    results = committed(d, "out")
    assert any(r["window_start"] > newest for r in results)
    ids = [(r["key"], r["window_start"]) for r in results]
    assert len(ids) == len(set(ids))
