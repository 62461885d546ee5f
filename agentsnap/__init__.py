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
    "InvalidAgentName",
    "JournalMessage",
    "JournalSegment",
    "JsonValue",
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
    "ToolCallRecord",
    "UnknownAgentError",
    "__version__",
]
