"""Exact decimals with Ray workers: the output is byte-identical to one process's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sealstream.cli import main
from test_decimals import _input, results_bytes, write_spec


def test_two_workers_write_the_single_process_decimal_bytes(
        ray_cluster: Any, tmp_path: Path) -> None:
    outputs = []
    for workers in (None, 2):
        d = tmp_path / f"w{workers}"
        d.mkdir()
        spec = write_spec(d, _input(d, events=1500), checkpoint='path = "ckpt"',
                          every_events=500, max_delay_ms=2000)
        extra = [] if workers is None else ["--workers", str(workers)]
        assert main(["run", str(spec), "--quiet", *extra]) == 0
        # each worker writes its own part files (docs/scale-out.md): the same result
        # lines, byte for byte, in another file order
        outputs.append(sorted(results_bytes(d / "out").splitlines()))
    assert outputs[0] and outputs[0] == outputs[1]
