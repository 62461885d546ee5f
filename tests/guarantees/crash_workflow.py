"""A token-passing run with side effects, which ``test_crash_resume.py`` kills and resumes.

Four agents pass six tokens among them; every hop of a token is one delivery, and each
delivery calls two side-effecting tools: ``explicit_effect`` with the key ``token:hop`` given
by the caller, and ``derived_effect`` with no key, so the runtime derives it from the run, the
agent, the message and the call. ``derived_effect`` also carries a note that the agent asks
a sampled model for, the natural way (``self.model.complete(...)``): the model words it at
random, after a random delay, so a handler re-executed after a kill would pass other
arguments if its model call were not replayed. The model logs every time it is asked in the
service's ``asks`` table. Both tools stand for an outside service: they insert the
logical effect (tool, token, hop) into the service's own table, keyed by the idempotency key
they are handed (``INSERT OR IGNORE``: the service deduplicates a key, as a payment API does).
The same logical effect under two keys is an effect that happened twice.

Handlers sleep a little at random, so the interleaving, and with it each agent's order of
deliveries and each message's sequence number, differs from one process to the next; each
agent's state records what it handled, in order, so the state depends on that order.

Usage::

    python tests/guarantees/crash_workflow.py URL SERVICE_DB RUN_ID            # first run
    python tests/guarantees/crash_workflow.py URL SERVICE_DB RUN_ID --resume   # after a kill
    python tests/guarantees/crash_workflow.py URL SERVICE_DB RUN_ID --resume --gate --wait 0

``URL`` is the agentsnap database (SQLite or PostgreSQL), ``SERVICE_DB`` the service's SQLite
file. The first run sends every token from the environment at the start. ``--resume`` calls
``Runtime.resume()`` and runs to the end; it sends again only the tokens that
``runtime.inputs_sent`` says were never sent. Each process prints ``RUNNING`` when its first
handler starts, and one JSON line ``{"result": ...}`` at the end. With ``--gate`` it prints
``ready`` and waits for a ``go`` line before resuming, prints ``{"resumed": ...}`` or
``{"error": ...}`` (then exits with status 3), and waits for another ``go`` before running;
``--wait`` is passed on to ``resume(wait=...)``. With ``--redact`` the run keeps the tokens
out of what it stores (the tools' ``token`` argument and the payloads' ``token`` key are
redacted), and a resume gets them back from a secret provider that knows every token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
import time
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    Redaction,
    Runtime,
    SnapshotPolicy,
    ToolCall,
    tool,
)
from agentsnap.models import ModelRequest
from agentsnap.redaction import Where
from agentsnap.store.sql import SqlStore
from agentsnap.testing import FunctionModel

AGENTS = ("a0", "a1", "a2", "a3")
TOKENS = tuple(f"t{i}" for i in range(6))
HOPS = 9
"""Hops of each token after its first delivery: each token is delivered ``HOPS + 1`` times."""
SNAPSHOT_EVERY = 3
EXPLICIT = "explicit_effect"
DERIVED = "derived_effect"
EXIT_REFUSED = 3

SERVICE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects ("
    "key TEXT PRIMARY KEY, effect TEXT NOT NULL, tool TEXT NOT NULL, "
    "pid INTEGER NOT NULL, attempt INTEGER NOT NULL)"
)
ASKS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS asks (prompt TEXT NOT NULL, answer TEXT NOT NULL, "
    "pid INTEGER NOT NULL, asked_at REAL NOT NULL)"
)


def token_vault(where: Where) -> str | None:
    """The secret provider of ``--redact``: the token whose marker ``where`` names."""
    return next((token for token in TOKENS if REDACTION.mark(token) == where.marker), None)


REDACTION = Redaction(
    tool_arguments=["token"], payload=["token"], key="crash test key", secret=token_vault
)
"""The policy of ``--redact``."""


def first_agent(token: str) -> str:
    return AGENTS[TOKENS.index(token) % len(AGENTS)]


def next_agent(token: str, hop: int) -> str:
    """Where a token goes after ``hop``: a fixed, scrambled route, so that every agent hears
    from several others and sends each of them tokens that came in on different channels (the
    order it takes them in, and so their sequence numbers, varies from run to run)."""
    return AGENTS[random.Random(f"{token}:{hop}").randrange(len(AGENTS))]


def initial_inputs() -> list[tuple[str, dict[str, Any]]]:
    """What the environment sends at the start, in order: ``(agent, payload)``."""
    return [(first_agent(token), {"token": token, "hop": 0}) for token in TOKENS]


def expected_effects() -> set[str]:
    """Every logical effect of a complete run."""
    return {
        effect_id(name, token, hop)
        for name in (EXPLICIT, DERIVED)
        for token in TOKENS
        for hop in range(HOPS + 1)
    }


def effect_id(tool_name: str, token: str, hop: int) -> str:
    return f"{tool_name}:{token}:{hop}"


class Service:
    """Where the outside service keeps its table (set from the command line)."""

    path = ""


def open_service(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


def perform(call: ToolCall, token: str, hop: int) -> dict[str, str]:
    """The outside service: records the effect once per idempotency key."""
    assert call.key is not None
    effect = effect_id(call.tool, token, hop)
    conn = open_service(Service.path)
    try:
        with conn:
            conn.execute(
                "INSERT OR IGNORE INTO effects (key, effect, tool, pid, attempt) "
                "VALUES (?, ?, ?, ?, ?)",
                (call.key, effect, call.tool, os.getpid(), call.attempt),
            )
    finally:
        conn.close()
    return {"effect": effect}


@tool(side_effect=True, rerun_if_unknown=True, name=EXPLICIT)
def explicit_effect(call: ToolCall, token: str, hop: int) -> dict[str, str]:
    """Called with ``key=f"{token}:{hop}"``."""
    return perform(call, token, hop)


@tool(side_effect=True, rerun_if_unknown=True, name=DERIVED)
def derived_effect(call: ToolCall, token: str, hop: int, note: str) -> dict[str, str]:
    """Called without a key: the runtime derives it; ``note`` is a sampled model's words."""
    return perform(call, token, hop)


async def sampled_note(request: ModelRequest) -> str:
    """A sampled model: a random wording after a random delay, each ask logged."""
    asked_at = time.time()
    await asyncio.sleep(random.uniform(0, 0.004))
    prompt = request.messages[-1].content
    answer = f"{random.choice(['note', 'remark', 'memo'])} {random.randrange(10**9)}"
    conn = open_service(Service.path)
    try:
        with conn:
            conn.execute(
                "INSERT INTO asks (prompt, answer, pid, asked_at) VALUES (?, ?, ?, ?)",
                (prompt, answer, os.getpid(), asked_at),
            )
    finally:
        conn.close()
    return answer


class HopState(AgentState):
    handled: list[str] = Field(default_factory=list)
    """``token:hop`` of every delivery handled, in order."""


class Hop(Agent[HopState]):
    """Handles one hop of a token: two effects, then the token goes to the next agent."""

    def __init__(self, name: str, rng: random.Random) -> None:
        super().__init__(name)
        self.rng = rng
        self.model = FunctionModel(sampled_note, name="sampled-note")

    async def handle(self, message: Message, ctx: Context[HopState]) -> None:
        announce_running()
        payload = message.payload_as(dict[str, str | int])
        token, hop = str(payload["token"]), int(payload["hop"])
        self.state.handled.append(f"{token}:{hop}")
        await asyncio.sleep(self.rng.uniform(0, 0.004))
        await explicit_effect(ctx, key=f"{token}:{hop}", token=token, hop=hop)
        await asyncio.sleep(self.rng.uniform(0, 0.002))
        note = await self.model.complete(f"note for {token}:{hop} on timeline {ctx.timeline}")
        await derived_effect(ctx, token=token, hop=hop, note=note)
        if hop < HOPS:
            ctx.send(next_agent(token, hop), {"token": token, "hop": hop + 1}, kind="token")
        await asyncio.sleep(self.rng.uniform(0, 0.002))


_running = False


def announce_running() -> None:
    global _running  # noqa: PLW0603  # once per process
    if not _running:
        _running = True
        print("RUNNING", flush=True)


def emit(document: Mapping[str, Any]) -> None:
    print(json.dumps(document, sort_keys=True), flush=True)


def inputs_still_to_send(sent: Mapping[str, int]) -> list[tuple[str, dict[str, Any]]]:
    """The initial inputs the environment has not sent yet, given how many each agent got."""
    seen: dict[str, int] = {}
    missing = []
    for agent, payload in initial_inputs():
        seen[agent] = seen.get(agent, 0) + 1
        if seen[agent] > sent.get(agent, 0):
            missing.append((agent, payload))
    return missing


async def main(options: argparse.Namespace) -> int:
    Service.path = options.service
    rng = random.Random(os.getpid())
    store = SqlStore(options.url)
    report: dict[str, Any] = {"pid": os.getpid()}
    try:
        runtime = Runtime(
            store=store,
            run_id=options.run_id,
            snapshot_policy=SnapshotPolicy(every_deliveries=SNAPSHOT_EVERY),
            redact=REDACTION if options.redact else None,
        )
        async with runtime:
            for name in AGENTS:
                runtime.add(Hop(name, rng))
            if options.resume:
                if options.gate:
                    emit({"ready": os.getpid()})
                    await asyncio.to_thread(sys.stdin.readline)
                try:
                    if options.wait is None:
                        snapshot = await runtime.resume()
                    else:
                        snapshot = await runtime.resume(wait=options.wait)
                except Exception as exc:
                    if not options.gate:
                        raise
                    emit(
                        {
                            "error": type(exc).__name__,
                            "message": str(exc),
                            "owner": getattr(exc, "owner", None),
                        }
                    )
                    return EXIT_REFUSED
                report["resumed_from"] = snapshot.seq
                sent = getattr(runtime, "inputs_sent", None)
                report["inputs_sent"] = dict(sent) if sent is not None else None
                if options.gate:
                    emit({"resumed": snapshot.seq, "pid": os.getpid()})
                    await asyncio.to_thread(sys.stdin.readline)
                if sent is not None:
                    for agent, payload in inputs_still_to_send(sent):
                        runtime.send(agent, payload, kind="token")
            else:
                for agent, payload in initial_inputs():
                    runtime.send(agent, payload, kind="token")
            await runtime.run_until_idle()
            report["handled"] = {name: list(runtime.agents[name].state.handled) for name in AGENTS}
    finally:
        await store.close()
    emit({"result": report})
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the agentsnap database URL")
    parser.add_argument("service", help="the service's SQLite file")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true", help="resume the run")
    parser.add_argument("--gate", action="store_true", help="wait for 'go' lines (see above)")
    parser.add_argument("--redact", action="store_true", help="keep the tokens out of the store")
    parser.add_argument(
        "--wait", type=float, default=None, help="resume(wait=...): seconds to wait for an owner"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
