"""Helpers for tests that drive the engine through its command line.

* :class:`Case` describes one pipeline over JSONL partitions (file texts).
* :func:`write_case` writes the input files and a TOML spec into a directory.
* :func:`run_engine` runs ``sealstream run SPEC`` in process and reads the
  committed output back; :func:`run_reference` runs ``tests/reference.py``.
* :func:`assert_same_output` compares two outputs as multisets (results keyed
  by ``(key, window_start, window_end)``, ints exact, floats within 1e-9
  relative; late events as parsed JSON objects) and explains any difference.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import reference as ref


@dataclass
class Case:
    partitions: list[tuple[str, str]]  # (path as written in the spec, file text)
    window: ref.WindowDef
    aggregates: dict[str, str]
    max_delay_ms: int = 0
    key: str | list[str] = "k"
    time: str = "ts"
    batch_size: int = 64
    checkpoint_every: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: [transform]: fields (name -> SQL text) and where (SQL text)
    fields: dict[str, str] = field(default_factory=dict)
    where: str | None = None
    #: the Python meaning of every SQL text used (fields, where, count_if conditions)
    meaning: dict[str, Any] = field(default_factory=dict)
    #: an [errors] output (bad records go to errors/ instead of stopping the run)
    errors: bool = False


@dataclass
class Output:
    results: list[dict[str, Any]]
    late: list[dict[str, Any]]


def jsonl(records: list[dict[str, Any] | None]) -> str:
    """File text from records; ``None`` stands for a blank line."""
    return "".join(("" if r is None else json.dumps(r)) + "\n" for r in records)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def spec_text(case: Case) -> str:
    w = case.window
    lines = [
        "[pipeline]",
        'name = "oracle"',
        f"batch_size = {case.batch_size}",
        "",
        "[source]",
        'kind = "jsonl"',
        f"paths = {_toml_value([p for p, _ in case.partitions])}",
        f"key = {_toml_value(case.key)}",
        f"time = {_toml_value(case.time)}",
        "",
        "[watermark]",
        f"max_delay_ms = {case.max_delay_ms}",
        "",
        "[window]",
        f"kind = {_toml_value(w.kind)}",
    ]
    if w.kind in ("tumbling", "sliding"):
        lines.append(f"size_ms = {w.size_ms}")
    if w.kind == "sliding":
        lines.append(f"slide_ms = {w.slide_ms}")
    if w.kind == "session":
        lines.append(f"gap_ms = {w.gap_ms}")
    lines.append(f"allowed_lateness_ms = {w.allowed_lateness_ms}")
    if case.fields or case.where is not None:
        lines += ["", "[transform]"]
        if case.where is not None:
            lines.append(f"where = {json.dumps(case.where)}")
        for name, text in case.fields.items():
            lines.append(f"fields.{name} = {json.dumps(text)}")
    lines += ["", "[aggregates]"]
    for name, expr in case.aggregates.items():
        lines.append(f"{json.dumps(name)} = {json.dumps(expr)}")
    lines += ["", "[sink]", 'kind = "jsonl"', 'path = "out"']
    lines += ["", "[late]", 'kind = "jsonl"', 'path = "late"']
    if case.errors:
        lines += ["", "[errors]", 'kind = "jsonl"', 'path = "errors"']
    if case.checkpoint_every is not None:
        lines += ["", "[checkpoint]", 'path = "ckpt"', f"every_events = {case.checkpoint_every}"]
    return "\n".join(lines) + "\n"


def write_case(case: Case, directory: Path) -> Path:
    """Write inputs and ``spec.toml`` into ``directory``; return the spec's path."""
    for name, text in case.partitions:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    spec = directory / "spec.toml"
    spec.write_text(spec_text(case), encoding="utf-8")
    return spec


def read_jsonl_dir(directory: Path) -> list[dict[str, Any]]:
    """Every record of the committed ``*.jsonl`` files (names not starting with . or _)."""
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        if path.name.startswith((".", "_")):
            continue
        for line in path.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                out.append(json.loads(line))
    return out


def run_engine(case: Case, directory: Path | None = None) -> Output:
    """Run ``case`` through the CLI in ``directory`` (a temporary one by default)."""
    if directory is None:
        with tempfile.TemporaryDirectory() as tmp:
            return run_engine(case, Path(tmp))
    from sealstream.cli import main

    spec = write_case(case, directory)
    rc = main(["run", str(spec)])
    assert rc == 0, f"sealstream run exited {rc}\n{spec_text(case)}"
    return Output(read_jsonl_dir(directory / "out"), read_jsonl_dir(directory / "late"))


def run_reference(case: Case) -> Output:
    o = ref.run(
        case.partitions,
        key=case.key,
        time=case.time,
        max_delay_ms=case.max_delay_ms,
        window=case.window,
        aggregates=case.aggregates,
        fields={n: case.meaning[t] for n, t in case.fields.items()},
        where=None if case.where is None else case.meaning[case.where],
        conditions=case.meaning,
    )
    return Output(o.results, o.late)


# ------------------------------------------------------------------ comparison


def _result_id(r: dict[str, Any], key: str | list[str] = "key") -> tuple[Any, ...]:
    """The identity of a result; a compound key's fields each under its own name."""
    if isinstance(key, list):
        return (*(ref.key_id(r.get(f)) for f in key), r["window_start"], r["window_end"])
    return (*ref.key_id(r["key"]), r["window_start"], r["window_end"])


result_id = _result_id


def same_value(expected: Any, actual: Any) -> bool:
    """Types respected: an int must be an int, a float a float (within 1e-9 relative)."""
    if isinstance(expected, ref.OneOf):
        return any(same_value(x, actual) for x in expected)
    if isinstance(expected, ref.Approx):
        return type(actual) is int and abs(actual - expected.value) <= max(
            1, ref.APPROX_REL * expected.value)
    if expected is None or isinstance(expected, bool):
        return actual is expected
    if type(expected) is int:
        return type(actual) is int and actual == expected
    if type(expected) is float:
        return type(actual) is float and math.isclose(
            actual, expected, rel_tol=1e-9, abs_tol=1e-12
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(same_value(e, a) for e, a in zip(expected, actual, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(same_value(expected[k], actual[k]) for k in expected)
        )
    return type(actual) is type(expected) and actual == expected


def canonical(obj: Any) -> str:
    """A JSON text that keeps 2 and 2.0 apart and ignores field order."""
    return json.dumps(obj, sort_keys=True)


def diff_output(expected: Output, actual: Output, key: str | list[str] = "key") -> list[str]:
    """Human-readable differences; empty when the outputs agree."""
    problems: list[str] = []

    def result_id(r: dict[str, Any]) -> tuple[Any, ...]:
        return _result_id(r, key if isinstance(key, list) else "key")

    exp_ids = Counter(result_id(r) for r in expected.results)
    act_ids = Counter(result_id(r) for r in actual.results)
    for rid, n in act_ids.items():
        if n > 1:
            problems.append(f"result {rid} emitted {n} times")
    exp_by = {result_id(r): r for r in expected.results}
    act_by = {result_id(r): r for r in actual.results}
    assert sum(exp_ids.values()) == len(exp_by), "reference emitted a duplicate identity"
    for rid in sorted(exp_by.keys() - act_by.keys(), key=repr):
        problems.append(f"missing result {exp_by[rid]}")
    for rid in sorted(act_by.keys() - exp_by.keys(), key=repr):
        problems.append(f"unexpected result {act_by[rid]}")
    for rid in sorted(exp_by.keys() & act_by.keys(), key=repr):
        e, a = exp_by[rid], act_by[rid]
        if set(e) != set(a) or not all(same_value(e[k], a[k]) for k in e):
            problems.append(f"result differs:\n  expected {e}\n  actual   {a}")
    exp_late = Counter(canonical(r) for r in expected.late)
    act_late = Counter(canonical(r) for r in actual.late)
    for text, n in (exp_late - act_late).items():
        problems.append(f"missing late event (x{n}) {text}")
    for text, n in (act_late - exp_late).items():
        problems.append(f"unexpected late event (x{n}) {text}")
    return problems


def describe(case: Case) -> str:
    parts = "\n".join(f"--- {name}\n{text}" for name, text in case.partitions)
    return f"{spec_text(case)}{parts}"


def assert_same_output(expected: Output, actual: Output, case: Case | None = None) -> None:
    problems = diff_output(expected, actual, case.key if case is not None else "key")
    if problems:
        detail = "\n".join(problems)
        ctx = f"\n=== case\n{describe(case)}" if case is not None else ""
        raise AssertionError(f"outputs differ:\n{detail}{ctx}")
