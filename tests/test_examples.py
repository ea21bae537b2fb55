"""The examples under examples/ run as a newcomer runs them, and show what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_agent_story_shows_the_tampered_checkpoint_refused() -> None:
    """Step 6 edits a copy of the newest checkpoint: its verdict is printed and is
    not ATOMIC (the edit used to change nothing, and the demo printed ATOMIC)."""
    pytest.importorskip("langgraph.graph")
    env = {k: v for k, v in os.environ.items()
           if k not in ("SEALSTREAM_CRASH_AT", "SEALSTREAM_ENCRYPTION_KEY")}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "agent_payment.py")], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    step6 = proc.stdout.split("== 6.", 1)[1]
    verdict = re.search(r"checkpoint \S+: (\w+) \((\w+)\)", step6)
    assert verdict is not None, step6
    assert verdict.group(1) != "ATOMIC_CHECKPOINT"
    assert verdict.groups() == ("INCONSISTENT_STATE", "SIGNATURE_MISMATCH")
    assert "tampering detected" in step6
