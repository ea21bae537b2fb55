"""Scale-out story (semantics sections 14 and 16): a job signed with an Ed25519 key runs
on 2 Ray workers, lines are appended, and it runs again on 3. An auditor holding only
the public key proves, through the public CLI alone, a result committed before the
rescale and one committed after it, and that the log after the rescale extends the
one before (no emitted epoch was removed or rewritten by the change of worker count)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scenarios._story import committed, make_input, write_spec
from scenarios.test_backfill_again import _append_second_part
from sealstream.checkpoint import manifest as mf
from sealstream.checkpoint import signing


def _ids(ckpt: Path) -> list[int]:
    return sorted(int(p.name[3:]) for p in ckpt.glob("cp-*"))


def test_proofs_and_consistency_across_a_rescale_from_2_to_3_workers(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sealstream.cli import main

    signing.generate(tmp_path / "keys")
    for name in (mf.KEY_ENV, signing.SIGNING_KEY_ENV, signing.VERIFY_KEYS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(signing.SIGNING_KEY_FILE_ENV,
                       str(tmp_path / "keys" / signing.PRIVATE_NAME))
    job = tmp_path / "job"
    names = make_input(job, partitions=3, events=300, seed=21)
    spec = write_spec(job, names, every_events=150, batch_size=40, keep=50)
    assert main(["run", str(spec), "--quiet", "--workers", "2"]) == 0
    before = _ids(job / "ckpt")[-1]
    first = committed(job, "out")
    _append_second_part(job, names, seed=22)
    assert main(["run", str(spec), "--quiet", "--workers", "3"]) == 0
    after = _ids(job / "ckpt")[-1]
    assert after > before
    seen = {(r["key"], r["window_start"]) for r in first}
    later = [r for r in committed(job, "out") if (r["key"], r["window_start"]) not in seen]
    assert later, "the second run committed nothing new"
    capsys.readouterr()

    # from here on: the auditor, with the public key only
    monkeypatch.delenv(signing.SIGNING_KEY_FILE_ENV)
    public = str(tmp_path / "keys" / signing.PUBLIC_NAME)
    store = str(job / "ckpt")
    for n, r in enumerate((first[0], later[-1])):
        rc = main(["checkpoints", "window", store, "--key", str(r["key"]), "--start",
                   str(r["window_start"]), "--end", str(r["window_end"]), "--json",
                   "--public-key", public])
        out = capsys.readouterr().out
        assert rc == 0, out
        data = json.loads(out)
        proof = data["checkpoint"]["output_emission_receipt"]
        assert proof["receipt_proof"] == 2 and proof["checkpoint"] == after, proof
        assert data["manifest"]["verdict"] == "ATOMIC_CHECKPOINT"
        (tmp_path / f"w{n}.json").write_text(out)
        rc = main(["receipts", "verify", str(tmp_path / f"w{n}.json"), "--checkpoints", store,
                   "--public-key", public])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert out.splitlines()[-1] == "1 proof checked, 0 failed"
    # the result committed before the rescale sits in an epoch the pre-rescale log holds
    pre = json.loads((tmp_path / "w0.json").read_text())
    assert pre["checkpoint"]["output_emission_receipt"]["epoch"] <= before
    rc = main(["receipts", "consistency", store, str(before), str(after), "--json",
               "--public-key", public])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(out)
    assert data["ok"] and data["old"]["checkpoint"] == before
    assert data["new"]["size"] > data["old"]["size"]
    # a proof with one byte flipped fails, with the public key alone
    bad = json.loads((tmp_path / "w1.json").read_text())
    rec = bad["checkpoint"]["output_emission_receipt"]
    rec["log_path"] = ("B" if rec["log_path"][0] != "B" else "C") + rec["log_path"][1:]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    rc = main(["receipts", "verify", str(tmp_path / "bad.json"), "--checkpoints", store,
               "--public-key", public])
    assert rc == 1
    assert capsys.readouterr().out.splitlines()[-1] == "1 proof checked, 1 failed"
