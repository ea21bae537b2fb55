"""The public surface of sealstream.sources."""

from __future__ import annotations

from pathlib import Path

import pytest

import sealstream.sources as sources
from sealstream.errors import SpecError
from sealstream.sources import FieldPlan, PartitionReader, open_partition


def test_all_is_sorted_and_complete() -> None:
    assert sources.__all__ == sorted(sources.__all__)
    for name in sources.__all__:
        assert hasattr(sources, name)


def test_unknown_kind_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="'xml'"):
        open_partition("xml", "p", tmp_path / "p", FieldPlan("k", "t"))


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_readers_follow_the_protocol(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"p.{kind}"
    path.write_text('{"k":1,"t":2}\n' if kind == "jsonl" else "k,t\n1,2\n")
    reader: PartitionReader = open_partition(kind, "p", path, FieldPlan("k", "t"))
    try:
        assert reader.name == "p"
        chunk = reader.next_chunk(5)
        assert chunk is not None and chunk.eof and chunk.last_offset == 0
        assert chunk.events["__t"].to_list() == [2]
        with pytest.raises(ValueError):
            reader.next_chunk(0)
    finally:
        reader.close()
