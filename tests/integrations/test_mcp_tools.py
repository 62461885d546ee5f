"""MCP tools against a real MCP server process (``mcp_bank.py``, started over stdio)."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.types import CallToolResult, ImageContent, TextContent

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    Runtime,
    ToolFailed,
)
from agentsnap.integrations.mcp import (
    IDEMPOTENCY_KEY,
    McpToolError,
    by_annotations,
    mcp_server,
    mcp_tools,
    result_json,
)
from agentsnap.store.ledger import MemoryLedger
from agentsnap.testing import SampledModel
from agentsnap.tools import Tool

BANK = Path(__file__).with_name("mcp_bank.py")


@pytest.fixture
def bank_db(tmp_path: Path) -> Path:
    return tmp_path / "bank.db"


@contextlib.asynccontextmanager
async def bank(bank_db: Path) -> AsyncIterator[ClientSession]:
    """The bank server, started for the test (an async fixture would stop it in another task,
    which the MCP SDK's task groups refuse)."""
    async with mcp_server(sys.executable, [str(BANK)], env={"BANK_DB": str(bank_db)}) as opened:
        yield opened


def calls(bank_db: Path, tool: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(bank_db)
    try:
        return conn.execute(
            "SELECT key, attempt, arguments, task FROM calls WHERE tool = ? ORDER BY seq", (tool,)
        ).fetchall()
    finally:
        conn.close()


def by_name(tools: list[Tool[Any]]) -> dict[str, Tool[Any]]:
    return {tool.name: tool for tool in tools}


async def test_read_only_tools_are_plain_and_the_others_go_through_the_ledger(
    bank_db: Path,
) -> None:
    async with bank(bank_db) as session:
        tools = by_name(await mcp_tools(session))
        assert {name: t.side_effect for name, t in tools.items()} == {
            "balance": False,  # readOnlyHint
            "transfer": True,  # destructiveHint
            "send_email": True,  # no annotations: the safe choice
            "wire": True,
        }
        assert tools["transfer"].arguments_schema()["required"] == ["to", "amount", "memo"]
        assert tools["balance"].description == "The balance of an account."

        class Payer(Agent[AgentState]):
            async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
                before = await tools["balance"](ctx, account="alice")
                paid = await tools["transfer"](ctx, to="bob", amount=30, memo="lunch")
                sent = await tools["send_email"](ctx, to="bob", subject="paid")
                self.state.memory.update(before=before, paid=paid, sent=sent)

        async with Runtime() as runtime:
            payer = runtime.add(Payer("payer"))
            runtime.send("payer", {})
            await runtime.run_until_idle()
            entries = await runtime.ledger.list_calls(runtime.run_id)
        memory = payer.state.memory
        assert memory["before"] == {"account": "alice", "balance": 1000}
        assert memory["paid"] == {"transfer_id": 1, "to": "bob", "amount": 30, "repeated": False}
        assert memory["sent"] == "queued email 1 to bob"
        assert sorted(e.tool for e in entries) == ["send_email", "transfer"]
        records = {r.tool: r for r in payer.state.tool_calls}
        assert records["balance"].key is None
        # The server got the call's idempotency key in _meta.
        assert calls(bank_db, "transfer") == [
            (
                records["transfer"].key,
                1,
                json.dumps({"amount": 30, "memo": "lunch", "to": "bob"}),
                0,
            )
        ]
        assert calls(bank_db, "balance")[0][0] is None


async def test_an_error_result_is_a_tool_failure_recorded_once(bank_db: Path) -> None:
    async with bank(bank_db) as session:
        transfer = by_name(await mcp_tools(session))["transfer"]
        ledger = MemoryLedger()
        for replayed in (False, True):
            with pytest.raises(ToolFailed) as failed:
                await transfer.invoke(ledger, key="refund-1", to="bob", amount=-5, memo="x")
            assert failed.value.error_type == "McpToolError"
            assert "amount must be positive" in failed.value.detail
            assert failed.value.replayed is replayed
        assert len(calls(bank_db, "transfer")) == 1


class Review(Agent[AgentState]):
    """Pays with a sampled memo; its first output is rejected, so the handler is redone."""

    def __init__(self, transfer: Tool[Any]) -> None:
        super().__init__("payer")
        self.transfer = transfer
        self.model = SampledModel([("memo", [f"memo #{i}" for i in range(50)])])
        self.runs = 0

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.runs += 1
        memo = await self.model.complete("write a memo")
        self.state.memory["paid"] = await self.transfer(ctx, to="bob", amount=40, memo=memo)
        ctx.send("out", {"memo": memo})

    async def evaluate(self, outputs: Any, ctx: Context[AgentState]) -> str | None:
        return None if ctx.feedback else "the memo is too vague"


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["got"] = message.payload


async def test_an_effect_happens_once_across_a_rollback(bank_db: Path) -> None:
    async with bank(bank_db) as session:
        transfer = by_name(await mcp_tools(session))["transfer"]
        async with Runtime() as runtime:
            payer = runtime.add(Review(transfer))
            runtime.add(Sink("out"))
            runtime.send("payer", {})
            await runtime.run_until_idle()
        assert payer.runs == 2
        assert payer.model.calls == 2  # asked again after the rollback: other words
        again = payer.state.tool_calls[-1]
        assert again.status == "replayed"
        paid = payer.state.memory["paid"]
        assert isinstance(paid, dict)
        assert paid["transfer_id"] == 1
        assert len(calls(bank_db, "transfer")) == 1


async def test_selection_by_names_and_by_predicate(bank_db: Path) -> None:
    async with bank(bank_db) as session:
        named = by_name(await mcp_tools(session, side_effect={"send_email"}))
        assert [n for n, t in named.items() if t.side_effect] == ["send_email"]
        chosen = by_name(
            await mcp_tools(session, side_effect=lambda tool: tool.name.startswith("tr"))
        )
        assert [n for n, t in chosen.items() if t.side_effect] == ["transfer"]
        everything = await mcp_tools(session, side_effect=True, prefix="bank_")
        assert all(t.side_effect for t in everything)
        assert sorted(t.name for t in everything)[0] == "bank_balance"
        assert not any(t.side_effect for t in await mcp_tools(session, side_effect=False))


@pytest.mark.parametrize(
    ("side_effect", "message"),
    [
        ({"transfer", "tranfer"}, "['tranfer'], which the server does not have"),
        ("transfer", "pass {'transfer'}"),
        ("everything", "got the string 'everything'"),
        ({1}, "takes tool names"),
        (3.5, "got float"),
        (lambda tool: "yes", "must return True or False"),
    ],
)
async def test_bad_selections_are_refused_clearly(
    bank_db: Path, side_effect: Any, message: str
) -> None:
    async with bank(bank_db) as session:
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            await mcp_tools(session, side_effect=side_effect)


async def test_bad_sources_are_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="use `async with mcp_server"):
        await mcp_tools("python server.py")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="command that starts the server"):
        async with mcp_server(""):
            pass
    with pytest.raises(ConfigurationError, match="list of arguments"):
        async with mcp_server("python", "server.py"):
            pass


async def test_rerun_if_unknown_names_must_exist(bank_db: Path) -> None:
    async with bank(bank_db) as session:
        with pytest.raises(ConfigurationError, match="rerun_if_unknown"):
            await mcp_tools(session, rerun_if_unknown={"nope"})


async def test_a_task_tool_runs_as_a_task_and_returns_its_result(bank_db: Path) -> None:
    async with bank(bank_db) as session:
        wire = by_name(await mcp_tools(session))["wire"]
        done = await wire.invoke(MemoryLedger(), key="wire-1", to="carol", amount=7)
        assert done == {"transfer_id": 1, "to": "carol", "amount": 7, "repeated": False}
        assert calls(bank_db, "wire") == [("wire-1", 1, '{"amount": 7, "to": "carol"}', 1)]


def test_results_become_json() -> None:
    assert result_json("t", CallToolResult(content=[TextContent(type="text", text="hi")])) == "hi"
    assert result_json("t", CallToolResult(content=[])) is None
    structured = CallToolResult(
        content=[TextContent(type="text", text="{}")], structured_content={"a": 1}
    )
    assert result_json("t", structured) == {"a": 1}
    mixed = CallToolResult(
        content=[
            TextContent(type="text", text="see"),
            ImageContent(type="image", data="AAAA", mime_type="image/png"),
        ]
    )
    assert result_json("t", mixed) == [
        {"type": "text", "text": "see"},
        {"type": "image", "data": "AAAA", "mimeType": "image/png"},
    ]
    with pytest.raises(McpToolError, match="no such account"):
        result_json(
            "t",
            CallToolResult(
                content=[TextContent(type="text", text="no such account")], is_error=True
            ),
        )


def test_by_annotations_reads_only_read_only_hint() -> None:
    from mcp.types import Tool as McpTool
    from mcp.types import ToolAnnotations

    schema: dict[str, Any] = {"type": "object"}
    assert by_annotations(McpTool(name="a", input_schema=schema))
    assert by_annotations(
        McpTool(name="a", input_schema=schema, annotations=ToolAnnotations(destructive_hint=False))
    )
    assert not by_annotations(
        McpTool(name="a", input_schema=schema, annotations=ToolAnnotations(read_only_hint=True))
    )
    assert IDEMPOTENCY_KEY == "io.agentsnap/idempotency-key"


def test_importing_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['mcp'] = None\n"
        "from agentsnap.integrations import MissingExtraError\n"
        "try:\n"
        "    import agentsnap.integrations.mcp\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("mcp ")
    assert "pip install 'agentsnap[mcp]'" in done.stdout
