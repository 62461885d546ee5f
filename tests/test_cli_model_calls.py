"""``agentsnap model-calls``, and the model calls in ``show`` and ``export``: a run whose
agents ask models, with a rollback, so that its calls are on two timelines."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner, Result
from model_call_run import ModelCallRun, make_model_call_run

from agentsnap import MemoryStore, RunInfo
from agentsnap.cli import main
from agentsnap.inspect import export_run, model_calls_table, show_snapshot, write_export
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore

# (agent, message, position, timeline, discarded): the first round's calls, asked again on
# timeline 1 after the reviewer rejected the draft, then the second round's.
CALLS = [
    ("writer", "$env>writer#1", 0, 0, True),
    ("writer", "$env>writer#1", 1, 0, True),
    ("reviewer", "writer>reviewer#1", 0, 0, True),
    ("writer", "$env>writer#1", 0, 1, False),
    ("writer", "$env>writer#1", 1, 1, False),
    ("reviewer", "writer>reviewer#1", 0, 1, False),
    ("writer", "$env>writer#2", 0, 1, False),
    ("writer", "$env>writer#2", 1, 1, False),
    ("reviewer", "writer>reviewer#2", 0, 1, False),
]


@dataclass(frozen=True)
class Made:
    db: str
    run: ModelCallRun


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def made(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Made:
    if request.param == "sqlite":
        db = f"sqlite:///{tmp_path_factory.mktemp('model-calls') / 'runs.db'}"
    else:
        from postgres_db import postgres_url_or_skip

        db = postgres_url_or_skip()

    async def go() -> ModelCallRun:
        store = SqlStore(db)
        try:
            run = await make_model_call_run(store)
            # Two more runs whose ids share a prefix, to make an ambiguous one.
            await store.create_run(RunInfo(id="abc1" + "0" * 28))
            await store.create_run(RunInfo(id="abc2" + "0" * 28))
            return run
        finally:
            await store.close()

    return Made(db, asyncio.run(go()))


def cli(made: Made, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--db", made.db])


def as_json(made: Made, *args: str) -> Any:
    result = cli(made, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def identities(calls: list[dict[str, Any]]) -> list[tuple[str, str, int, int, bool]]:
    return [(c["agent"], c["message"], c["position"], c["timeline"], c["discarded"]) for c in calls]


def test_the_json_lists_every_call_whole_with_totals(made: Made) -> None:
    doc = as_json(made, "model-calls", made.run.run_id[:8])
    assert set(doc) == {"run_id", "timeline", "calls", "totals"}
    assert doc["run_id"] == made.run.run_id
    assert doc["timeline"] == 1
    assert identities(doc["calls"]) == CALLS
    first = doc["calls"][0]
    assert set(first) == {
        "run",
        "agent",
        "message",
        "position",
        "timeline",
        "model",
        "input_tokens",
        "output_tokens",
        "started_at",
        "latency_ms",
        "replays",
        "request",
        "response",
        "discarded",
    }
    assert first["model"] == "writer-model"
    assert first["request"]["messages"] == [{"role": "user", "content": "write a draft"}]
    assert first["response"]["text"] == "a long long long draft"
    assert (first["input_tokens"], first["output_tokens"]) == (3, 5), "words, as the model counts"
    redo = doc["calls"][3]
    assert "too long" in redo["request"]["messages"][0]["content"], "asked with the feedback"
    assert all(c["replays"] == 0 and c["latency_ms"] >= 0 for c in doc["calls"])
    assert all(c["started_at"].endswith("+00:00") for c in doc["calls"])
    totals = doc["totals"]
    for agent in ("writer", "reviewer"):
        mine = [c for c in doc["calls"] if c["agent"] == agent]
        assert totals["agents"][agent] == {
            "calls": len(mine),
            "input_tokens": sum(c["input_tokens"] for c in mine),
            "output_tokens": sum(c["output_tokens"] for c in mine),
        }
    assert totals["calls"] == 9
    assert totals["input_tokens"] == sum(c["input_tokens"] for c in doc["calls"])
    assert totals["output_tokens"] == sum(c["output_tokens"] for c in doc["calls"])


def test_the_table_marks_discarded_calls_and_ends_with_totals(made: Made) -> None:
    result = cli(made, "model-calls", made.run.run_id)
    assert result.exit_code == 0, result.output
    header, *lines = result.output.splitlines()
    assert header.split() == [
        "AGENT",
        "MESSAGE",
        "POS",
        "TIMELINE",
        "MODEL",
        "IN",
        "OUT",
        "LATENCY",
        "STARTED",
        "REPLAYS",
    ]
    rows, footer, legend = lines[:9], lines[9:12], lines[12:]
    for line, (agent, message, position, timeline, discarded) in zip(rows, CALLS, strict=True):
        cells = line.split()
        assert line.startswith("~" if discarded else " ")
        cells = cells[1:] if discarded else cells
        assert cells[:5] == [agent, message, str(position), str(timeline), f"{agent}-model"]
        assert cells[-1] == "0", "no answer was replayed"
    doc = as_json(made, "model-calls", made.run.run_id)
    totals = doc["totals"]
    assert [li.split()[:3] for li in footer] == [
        ["reviewer", "3", "calls"],
        ["writer", "6", "calls"],
        ["total", "9", "calls"],
    ]
    assert footer[-1].split()[3:] == [str(totals["input_tokens"]), str(totals["output_tokens"])]
    writer = totals["agents"]["writer"]
    assert footer[1].split()[3:] == [str(writer["input_tokens"]), str(writer["output_tokens"])]
    assert legend == [
        "~ 3 calls of a discarded timeline (asked again after a rollback); the run's latest "
        "timeline is 1"
    ]


def test_agent_keeps_that_agents_calls_and_totals(made: Made) -> None:
    doc = as_json(made, "model-calls", made.run.run_id, "--agent", "reviewer")
    assert identities(doc["calls"]) == [c for c in CALLS if c[0] == "reviewer"]
    assert doc["totals"]["calls"] == 3
    assert list(doc["totals"]["agents"]) == ["reviewer"]
    assert doc["totals"]["input_tokens"] == sum(c["input_tokens"] for c in doc["calls"])

    text = cli(made, "model-calls", made.run.run_id, "--agent", "reviewer").output.splitlines()
    assert [li.split()[0] for li in text[1:4]] == ["~", "reviewer", "reviewer"]
    assert text[4].split()[:3] == ["total", "3", "calls"], "one agent: no line per agent"

    missing = cli(made, "model-calls", made.run.run_id, "--agent", "nobody")
    assert missing.exit_code == 1
    assert missing.output == f"Error: run {made.run.run_id} has no agent 'nobody'\n"


def test_unknown_and_ambiguous_runs_are_one_line_errors(made: Made) -> None:
    unknown = cli(made, "model-calls", "ffff")
    assert unknown.exit_code == 1
    assert unknown.output == "Error: no run with id 'ffff' in this store\n"
    ambiguous = cli(made, "model-calls", "abc")
    assert ambiguous.exit_code == 1
    assert len(ambiguous.output.splitlines()) == 1
    assert "ambiguous" in ambiguous.output


def test_a_run_without_model_calls_says_so(made: Made) -> None:
    result = cli(made, "model-calls", "abc1")
    assert result.exit_code == 0, result.output
    assert result.output == f"run abc1{'0' * 28} recorded no model calls\n"
    doc = as_json(made, "model-calls", "abc1")
    assert doc["calls"] == []
    assert doc["totals"] == {"calls": 0, "input_tokens": 0, "output_tokens": 0, "agents": {}}


def test_show_lists_each_agents_calls_since_the_previous_cut(made: Made) -> None:
    second = as_json(made, "show", made.run.second[:8])
    assert second["previous"]["id"] == made.run.first
    assert identities(second["agents"]["writer"]["model_calls"]) == CALLS[6:8]
    assert identities(second["agents"]["reviewer"]["model_calls"]) == CALLS[8:]
    assert second["agents"]["$env"]["model_calls"] == []
    call = second["agents"]["writer"]["model_calls"][0]
    assert call["answer"] == "a draft in one line", "the first line of the answer"
    assert "request" not in call
    assert "response" not in call

    first = as_json(made, "show", made.run.first)
    writer = first["agents"]["writer"]["model_calls"]
    assert identities(writer) == [c for c in CALLS[:6] if c[0] == "writer"], (
        "the discarded timeline's calls too"
    )
    only = as_json(made, "show", made.run.first, "--agent", "reviewer")
    assert list(only["agents"]) == ["reviewer"]
    assert identities(only["agents"]["reviewer"]["model_calls"]) == [CALLS[2], CALLS[5]]

    text = cli(made, "show", made.run.first).output.splitlines()
    at = text.index("agent writer  (state " + first["agents"]["writer"]["state_hash"][:12] + ")")
    heading = next(li for li in text[at:] if li.startswith("  model calls since"))
    tokens_in = sum(c["input_tokens"] for c in writer)
    tokens_out = sum(c["output_tokens"] for c in writer)
    seq = first["previous"]["seq"]
    assert heading == (
        f"  model calls since snapshot {seq}: 4 ({tokens_in} tokens in, {tokens_out} out)"
    )
    calls = text[text.index(heading) + 1 : text.index(heading) + 5]
    assert calls[0].startswith("   ~$env>writer#1 #0 timeline 0  writer-model  3/5 tokens  ")
    assert calls[0].endswith(": a long long long draft")
    assert calls[2].startswith("    $env>writer#1 #0 timeline 1  writer-model  ")


def test_export_holds_the_runs_model_calls(made: Made) -> None:
    result = cli(made, "export", made.run.run_id[:8])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    listed = as_json(made, "model-calls", made.run.run_id)["calls"]
    assert document["model_calls"] == [
        {k: v for k, v in c.items() if k != "discarded"} for c in listed
    ]
    assert list(document)[4:7] == ["owners", "tool_calls", "model_calls"]
    assert len(document["model_calls"]) == 9


async def test_the_queries_read_a_ledger_given_to_them() -> None:
    store = MemoryStore()
    ledger = MemoryLedger()
    run = await make_model_call_run(store, ledger)
    doc = await model_calls_table(store, run.run_id, ledger=ledger)
    assert identities([c.model_dump() for c in doc.calls]) == CALLS
    without = await model_calls_table(store, run.run_id)
    assert without.calls == [], "a memory store has no ledger of its own"
    shown = await show_snapshot(store, run.second, ledger=ledger)
    calls = shown.agents["reviewer"].model_calls
    assert identities([c.model_dump() for c in calls]) == CALLS[8:]


async def test_the_streamed_export_writes_the_model_calls_export_run_lists() -> None:
    store = MemoryStore()
    ledger = MemoryLedger()
    run = await make_model_call_run(store, ledger)
    document = await export_run(store, run.run_id, ledger)
    assert len(document["model_calls"]) == len(CALLS)
    for indent in (None, 2):
        pieces: list[str] = []
        await write_export(store, run.run_id, pieces.append, indent=indent, ledger=ledger, page=1)
        assert "".join(pieces) == json.dumps(document, indent=indent, ensure_ascii=False)
