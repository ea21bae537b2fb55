"""Results of a benchmark run: the markdown report and the PNG chart."""

from __future__ import annotations

import importlib.util
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.harness import Run, Workload


@dataclass
class Result:
    name: str
    group: str
    description: str
    status: str  # "ok" | "skipped" | "failed"
    note: str = ""
    runs: list[Run] = field(default_factory=list)
    check: str = ""
    events: int = 0
    fmt: str = "jsonl"
    kind: str = "tumbling"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float | None:
        return statistics.median(r.seconds for r in self.runs) if self.runs else None

    @property
    def rate(self) -> float | None:
        med = self.median_s
        return self.events / med if med else None

    @property
    def median_rss_mb(self) -> float | None:
        return statistics.median(r.max_rss_kb for r in self.runs) / 1024 if self.runs else None

    @property
    def peak_rss_mb(self) -> float | None:
        return max(r.max_rss_kb for r in self.runs) / 1024 if self.runs else None

    @property
    def cpu_util(self) -> float | None:
        utils = [u for r in self.runs if (u := r.cpu_util) is not None]
        return statistics.median(utils) if utils else None

    @property
    def summary(self) -> dict[str, Any] | None:
        for r in reversed(self.runs):
            if r.summary is not None:
                return r.summary
        return None


@dataclass
class SweepPoint:
    axis: str  # "events" | "keys" | "checkpoint_ms"
    value: int  # checkpoint_ms 0 = no checkpoints
    result: Result


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _num(x: Any, spec: str = ",") -> str:
    return format(x, spec) if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _bytes(x: Any) -> str:
    if not isinstance(x, int | float) or isinstance(x, bool):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


def _pct(a: float | None, b: float | None) -> str:
    return f"{100 * a / b:.0f} %" if a and b else "-"


def fastest_one_shot(results: list[Result], fmt: str) -> Result | None:
    done = [r for r in results if r.group == "one-shot" and r.fmt == fmt and r.median_s]
    return min(done, key=lambda r: r.median_s or 0.0, default=None)


def ratios(results: list[Result]) -> list[tuple[str, str, str]]:
    """(what, value, target) lines: rates relative to each other, within this run."""
    by = {r.name: r for r in results if r.status == "ok" and r.runs}
    out: list[tuple[str, str, str]] = []

    def rate(name: str) -> float | None:
        return by[name].rate if name in by else None

    tumbling = rate("sealstream")
    out.append(("sliding / tumbling events/s", _pct(rate("sealstream-sliding"), tumbling),
                ">= 50 %"))
    out.append(("session / tumbling events/s", _pct(rate("sealstream-session"), tumbling),
                ">= 33 %"))
    out.append(("checkpointed / unchecked events/s",
                _pct(rate("sealstream-ckpt"), tumbling), ">= 95 %"))
    many, ckpt = rate("sealstream-many-keys"), rate("sealstream-ckpt")
    out.append(("1,000,000 keys: time / 10,000 keys' time (both checkpointed)",
                f"{ckpt / many:.2f}x" if many and ckpt else "-", "<= 2x"))
    for fmt, name, target in (("jsonl", "sealstream-ckpt", ">= 60 %"),
                              ("parquet", "sealstream-parquet", ">= 50 %")):
        best = fastest_one_shot(results, fmt)
        if best is not None:
            out.append((f"{name} / fastest {fmt} one-shot ({best.name}) events/s",
                        _pct(rate(name), best.rate), target))
    for peer, what, target in (("bytewax", "bytewax (recovery on)", "> 100x"),
                               ("pyflink", "PyFlink SQL (checkpoints on)", "> 1x")):
        if peer in by:
            out.append((f"sealstream-ckpt / {what} events/s",
                        f"{(rate('sealstream-ckpt') or 0) / (rate(peer) or 1):.1f}x", target))
    return out


def render_markdown(
    w: Workload,
    results: list[Result],
    sweeps: list[SweepPoint],
    mach: dict[str, Any],
    repeat: int,
) -> str:
    lines = [
        "# sealstream benchmark",
        "",
        f"Workload: {w.events:,} events, {w.keys:,} keys (Zipf-like, skew 0.8), "
        f"{w.partitions} partitions (JSONL, and the same rows as Parquet), disorder <= "
        f"{w.disorder_ms} ms, `n = count`, `total = sum(amount)`, max_delay_ms = "
        f"{w.max_delay_ms}; windows: tumbling {w.size_ms // 1000} s, sliding "
        f"{w.size_ms // 1000} s / {w.slide_ms // 1000} s, session {w.gap_ms // 1000} s. "
        f"Whole-process wall time and peak RSS of the child process, median of {repeat} "
        "(peers: see runs); CPU = (user + system) / wall, 100 % = one core busy.",
        "",
        "| config | input | events | median s | events/s | RSS MB median (max) | CPU "
        "| vs fastest one-shot (same input; events/s ratio) | check |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        if r.group == "state":
            continue
        if r.status != "ok" or not r.runs:
            lines.append(f"| {r.name} | {r.fmt} | - | - | - | - | - | - | {r.status}: {r.note} |")
            continue
        best = fastest_one_shot(results, r.fmt)
        # by rate, so that a config over fewer events (a peer) compares fairly
        ratio = best.rate / r.rate if best and best.rate and r.rate else None
        lines.append(
            f"| {r.name} | {r.fmt} | {r.events:,} | {_fmt(r.median_s, '.2f')} | "
            f"{_fmt(r.rate, ',.0f')} | {_fmt(r.median_rss_mb, '.0f')} "
            f"({_fmt(r.peak_rss_mb, '.0f')}) | {_fmt((r.cpu_util or 0) * 100, '.0f')} % | "
            f"{_fmt(ratio, '.2f') + 'x' if ratio else '-'} | {r.check} |"
        )
    lines += ["", "Ratios (same run):", "", "| ratio | value | target |", "| --- | ---: | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in ratios(results)]

    lines += _state_section(w, results)

    summaries = [(r, r.summary) for r in results if r.group == "sealstream" and r.summary]
    if summaries:
        lines += [
            "",
            "Engine summaries (`--summary-json`, last run):",
            "",
            "| config | events | windows fired | late | bad | engine-reported s "
            "| checkpoints | mean ckpt ms | mean ckpt size |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r, s in summaries:
            ck = s.get("checkpoints") or {}
            n_ck = ck.get("count")
            lines.append(
                f"| {r.name} | {_num(s.get('events'))} | {_num(s.get('windows_fired'))} | "
                f"{_num(s.get('late_events'))} | {_num(s.get('bad_records'))} | "
                f"{_num(s.get('seconds'), '.2f')} | {_num(n_ck)} | "
                f"{_num(ck.get('mean_ms') if n_ck else None, '.1f')} | "
                f"{_bytes(ck.get('mean_bytes') if n_ck else None)} |"
            )
    if sweeps:
        lines += [
            "",
            "Sweeps (`sealstream`, JSONL, tumbling; one run per point unless it is a config "
            "of the table above; chart: `latest.png`):",
            "",
            "| axis | value | events | keys | median s | events/s | RSS MB | CPU |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for sp in sweeps:
            r = sp.result
            if not r.runs:
                lines.append(f"| {sp.axis} | {sp.value:,} | - | - | - | - | - | {r.status} |")
                continue
            label = "none" if sp.axis == "checkpoint_ms" and sp.value == 0 else f"{sp.value:,}"
            lines.append(
                f"| {sp.axis} | {label} | {r.events:,} | {_num(r.extra.get('keys'))} | "
                f"{_fmt(r.median_s, '.2f')} | {_fmt(r.rate, ',.0f')} | "
                f"{_fmt(r.median_rss_mb, '.0f')} | {_fmt((r.cpu_util or 0) * 100, '.0f')} % |"
            )
    lines += [
        "",
        "Runs (seconds): "
        + "; ".join(
            f"{r.name} " + ", ".join(f"{x.seconds:.2f}" for x in r.runs) for r in results if r.runs
        ),
        "",
        "Machine: "
        + ", ".join(
            f"{k} {mach[k]}"
            for k in ("cpu_model", "cpu_count", "cpus_usable", "cgroup_cpu_limit", "memory_gb",
                      "python", "platform")
            if k in mach
        )
        + f"; versions {mach.get('versions')}; "
        f"load average at start {mach.get('loadavg_at_start')}, "
        f"at end {mach.get('loadavg_at_end')}; {mach['date']}. The machine is shared: compare "
        "ratios within one run, not absolute times across runs.",
        "",
    ]
    notes = [f"- {r.name}: {r.note}" for r in results if r.note and r.status == "ok"]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    return "\n".join(lines)


def _state_section(w: Workload, results: list[Result]) -> list[str]:
    by = {r.name: r for r in results}
    lines: list[str] = []
    st = by.get("state")
    s = st.summary if st else None
    if s:
        process_s, restore_s = s.get("process_s"), s.get("restore_s")
        lines += [
            "",
            f"Open-window state (`python -m bench.state`: {int(s['windows']):,} open tumbling "
            "windows, one per key, `count` + `sum`, built by the window operator):",
            "",
            "| figure | value |",
            "| --- | ---: |",
            f"| checkpoint state file (Arrow IPC, compressed) | {_bytes(s.get('state_bytes'))} |",
            "| bytes per open window in the checkpoint | "
            f"{_num(s.get('bytes_per_window'), '.1f')} |",
            f"| bytes per open window in memory | "
            f"{_num(s['in_memory_bytes'] / s['windows'], '.1f')} |",
            f"| snapshot + encode + write | {_num(s.get('encode_s'), '.3f')} s |",
            f"| restore: read + decode + build the operator | {_num(restore_s, '.3f')} s |",
            f"| the operator processing those {int(s['windows']):,} events (no parsing) "
            f"| {_num(process_s, '.3f')} s |",
            f"| restore time / processing time | "
            f"{_fmt(restore_s / process_s if restore_s and process_s else None, '.2f')} |",
        ]
        if st and st.runs:
            lines.append(f"| whole process: wall, peak RSS | {_fmt(st.median_s, '.2f')} s, "
                         f"{_fmt(st.peak_rss_mb, '.0f')} MB |")
    mk = by.get("sealstream-many-keys")
    ck = mk.extra.get("largest_checkpoint") if mk else None
    if ck and ck.get("open_windows"):
        lines += [
            "",
            f"`sealstream-many-keys` ({w.many_keys:,} keys): its checkpoint with the most open "
            f"windows held {ck['open_windows']:,} windows in a {_bytes(ck['state_bytes'])} "
            f"state file: {ck['state_bytes'] / ck['open_windows']:.1f} bytes per window.",
        ]
    return lines


def write_chart(results: list[Result], sweeps: list[SweepPoint], path: Path) -> str:
    if importlib.util.find_spec("matplotlib") is None:
        return "no chart (matplotlib is not installed in the venv)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        axes_def = [
            ("events", "events in the input"),
            ("keys", "distinct keys"),
            ("checkpoint_ms", "checkpoint interval, ms"),
        ]
        done = [r for r in results if r.runs and r.status == "ok" and r.group != "state"]
        fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
        for ax, (axis, label) in zip(axes[:3], axes_def, strict=True):
            pts = sorted((sp.value, sp.result.rate) for sp in sweeps
                         if sp.axis == axis and sp.result.rate and sp.value > 0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            if axis == "checkpoint_ms":
                none = [sp.result.rate for sp in sweeps if sp.axis == axis and sp.value == 0]
                if none and none[0]:
                    ax.axhline(none[0], linestyle="--", color="grey", label="no checkpoints")
                    ax.legend(loc="lower right")
            ax.set_xlabel(label)
            ax.set_ylabel("events/s")
            ax.yaxis.set_major_formatter(matplotlib.ticker.EngFormatter())
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        ax = axes[3]
        ax.barh([r.name for r in done], [r.rate or 0 for r in done])
        ax.set_xlabel("events/s (whole process, higher is better)")
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter())
        ax.invert_yaxis()
        fig.suptitle("sealstream throughput (tumbling JSONL unless named)")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return f"chart: {path}"
    except Exception as exc:  # noqa: BLE001 - the chart is optional
        return f"no chart ({type(exc).__name__}: {exc})"
