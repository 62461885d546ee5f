"""The public API is what ``__all__`` says; changing it must be a deliberate edit here."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path
from types import ModuleType

import pytest

import agentsnap
import agentsnap.ledger
import agentsnap.once
import agentsnap.redaction
import agentsnap.semconv
import agentsnap.store.ledger
import agentsnap.telemetry
import agentsnap.testing
import agentsnap.tools

# The public API of agentsnap. Adding or removing a name is an API change: update this list
# in the same change, on purpose.
EXPECTED_ALL = [
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

EXPECTED_TESTING_ALL = [
    "FunctionModel",
    "SampledModel",
    "ScriptedModel",
    "ScriptedScheduler",
    "SeededScheduler",
    "SequentialScheduler",
    "assert_consistent",
    "bus_of",
    "cut_problems",
]


EXPECTED_TOOLS_ALL = [
    "OnDivergence",
    "OnRedo",
    "Tool",
    "ToolCall",
    "ToolRetry",
    "run_tool_calls",
    "tool",
]

EXPECTED_LEDGER_ALL = [
    "Change",
    "Ledger",
    "LedgerEntry",
    "ToolCallStatus",
    "call_key",
    "check_key",
    "fingerprint",
    "is_orphaned",
    "mark_orphaned",
    "orphaned",
    "owner_id",
    "resolve",
]

EXPECTED_ONCE_ALL = [
    "Compensable",
    "Diverged",
    "KnownTools",
    "Outcome",
    "PendingOutcomes",
    "Unrecorded",
    "compensate",
    "effects_done",
    "reconcile",
    "run_once",
]

# agentsnap.telemetry re-exports the table of names, which agentsnap.semconv defines.
EXPECTED_TELEMETRY_ALL = [
    "NAMES",
    "Name",
    "Telemetry",
    "ToolCallSpan",
    "install_sdk",
    "markdown_table",
    "resolve",
    "tool_call",
]

EXPECTED_SEMCONV_ALL = [
    "NAMES",
    "SCOPE",
    "Name",
    "markdown_table",
]


def isort_key(name: str) -> tuple[int, list[int | str]]:
    """The order ruff's RUF022 keeps ``__all__`` in.

    SCREAMING_CASE constants first, then CamelCase classes, then everything else; within each
    group a natural sort (digit runs compare as numbers).
    """
    if len(name) > 1 and name.isupper():
        group = 0
    elif name[:1].isupper():
        group = 1
    else:
        group = 2
    natural: list[int | str] = [
        int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name) if part
    ]
    return group, natural


def test_agentsnap_all_is_pinned() -> None:
    assert agentsnap.__all__ == EXPECTED_ALL, (
        "agentsnap.__all__ changed; if the public API change is deliberate, update "
        "EXPECTED_ALL in tests/test_exported_members.py"
    )


def test_testing_all_is_pinned() -> None:
    assert agentsnap.testing.__all__ == EXPECTED_TESTING_ALL, (
        "agentsnap.testing.__all__ changed; if that is deliberate, update "
        "EXPECTED_TESTING_ALL in tests/test_exported_members.py"
    )


def test_tools_ledger_and_once_all_are_pinned() -> None:
    assert agentsnap.tools.__all__ == EXPECTED_TOOLS_ALL
    assert agentsnap.ledger.__all__ == EXPECTED_LEDGER_ALL
    assert agentsnap.once.__all__ == EXPECTED_ONCE_ALL


def test_the_ledger_names_are_defined_once() -> None:
    # Nothing re-exports the ledger's names: agentsnap.tools and agentsnap.once use them.
    for name in EXPECTED_LEDGER_ALL:
        assert getattr(agentsnap.ledger, name).__module__ == "agentsnap.ledger", name
    assert not set(EXPECTED_LEDGER_ALL) & {*EXPECTED_TOOLS_ALL, *EXPECTED_ONCE_ALL}


def imported_by(module: ModuleType) -> set[str]:
    """What a module of the package agentsnap imports: modules, and ``module.name``."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # The module is in the package agentsnap: ``from . import x`` is agentsnap.x
            found = ".".join(filter(None, ["agentsnap" if node.level else "", node.module]))
            imported.add(found)
            imported.update(f"{found}.{alias.name}" for alias in node.names)
    return imported


def test_the_ledger_and_once_do_not_import_the_tools() -> None:
    # Imports run one way: the tools use the ledger, the ledger knows nothing of the tools.
    for module in (agentsnap.ledger, agentsnap.once):
        imported = imported_by(module)
        assert not {name for name in imported if name.startswith("agentsnap.tools")}


def test_tools_and_the_ledger_import_no_private_names_of_each_other() -> None:
    modules = {"agentsnap.tools", "agentsnap.ledger", "agentsnap.once", "agentsnap.store.ledger"}
    for module in (agentsnap.tools, agentsnap.ledger, agentsnap.once, agentsnap.store.ledger):
        private = {
            name
            for name in imported_by(module)
            if name.rpartition(".")[0] in modules and name.rpartition(".")[2].startswith("_")
        }
        assert not private, (module.__name__, private)


EXPECTED_REDACTION_ALL = [
    "MARKED",
    "Kind",
    "Redaction",
    "Secret",
    "Where",
    "find_markers",
    "unredact",
    "unredact_snapshot",
]


def test_redaction_all_is_pinned() -> None:
    assert agentsnap.redaction.__all__ == EXPECTED_REDACTION_ALL


def test_telemetry_and_semconv_all_are_pinned() -> None:
    assert agentsnap.telemetry.__all__ == EXPECTED_TELEMETRY_ALL
    assert agentsnap.semconv.__all__ == EXPECTED_SEMCONV_ALL


def test_telemetry_re_exports_the_semconv_names_themselves() -> None:
    constants = [name for name in agentsnap.semconv.__annotations__ if name.isupper()]
    assert len(constants) > len(EXPECTED_SEMCONV_ALL)
    for name in [*EXPECTED_SEMCONV_ALL, *constants]:
        assert getattr(agentsnap.telemetry, name) is getattr(agentsnap.semconv, name), name
    assert agentsnap.telemetry.Name.__module__ == "agentsnap.semconv"
    assert agentsnap.telemetry.markdown_table.__module__ == "agentsnap.semconv"


def test_semconv_imports_neither_the_recorder_nor_opentelemetry() -> None:
    # The names are only names: agentsnap.telemetry records with them, and they need neither
    # the recorder nor OpenTelemetry (its SDK least of all).
    imported = imported_by(agentsnap.semconv)
    assert not {name for name in imported if name.startswith("agentsnap.telemetry")}
    assert not {name for name in imported if name.startswith("opentelemetry")}


def test_expected_lists_are_sorted_and_unique() -> None:
    # Guards the lists above, so that a hand edit keeps them in ruff's order.
    for names in (
        EXPECTED_ALL,
        EXPECTED_TESTING_ALL,
        EXPECTED_TOOLS_ALL,
        EXPECTED_LEDGER_ALL,
        EXPECTED_TELEMETRY_ALL,
        EXPECTED_SEMCONV_ALL,
    ):
        assert len(set(names)) == len(names)
        assert names == sorted(names, key=isort_key)


@pytest.mark.parametrize("module", [agentsnap, agentsnap.testing], ids=lambda m: m.__name__)
def test_all_is_sorted_and_unique(module: ModuleType) -> None:
    names = list(module.__all__)
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert not duplicates, f"{module.__name__}.__all__ lists {duplicates} more than once"
    assert names == sorted(names, key=isort_key), f"{module.__name__}.__all__ is not sorted"


@pytest.mark.parametrize("module", [agentsnap, agentsnap.testing], ids=lambda m: m.__name__)
def test_every_exported_name_exists(module: ModuleType) -> None:
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module.__name__}.__all__ names missing attributes: {missing}"


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from agentsnap import *", namespace)
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == sorted(EXPECTED_ALL)


def test_version_matches_the_installed_distribution() -> None:
    assert agentsnap.__version__ == importlib.metadata.version("agentsnap")
