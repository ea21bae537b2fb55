"""Merkle receipts: what the signed roots and the receipt ids cost, and how large a proof is.

    python -m bench.receipts [--events N] [--keys N] [--every N] [--rounds N]

The standard workload's shape (``--events`` events over 3 partitions, ``--keys`` keys,
60 s tumbling windows, a checkpoint every ``--every`` events) runs in this process
alternately *with* Merkle receipts (as shipped: a root over each epoch's sorted result
ids, signed in the manifest, and the ids kept in ``receipt-ids.arrow``) and *without*
(today's receipts before them: count and digest only; the bench switches the root and the
ids file off), ``--rounds`` times each; the table gives the median throughput of each and
their ratio (the target: at most 2% slower). It also builds the tree of an epoch of
1,000,000 results and reports the largest proof's size (the target: at most 1 KB) and the
time to build that tree. Written to ``bench/results/receipts.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "receipts"
RESULTS = ROOT / "bench" / "results"


@contextlib.contextmanager
def without_roots() -> Iterator[None]:
    """Receipts as before Merkle roots: no tree, no ids file (bench only)."""
    from sealstream._runtime import persist
    from sealstream.checkpoint import receipts as trees

    real_root, real_digest = trees.root, persist.Checkpointing._digest_receipts

    def digest(self: persist.Checkpointing, *args: object) -> dict[str, object]:
        out = real_digest(self, *args)  # type: ignore[arg-type]
        self._receipt_ids = None
        return out

    trees.root = lambda ids: trees.EMPTY_ROOT  # type: ignore[assignment]
    persist.Checkpointing._digest_receipts = digest  # type: ignore[method-assign]
    try:
        yield
    finally:
        trees.root = real_root  # type: ignore[assignment]
        persist.Checkpointing._digest_receipts = real_digest  # type: ignore[method-assign]


def one_run(spec: Path, events: int, roots: bool) -> float:
    from sealstream import run

    d = spec.parent
    for sub in ("out", "ckpt"):
        shutil.rmtree(d / sub, ignore_errors=True)
    ctx = contextlib.nullcontext() if roots else without_roots()
    with ctx:
        t0 = time.perf_counter()
        run(spec)
        took = time.perf_counter() - t0
    if roots:
        assert any((d / "ckpt").rglob("receipt-ids.arrow")), "no receipt ids written"
    return events / took


def proof_size(n: int) -> tuple[int, float]:
    from sealstream.checkpoint import receipts as trees

    ids = pl.Series("id", [f"user{i % 10_000}|false|{(i // 10_000) * 60_000}|"
                           f"{(i // 10_000 + 1) * 60_000}" for i in range(n)]).sort()
    t0 = time.perf_counter()
    tree = trees.levels(ids)
    took = time.perf_counter() - t0
    lists = [s.to_list() for s in tree]
    worst = max(len(trees.proof_bytes(trees.make_proof(
        "receipts_bench", 123_456_789, 987_654, ids[i], i, n, trees.path(lists, i))))
        for i in (0, n // 3, n - 1))
    return worst, took


@contextlib.contextmanager
def hmac_without_log() -> Iterator[None]:
    """The baseline of issue 31: HMAC signatures, no emission log (bench only)."""
    import os

    from sealstream.checkpoint import emission_log

    real_head = emission_log.head
    saved = {k: os.environ.pop(k) for k in ("SEALSTREAM_SIGNING_KEY",
                                             "SEALSTREAM_SIGNING_KEY_FILE") if k in os.environ}
    os.environ["SEALSTREAM_CHECKPOINT_KEY"] = "bench-hmac-key"
    emission_log.head = lambda entries: {"size": 0, "root": ""}  # type: ignore[assignment]
    try:
        yield
    finally:
        emission_log.head = real_head  # type: ignore[assignment]
        os.environ.pop("SEALSTREAM_CHECKPOINT_KEY", None)
        os.environ.update(saved)


@contextlib.contextmanager
def ed25519_with_log(key_file: Path) -> Iterator[None]:
    import os

    os.environ["SEALSTREAM_SIGNING_KEY_FILE"] = str(key_file)
    try:
        yield
    finally:
        os.environ.pop("SEALSTREAM_SIGNING_KEY_FILE", None)


@contextlib.contextmanager
def unsigned_without_log() -> Iterator[None]:
    """No key at all (the unkeyed SHA-256 digest) and no emission log (bench only)."""
    import os

    from sealstream.checkpoint import emission_log

    real_head = emission_log.head
    saved = {k: os.environ.pop(k) for k in ("SEALSTREAM_SIGNING_KEY", "SEALSTREAM_CHECKPOINT_KEY",
                                             "SEALSTREAM_SIGNING_KEY_FILE") if k in os.environ}
    emission_log.head = lambda entries: {"size": 0, "root": ""}  # type: ignore[assignment]
    try:
        yield
    finally:
        emission_log.head = real_head  # type: ignore[assignment]
        os.environ.update(saved)


def signed_run(spec: Path, events: int, key_file: Path | None,
               unsigned: bool = False) -> float:
    from sealstream import run

    d = spec.parent
    for sub in ("out", "ckpt"):
        shutil.rmtree(d / sub, ignore_errors=True)
    ctx = (unsigned_without_log() if unsigned else
           hmac_without_log() if key_file is None else ed25519_with_log(key_file))
    with ctx:
        t0 = time.perf_counter()
        run(spec)
        took = time.perf_counter() - t0
    return events / took


def log_proof(n: int, epochs: int) -> tuple[int, float, float]:
    """The largest format-2 proof for ``n`` results in the newest of ``epochs`` epochs
    (the other epochs' roots made up), the time to build that epoch's tree, and the time
    per proof once it is built."""
    from sealstream.checkpoint import proofs
    from sealstream.checkpoint import receipts as trees

    keys = max(1, n // 1000)
    ids = pl.select(pl.concat_str([
        pl.lit("user"), (pl.int_range(n) % keys).cast(pl.String), pl.lit("|false|"),
        ((pl.int_range(n) // keys) * 60_000).cast(pl.String), pl.lit("|"),
        ((pl.int_range(n) // keys + 1) * 60_000).cast(pl.String)]).alias("id")
    )["id"].sort()
    t0 = time.perf_counter()
    root = trees.root(ids)
    entries: list[object] = [[e, 1000, trees.EMPTY_ROOT] for e in range(1, epochs)]
    entries.append([epochs, n, root])
    prover = proofs.EpochProver("receipts_bench", 123_456_789, entries, epochs, ids)
    build = time.perf_counter() - t0
    t1 = time.perf_counter()
    picks = (0, n // 3, n - 1)
    worst = max(len(trees.proof_bytes(prover.proof(i))) for i in picks)
    per = (time.perf_counter() - t1) / len(picks)
    return worst, build, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--signatures-only", action="store_true",
                    help="Only the throughput of Ed25519 + the emission log against unsigned "
                         "and HMAC runs without the log (alternating); the section is "
                         "appended to bench/results/receipts.md.")
    args = ap.parse_args()
    from sealstream.testing.datagen import generate
    from sealstream.testing.specs import files_source, spec_text

    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / f"data-{args.events}-{args.keys}"
    if not data.is_dir():
        generate(data, events=args.events, keys=args.keys, partitions=3)
    paths = sorted(str(x) for x in data.glob("p*.jsonl"))
    spec = WORK / "spec.toml"
    spec.write_text(spec_text("receipts_bench", files_source(paths), batch_size=20000,
                              every_events=args.every, keep=2))
    if args.signatures_only:
        signatures_only(spec, args)
        return
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for roots in (False, True):
            rates[roots].append(one_run(spec, args.events, roots))
    with_r, without = statistics.median(rates[True]), statistics.median(rates[False])
    size, build_s = proof_size(1_000_000)
    from sealstream.checkpoint import signing

    keydir = WORK / "keys"
    shutil.rmtree(keydir, ignore_errors=True)
    signing.generate(keydir)
    signed: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for pub in (False, True):
            signed[pub].append(signed_run(
                spec, args.events, keydir / signing.PRIVATE_NAME if pub else None))
    ed, hm = statistics.median(signed[True]), statistics.median(signed[False])
    log_rows = []
    for n, epochs in ((1_000_000, 1), (1_000_000, 1000), (10_000_000, 1), (10_000_000, 1000)):
        worst, build, per = log_proof(n, epochs)
        log_rows.append(f"| {n:,} | {epochs:,} | {worst:,} | {build:.2f} s | "
                        f"{per * 1000:.2f} ms |")
    lines = [
        "# Merkle receipts",
        "",
        f"{args.events:,} events, {args.keys:,} keys, 60 s tumbling windows, a checkpoint "
        f"every {args.every:,} events; median of {args.rounds} runs each, alternating.",
        "",
        "| receipts | events/s |",
        "| --- | --- |",
        f"| count + digest (before) | {without:,.0f} |",
        f"| + Merkle root signed, ids kept | {with_r:,.0f} |",
        "",
        f"Throughput ratio (with / without): **{with_r / without:.3f}** (target >= 0.98).",
        "",
        f"Largest proof for an epoch of 1,000,000 results: **{size} bytes** (target <= 1024); "
        f"building that tree: {build_s:.2f} s (on the checkpoint's writer thread).",
        "",
        "## Ed25519 and the emission log (issue 31)",
        "",
        "| signatures | events/s |",
        "| --- | --- |",
        f"| HMAC, no emission log | {hm:,.0f} |",
        f"| Ed25519 + emission log | {ed:,.0f} |",
        "",
        f"Throughput ratio (Ed25519 + log / HMAC without): **{ed / hm:.3f}** (target >= 0.97).",
        "",
        "Proofs through the log (format 2), result -> epoch root -> signed log root; the "
        "results in the newest epoch of a log of that many epochs:",
        "",
        "| results in the epoch | epochs in the log | largest proof (bytes) | "
        "tree + log build | per proof |",
        "| --- | --- | --- | --- | --- |",
        *log_rows,
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "receipts.md").write_text("\n".join(lines))
    print("\n".join(lines))


def signatures_only(spec: Path, args: argparse.Namespace) -> None:
    """Ed25519 + log vs unsigned and vs HMAC, both without the log: in this process,
    alternating within each round, median of ``--rounds``; appended to receipts.md."""
    import os

    from sealstream.checkpoint import signing

    keydir = WORK / "keys"
    shutil.rmtree(keydir, ignore_errors=True)
    signing.generate(keydir)
    key = keydir / signing.PRIVATE_NAME
    runs: dict[str, list[float]] = {"unsigned": [], "hmac": [], "ed25519": []}
    for _ in range(args.rounds):
        runs["unsigned"].append(signed_run(spec, args.events, None, unsigned=True))
        runs["ed25519"].append(signed_run(spec, args.events, key))
        runs["hmac"].append(signed_run(spec, args.events, None))
    med = {k: statistics.median(v) for k, v in runs.items()}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "",
        f"## {time.strftime('%Y-%m-%d', time.gmtime())}: Ed25519 + emission log segments "
        "against unsigned (`--signatures-only`)",
        "",
        f"`python -m bench.receipts --signatures-only --events {args.events} --every "
        f"{args.every} --rounds {args.rounds}`: {args.events:,} events, {args.keys:,} keys, "
        f"a checkpoint every {args.every:,} events; the three configurations alternate in "
        f"each round, in one process; load average at the end: {load}.",
        "",
        "| signatures | runs (events/s) | median |",
        "| --- | --- | --- |",
        *(f"| {name} | {', '.join(f'{r:,.0f}' for r in runs[k])} | {med[k]:,.0f} |"
          for k, name in (("unsigned", "unsigned (sha256), no emission log"),
                          ("hmac", "HMAC, no emission log"),
                          ("ed25519", "Ed25519 + emission log (segments)"))),
        "",
        f"Ratio Ed25519 + log / unsigned: **{med['ed25519'] / med['unsigned']:.3f}**; "
        f"/ HMAC: **{med['ed25519'] / med['hmac']:.3f}** (target >= 0.97).",
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / "receipts.md", "a", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
