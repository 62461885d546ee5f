"""A team of agents from three kinds in one run: a rejected draft, one email, even across a kill.

- The **researcher** is a pydantic-ai agent (``PydanticAIAgent`` with ``AgentsnapDurability``):
  it looks the customer up through the mail server's ``find_contact`` tool and the order
  through a tool of its own, and writes a brief for the writer.
- The **writer** is an agent of the OpenAI Agents SDK (``OpenAIAgent``): it drafts the email,
  and sends it through the mail server's ``send_email`` tool once the critic approved it.
- The **critic** is a hand-written agentsnap ``Agent``: house style wants every email to a
  customer signed "The Acme team", so it rejects the first draft.
- The **mail server** is an MCP server (``mail_server.py``) this program starts over stdio;
  ``mcp_tools`` makes its tools agentsnap tools: ``find_contact`` (``readOnlyHint``) is called
  plainly, ``send_email`` goes through the ledger under an idempotency key bound to the call,
  which the server also gets and keeps, so it never sends one email twice.

The critic's rejection rolls the whole team back to one consistent cut (the researcher's
snapshot, taken as its brief went to the writer): every agent's state, the writer's SDK
conversation with it. The writer drafts again with the reason in its input, the critic
approves, and the email goes out once. Every model call is a recorded step.

``--crash-after email-sent`` kills this process (SIGKILL) once the mail server has sent the
email but before its answer is recorded, ``--crash-after email-recorded`` once the answer is
recorded but before the writer's turn ended; ``--resume RUN --dir DIR`` then goes on with the
run: the model calls made are answered from the record, the email's call is sent again
under the same key (the server answers with the email it sent) or gets its recorded result,
and the mail server's outbox still holds one email.

By default the models are the SDKs' test models (a pydantic-ai ``FunctionModel``, the Agents
SDK's ``ScriptedModel``), so the run needs no network. ``--model provider:name`` (for example
``openai:gpt-4.1-mini``) puts a real model behind both SDK agents: it needs the provider's
API key in the environment (``OPENAI_API_KEY`` for OpenAI), pydantic-ai's extra for the
provider, and for a provider other than OpenAI the Agents SDK's LiteLLM extra
(``openai-agents[litellm]``). A real model may need more than one rejection, or none.

The run and the mail server's outbox are kept in ``--dir`` (a new temporary folder by
default; ``--db`` puts the run in another database, SQLite or PostgreSQL). The program checks
its own outcome and exits with status 1 when it is not the expected one.

Run it with:

    python examples/sdk_team.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from agents import Agent as SDKAgent
from agents import RunConfig
from agents.models.interface import Model as SDKModel
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from mcp import ClientSession
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model as PydanticModel
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.mcp import mcp_server, mcp_tools
from agentsnap.integrations.openai_agents import OpenAIAgent, as_sdk_tool
from agentsnap.integrations.pydantic_ai import (
    AgentsnapDurability,
    PydanticAIAgent,
    agentsnap_toolset,
)
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger
from agentsnap.tools import Tool

SERVER = Path(__file__).with_name("mail_server.py")
TASK = "Order A17 is late. Find out who ordered it and what happened, for the writer."
SIGNATURE = "The Acme team"
APPROVED = "Approved. Send this email to {to} with the subject 'Your order A17':\n\n"
CRASH_POINTS = ("email-sent", "email-recorded")
CRASH: dict[str, str] = {}
"""The crash point chosen (``point``) and the command that resumes the run (``resume``)."""
ASKED: list[str] = []
"""The agents whose test model this process asked, once per answer (replays ask none)."""


def crash(point: str) -> None:
    """Kill this process with SIGKILL if ``point`` is the crash point chosen."""
    if CRASH.get("point") == point:
        print(f"killed at {point} (SIGKILL); resume with: {CRASH['resume']}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


# The researcher: a pydantic-ai agent.


def researcher_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look the customer and the order up, then write the brief."""
    ASKED.append("researcher")
    returned: dict[str, Any] = {
        part.tool_name: part.content
        for message in messages
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    if "find_contact" not in returned:
        return ModelResponse(parts=[ToolCallPart("find_contact", {"name": "Ada Lovelace"})])
    if "order_status" not in returned:
        return ModelResponse(parts=[ToolCallPart("order_status", {"order": "A17"})])
    contact = returned["find_contact"]  # JSON, as the tool returned it
    brief = f"Write to {contact['name']} <{contact['email']}>: {returned['order_status']}"
    return ModelResponse(parts=[TextPart(brief)])


def researcher(model: PydanticModel | str, find_contact: Tool[Any]) -> PydanticAgent[None, str]:
    agent = PydanticAgent(
        model,
        instructions=(
            "Look the customer up with find_contact and the order with order_status, then "
            "answer with a brief for the writer: the customer's name and email address, and "
            "what happened to the order."
        ),
        toolsets=[agentsnap_toolset(find_contact)],
        capabilities=[AgentsnapDurability(read_only={"order_status"})],
    )

    @agent.tool_plain
    def order_status(order: str) -> str:
        """What happened to an order, and when it arrives."""
        return f"order {order} (ordered by Ada Lovelace) is delayed; it now arrives on 12 June"

    return agent


class Researcher(PydanticAIAgent):
    """The pydantic-ai researcher; a snapshot starts as its brief goes to the writer."""

    async def handle(self, message: Message, ctx: Context[Any]) -> None:
        await super().handle(message, ctx)
        ctx.snapshot()  # the cut a rejection of the writer's work goes back to


# The writer: an OpenAI Agents SDK agent.


def writer_answer(call: ModelCall) -> list[Any]:
    """Draft the email (signed once told to), and send it once approved."""
    ASKED.append("writer")
    items: list[Any] = call.input if isinstance(call.input, list) else [call.input]
    last = items[-1]
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        crash("email-recorded")  # the send is recorded; the writer's turn is not over
        return [assistant_message("The email is sent.")]
    said = str(last.get("content", "")) if isinstance(last, dict) else str(last)
    if said.startswith("Approved."):
        draft = said.split("\n\n", 1)[1]
        arguments = {"to": "ada@example.com", "subject": "Your order A17", "body": draft}
        return [function_call("send_email", arguments, call_id="send-1")]
    draft = "Dear Ada,\n\nwe are sorry: your order A17 is delayed, and now arrives on 12 June."
    if "rejected" in str(items):
        draft += f"\n\n{SIGNATURE}"
    return [assistant_message(draft)]


def writer(model: SDKModel | str, send_email: Tool[Any]) -> SDKAgent[Any]:
    return SDKAgent(
        name="writer",
        instructions=(
            "Write a short email to the customer from the brief you are given; answer with the "
            "email's body only. When you are told your draft is approved, send it with "
            "send_email exactly as approved, then say that it is sent."
        ),
        model=model,
        tools=[as_sdk_tool(send_email)],
    )


# The critic: a hand-written agentsnap agent.


class Critic(Agent[AgentState]):
    """Reviews the writer's draft, approves it, and keeps the writer's confirmation."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = message.payload_as(dict[str, Any])
        text = str(payload["output"])
        memory = self.state.memory
        if "approved" in memory:  # the writer says the email is sent
            memory["confirmation"] = text
            return
        if SIGNATURE not in text:
            ctx.reject("writer", f"sign the email '{SIGNATURE}', as every email to a customer is")
        memory["approved"] = text
        ctx.send("writer", APPROVED.format(to="ada@example.com") + text, kind="approved")


def crash_once_sent(session: ClientSession) -> None:
    """Make the process die as the mail server's answer to ``send_email`` arrives."""
    call_tool = session.call_tool

    async def calling(name: str, arguments: dict[str, Any] | None = None, **options: Any) -> Any:
        result = await call_tool(name, arguments, **options)
        if name == "send_email":
            crash("email-sent")  # sent by the server; its answer never reaches the ledger
        return result

    session.call_tool = calling  # type: ignore[method-assign,assignment]


def models(name: str | None) -> tuple[PydanticModel | str, SDKModel | str]:
    """The researcher's and the writer's models: the test models, or ``provider:name``."""
    if name is None:
        scripted = ScriptedModel([ModelStep.respond(writer_answer) for _ in range(16)])
        return FunctionModel(researcher_model), scripted
    provider, _, model = name.partition(":")
    return name, model if provider == "openai" else f"litellm/{provider}/{model}"


async def run_team(options: argparse.Namespace, run_id: str, folder: Path) -> list[str]:
    """Run (or resume) the team; return what went wrong (nothing, when all is well)."""
    outbox = folder / "mail.db"
    store = SqlStore(options.db or f"sqlite:///{folder / 'agentsnap.db'}")
    ledger = ledger_for(store)
    assert isinstance(ledger, SqlLedger)
    research_model, writing_model = models(options.model)
    env = {"MAIL_DB": str(outbox)}
    try:
        async with mcp_server(sys.executable, [str(SERVER)], env=env) as session:
            if options.crash_after == "email-sent":
                crash_once_sent(session)
            tools = {t.name: t for t in await mcp_tools(session, rerun_if_unknown={"send_email"})}
            async with Runtime(store=store, ledger=ledger, run_id=run_id) as runtime:
                runtime.add(
                    Researcher(
                        "researcher", researcher(research_model, tools["find_contact"]), to="writer"
                    )
                )
                writer_agent = runtime.add(
                    OpenAIAgent(
                        "writer",
                        writer(writing_model, tools["send_email"]),
                        reply_to="critic",
                        run_config=RunConfig(tracing_disabled=options.model is None),
                    )
                )
                critic = runtime.add(Critic("critic"))
                if options.resume:
                    cut = await runtime.resume()
                    print(f"resumed run {run_id} from snapshot {cut.seq}")
                else:
                    runtime.send("researcher", TASK)
                await runtime.run_until_idle()
            rollbacks = await store.list_rollbacks(run_id)
            cuts = [await store.load_snapshot(r.snapshot_id) for r in rollbacks]
            calls = await ledger.list_model_calls(run_id)
    finally:
        await ledger.close()
        await store.close()

    for rollback, cut in zip(rollbacks, cuts, strict=True):
        team = ", ".join(sorted(name for name in cut.agents if not name.startswith("$")))
        print(f"{rollback.source} rejected the {rollback.agent}'s draft: {rollback.reason}")
        print(f"  the team went back to snapshot {cut.seq}: {team}")
    for call in calls:
        answer = call.answer()
        said = answer.text or ", ".join(c.name for c in answer.tool_calls)
        print(f"model call of {call.agent}, timeline {call.timeline}: {said[:60]!r}")
    for record in writer_agent.state.tool_calls:
        print(f"writer's tool {record.tool}: {record.status} {record.result}")
    conn = sqlite3.connect(outbox)
    try:
        emails = conn.execute("SELECT recipient, body FROM outbox").fetchall()
        requests = conn.execute("SELECT COUNT(*) FROM requests WHERE tool = 'send_email'")
        (asked,) = requests.fetchone()
    finally:
        conn.close()
    if options.model is None:
        print(f"model answers asked for by this process: {len(ASKED)} of {len(calls)} recorded")
    print(f"the mail server got {asked} send_email request(s) and sent {len(emails)} email(s)")
    approved = critic.state.memory.get("approved")
    problems = []
    if len(emails) != 1:
        problems.append(f"expected one email, the outbox holds {len(emails)}")
    elif emails[0][1] != approved:
        problems.append("the email sent is not the draft the critic approved")
    if not rollbacks:
        problems.append("the critic rejected no draft")
    if not any(call.timeline > 0 and call.agent == "writer" for call in calls):
        problems.append("the writer's model was not asked again after the rollback")
    if "confirmation" not in critic.state.memory:
        problems.append("the writer did not confirm the email")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a real model for both SDK agents, as provider:name")
    parser.add_argument("--dir", help="where the run and the outbox are kept (default: temporary)")
    parser.add_argument("--db", help="keep the run in this database (sqlite:/// or postgresql://)")
    parser.add_argument("--crash-after", choices=CRASH_POINTS, help="kill the run at this point")
    parser.add_argument("--resume", metavar="RUN", help="resume run RUN kept in --dir")
    options = parser.parse_args(argv)
    if options.resume and not options.dir:
        parser.error("--resume needs the --dir the run was kept in")
    if options.crash_after and options.model:
        parser.error("--crash-after uses the test models: leave out --model")
    keep = options.dir is not None or options.crash_after is not None
    folder = Path(options.dir or tempfile.mkdtemp(prefix="sdk_team_"))
    folder.mkdir(parents=True, exist_ok=True)
    run_id = options.resume or uuid.uuid4().hex
    resume = ["python", "examples/sdk_team.py", "--resume", run_id, "--dir", str(folder)]
    CRASH.update(
        point=options.crash_after or "",
        resume=" ".join(resume + (["--db", options.db] if options.db else [])),
    )
    print(f"run {run_id} in {folder}", flush=True)
    try:
        problems = asyncio.run(run_team(options, run_id, folder))
    finally:
        if not keep:
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
    for problem in problems:
        print("PROBLEM:", problem)
    if problems:
        return 1
    print("the critic's rejection took the whole team back, and the email went out once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
