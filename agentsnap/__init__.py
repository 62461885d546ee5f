"""agentsnap: multi-agent workflows with consistent snapshots, rollback and idempotent tools.

The names below are the public API; everything else may change without notice.
"""

from agentsnap.agents import Agent, Context, Feedback
from agentsnap.bus import AsyncioScheduler, Scheduler
from agentsnap.exceptions import (
    AgentsnapError,
    ConfigurationError,
    DuplicateAgentError,
    HandlerFailed,
    IdempotencyConflict,
    InvalidAgentName,
    NotFoundError,
    PayloadNotSerializable,
    RunError,
    RuntimeClosedError,
    ScheduleError,
    SchemaOutOfDate,
    SnapshotFailed,
    StateNotSerializable,
    StoreError,
    ToolArgumentsInvalid,
    ToolFailed,
    ToolInProgress,
    ToolOutcomeUnknown,
    UnknownAgentError,
)
from agentsnap.messages import ENVIRONMENT, ChannelId, JsonValue, Marker, Message
from agentsnap.records import (
    AgentCut,
    AgentVersion,
    ChannelRecord,
    JournalMessage,
    JournalSegment,
    RecordedMessage,
    RunInfo,
    Snapshot,
    SnapshotStatus,
)
from agentsnap.runtime import Runtime
from agentsnap.snapshot import SnapshotHandle, SnapshotPolicy
from agentsnap.state import AgentState, PlanStep, ToolCallRecord
from agentsnap.store import MemoryStore, Store
from agentsnap.tools import Ledger, LedgerEntry, Tool, ToolCall, ToolCallStatus, ToolRetry, tool

__version__ = "0.1.0"

__all__ = [
    "ENVIRONMENT",
    "Agent",
    "AgentCut",
    "AgentState",
    "AgentVersion",
    "AgentsnapError",
    "AsyncioScheduler",
    "ChannelId",
    "ChannelRecord",
    "ConfigurationError",
    "Context",
    "DuplicateAgentError",
    "Feedback",
    "HandlerFailed",
    "IdempotencyConflict",
    "InvalidAgentName",
    "JournalMessage",
    "JournalSegment",
    "JsonValue",
    "Ledger",
    "LedgerEntry",
    "Marker",
    "MemoryStore",
    "Message",
    "NotFoundError",
    "PayloadNotSerializable",
    "PlanStep",
    "RecordedMessage",
    "RunError",
    "RunInfo",
    "Runtime",
    "RuntimeClosedError",
    "ScheduleError",
    "Scheduler",
    "SchemaOutOfDate",
    "Snapshot",
    "SnapshotFailed",
    "SnapshotHandle",
    "SnapshotPolicy",
    "SnapshotStatus",
    "StateNotSerializable",
    "Store",
    "StoreError",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolCall",
    "ToolCallRecord",
    "ToolCallStatus",
    "ToolFailed",
    "ToolInProgress",
    "ToolOutcomeUnknown",
    "ToolRetry",
    "UnknownAgentError",
    "__version__",
    "tool",
]
