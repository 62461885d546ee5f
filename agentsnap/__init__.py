"""agentsnap: multi-agent workflows with consistent snapshots, rollback and idempotent tools.

The names below are the public API; everything else may change without notice.
"""

import logging

from agentsnap.agents import Agent, Context, DoneEffect, Feedback
from agentsnap.bus import AsyncioScheduler, Scheduler
from agentsnap.checks import Verdict
from agentsnap.exceptions import (
    AgentsnapError,
    AnswerInvalid,
    ApprovalDenied,
    ConfigurationError,
    DuplicateAgentError,
    EffectDiverged,
    HandlerFailed,
    IdempotencyConflict,
    InvalidAgentName,
    NotFoundError,
    OutputRejected,
    OwnershipLost,
    PayloadInvalid,
    PayloadNotSerializable,
    RedactedValueNeeded,
    RequestExpired,
    RequestNotPending,
    RequestRejected,
    RollbackExhausted,
    RunCancelled,
    RunError,
    RunOwnedError,
    RuntimeClosedError,
    ScheduleError,
    SchemaOutOfDate,
    Signal,
    SnapshotDamaged,
    SnapshotFailed,
    SnapshotInProgress,
    StateInvalid,
    StateNotReadable,
    StateNotSerializable,
    StoreError,
    ToolArgumentsInvalid,
    ToolFailed,
    ToolInProgress,
    ToolOutcomeUnknown,
    TransportError,
    UnknownAgentError,
)
from agentsnap.handles import SnapshotHandle
from agentsnap.ledger import Ledger, LedgerEntry, ToolCallStatus
from agentsnap.messages import ENVIRONMENT, ChannelId, JsonInput, JsonValue, Marker, Message
from agentsnap.model_calls import ModelCallRecord
from agentsnap.models import ChatMessage, ModelRequest, ModelResponse, ToolSpec
from agentsnap.ownership import RunOwnership
from agentsnap.records import (
    AgentCut,
    AgentVersion,
    ChannelRecord,
    GraphCheckpoint,
    JournalMessage,
    JournalSegment,
    RecordedMessage,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunLease,
    RunOwner,
    RunStatus,
    Snapshot,
    SnapshotStatus,
)
from agentsnap.redaction import Redaction
from agentsnap.requests import Approval, HumanRequest
from agentsnap.rollback import RetryPolicy
from agentsnap.runtime import Runtime
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.state import AgentState, PlanStep, ToolCallRecord
from agentsnap.store import MemoryStore, Store
from agentsnap.store.faults import StoreRetry
from agentsnap.tools import Tool, ToolCall, ToolRetry, tool
from agentsnap.versions import upcaster

__version__ = "0.1.0"

# Log records go where the application sends them; none are printed unless it configures
# logging (the standard advice for libraries).
logging.getLogger("agentsnap").addHandler(logging.NullHandler())

__all__ = [
    "ENVIRONMENT",
    "Agent",
    "AgentCut",
    "AgentState",
    "AgentVersion",
    "AgentsnapError",
    "AnswerInvalid",
    "Approval",
    "ApprovalDenied",
    "AsyncioScheduler",
    "ChannelId",
    "ChannelRecord",
    "ChatMessage",
    "ConfigurationError",
    "Context",
    "DoneEffect",
    "DuplicateAgentError",
    "EffectDiverged",
    "Feedback",
    "GraphCheckpoint",
    "HandlerFailed",
    "HumanRequest",
    "IdempotencyConflict",
    "InvalidAgentName",
    "JournalMessage",
    "JournalSegment",
    "JsonInput",
    "JsonValue",
    "Ledger",
    "LedgerEntry",
    "Marker",
    "MemoryStore",
    "Message",
    "ModelCallRecord",
    "ModelRequest",
    "ModelResponse",
    "NotFoundError",
    "OutputRejected",
    "OwnershipLost",
    "PayloadInvalid",
    "PayloadNotSerializable",
    "PlanStep",
    "RecordedMessage",
    "RedactedValueNeeded",
    "Redaction",
    "ReplaySegment",
    "RequestExpired",
    "RequestNotPending",
    "RequestRejected",
    "RetryPolicy",
    "RollbackExhausted",
    "RollbackInfo",
    "RunCancelled",
    "RunError",
    "RunInfo",
    "RunLease",
    "RunOwnedError",
    "RunOwner",
    "RunOwnership",
    "RunStatus",
    "Runtime",
    "RuntimeClosedError",
    "ScheduleError",
    "Scheduler",
    "SchemaOutOfDate",
    "Signal",
    "Snapshot",
    "SnapshotDamaged",
    "SnapshotFailed",
    "SnapshotHandle",
    "SnapshotInProgress",
    "SnapshotPolicy",
    "SnapshotStatus",
    "StateInvalid",
    "StateNotReadable",
    "StateNotSerializable",
    "Store",
    "StoreError",
    "StoreRetry",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolCall",
    "ToolCallRecord",
    "ToolCallStatus",
    "ToolFailed",
    "ToolInProgress",
    "ToolOutcomeUnknown",
    "ToolRetry",
    "ToolSpec",
    "TransportError",
    "UnknownAgentError",
    "Verdict",
    "__version__",
    "tool",
    "upcaster",
]
