"""Issue 33 (checkpointed runs within 95 % of unchecked): an epoch's result receipt
(sorted ids, digest, Merkle root: the bulk of the receipts' work) is built on its own
thread as soon as the checkpoint closes the epoch, beside the writer thread making the
epoch's output durable, not after it. The final checkpoint of a bounded run, which the
run waits for, then waits for the longer of the two instead of their sum.

The story: a job whose only checkpoint is the final one; the results sink's fsyncs
(``durable``) wait until the epoch's Merkle root has been built (a generous bound, then
they go on). Before the change the root was built only after them: the bound ran out
and the run's receipt came too late. The checkpoint must still verify, with the same
root as the reference's."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import in_process, make_input, write_spec  # noqa: E402

from sealstream.checkpoint import receipts as trees  # noqa: E402
from sealstream.checkpoint.manifest import RECEIPT_IDS_NAME  # noqa: E402
from sealstream.sinks.jsonl import JsonlDirSink  # noqa: E402

BOUND_S = 60.0  # generous: the root of a few hundred ids takes milliseconds


def test_the_final_receipt_is_built_while_the_output_is_made_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = threading.Event()
    roots: list[tuple[str, str]] = []
    real_root, real_of_leaves = trees.root, trees.root_of_leaves

    def noted(r: str) -> str:
        roots.append((threading.current_thread().name, r))
        built.set()
        return r

    def root(ids: pl.Series) -> str:
        return noted(real_root(ids))

    def root_of_leaves(leaves: pl.Series) -> str:
        return noted(real_of_leaves(leaves))

    seen: list[bool] = []  # per durable() of the results: was the root built by then?
    real_prepare = JsonlDirSink.prepare_deferred

    def prepare_deferred(self: JsonlDirSink, epoch: int
                         ) -> tuple[list[str], Callable[[], None]]:
        tokens, durable = real_prepare(self, epoch)

        def waiting() -> None:
            if tokens:
                seen.append(built.wait(BOUND_S))
            durable()

        return tokens, waiting

    monkeypatch.setattr(trees, "root", root)
    monkeypatch.setattr(trees, "root_of_leaves", root_of_leaves, raising=False)
    monkeypatch.setattr(JsonlDirSink, "prepare_deferred", prepare_deferred)
    d = tmp_path / "job"
    spec = write_spec(d, make_input(d, events=200), every_events=1_000_000)
    res = in_process("run", str(spec), "--quiet")
    assert res.returncode == 0, res.stderr
    assert seen and all(seen), seen  # results and late events: the root built meanwhile
    assert [name.startswith("sealstream-receipts") for name, _ in roots] == [True], roots
    ok = in_process("checkpoints", "verify", str(d / "ckpt"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the ids the checkpoint wrote give that root, built from scratch
    cps = sorted((d / "ckpt").glob("cp-*"))
    ids = trees.decode_ids((cps[-1] / RECEIPT_IDS_NAME).read_bytes())
    assert ids.len() > 0 and real_root(ids) == roots[0][1]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 13, 100])
def test_the_root_of_leaves_staged_ahead_is_the_root_of_the_ids(n: int) -> None:
    """Leaves hashed as results are staged (any order), sorted with their ids at the
    epoch's close, give the root :func:`trees.root` gives over the sorted ids."""
    ids = pl.Series("id", [f"u{(i * 7919) % 1009}|false|{i % 4}|{i % 4 + 60}"
                           for i in range(n)], dtype=pl.String)
    staged = pl.DataFrame({"id": ids}).with_columns(trees.leaf_hashes(pl.col("id")).alias("h"))
    both = staged.sort("id")
    assert trees.root_of_leaves(both["h"]) == trees.root(ids.sort())
