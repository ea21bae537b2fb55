"""A two-source join case: the engine's spec and files, and the expected output from
tests/reference.py plus the join rule written out in Python (docs/joins.md).

The reference model knows one source. The two sources are fed to it as one list of
partitions (clicks' files, then views' files: the union's read order), with their
fields renamed to one key ``k``, one time ``ts``, a 0/1 tag per source and each
source's value under ``SOURCE.FIELD``; per-source counts are count_if over the tag
and per-source value aggregates read ``SOURCE.FIELD``. The join rule is then applied
to its results here: inner keeps a window both sides saw, left one the left side
saw; a side not seen has null aggregates; ``ctr = clicks.n / views.n``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reference as ref  # noqa: E402
from helpers import Output, read_jsonl_dir  # noqa: E402

#: per source: (key field, time field, value field) in its files
FIELDS = {"clicks": ("k", "ts", "v"), "views": ("ad", "time", "cost")}
AGGREGATES = {"clicks.n": "count", "views.n": "count", "clicks.total": "sum(v)",
              "views.top": "max(cost)"}


@dataclass
class JoinCase:
    #: per source: partitions as (path as written, records); a record is
    #: (key, time, value or None) or None for a blank line
    files: dict[str, list[tuple[str, list[tuple[Any, int, Any] | None]]]]
    window: ref.WindowDef
    join: str = "inner"
    left: str = "clicks"
    max_delay_ms: int = 0
    batch_size: int = 64
    checkpoint_every: int | None = None
    extra_spec: list[str] = field(default_factory=list)

    def raw(self, src: str, rec: tuple[Any, int, Any] | None) -> dict[str, Any] | None:
        if rec is None:
            return None
        k, t, v = FIELDS[src]
        out: dict[str, Any] = {k: rec[0], t: rec[1]}
        if rec[2] is not None:
            out[v] = rec[2]
        return out

    def texts(self) -> list[tuple[str, str, list[dict[str, Any] | None]]]:
        """(source, path, raw records) of every partition in the union's read order."""
        out = []
        for src in sorted(self.files):
            for path, recs in self.files[src]:
                out.append((src, path, [self.raw(src, r) for r in recs]))
        return out

    def spec(self) -> str:
        w = self.window
        lines = ["[pipeline]", 'name = "joined"', f"batch_size = {self.batch_size}", ""]
        for src in self.files:  # as written: clicks first
            k, t, _ = FIELDS[src]
            paths = json.dumps([p for p, _ in self.files[src]])
            lines += [f"[sources.{src}]", 'kind = "jsonl"', f"paths = {paths}",
                      f'key = "{k}"', f'time = "{t}"', ""]
        lines += ["[watermark]", f"max_delay_ms = {self.max_delay_ms}", "", "[window]",
                  f'kind = "{w.kind}"']
        if w.kind in ("tumbling", "sliding"):
            lines.append(f"size_ms = {w.size_ms}")
        if w.kind == "sliding":
            lines.append(f"slide_ms = {w.slide_ms}")
        if w.kind == "session":
            lines.append(f"gap_ms = {w.gap_ms}")
        lines += [f"allowed_lateness_ms = {w.allowed_lateness_ms}", "", "[aggregates]"]
        lines += [f"{n} = {json.dumps(e)}" for n, e in AGGREGATES.items()]
        lines += ["", "[join]", f'type = "{self.join}"']
        if self.join == "left":
            lines.append(f'left = "{self.left}"')
        lines += ['fields.ctr = "clicks.n / views.n"', "",
                  "[sink]", 'kind = "jsonl"', 'path = "out"', "",
                  "[late]", 'kind = "jsonl"', 'path = "late"', ""]
        if self.checkpoint_every is not None:
            lines += ["[checkpoint]", 'path = "ckpt"',
                      f"every_events = {self.checkpoint_every}", ""]
        return "\n".join(lines + self.extra_spec) + "\n"

    def write(self, directory: Path) -> Path:
        for _src, path, recs in self.texts():
            p = directory / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("".join(("" if r is None else json.dumps(r)) + "\n" for r in recs),
                         encoding="utf-8")
        spec = directory / "spec.toml"
        spec.write_text(self.spec(), encoding="utf-8")
        return spec

    def expected(self) -> Output:
        parts: list[tuple[str, str]] = []
        raw_by: dict[tuple[str, int], dict[str, Any]] = {}
        for src, path, recs in self.texts():
            lines = []
            for off, (rec, r) in enumerate(zip(recs, self._recs(src, path), strict=True)):
                if rec is None or r is None:
                    lines.append("")
                    continue
                raw_by[(path, off)] = rec
                norm: dict[str, Any] = {"k": r[0], "ts": r[1], f"is_{src}": 1}
                if r[2] is not None:
                    norm[f"{src}.val"] = r[2]
                lines.append(json.dumps(norm))
            parts.append((path, "".join(x + "\n" for x in lines)))
        out = ref.run(
            parts, key="k", time="ts", max_delay_ms=self.max_delay_ms, window=self.window,
            aggregates={"clicks.n": "count_if(is_clicks)", "views.n": "count_if(is_views)",
                        "clicks.total": "sum(clicks.val)", "views.top": "max(views.val)"},
            conditions={"is_clicks": lambda r: r.get("is_clicks") == 1,
                        "is_views": lambda r: r.get("is_views") == 1},
        )
        results = []
        for r in out.results:
            seen = {"clicks": r["clicks.n"] > 0, "views": r["views.n"] > 0}
            if not (all(seen.values()) if self.join == "inner" else seen[self.left]):
                continue
            row = dict(r)
            for name in AGGREGATES:
                if not seen[name.split(".")[0]]:
                    row[name] = None
            c, v = row["clicks.n"], row["views.n"]
            ctr = None if c is None or v is None or v == 0 else c / v
            row["ctr"] = ctr if ctr is None or math.isfinite(ctr) else None
            results.append(row)
        late = []
        for e in out.late:
            late.append({**raw_by[(e["_partition"], e["_offset"])],
                         "_partition": e["_partition"], "_offset": e["_offset"]})
        return Output(results, late)

    def _recs(self, src: str, path: str) -> list[tuple[Any, int, Any] | None]:
        return dict(self.files[src])[path]


def run_engine(case: JoinCase, directory: Path) -> Output:
    from sealstream.cli import main

    spec = case.write(directory)
    rc = main(["run", str(spec)])
    assert rc == 0, f"sealstream run exited {rc}\n{case.spec()}"
    return Output(read_jsonl_dir(directory / "out"), read_jsonl_dir(directory / "late"))


# ------------------------------------------------------------ click-through-rate stories
# The story tests (test_join_kafka/nats/chaos/transforms.py) join clicks with
# impressions (or views) on an ad key; their specs differ only in the sources, the
# window, the aggregates and the outputs.

#: per CTR source: (key field, time field, value field) in its records
CTR_FIELDS = {"clicks": ("ad", "ts", "bid"), "impressions": ("ad_id", "shown_at", "cost")}


def _table(name: str, settings: dict[str, Any]) -> list[str]:
    # keys as written (dotted keys stay dotted), values as TOML (JSON's strings, numbers
    # and lists are TOML's too)
    return [f"[{name}]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items()), ""]


def source_block(name: str, kind: str, fields: tuple[str, str, str] | None = None,
                 settings: dict[str, Any] | None = None, extra: str = "") -> str:
    """``[sources.NAME]`` of ``kind`` keyed and timed by ``fields`` (CTR_FIELDS[NAME] by
    default), with ``settings`` and ``extra`` TOML lines (a sub-table, say) after it."""
    k, t, _ = fields or CTR_FIELDS[name]
    block = _table(f"sources.{name}",
                   {"kind": kind, **(settings or {}), "key": k, "time": t})
    return "\n".join(block) + extra


def ctr_spec(sources: list[str], *, left: str, window: dict[str, Any],
             aggregates: dict[str, str], name: str = "ctr", batch_size: int | None = 64,
             max_delay_ms: int | None = 1000, outputs: tuple[str, ...] = ("late", "errors"),
             checkpoint: dict[str, Any] | None = None) -> str:
    """A left join of ``sources`` (``[sources.NAME]`` blocks) on ``left`` with
    ``ctr = clicks.n / LEFT.n``, results into ``out`` and each of ``outputs``
    (late, errors) into a directory of its name."""
    head: dict[str, Any] = {"name": name}
    if batch_size is not None:
        head["batch_size"] = batch_size
    lines = _table("pipeline", head) + ["\n".join(sources), ""]
    if max_delay_ms is not None:
        lines += _table("watermark", {"max_delay_ms": max_delay_ms})
    lines += _table("window", window)
    lines += ["[aggregates]", *(f"{n} = {json.dumps(e)}" for n, e in aggregates.items()), ""]
    lines += ["[join]", 'type = "left"', f'left = "{left}"',
              f'fields.ctr = "clicks.n / {left}.n"', ""]
    for out in ("sink", *outputs):
        lines += _table(out, {"kind": "jsonl", "path": "out" if out == "sink" else out})
    if checkpoint is not None:
        lines += _table("checkpoint", checkpoint)
    return "\n".join(lines)
