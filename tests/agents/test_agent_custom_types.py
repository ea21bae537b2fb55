"""Issue 19, defect 6: custom state types (dataclasses, pydantic models) come back
as themselves after a restart, without pickle, once registered; an unregistered
type is refused with a clear error instead of coming back as a plain dict."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

import pydantic  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402
from sealstream.errors import CheckpointError, SpecError  # noqa: E402

KEY = b"custom-types-key"


@dataclass
class Order:
    id: str
    amount: int


class Customer(pydantic.BaseModel):
    name: str
    vip: bool = False


class S(TypedDict, total=False):
    order: Order
    customer: Customer
    n: int


def _graph(saver: SealstreamSaver) -> Any:
    def first(state: S) -> S:
        return {"order": Order("o-1", 42), "customer": Customer(name="Ada"), "n": 1}

    def second(state: S) -> S:
        assert isinstance(state["order"], Order), type(state["order"])
        assert isinstance(state["customer"], Customer), type(state["customer"])
        return {"n": state["n"] + 1}

    g = StateGraph(S)
    g.add_node("first", first)
    g.add_node("second", second)
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    g.add_edge("second", END)
    return g.compile(checkpointer=saver, interrupt_before=["second"])


def test_registered_custom_types_survive_a_restart(tmp_path: Path) -> None:
    db, cfg = tmp_path / "agents.db", {"configurable": {"thread_id": "t"}}
    saver = SealstreamSaver(db, key=KEY, encryption_key=None,
                            allowed_types=[Order, Customer])
    _graph(saver).invoke({"n": 0}, cfg)  # stops before "second"
    saver.close()  # the process restarts
    saver = SealstreamSaver(db, key=KEY, encryption_key=None,
                            allowed_types=[Order, Customer])
    out = _graph(saver).invoke(None, cfg)
    assert out["order"] == Order("o-1", 42) and out["customer"] == Customer(name="Ada")
    assert out["n"] == 2
    saver.close()


def test_an_unregistered_type_is_refused_clearly(tmp_path: Path) -> None:
    saver = SealstreamSaver(tmp_path / "agents.db", key=KEY, encryption_key=None)
    with pytest.raises(CheckpointError, match=r"test_agent_custom_types\.Order.*allowed_types"):
        _graph(saver).invoke({"n": 0}, {"configurable": {"thread_id": "t"}})
    saver.close()
    with pytest.raises(SpecError, match="allowed_types"):
        SealstreamSaver(tmp_path / "b.db", key=KEY, encryption_key=None,
                        allowed_types=Order)  # type: ignore[arg-type]
