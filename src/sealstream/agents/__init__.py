"""Durable, verifiable checkpoints for AI-agent workflows.

* :class:`AgentCheckpointStore` — signed agent checkpoints per execution id and
  namespace (conversation, node, completed actions, pending approvals, artifact
  references), verified by the pure guard in :mod:`sealstream.agents.judge`, kept
  as a history, pruned by retention, optionally encrypted (fail closed).
* :class:`EffectLedger` — intents and outcomes of side effects with deterministic
  idempotency keys; unfinished intents are reconciled, never blindly repeated;
  approvals that survive restarts.
* Row stores: :class:`SqliteRowStore` (embedded default) and
  :class:`PostgresRowStore` (shared deployments).
* ``sealstream.agents.langgraph.SealstreamSaver`` — a LangGraph checkpoint saver on
  the same store (``pip install 'sealstream[langgraph]'``; imported lazily).

See ``docs/agents.md``.
"""

from __future__ import annotations

from sealstream.agents._seal import KeyRing, key_label
from sealstream.agents.checkpoint import (
    AgentCheckpoint,
    AgentCheckpointError,
    AgentCheckpointStore,
    Artifact,
    NoValidAgentCheckpointError,
)
from sealstream.agents.judge import AgentVerdict
from sealstream.agents.ledger import (
    Approval,
    ApprovalError,
    Effect,
    EffectLedger,
    Reconciliation,
    Tool,
    UnreconciledEffectError,
    idempotency_key,
)
from sealstream.agents.store import PostgresRowStore, RowStore, SqliteRowStore, open_row_store

__all__ = [
    "AgentCheckpoint",
    "AgentCheckpointError",
    "AgentCheckpointStore",
    "AgentVerdict",
    "Approval",
    "ApprovalError",
    "Artifact",
    "Effect",
    "EffectLedger",
    "KeyRing",
    "NoValidAgentCheckpointError",
    "PostgresRowStore",
    "Reconciliation",
    "RowStore",
    "SqliteRowStore",
    "Tool",
    "UnreconciledEffectError",
    "idempotency_key",
    "key_label",
    "open_row_store",
]
