"""A LangChain ``create_agent`` agent with the agentsnap middleware, as an agentsnap agent.

A rollback with feedback changes the model's answer; the redo's side-effecting tool call,
worded otherwise by a sampled model, returns the recorded outcome; model calls keep
LangChain's own JSON; a recorded answer is given back as the same ``AIMessage``; tool calls
of one answer run in the model's order; the conversation is in a consistent cut that
``agentsnap show`` prints; misuse is refused with a message that says what to do.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest as LangChainRequest
from langchain.agents.middleware.types import ModelResponse as LangChainResponse
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, messages_from_dict
from langchain_core.tools import tool as lc_tool
from pydantic import BaseModel

from agentsnap import ConfigurationError, ModelResponse, Runtime
from agentsnap.cli import main as cli
from agentsnap.integrations.langchain import (
    AgentsnapMiddleware,
    ConversationState,
    LangChainAgent,
    SideEffect,
)
from agentsnap.integrations.langchain._middleware import rebuilt, request_of, response_of
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore
from agentsnap.testing import assert_consistent

from .langchain_team import SENT, TASK, SampledChat, ToolingFake, add_team, writer_agent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_emails_yet() -> None:
    SENT.clear()


async def test_rollback_feedback_changes_the_answer_and_the_email_goes_out_once() -> None:
    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        writer = add_team(runtime)
        runtime.send("writer", TASK)
        await runtime.run_until_idle()
        calls = await ledger.list_model_calls(runtime.run_id)
        (rollback,) = runtime.rollbacks
    assert (rollback.agent, rollback.reason) == ("writer", "apologise for the delay")
    # The model was asked again after the rollback, told why, and answered otherwise.
    assert [(c.timeline, c.position) for c in calls] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    first, redone = calls[1].answer().text, calls[3].answer().text
    assert not first.startswith("Sorry")
    assert redone.startswith("Sorry for the delay")
    assert runtime.agents["critic"].state.memory["accepted"] == redone
    redo_prompt = calls[2].asked().messages[-1].content
    assert "apologise for the delay" in redo_prompt
    assert "Already done" in redo_prompt  # the email the undone path sent
    # The redo's email was worded otherwise, yet it is the same effect: sent once.
    words = [c.answer().tool_calls[1].arguments["text"] for c in (calls[0], calls[2])]
    assert words[0] != words[1]
    assert len(SENT) == 1
    emails = [c for c in writer.state.tool_calls if c.tool == "send_email"]
    assert [c.status for c in emails] == ["replayed"]
    assert emails[0].key == SENT[0][0]
    assert emails[0].arguments["text"] == words[1]
    # The read-only lookup ran again; it has no key.
    lookups = [c for c in writer.state.tool_calls if c.tool == "look_up"]
    assert [(c.status, c.key) for c in lookups] == [("ok", None)]
    # The conversation in the state: system prompt aside, user, tool calls, tools, answer.
    conversation = messages_from_dict(writer.state.messages)
    assert [type(m) for m in conversation] == [
        HumanMessage,
        AIMessage,
        ToolMessage,
        ToolMessage,
        AIMessage,
    ]
    assert writer.state.answer == redone
    assert writer.state.feedback_seen == 1


async def test_model_calls_keep_langchains_json_and_fill_the_inspectors_fields() -> None:
    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        add_team(runtime)
        runtime.send("writer", TASK)
        await runtime.run_until_idle()
        first = (await ledger.list_model_calls(runtime.run_id))[0]
    request, answer = first.asked(), first.answer()
    assert [m.role for m in request.messages] == ["system", "user"]
    assert [t.name for t in request.tools] == ["look_up", "send_email"]
    assert request.tools[1].parameters["required"] == ["to", "text"]
    assert request.native is not None
    assert request.native["messages"][0]["type"] == "system"  # type: ignore[index,call-overload]
    assert request.native["model"] == "SampledChat"
    assert [c.name for c in answer.tool_calls] == ["look_up", "send_email"]
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.model) == (
        20,
        8,
        "sampled-chat",
    )
    assert answer.native is not None
    (message,) = messages_from_dict(answer.native["result"])  # type: ignore[arg-type]
    assert isinstance(message, AIMessage)
    assert [c["id"] for c in message.tool_calls] == [c.id for c in answer.tool_calls]
    assert (first.input_tokens, first.output_tokens) == (20, 8)


def test_a_recorded_answer_is_given_back_as_langchains_own_objects() -> None:
    """What a resumed handler gets instead of asking: the AIMessage and structured response."""

    class Verdict(BaseModel):
        ok: bool
        why: str

    answer = AIMessage(
        content="",
        id="lc_run-1",
        tool_calls=[{"name": "send_email", "args": {"to": "ann"}, "id": "c1", "type": "tool_call"}],
        usage_metadata={"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
    )
    given = LangChainResponse(result=[answer], structured_response=Verdict(ok=True, why="fine"))
    request = LangChainRequest(
        model=SampledChat(),
        messages=[HumanMessage("hi", id="h")],
        response_format=ToolStrategy(Verdict),
    )
    recorded = ModelResponse.model_validate_json(response_of(given).model_dump_json())
    back = rebuilt(recorded, request)
    assert back.result == [answer]
    assert back.structured_response == Verdict(ok=True, why="fine")
    assert request_of(request).messages[0].content == "hi"


async def test_tool_calls_of_one_answer_run_in_the_models_order() -> None:
    """Two emails in one answer: each keeps its place, whichever task gets there first."""
    order: list[str] = []

    @lc_tool
    async def email(to: str) -> str:
        """Send an email."""
        order.append(to)
        return f"sent to {to}"

    class Slow(AgentMiddleware):
        """Holds the first calls back longest, so that the last would come first."""

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            await asyncio.sleep({"a": 0.06, "b": 0.03}.get(request.tool_call["args"]["to"], 0))
            return await handler(request)

    calls = [{"name": "email", "args": {"to": to}, "id": f"c{to}"} for to in "abc"]
    model = ToolingFake(
        messages=iter([AIMessage(content="", tool_calls=calls), AIMessage(content="done")])
    )
    agent = create_agent(model, tools=[email], middleware=[Slow(), AgentsnapMiddleware()])
    async with Runtime() as runtime:
        runner = runtime.add(LangChainAgent("runner", agent))
        runtime.send("runner", "email a, b and c")
        await runtime.run_until_idle()
    assert order == ["a", "b", "c"]
    assert [c.arguments["to"] for c in runner.state.tool_calls] == ["a", "b", "c"]
    assert len({c.key for c in runner.state.tool_calls}) == 3
    assert runner.state.answer == "done"


async def _run_to_a_cut(url: str) -> tuple[str, list[dict[str, Any]]]:
    store = SqlStore(url)
    try:
        async with Runtime(store=store) as runtime:
            writer = add_team(runtime)
            runtime.send("writer", TASK)
            await runtime.run_until_idle()
            cut = await runtime.snapshot()
        (stored,) = [s for s in await store.list_snapshots(runtime.run_id) if s.id == cut.id]
        assert_consistent(stored)
        saved = ConversationState.model_validate(stored.agents["writer"].state)
        assert saved.messages == writer.state.messages
        return cut.id, saved.messages
    finally:
        await store.close()


def test_the_conversation_is_in_a_consistent_cut_that_agentsnap_show_prints(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    cut_id, messages = asyncio.run(_run_to_a_cut(url))
    assert len(messages) == 5
    shown = CliRunner().invoke(cli, ["show", cut_id, "--db", url])
    assert shown.exit_code == 0, shown.output
    assert "agent writer" in shown.output
    assert 'answer: "Sorry for the delay' in shown.output
    assert "messages:" in shown.output
    as_json = CliRunner().invoke(cli, ["show", cut_id, "--db", url, "--agent", "writer", "--json"])
    assert as_json.exit_code == 0, as_json.output
    state = json.loads(as_json.output)["agents"]["writer"]["state"]
    (human, *_) = messages_from_dict(state["messages"])
    assert isinstance(human, HumanMessage)
    assert human.text.startswith(TASK)
    assert "apologise for the delay" in human.text  # the redo's turn, with the reason


def test_a_tool_cannot_be_both_side_effecting_and_read_only() -> None:
    with pytest.raises(ConfigurationError, match="both"):
        AgentsnapMiddleware(side_effects={"send": SideEffect()}, read_only=["send"])


def test_side_effects_by_name_make_every_other_tool_read_only() -> None:
    middleware = AgentsnapMiddleware(side_effects=["send_email"])
    assert middleware.effect_of("send_email") == SideEffect()
    assert middleware.effect_of("look_up") is None
    default = AgentsnapMiddleware(read_only=["look_up"])
    assert default.effect_of("anything") == SideEffect()
    assert default.effect_of("look_up") is None


async def test_the_middleware_outside_a_handler_says_what_to_do() -> None:
    agent = writer_agent()
    with pytest.raises(ConfigurationError, match="outside an agentsnap handler"):
        await agent.ainvoke({"messages": [HumanMessage(TASK)]})


def test_the_middleware_refuses_a_synchronous_run() -> None:
    with pytest.raises(ConfigurationError, match="ainvoke"):
        writer_agent().invoke({"messages": [HumanMessage(TASK)]})


async def test_an_agent_without_the_middleware_is_refused() -> None:
    agent = create_agent(ToolingFake(messages=iter([AIMessage(content="hi")])))
    async with Runtime() as runtime:
        runtime.add(LangChainAgent("bare", agent))
        runtime.send("bare", "hello")
        with pytest.raises(Exception, match="AgentsnapMiddleware"):
            await runtime.run_until_idle()


def test_not_a_langchain_agent_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="create_agent"):
        LangChainAgent("x", object())  # type: ignore[arg-type]


def test_importing_without_langchain_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['langchain'] = None\n"
        "sys.modules['langchain.agents'] = None\n"
        "try:\n"
        "    import agentsnap.integrations.langchain\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.extra)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=_env(),
    )
    assert done.stdout.strip() == "MissingExtraError langchain", done.stderr


def _env() -> dict[str, Any]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}
