"""The README's click-through-rate job (the same blocks as docs/joins.md) runs end to
end in its spec and Python forms, and agrees with a one-shot Polars SQL query of the
shape a Flink user would write (a left join of two aggregated windowed subqueries)."""

from __future__ import annotations

import json
import math
import random
import re
import runpy
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.cli import main

ROOT = Path(__file__).resolve().parents[2]
TITLE = "Joins: click-through rate per ad per minute"


def _readme_block(lang: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"## {re.escape(TITLE)}\n(?:(?!\n## ).)*?```{lang}\n(.*?)```", text, re.S)
    assert m, f"README has no {lang} block under '## {TITLE}'"
    return m.group(1)


def _doc_block(section: str, lang: str) -> str:
    text = (ROOT / "docs" / "joins.md").read_text(encoding="utf-8")
    m = re.search(rf"## {section}\n\n```{lang}\n(.*?)```", text, re.S)
    assert m, f"docs/joins.md has no {lang} block under '## {section}'"
    return m.group(1)


def _inputs(d: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Clicks (JSONL) and impressions (CSV), two files each; every file's disorder (3 s)
    stays below max_delay_ms (5 s), so no event is late."""
    rng = random.Random(34)
    clicks: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    (d / "clicks").mkdir(parents=True)
    (d / "impressions").mkdir(parents=True)
    for part in range(2):
        t = 1_717_000_000_000
        rows = []
        for _ in range(2500):
            t += rng.randint(0, 200)
            rows.append({"ad_id": f"ad{rng.randint(0, 40)}", "shown_at": t - rng.randint(0, 3000),
                         "cost": rng.choice([rng.randint(1, 9), round(rng.uniform(0, 2), 3)])})
        shown += rows
        (d / "impressions" / f"i{part}.csv").write_text(
            "ad_id,shown_at,cost\n" + "".join(f"{r['ad_id']},{r['shown_at']},{r['cost']}\n"
                                              for r in rows))
        t = 1_717_000_000_000
        rows = []
        for _ in range(300):
            t += rng.randint(0, 1700)
            rows.append({"ad": f"ad{rng.randint(0, 45)}", "ts": t - rng.randint(0, 3000)})
        clicks += rows
        (d / "clicks" / f"c{part}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    return pl.DataFrame(clicks), pl.DataFrame(shown, schema_overrides={"cost": pl.Float64})


SQL = """
SELECT i.ad_id AS key, i.window_start, c.n AS clicks_n, i.n AS impressions_n,
       i.cost AS impressions_cost, CAST(c.n AS DOUBLE) / i.n AS ctr
FROM (SELECT ad_id, shown_at // 60000 * 60000 AS window_start, COUNT(*) AS n,
             SUM(cost) AS cost
      FROM impressions GROUP BY ad_id, window_start) i
LEFT JOIN
     (SELECT ad, ts // 60000 * 60000 AS window_start, COUNT(*) AS n
      FROM clicks GROUP BY ad, window_start) c
ON i.ad_id = c.ad AND i.window_start = c.window_start
"""


def _results(d: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for f in sorted(d.glob("*.jsonl")) for x in f.read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["key"], r["window_start"]))


def test_readme_ctr_job_runs_in_spec_and_python_and_matches_sql(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _readme_block("toml") == _doc_block("The spec", "toml")
    assert _readme_block("python") == _doc_block("The same in Python", "python")
    clicks, shown = _inputs(tmp_path / "spec")
    (tmp_path / "spec" / "spec.toml").write_text(_readme_block("toml"))
    assert main(["run", str(tmp_path / "spec" / "spec.toml"), "--quiet"]) == 0
    shutil.copytree(tmp_path / "spec" / "clicks", tmp_path / "py" / "clicks")
    shutil.copytree(tmp_path / "spec" / "impressions", tmp_path / "py" / "impressions")
    (tmp_path / "py" / "job.py").write_text(_readme_block("python"))
    monkeypatch.chdir(tmp_path / "py")
    runpy.run_path(str(tmp_path / "py" / "job.py"), run_name="__main__")
    got = _results(tmp_path / "spec" / "ctr-per-minute")
    py = _results(tmp_path / "py" / "ctr-per-minute")
    # the same results; float sums within 1e-9 relative (semantics section 6)
    assert len(got) == len(py)
    for a, b in zip(got, py, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float) and isinstance(b[k], float):
                assert math.isclose(a[k], b[k], rel_tol=1e-9), (k, a, b)
            else:
                assert a[k] == b[k] and type(a[k]) is type(b[k]), (k, a, b)

    want = pl.SQLContext(clicks=clicks, impressions=shown).execute(SQL, eager=True)
    assert want.height == len(got) > 100
    assert any(r["clicks.n"] is None for r in got) and any(r["clicks.n"] for r in got)
    by_id = {(r["key"], r["window_start"]): r for r in got}
    for w in want.iter_rows(named=True):
        r = by_id[(w["key"], w["window_start"])]
        assert r["window_end"] == w["window_start"] + 60_000
        assert r["clicks.n"] == w["clicks_n"] and r["impressions.n"] == w["impressions_n"]
        assert math.isclose(r["impressions.cost"], w["impressions_cost"], rel_tol=1e-9)
        if w["ctr"] is None:
            assert r["ctr"] is None
        else:
            assert math.isclose(r["ctr"], w["ctr"], rel_tol=1e-9)
