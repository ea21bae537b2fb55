"""What object storage does not cover yet is refused in one line (exit 2), before
anything is read or created: followed S3 inputs and the raw-event archive; and S3 outputs
that cannot work (a bad bucket name, prefixes inside each other, an endpoint for a
local directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sealstream.cli import main
from test_pipeline_spec import base_spec, write_inputs, write_spec


def _edit_source(spec: dict[str, Any]) -> None:
    spec["source"]["paths"] = ["s3://bucket/events/*.jsonl"]
    spec["source"]["follow"] = True


def _edit_sink(spec: dict[str, Any]) -> None:
    spec["sink"]["path"] = "s3://bucket/out"
    spec["late"]["path"] = "s3://bucket/out/late"


def _edit_late(spec: dict[str, Any]) -> None:
    spec["late"]["path"] = "S3://Not_A_Bucket/late"


def _edit_endpoint(spec: dict[str, Any]) -> None:
    spec["sink"]["endpoint_url"] = "http://127.0.0.1:9000"


def _edit_archive(spec: dict[str, Any]) -> None:
    spec["archive"] = {"url": "s3://bucket/archive"}


@pytest.mark.parametrize(("edit", "needle"), [
    (_edit_source, "source.paths[0]: 's3://bucket/events/*.jsonl': following objects in S3 "
                   "is not supported yet"),
    (_edit_sink, "late.path: 's3://bucket/out/late' overlaps the sink output; give each its "
                 "own prefix"),
    (_edit_late, "late.path: S3://Not_A_Bucket/late: expected s3://BUCKET/PREFIX"),
    (_edit_endpoint, "sink.endpoint_url: only for an s3:// path"),
    (_edit_archive, "[archive]: the raw-event archive is supported for kind = \"kafka\" "
                    "and \"nats\" sources and for followed jsonl/csv files (follow = true), "
                    "not yet for a bounded 'jsonl' source"),
])
def test_not_yet_supported_object_storage_is_one_line(tmp_path: Path, edit: Any, needle: str,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    d = tmp_path / "job"
    write_inputs(d)
    spec = base_spec()
    edit(spec)
    rc = main(["run", str(write_spec(d, spec))])
    _, err = capsys.readouterr()
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("sealstream: error: "), err
    assert needle in err, err
    assert sorted(p.name for p in d.iterdir()) == ["in", "spec.toml"]
