"""Deterministic, vectorised generator of realistic event streams, and a spec writer.

Used by the demo, the benchmark (``python -m bench``) and the tests::

    >>> from sealstream.testing.datagen import generate, write_spec
    >>> paths = generate("in", events=1_000, keys=50, partitions=2)   # doctest: +SKIP
    >>> write_spec("job.toml", paths=paths, checkpoint="ckpt")         # doctest: +SKIP

or from a shell: ``python -m sealstream.testing.datagen in --events 100000 --partitions 2``.

The stream model (every choice below is part of the documented contract of this
module; the tests check the bounds)
--------------------------------------------------------------------------------
* ``events`` records in total, split over ``partitions`` files ``p0.<fmt>``,
  ``p1.<fmt>``, ... as evenly as possible (the first ``events % partitions``
  files get one more). Bad records count as records: a file holds exactly its
  share of lines (JSONL, CSV after its header) or rows (Parquet).
* Records are ``{"user": "u00042", "ts": 1700000012345, "amount": 12.34}``. The
  key is ``u`` plus the key index zero-padded to at least 5 digits.
* Keys follow a bounded Zipf law: key ``i`` (0-based) is drawn with probability
  proportional to ``1 / (i + 1) ** skew`` over the ``keys`` keys, so ``u00000``
  is the hottest. The default ``skew=0.8`` gives the hottest of 10,000 keys about
  4 % of the events and leaves every key some traffic; ``skew=0`` is uniform.
* Amounts are log-normal (median about 20, in cents precision): written with
  exactly two decimals (``12.34``, ``5.00``) when ``float_amounts`` is true, or
  as whole integers (``12``) otherwise (sums then stay integers).
* Each partition's *arrival clock* starts at ``start_ms + disorder_ms`` (so no
  on-time event is earlier than ``start_ms``) and advances by
  exponential inter-arrival gaps with mean ``1000 / rate_per_s`` ms (a Poisson
  process of ``rate_per_s`` events per second per partition), so event ``i``'s
  arrival time ``b_i`` never decreases.
* Bounded disorder: an on-time event's time is ``b_i - d_i`` with ``d_i`` uniform
  in ``[0, disorder_ms]``. Hence every on-time event's time is at most
  ``disorder_ms`` below the running maximum of the event times before it in its
  partition, and with ``max_delay_ms >= disorder_ms`` no on-time event is late.
* Late events: exactly ``round(events * late_fraction)`` good events (never a
  partition's first good event) get the time ``M_i - late_by_ms - d_i``, where
  ``M_i`` is the running maximum of the times before them in their partition.
  They never raise that maximum. Within its own partition such an event is late
  for a tumbling window of ``size_ms`` whenever
  ``late_by_ms >= size_ms + allowed_lateness_ms + max_delay_ms``. With several
  partitions the global watermark is the minimum over partitions, so an engine
  may find fewer of them late near the start of the input, depending on its
  read order (semantics §2).
* Bad records: exactly ``round(events * bad_fraction)`` records are malformed,
  cycling through three kinds (see ``BAD_KINDS``): a truncated JSON line, a
  record without ``ts``, and a record whose ``amount`` is the string ``"n/a"``.
  CSV uses a non-integer time (``soon``), an empty ``ts`` and ``amount=n/a``;
  Parquet, whose columns are typed, uses a null ``ts`` (kinds 0 and 2) and a
  null ``user`` (kind 1). Bad
  records do not take part in the watermark or in the disorder bound.
* Everything is drawn from ``numpy.random.default_rng([seed, partition])``, so
  a given call always writes byte-identical files, and no Python code runs per
  event (2,000,000 JSONL lines take about 2 s).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

__all__ = [
    "BAD_KINDS",
    "GENERATOR_VERSION",
    "generate",
    "main",
    "partition_sizes",
    "toml_dumps",
    "write_spec",
]

GENERATOR_VERSION = 1
"""Bumped whenever the same arguments would produce different bytes."""

BAD_KINDS = ("invalid_json", "missing_ts", "non_numeric_amount")

Format = Literal["jsonl", "csv", "parquet"]
_FORMATS = ("jsonl", "csv", "parquet")


def partition_sizes(total: int, partitions: int) -> list[int]:
    """``total`` split over ``partitions`` as evenly as possible, larger shares first."""
    base, extra = divmod(total, partitions)
    return [base + (1 if p < extra else 0) for p in range(partitions)]


def _key_probabilities(keys: int, skew: float) -> np.ndarray:
    ranks = np.arange(1, keys + 1, dtype=np.float64)
    weights: np.ndarray = ranks ** (-skew) if skew else np.ones(keys)
    probs: np.ndarray = weights / float(weights.sum())
    return probs


def _partition_columns(
    rng: np.random.Generator,
    n: int,
    *,
    n_bad: int,
    bad_offset: int,
    n_late: int,
    probs: np.ndarray,
    start_ms: int,
    rate_per_s: float,
    disorder_ms: int,
    late_by_ms: int,
    float_amounts: bool,
) -> dict[str, np.ndarray]:
    """Numpy columns of one partition: key index, time, amount (cents or units), flags."""
    key_idx = rng.choice(len(probs), size=n, p=probs).astype(np.int64)
    gaps = rng.exponential(1000.0 / rate_per_s, size=n)
    arrival = np.empty(n, dtype=np.float64)
    if n:
        arrival[0] = 0.0
        np.cumsum(gaps[:-1], out=arrival[1:])
    base = start_ms + disorder_ms + np.floor(arrival).astype(np.int64)
    jitter = rng.integers(0, disorder_ms + 1, size=n, dtype=np.int64)
    ts = base - jitter

    raw_amount = rng.lognormal(mean=math.log(20.0), sigma=1.0, size=n)
    if float_amounts:
        amount = np.clip(np.rint(raw_amount * 100.0), 1, 10_000_000).astype(np.int64)
    else:
        amount = np.clip(np.rint(raw_amount), 1, 100_000).astype(np.int64)

    bad = np.zeros(n, dtype=bool)
    if n_bad:
        bad[rng.choice(n, size=n_bad, replace=False)] = True
    bad_kind = np.full(n, -1, dtype=np.int64)
    bad_kind[bad] = (bad_offset + np.arange(n_bad, dtype=np.int64)) % len(BAD_KINDS)

    late = np.zeros(n, dtype=bool)
    good_idx = np.flatnonzero(~bad)
    eligible = good_idx[1:]  # a partition's first good event cannot be late
    n_late = min(n_late, len(eligible))
    if n_late:
        late[rng.choice(eligible, size=n_late, replace=False)] = True
        # Running max of on-time good events strictly before each position.
        on_time = np.where(bad | late, np.iinfo(np.int64).min, ts)
        running = np.maximum.accumulate(on_time)
        idx = np.flatnonzero(late)
        ts = ts.copy()
        ts[idx] = running[idx - 1] - late_by_ms - jitter[idx]
    return {
        "key": key_idx,
        "ts": ts,
        "amount": amount,
        "bad_kind": bad_kind,
        "late": late,
    }


def _user_expr(width: int) -> pl.Expr:
    return pl.lit("u") + pl.col("key").cast(pl.String).str.zfill(width)


def _amount_expr(float_amounts: bool) -> pl.Expr:
    a = pl.col("amount")
    if float_amounts:
        return (a // 100).cast(pl.String) + pl.lit(".") + (a % 100).cast(pl.String).str.zfill(2)
    return a.cast(pl.String)


def _jsonl_lines(df: pl.DataFrame, width: int, float_amounts: bool) -> pl.Series:
    user = pl.lit('{"user":"') + _user_expr(width) + pl.lit('"')
    ts = pl.col("ts").cast(pl.String)
    amount = _amount_expr(float_amounts)
    good = user + pl.lit(',"ts":') + ts + pl.lit(',"amount":') + amount + pl.lit("}")
    kind = pl.col("bad_kind")
    line = (
        pl.when(kind == 0)
        .then(user + pl.lit(',"ts":') + ts + pl.lit(',"amount":') + amount)  # no closing brace
        .when(kind == 1)
        .then(user + pl.lit(',"amount":') + amount + pl.lit("}"))
        .when(kind == 2)
        .then(user + pl.lit(',"ts":') + ts + pl.lit(',"amount":"n/a"}'))
        .otherwise(good)
    )
    return df.select(line.alias("line")).to_series()


def _csv_lines(df: pl.DataFrame, width: int, float_amounts: bool) -> pl.Series:
    user = _user_expr(width)
    ts = pl.col("ts").cast(pl.String)
    amount = _amount_expr(float_amounts)
    sep = pl.lit(",")
    kind = pl.col("bad_kind")
    line = (
        pl.when(kind == 0)
        .then(user + pl.lit(",soon,") + amount)
        .when(kind == 1)
        .then(user + pl.lit(",,") + amount)
        .when(kind == 2)
        .then(user + sep + ts + pl.lit(",n/a"))
        .otherwise(user + sep + ts + sep + amount)
    )
    return df.select(line.alias("line")).to_series()


def _write_lines(path: Path, lines: pl.Series, header: str | None = None) -> None:
    with path.open("wb") as fh:
        if header is not None:
            fh.write(header.encode() + b"\n")
        if len(lines):
            lines.to_frame().write_csv(fh, include_header=False, quote_style="never")


def generate(
    out_dir: str | Path,
    *,
    events: int,
    keys: int,
    partitions: int = 1,
    fmt: Format = "jsonl",
    disorder_ms: int = 800,
    late_fraction: float = 0.0,
    late_by_ms: int = 120_000,
    bad_fraction: float = 0.0,
    start_ms: int = 1_700_000_000_000,
    rate_per_s: float = 1_000.0,
    seed: int = 0,
    float_amounts: bool = True,
    skew: float = 0.8,
) -> list[Path]:
    """Write ``partitions`` files ``p0.<fmt>``... into ``out_dir``; return their paths.

    See the module docstring for the exact model. ``rate_per_s`` is per
    partition; ``late_by_ms`` defaults to two minutes, which makes the late
    events late for a 60 s tumbling window whenever
    ``max_delay_ms + allowed_lateness_ms <= 60_000``.
    """
    if fmt not in _FORMATS:
        raise ValueError(f"fmt: {fmt!r} is not one of {', '.join(_FORMATS)}")
    if events < 0 or keys < 1 or partitions < 1:
        raise ValueError("need events >= 0, keys >= 1 and partitions >= 1")
    if disorder_ms < 0 or late_by_ms < 0 or rate_per_s <= 0:
        raise ValueError("need disorder_ms >= 0, late_by_ms >= 0 and rate_per_s > 0")
    for name, frac in (("late_fraction", late_fraction), ("bad_fraction", bad_fraction)):
        if not 0.0 <= frac <= 1.0:
            raise ValueError(f"{name}: must be within [0, 1], got {frac}")
    if late_fraction + bad_fraction > 1.0:
        raise ValueError("late_fraction + bad_fraction must not exceed 1")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes = partition_sizes(events, partitions)
    bad_sizes = partition_sizes(round(events * bad_fraction), partitions)
    late_sizes = partition_sizes(round(events * late_fraction), partitions)
    probs = _key_probabilities(keys, skew)
    width = max(5, len(str(keys - 1)))
    paths: list[Path] = []
    for p, n in enumerate(sizes):
        rng = np.random.default_rng([seed, p])
        cols = _partition_columns(
            rng,
            n,
            n_bad=min(bad_sizes[p], n),
            bad_offset=sum(bad_sizes[:p]),
            n_late=late_sizes[p],
            probs=probs,
            start_ms=start_ms,
            rate_per_s=rate_per_s,
            disorder_ms=disorder_ms,
            late_by_ms=late_by_ms,
            float_amounts=float_amounts,
        )
        df = pl.DataFrame({k: cols[k] for k in ("key", "ts", "amount", "bad_kind")})
        path = out / f"p{p}.{fmt}"
        if fmt == "jsonl":
            _write_lines(path, _jsonl_lines(df, width, float_amounts))
        elif fmt == "csv":
            _write_lines(path, _csv_lines(df, width, float_amounts), header="user,ts,amount")
        else:
            kind = pl.col("bad_kind")
            # numpy divides exactly (polars multiplies by 0.01), matching the JSON text.
            amount = pl.lit(pl.Series(cols["amount"] / 100.0 if float_amounts else cols["amount"]))
            table = df.select(
                pl.when(kind == 1).then(None).otherwise(_user_expr(width)).alias("user"),
                pl.when(kind.is_in([0, 2])).then(None).otherwise(pl.col("ts")).alias("ts"),
                amount.alias("amount"),
            )
            table.write_parquet(path, compression="zstd", statistics=True)
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- TOML spec

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_SECTION_ORDER = (
    "pipeline",
    "source",
    "watermark",
    "window",
    "aggregates",
    "sink",
    "late",
    "errors",
    "checkpoint",
)


def _toml_str(s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, Path):
        return _toml_str(str(v))
    if isinstance(v, Mapping):
        items = ", ".join(f"{_toml_key(str(k))} = {_toml_value(x)}" for k, x in v.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(v, Sequence):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} ({type(v).__name__}) as a TOML value")


def toml_dumps(data: Mapping[str, Mapping[str, Any]]) -> str:
    """Serialise ``{section: {key: value}}`` (one level of tables) as TOML text."""
    chunks: list[str] = []
    for section, body in data.items():
        lines = [f"[{_toml_key(section)}]"]
        for k, v in body.items():
            if v is None:
                continue
            lines.append(f"{_toml_key(str(k))} = {_toml_value(v)}")
        chunks.append("\n".join(lines))
    return "\n\n".join(chunks) + "\n"


def _spec_path_text(p: str | Path, spec_dir: Path) -> str:
    """Strings verbatim; Path objects relative to the spec's directory when inside it."""
    if isinstance(p, str):
        return p
    absolute = Path(p).resolve()
    try:
        return absolute.relative_to(spec_dir).as_posix()
    except ValueError:
        return str(absolute)


def _output_section(value: Any, spec_dir: Path, default_kind: str = "jsonl") -> dict[str, Any]:
    if isinstance(value, Mapping):
        sec = dict(value)
        sec.setdefault("kind", default_kind)
        if "path" in sec and sec["path"] is not None:
            sec["path"] = _spec_path_text(sec["path"], spec_dir)
        return sec
    if value == "stdout":
        return {"kind": "stdout"}
    return {"kind": default_kind, "path": _spec_path_text(value, spec_dir)}


def write_spec(
    path: str | Path,
    *,
    paths: Sequence[str | Path] | str | Path,
    name: str = "sealstream-job",
    kind: Format | None = None,
    key: str = "user",
    time: str = "ts",
    max_delay_ms: int | None = 1_000,
    window: str | Mapping[str, Any] = "tumbling",
    size_ms: int | None = None,
    slide_ms: int | None = None,
    gap_ms: int | None = None,
    allowed_lateness_ms: int | None = None,
    aggregates: Mapping[str, str] | None = None,
    sink: str | Path | Mapping[str, Any] = "out",
    sink_kind: str = "jsonl",
    late: str | Path | Mapping[str, Any] | None = None,
    errors: str | Path | Mapping[str, Any] | None = None,
    checkpoint: str | Path | Mapping[str, Any] | None = None,
    checkpoint_every_ms: int | None = None,
    checkpoint_every_events: int | None = None,
    checkpoint_keep: int | None = None,
    batch_size: int | None = None,
) -> Path:
    """Write a spec in the contract's TOML format (semantics §9); return its path.

    * ``paths``: the partition files. Strings are written verbatim (relative
      ones are relative to the spec file, as ``sealstream run`` reads them);
      :class:`~pathlib.Path` objects are written relative to the spec's
      directory when inside it, else absolute - so the list :func:`generate`
      returns can be passed as is. ``kind`` defaults to the first path's
      suffix (``jsonl``, ``csv`` or ``parquet``).
    * ``window``: ``"tumbling"`` (``size_ms`` defaults to 60000),
      ``"sliding"`` (``size_ms``, ``slide_ms``) or ``"session"`` (``gap_ms``,
      default 30000); or a whole ``[window]`` table as a mapping.
    * ``aggregates`` defaults to ``{"n": "count", "total": "sum(amount)"}``.
    * ``sink``, ``late``, ``errors``: a directory (str/Path, kind ``jsonl``;
      the sink uses ``sink_kind``), ``"stdout"``, or a whole table as a mapping.
      ``late``/``errors``/``checkpoint`` sections are written only when given.
    * ``checkpoint``: a directory (with ``checkpoint_every_ms`` /
      ``checkpoint_every_events`` / ``checkpoint_keep``) or a whole table.
    * ``max_delay_ms=None`` leaves out the ``[watermark]`` section (engine
      default 0); ``batch_size`` goes to ``[pipeline]`` when given.
    """
    spec = Path(path)
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec_dir = spec.parent.resolve()
    path_list: list[str | Path] = [paths] if isinstance(paths, str | Path) else list(paths)
    if not path_list:
        raise ValueError("paths: at least one input file is needed")
    if kind is None:
        suffix = Path(str(path_list[0])).suffix.lstrip(".").lower()
        kind = "jsonl" if suffix in ("json", "ndjson", "") else suffix  # type: ignore[assignment]
        if kind not in _FORMATS:
            raise ValueError(f"kind: cannot tell the source kind of {path_list[0]!r}; pass kind=")

    data: dict[str, dict[str, Any]] = {
        "pipeline": {"name": name, "batch_size": batch_size},
        "source": {
            "kind": kind,
            "paths": [_spec_path_text(p, spec_dir) for p in path_list],
            "key": key,
            "time": time,
        },
    }
    if max_delay_ms is not None:
        data["watermark"] = {"max_delay_ms": max_delay_ms}
    if isinstance(window, Mapping):
        win: dict[str, Any] = dict(window)
    else:
        win = {"kind": window}
        if window == "tumbling":
            win["size_ms"] = 60_000 if size_ms is None else size_ms
        elif window == "sliding":
            win["size_ms"] = size_ms
            win["slide_ms"] = slide_ms
        elif window == "session":
            win["gap_ms"] = 30_000 if gap_ms is None else gap_ms
        else:
            raise ValueError(f"window: {window!r} is not one of tumbling, sliding, session")
        win["allowed_lateness_ms"] = allowed_lateness_ms
    data["window"] = win
    data["aggregates"] = dict(
        aggregates if aggregates is not None else {"n": "count", "total": "sum(amount)"}
    )
    data["sink"] = _output_section(sink, spec_dir, sink_kind)
    if late is not None:
        data["late"] = _output_section(late, spec_dir)
    if errors is not None:
        data["errors"] = _output_section(errors, spec_dir)
    if checkpoint is not None:
        if isinstance(checkpoint, Mapping):
            ck = dict(checkpoint)
            if ck.get("path") is not None:
                ck["path"] = _spec_path_text(ck["path"], spec_dir)
        else:
            ck = {"path": _spec_path_text(checkpoint, spec_dir)}
        for k, v in (
            ("every_events", checkpoint_every_events),
            ("every_ms", checkpoint_every_ms),
            ("keep", checkpoint_keep),
        ):
            if v is not None:
                ck[k] = v
        data["checkpoint"] = ck
    ordered = {s: data[s] for s in _SECTION_ORDER if s in data}
    spec.write_text(toml_dumps(ordered), encoding="utf-8")
    return spec


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sealstream.testing.datagen OUT_DIR --events N ...``: write the files."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m sealstream.testing.datagen", description=generate.__doc__
    )
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--fmt", choices=_FORMATS, default="jsonl")
    ap.add_argument("--disorder-ms", type=int, default=800)
    ap.add_argument("--late-fraction", type=float, default=0.0)
    ap.add_argument("--late-by-ms", type=int, default=120_000)
    ap.add_argument("--bad-fraction", type=float, default=0.0)
    ap.add_argument("--start-ms", type=int, default=1_700_000_000_000)
    ap.add_argument("--rate-per-s", type=float, default=1_000.0)
    ap.add_argument("--skew", type=float, default=0.8)
    ap.add_argument("--int-amounts", action="store_true", help="whole-number amounts")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        paths = generate(
            a.out_dir,
            events=a.events,
            keys=a.keys,
            partitions=a.partitions,
            fmt=a.fmt,
            disorder_ms=a.disorder_ms,
            late_fraction=a.late_fraction,
            late_by_ms=a.late_by_ms,
            bad_fraction=a.bad_fraction,
            start_ms=a.start_ms,
            rate_per_s=a.rate_per_s,
            seed=a.seed,
            float_amounts=not a.int_amounts,
            skew=a.skew,
        )
    except ValueError as exc:
        ap.error(str(exc))
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
