"""The fourth decision rule, judged without a disk: a checkpoint whose only missing or
damaged components are rebuildable is resumed from (PARTIAL, REBUILDABLE_COMPONENT);
any other problem beside it, the signature's included, keeps the plain verdict."""

from __future__ import annotations

import pytest
from test_guard import PARTIAL, Ckpt, parent_of

from sealstream.checkpoint.guard import (
    ATOMIC,
    INCONSISTENT,
    REBUILDABLE_REASON,
    FileFact,
    judge,
    judge_resumable,
)
from sealstream.checkpoint.manifest import STATE_NAME, SUPPRESS_NAME

KEY = b"k"


def _ckpt() -> Ckpt:
    return Ckpt(key=KEY, suppress_bytes=b"ARROW1\x00\x00suppress" * 9)


@pytest.mark.parametrize("damage", ["missing", "truncated", "altered", "undecryptable"])
def test_only_the_suppression_set_damaged_is_resumable(damage: str) -> None:
    c = _ckpt()
    facts = c.facts()
    rel = c.path(SUPPRESS_NAME)
    size = facts[rel].size
    facts[rel] = {
        "missing": FileFact(False),
        "truncated": FileFact(True, size // 2, "0" * 64),
        "altered": FileFact(True, size, "0" * 64),
        "undecryptable": FileFact(True, size, "", ("DECRYPTION_FAILED", "altered")),
    }[damage]
    ev = c.evidence(files=facts)
    plain = judge(ev, parent_of(c), c.policy())
    assert plain.verdict != ATOMIC
    v = judge_resumable(ev, parent_of(c), c.policy())
    assert (v.verdict, v.reason, v.rebuild) == (PARTIAL, REBUILDABLE_REASON, ("suppress",))
    assert v.resumable and not v.ok and v.watermark_ms == c.watermark["global_ms"]
    assert v.to_json()["rebuild"] == ["suppress"]


def test_an_intact_checkpoint_is_atomic_as_before() -> None:
    c = _ckpt()
    v = judge_resumable(c.evidence(), parent_of(c), c.policy())
    assert v.ok and v.rebuild == ()


@pytest.mark.parametrize("other", ["state altered", "wrong key", "watermark mismatch",
                                   "not a regular file"])
def test_another_problem_beside_it_is_not_resumable(other: str) -> None:
    c = _ckpt()
    facts = c.facts()
    facts[c.path(SUPPRESS_NAME)] = FileFact(False)
    ev = c.evidence(files=facts)
    policy = c.policy()
    if other == "state altered":
        facts[c.path(STATE_NAME)] = FileFact(True, facts[c.path(STATE_NAME)].size, "0" * 64)
    elif other == "wrong key":
        policy = c.policy(key=b"another")
    elif other == "watermark mismatch":
        ev = c.evidence(files=facts, state_meta={"watermark": {"global_ms": 1}})
    else:
        facts[c.path(SUPPRESS_NAME)] = FileFact(True, 0, "", ("NOT_A_REGULAR_FILE", "a FIFO"))
    v = judge_resumable(ev, parent_of(c), policy)
    assert not v.resumable and v.rebuild == ()
    assert v == judge(ev, parent_of(c), policy)
    assert v.verdict in (PARTIAL, INCONSISTENT)
