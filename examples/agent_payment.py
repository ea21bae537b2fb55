"""A payment agent that is killed mid-payment and pays exactly once.

Run it::

    .venv/bin/python examples/agent_payment.py            # the whole story
    .venv/bin/python examples/agent_payment.py --dir D step   # one run of the agent

The story (each agent run is a separate process):

1. the agent plans a payment and stops at an approval: a pending approval that
   survives the process;
2. an operator approves it explicitly;
3. the agent resumes, the payment tool submits the payment to the provider and
   the process is SIGKILLed right after the tool returns, before the outcome or
   the next checkpoint is written (``SEALSTREAM_CRASH_AT=after_call``);
4. the agent resumes: the unfinished intent is reconciled with the provider
   (payment found under its idempotency key: recorded, not submitted again);
5. the verified history: every LangGraph checkpoint and ledger row is checked by
   the guard; the provider shows exactly one payment and one submission;
6. a copy of the store is edited by hand: the guard names the tampered checkpoint.

Set ``SEALSTREAM_CHECKPOINT_KEY`` to sign with HMAC-SHA256 (without it rows carry
an unkeyed SHA-256, which detects corruption but not deliberate tampering) and
``SEALSTREAM_ENCRYPTION_KEY`` (64 hex digits) to encrypt every row.

The payment provider is a SQLite file with its own idempotency-key table, acting
as the external system. Nothing here needs a model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from sealstream.agents import (
    AgentCheckpoint,
    Artifact,
    EffectLedger,
    Reconciliation,
    Tool,
)
from sealstream.agents.langgraph import SealstreamSaver

THREAD = "invoice-2024-117"
APPROVAL = "pay-invoice-2024-117"
INVOICE = {"invoice": "2024-117", "payee": "ACME GmbH", "amount_cents": 125_000}


class PaymentProvider:
    """The external system: payments deduplicated by idempotency key; every request logged."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS payments (idem_key TEXT PRIMARY KEY, payment_id TEXT, "
            "payee TEXT, amount_cents INTEGER)")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS requests (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "kind TEXT, idem_key TEXT)")

    def submit(self, key: str, payee: str, amount_cents: int) -> dict[str, Any]:
        self.conn.execute("INSERT INTO requests (kind, idem_key) VALUES ('submit', ?)", (key,))
        pid = f"pay_{key[:10]}"
        self.conn.execute("INSERT INTO payments VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                          (key, pid, payee, amount_cents))
        found = self.lookup(key, log=False)
        assert found is not None
        return found

    def lookup(self, key: str, log: bool = True) -> dict[str, Any] | None:
        if log:
            self.conn.execute("INSERT INTO requests (kind, idem_key) VALUES ('lookup', ?)",
                              (key,))
        row = self.conn.execute("SELECT payment_id, payee, amount_cents FROM payments "
                                "WHERE idem_key = ?", (key,)).fetchone()
        if row is None:
            return None
        return {"payment_id": row[0], "payee": row[1], "amount_cents": row[2]}

    def close(self) -> None:
        self.conn.close()

    def counts(self) -> dict[str, int]:
        def one(sql: str) -> int:
            return int(self.conn.execute(sql).fetchone()[0])

        return {"payments": one("SELECT COUNT(*) FROM payments"),
                "submits": one("SELECT COUNT(*) FROM requests WHERE kind = 'submit'"),
                "lookups": one("SELECT COUNT(*) FROM requests WHERE kind = 'lookup'")}


class State(TypedDict, total=False):
    invoice: str
    payee: str
    amount_cents: int
    conversation: list[str]
    approved: bool
    payment: dict[str, Any]


def payment_tool(provider: PaymentProvider) -> Tool:
    """Submits with the idempotency key; reconciles by asking the provider about it."""

    def lookup(key: str, args: Any) -> Reconciliation:
        found = provider.lookup(key)
        return Reconciliation(found is not None, found)

    return Tool("pay", call=lambda key, args: provider.submit(key, **args), reconcile=lookup)


def build(saver: SealstreamSaver, ledger: EffectLedger, provider: PaymentProvider) -> Any:
    pay_tool = payment_tool(provider)

    def plan(state: State) -> State:
        line = f"plan: pay {state['amount_cents'] / 100:.2f} to {state['payee']}"
        return {"conversation": [*state.get("conversation", []), line]}

    def approve(state: State) -> State:
        ledger.request_approval(APPROVAL, {"payee": state["payee"],
                                           "amount_cents": state["amount_cents"]})
        approval = ledger.approval(APPROVAL)
        if approval is None or approval.status == "pending":
            interrupt({"approval": APPROVAL})  # stops here until resumed by a decision
            approval = ledger.approval(APPROVAL)
        assert approval is not None and approval.status != "pending"
        line = f"approval: {approval.status} by {approval.by}"
        return {"approved": approval.status == "approved",
                "conversation": [*state["conversation"], line]}

    def pay(state: State) -> State:
        payment = ledger.perform(pay_tool, step=f"{state['invoice']}:pay",
                                 args={"payee": state["payee"],
                                       "amount_cents": state["amount_cents"]})
        return {"payment": payment,
                "conversation": [*state["conversation"], f"paid: {payment['payment_id']}"]}

    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("approve", approve)
    graph.add_node("pay", pay)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "approve")
    graph.add_conditional_edges("approve", lambda s: "pay" if s["approved"] else END)
    graph.add_edge("pay", END)
    return graph.compile(checkpointer=saver)


def step(work: Path) -> int:
    """One run of the agent: start, resume after a crash, or resume an approval."""
    saver = SealstreamSaver(work / "agents.db")
    ledger = EffectLedger(saver.store, THREAD)
    provider = PaymentProvider(work / "provider.db")
    graph = build(saver, ledger, provider)
    config: Any = {"configurable": {"thread_id": THREAD}}
    open_intents = [e for e in ledger.effects() if not e.done]
    if open_intents:
        print(f"[agent] resuming: {len(open_intents)} effect(s) started but not recorded; "
              "reconciling them first")
        for effect in ledger.reconcile_pending({"pay": payment_tool(provider)}):
            print(f"[agent] reconciled {effect.tool} key={effect.key[:12]}…: via={effect.via}")
    snapshot = graph.get_state(config)
    if not snapshot.values:
        print("[agent] new execution", THREAD)
        graph.invoke(dict(INVOICE), config, durability="sync")
    elif any(t.interrupts for t in snapshot.tasks):
        approval = ledger.approval(APPROVAL)
        if approval is None or approval.status == "pending":
            print(f"[agent] still waiting for approval {APPROVAL}")
            saver.close()
            provider.close()
            return 0
        print(f"[agent] approval {approval.status}: resuming")
        graph.invoke(Command(resume=approval.status), config, durability="sync")
    elif snapshot.tasks:  # stopped mid-run: tasks left, or done but not checkpointed
        print(f"[agent] resuming after node(s) {[t.name for t in snapshot.tasks]}")
        graph.invoke(None, config, durability="sync")
    else:
        print("[agent] execution already finished")
    final = graph.get_state(config)
    for effect in ledger.effects():
        print(f"[agent] effect {effect.tool} key={effect.key[:12]}… done={effect.done} "
              f"via={effect.via}")
    if any(t.interrupts for t in final.tasks):
        pending = [a.approval_id for a in ledger.pending_approvals()]
        print(f"[agent] waiting for approval: {pending}")
    elif not final.next:
        receipt = json.dumps(final.values.get("payment"), sort_keys=True).encode()
        (work / "receipt.json").write_bytes(receipt)
        saved = saver.store.save(AgentCheckpoint(
            THREAD, node="done",
            conversation=[{"text": t} for t in final.values["conversation"]],
            state={"invoice": final.values["invoice"]},
            completed_actions=ledger.completed(),
            artifacts=[Artifact.of((work / "receipt.json").resolve().as_uri(), receipt)],
            namespace="summary"))
        print(f"[agent] finished; summary checkpoint {saved.checkpoint_id} saved")
    saver.close()
    provider.close()
    return 0


def history(work: Path) -> None:
    saver = SealstreamSaver(work / "agents.db")
    ledger = EffectLedger(saver.store, THREAD)
    print("verified history of", THREAD)
    for ns in saver.store.namespaces(THREAD):
        for v in saver.store.history(THREAD, ns):
            print(f"  checkpoint {ns or '(root)'}/{v.checkpoint_id}: {v.verdict} ({v.reason})")
    for v in ledger.verify():
        key, _, kind = v.checkpoint_id.partition("|")
        print(f"  ledger {key[:12]}…|{kind}: {v.verdict} ({v.reason})")
    for approval in [ledger.approval(APPROVAL)]:
        assert approval is not None
        who = f" by {approval.by}" if approval.by else ""
        print(f"  approval {approval.approval_id}: {approval.status}{who}")
    provider = PaymentProvider(work / "provider.db")
    counts = provider.counts()
    provider.close()
    print(f"provider: {counts['payments']} payment(s), {counts['submits']} submit request(s), "
          f"{counts['lookups']} lookup(s)")
    saver.close()


def run_child(work: Path, crash: str | None = None) -> int:
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    if crash:
        env["SEALSTREAM_CRASH_AT"] = crash
    proc = subprocess.run([sys.executable, __file__, "--dir", str(work), "step"], env=env,
                          check=False)
    return proc.returncode


def story(work: Path) -> int:
    print(f"== 1. start the agent (state in {work})")
    run_child(work)
    print("== 2. an operator approves the payment explicitly")
    ledger = EffectLedger(work / "agents.db", THREAD)
    print("   pending:", [a.approval_id for a in ledger.pending_approvals()])
    ledger.decide(APPROVAL, True, by="operator@example.com", note="invoice checked")
    ledger.close()
    print("== 3. resume; the process is SIGKILLed right after the payment tool returns")
    code = run_child(work, crash="after_call:1")
    print(f"   agent process exited with {code}"
          + (" (killed by SIGKILL)" if code == -signal.SIGKILL else ""))
    provider = PaymentProvider(work / "provider.db")
    print("   provider now:", provider.counts())
    provider.close()
    print("== 4. resume after the crash")
    run_child(work)
    print("== 5. verified history")
    history(work)
    print("== 6. tamper with a copy: the newest checkpoint's manifest is edited by hand")
    tampered = work / "tampered"
    tampered.mkdir(exist_ok=True)
    shutil.copy(work / "agents.db", tampered / "agents.db")
    conn = sqlite3.connect(tampered / "agents.db")
    name, data = conn.execute("SELECT name, data FROM agent_rows WHERE space = 'cp' AND "
                              "execution = ? AND ns = '' ORDER BY name DESC", (THREAD,)).fetchone()
    edited = bytearray(data)
    value = re.search(rb'"created_ms":\s*(\d)', data) if data.startswith(b"{") else None
    if value is not None:  # signed JSON (compact): change one digit of a value
        digit = value.start(1)
        edited[digit] = ord("1") if edited[digit] != ord("1") else ord("2")
    else:  # an encrypted envelope: flip one bit
        edited[len(edited) // 2] ^= 1
    if bytes(edited) == bytes(data):
        raise SystemExit("step 6: the edit changed nothing; the demo would prove nothing")
    conn.execute("UPDATE agent_rows SET data = ? WHERE space = 'cp' AND name = ?",
                 (bytes(edited), name))
    conn.commit()
    conn.close()
    saver = SealstreamSaver(tampered / "agents.db")
    verdict = saver.store.verify(THREAD, name)
    print(f"   checkpoint {name}: {verdict.verdict} ({verdict.reason})")
    saver.close()
    if verdict.verdict == "ATOMIC_CHECKPOINT":
        print("   FAILED: the edited checkpoint still verifies", file=sys.stderr)
        return 1
    print("   tampering detected: the guard refuses to resume from this checkpoint")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="working directory")
    parser.add_argument("command", nargs="?", default="story",
                        choices=["story", "step", "history"])
    args = parser.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="agent-payment-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.command == "step":
        return step(work)
    if args.command == "history":
        history(work)
        return 0
    if any(work.iterdir()):  # the story needs a fresh state: never reuse leftovers
        parser.error(f"--dir {work} is not empty; the story starts from nothing "
                     "(omit --dir to use a new temporary directory)")
    return story(work)


if __name__ == "__main__":
    sys.exit(main())
