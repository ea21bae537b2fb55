"""A several-source job reading two NATS JetStream streams (a real nats-server,
docs/joins.md): the click-through rate equals the same join over the same events in
files, and a second run reads only what was published since on either stream."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "nats"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scenarios"))

from _jet import Jet  # noqa: E402
from _join_case import CTR_FIELDS, ctr_spec, source_block  # noqa: E402
from _story import committed  # noqa: E402


def _input(d: Path, seed: int, n: int, start_ms: int) -> dict[str, list[list[str]]]:
    """Two partitions per source; disorder below max_delay_ms, so no event is late
    whatever the interleaving of partitions (NATS positions are stream sequences)."""
    rng = random.Random(seed)
    out: dict[str, list[list[str]]] = {}
    for src, (k, t, v) in CTR_FIELDS.items():
        out[src] = []
        for p in range(2):
            now, lines = start_ms, []
            for _ in range(n):
                now += rng.randint(0, 200)
                lines.append(json.dumps({k: f"ad{rng.randint(0, 6)}",
                                         t: now - rng.randint(0, 400),
                                         v: round(rng.uniform(0, 3), 2)}))
            path = d / src / f"p{p}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
            out[src].append(lines)
    return out


def _publish(jets: dict[str, Jet], data: dict[str, list[list[str]]]) -> None:
    for src, parts in data.items():
        items: list[tuple[str, bytes | dict[str, Any]]] = []
        for i in range(max(map(len, parts))):
            for p, lines in enumerate(parts):
                if i < len(lines):
                    items.append((f"p{p}", lines[i].encode()))
        jets[src].publish(items)


def _spec(d: Path, sources: list[str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.toml").write_text(ctr_spec(
        sources, left="impressions", window={"kind": "tumbling", "size_ms": 5000},
        aggregates={"clicks.n": "count", "impressions.n": "count",
                    "impressions.cost": "sum(cost)"},
        outputs=(), checkpoint={"path": "ckpt", "every_events": 150}))
    return d / "spec.toml"


def _run(spec: Path, *extra: str) -> None:
    r = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                        *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def _results(d: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {(r["key"], r["window_start"]): r for r in committed(d, "out")}


def test_ctr_from_two_streams_equals_the_same_join_from_files(nats_server: Any,
                                                              tmp_path: Path) -> None:
    jets = {src: Jet(nats_server.url, f"S{uuid.uuid4().hex[:10]}") for src in CTR_FIELDS}
    for jet in jets.values():
        jet.create(["p0", "p1"])
    data = _input(tmp_path / "data", seed=4, n=300, start_ms=1_700_000_000_000)
    _publish(jets, data)

    def nats(src: str) -> str:
        jet = jets[src]
        return source_block(src, "nats", settings={
            "servers": jet.url, "stream": jet.stream, "subjects": [jet.s("*")], "stop": "end"})

    def files(src: str) -> str:
        paths = [str(tmp_path / "data" / src / f"p{p}.jsonl") for p in range(2)]
        return source_block(src, "jsonl", settings={"paths": paths})

    ref = _spec(tmp_path / "files", [files(s) for s in CTR_FIELDS])
    _run(ref)
    spec = _spec(tmp_path / "nats", [nats(s) for s in CTR_FIELDS])
    _run(spec)
    got, want = _results(spec.parent), _results(ref.parent)
    assert got.keys() == want.keys() and got
    assert any(r["clicks.n"] is None for r in want.values())  # the left join pads
    for k, r in got.items():  # sums may differ in the last bit: another addition order
        assert r.keys() == want[k].keys()
        for name, v in r.items():
            exp = want[k][name]
            assert (v == pytest.approx(exp, rel=1e-12) if isinstance(exp, float)
                    else v == exp), (k, name, v, exp)

    # the checkpoint bound both streams' positions: a second run reads only the new
    more = _input(tmp_path / "more", seed=5, n=20, start_ms=1_800_000_000_000)
    _publish(jets, more)
    summary = tmp_path / "summary.json"
    _run(spec, "--summary-json", str(summary))
    assert json.loads(summary.read_text())["this_run"]["events"] == 4 * 20
