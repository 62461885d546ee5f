"""The demo: a critic rejects the first draft, the team rolls back, the second draft passes.

Four agents write a short report; the run goes back to the last consistent cut when the
critic rejects the writer's first draft.

```
$env ──task──▶ planner ──topics──▶ researcher ──notes──▶ writer ──draft──▶ critic
                                                            ▲                │
                                                            └── rollback ◀───┘ (no sources)
```

* the **planner** turns the task into a plan (``state.plan``) and asks for research;
* the **researcher** collects numbered notes, takes a snapshot of the whole team and sends
  the notes on;
* the **writer** drafts the report from the notes; its prompt carries any feedback it got;
* the **critic** accepts a draft only when it cites the notes (``[1]``, ``[2]`` …), else it
  rejects it with ``ctx.reject``: every agent goes back to the researcher's snapshot, the
  writer is told why, and writes again.

Each agent keeps its model as ``self.model``, so every ``self.model.complete(...)`` in a
handler is a recorded model call (see [`Context.chat`][agentsnap.Context.chat]): the writer's
redo asks the model again, on the run's new timeline, and both drafts stay recorded.

The model is [`ScriptedModel`][agentsnap.testing.ScriptedModel] unless a LangChain model is
named (``--model provider:name``), so the demo needs no network and tells the same story
every time. Run it with ``agentsnap demo`` (or ``make demo``); it prints what happened, where
the run is stored, and the commands that show its rollback, draw its timeline and export it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from pydantic import BaseModel, Field

from agentsnap._hints import cli_command
from agentsnap.agents import Agent, Context
from agentsnap.messages import JsonValue, Message
from agentsnap.model_calls import ModelCallLog, ModelCallRecord
from agentsnap.models import ChatModel
from agentsnap.records import RollbackInfo, RunInfo, Snapshot
from agentsnap.runtime import Runtime
from agentsnap.state import AgentState, PlanStep
from agentsnap.store import Store
from agentsnap.testing import ScriptedModel

__all__ = ["DemoResult", "demo_model", "run_demo"]

TASK = "Explain in one paragraph why a multi-agent run needs consistent snapshots."

S = TypeVar("S", bound=AgentState)

_CITATION = re.compile(r"\[\d+\]")


def demo_model(delay: float = 0.02) -> ScriptedModel:
    """The scripted model the demo uses: a first draft without sources, a second with.

    Args:
        delay: Seconds per answer, standing in for a real model's latency.
    """
    return ScriptedModel(
        [
            (
                "Plan the work",
                "1. Find how agents lose or duplicate messages when saved one by one\n"
                "2. Find what a consistent cut guarantees\n"
                "3. Write the paragraph",
            ),
            (
                "Research",
                "[1] Saving agents one after the other while messages flow can count a "
                "message twice or lose it (Chandy and Lamport, 1985).\n"
                "[2] A consistent cut records every agent and the messages in flight, so a "
                "run restored from it is a state the run could really have been in.",
            ),
            (
                "Feedback:",
                "Agents that talk while they are saved one by one can end up counting a "
                "message twice or losing it [1]. A consistent cut records every agent together "
                "with the messages still in flight, so a run restored from it continues from a "
                "state it could really have been in, and a mistake can be undone by going back "
                "to it [2].",
            ),
            (
                "Write the report",
                "Multi-agent runs need snapshots so that a failed step can be undone by going "
                "back to an earlier state of the whole team.",
            ),
        ],
        delay=delay,
    )


class Topics(BaseModel):
    """What the planner asks the researcher to look into."""

    task: str


class Notes(BaseModel):
    """The researcher's notes, on their way to the writer."""

    task: str
    notes: str


class Draft(BaseModel):
    """A draft of the report, on its way to the critic."""

    draft: str


class _Asking(Agent[S]):
    """An agent of the team that asks a chat model (the runtime records its answers)."""

    name_in_team: ClassVar[str]
    """The agent's name: the team's agents send to each other by these names."""

    def __init__(self, model: ChatModel) -> None:
        super().__init__(self.name_in_team)
        self.model = model


class PlannerState(AgentState):
    """The planner keeps the task and the plan (in ``plan``)."""

    task: str = ""


class Planner(_Asking[PlannerState]):
    """Turns the task into a plan and asks the researcher for notes."""

    name_in_team = "planner"

    async def handle(self, message: Message, ctx: Context[PlannerState]) -> None:
        self.state.task = str(message.payload)
        answer = await self.model.complete(f"Plan the work for this task: {self.state.task}")
        self.state.plan = [
            PlanStep(description=line.split(".", 1)[-1].strip())
            for line in answer.splitlines()
            if line.strip()
        ]
        self.state.plan[0].status = "in_progress"
        ctx.send("researcher", Topics(task=self.state.task), kind="topics")


class NotesState(AgentState):
    """The researcher keeps its notes."""

    notes: str = ""


class Researcher(_Asking[NotesState]):
    """Collects numbered notes, snapshots the team, and passes the notes on."""

    name_in_team = "researcher"

    async def handle(self, message: Message, ctx: Context[NotesState]) -> None:
        task = message.payload_as(Topics).task
        self.state.notes = await self.model.complete(f"Research: {task}")
        # The research is worth keeping: a cut to come back to if the writing goes wrong.
        # Recorded as this handler returns, the cut holds the notes in flight to the
        # writer, so going back to it has the writer start again from the notes.
        ctx.snapshot()
        ctx.send("writer", Notes(task=task, notes=self.state.notes), kind="notes")


class WriterState(AgentState):
    """The writer keeps every draft it wrote in this timeline."""

    drafts: list[str] = Field(default_factory=list)


class Writer(_Asking[WriterState]):
    """Drafts the report from the notes, taking any feedback into account."""

    name_in_team = "writer"

    async def handle(self, message: Message, ctx: Context[WriterState]) -> None:
        notes = message.payload_as(Notes)
        prompt = f"Write the report for: {notes.task}\nNotes:\n{notes.notes}"
        if ctx.feedback:
            # The reasons, and any side effects the undone work already performed.
            prompt += "\nFeedback: " + "; ".join(f.text() for f in ctx.feedback)
        draft = await self.model.complete(prompt)  # recorded: the runtime bound self.model
        self.state.drafts.append(draft)
        ctx.send("critic", Draft(draft=draft), kind="draft")


class CriticState(AgentState):
    """The critic keeps the report it accepted."""

    accepted: str | None = None


class Critic(Agent[CriticState]):
    """Accepts a draft only when it cites the notes."""

    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        draft = message.payload_as(Draft).draft
        if not _CITATION.search(draft):
            ctx.reject(
                "writer",
                "the draft cites no sources: support each claim with the notes' numbers, like [1]",
            )
        self.state.accepted = draft


@dataclass
class DemoResult:
    """What the demo did.

    Attributes:
        run: The stored run.
        snapshots: Its snapshots, in order.
        rollbacks: Its rollbacks, in order.
        report: The accepted report, if any.
        drafts: The writer's drafts in the final timeline.
        model_calls: The agents' recorded model calls, in the order they were made (none
            when the runtime's ledger does not keep model calls).
    """

    run: RunInfo
    snapshots: list[Snapshot]
    rollbacks: list[RollbackInfo]
    report: str | None
    drafts: list[str] = field(default_factory=list)
    model_calls: list[ModelCallRecord] = field(default_factory=list)


async def run_demo(
    store: Store,
    model: ChatModel | None = None,
    *,
    journal: bool = True,
    run_id: str | None = None,
) -> DemoResult:
    """Run the demo workflow against ``store`` and return what happened.

    Args:
        store: Where the run goes.
        model: The model the agents ask (the scripted one by default).
        journal: Keep every message in the store, so the run's timeline shows them.
        run_id: Id of the run (generated when omitted), so that a caller interrupted by
            Ctrl-C can say which run it left.
    """
    model = model or demo_model()
    metadata: dict[str, JsonValue] = {"demo": "research team"}
    async with Runtime(
        store=store, name="demo", metadata=metadata, journal=journal, run_id=run_id
    ) as runtime:
        runtime.add(Planner(model))
        runtime.add(Researcher(model))
        runtime.add(Writer(model))
        critic = runtime.add(Critic("critic", CriticState()))
        writer = runtime.agents["writer"]
        runtime.send("planner", TASK, kind="task")
        await runtime.run_until_idle()
        report = critic.state.accepted
        drafts = list(writer.state.drafts)
        ledger = runtime.ledger
        calls = (
            await ledger.list_model_calls(runtime.run_id)
            if isinstance(ledger, ModelCallLog)
            else []
        )
    return DemoResult(
        run=await store.get_run(runtime.run_id),
        snapshots=await store.list_snapshots(runtime.run_id),
        rollbacks=await store.list_rollbacks(runtime.run_id),
        report=report,
        drafts=drafts,
        model_calls=calls,
    )


def describe(result: DemoResult, url: str | None) -> list[str]:
    """The demo's account of ``result``, line by line (``url``: where it is stored, if kept).

    The commands it suggests for a stored run name ``agentsnap`` as it can be run from the
    current directory (``.venv/bin/agentsnap`` after ``make demo``), so they work when pasted.
    """
    lines = ["agentsnap demo: planner -> researcher -> writer -> critic", ""]
    by_id = {snapshot.id: snapshot for snapshot in result.snapshots}
    for snapshot in result.snapshots:
        line = f"  snapshot {snapshot.seq} by {snapshot.initiator}: {snapshot.status.value}"
        if snapshot.error:
            line += f" ({snapshot.error})"
        lines.append(line)
    for rollback in result.rollbacks:
        target = by_id.get(rollback.snapshot_id)
        where = f"snapshot {target.seq}" if target else rollback.snapshot_id
        lines.append(
            f"  rollback to {where}: {rollback.source} rejected {rollback.agent}'s output "
            f"(attempt {rollback.attempt}): {rollback.reason}"
        )
    lines += ["", f"final report ({result.run.status.value}):", f"  {result.report}", ""]
    if url is None:
        lines.append(f"run {result.run.id} was kept in memory only")
        return lines
    run = result.run.id
    lines.append(f"run {run} is stored in {url}; look at it with:")
    # Commands as they can be pasted here (``.venv/bin/agentsnap`` when it is not on PATH).
    lines += [
        f"  {cli_command('rollbacks', run, '--db', url)}",
        f"  {cli_command('timeline', run, '--db', url, '-o', 'timeline.html')}",
        f"  {cli_command('export', run, '--db', url, '--indent', '2')}",
        # Last, since it serves until Ctrl-C: the web inspector over the same database.
        f"  {cli_command('ui', '--db', url)}",
    ]
    return lines
