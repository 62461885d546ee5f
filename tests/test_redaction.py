"""Redaction before persistence: a card number reaches no byte of what a run leaves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    OutputRejected,
    RedactedValueNeeded,
    Redaction,
    Runtime,
    tool,
)
from agentsnap.inspect import export_run
from agentsnap.ledger import fingerprint
from agentsnap.redaction import Where, find_markers, unredact
from agentsnap.store.sql import SqlStore
from agentsnap.telemetry import Telemetry
from agentsnap.testing import ScriptedModel
from agentsnap.timeline import load_timeline, render_html
from agentsnap.ui.server import create_app

CARD = "4111 1111 1111 1111"
NEEDLES = (CARD.encode(), CARD.replace(" ", "").encode(), b"4111")
KEY = "test key"


class Till(AgentState):
    card: str = ""
    note: str = ""
    done: int = 0


CHARGED: list[str] = []


@tool(side_effect=True)
async def charge(card: str, amount: int) -> str:
    CHARGED.append(card)
    return f"charge-{len(CHARGED)}"


class Cashier(Agent[Till]):
    def __init__(self, name: str = "cashier") -> None:
        super().__init__(name, Till())
        self.model = ScriptedModel([("receipt", "thanks")])

    async def handle(self, message: Message, ctx: Context[Till]) -> None:
        payload = message.payload_as(dict[str, Any])
        card = payload["card"]
        ctx.state.card = card
        ctx.state.note = await ctx.complete(self.model, f"Write a receipt for card {card}")
        await charge(ctx, card=card, amount=payload["amount"])
        ctx.state.done += 1
        ctx.send("clerk", {"card": card, "ok": True})


class Clerk(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        await asyncio.sleep(0)


def policy(**extra: Any) -> Redaction:
    return Redaction(
        state=["card"],
        payload=["card"],
        tool_arguments=["card"],
        model_request=["messages.*.content"],
        key=KEY,
        **extra,
    )


def leaks(data: bytes) -> list[bytes]:
    return [needle for needle in NEEDLES if needle in data]


CARDS = r"\b(?:\d[ -]?){12,18}\d\b"


async def run_with_card(url: str, otel: Telemetry) -> str:
    store = SqlStore(url)
    redaction = policy(patterns=[CARDS])  # the patterns mask the free text: a reason
    async with Runtime(store=store, redact=redaction, telemetry=otel) as runtime:
        cashier = runtime.add(Cashier())
        runtime.add(Clerk("clerk", AgentState()))
        runtime.send("cashier", {"card": CARD, "amount": 5})
        await runtime.snapshot()  # with the cashier's message in flight
        await runtime.run_until_idle()
        await runtime.snapshot()
        assert cashier.state.card == CARD  # the live value is never redacted
        await runtime.rollback(reason=f"card {CARD} looked odd")
        assert cashier.state.card == CARD  # a cut kept in memory needs no secret
    await store.close()
    return runtime.run_id


def test_a_card_number_is_nowhere_in_what_a_run_leaves(tmp_path: Path) -> None:
    db = tmp_path / "run.db"
    url = f"sqlite:///{db}"
    spans = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    otel = Telemetry(tracer_provider=provider)
    run_id = asyncio.run(run_with_card(url, otel))

    files = [p for p in tmp_path.iterdir() if p.is_file() and p.name.startswith("run.db")]
    assert files
    for path in files:
        assert not leaks(path.read_bytes()), path.name

    async def read() -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
        store = SqlStore(url)
        try:
            exported = await export_run(store, run_id)
            html = render_html(await load_timeline(store, run_id))
            stored = await store.list_snapshots(run_id)
            return exported, html, [s.model_dump(mode="json") for s in stored]
        finally:
            await store.close()

    exported, html, snapshots = asyncio.run(read())
    text = json.dumps(exported)
    assert not leaks(text.encode())
    assert "[redacted str hmac:" in text
    assert exported["model_calls"] or "model" in text
    assert not leaks(html.encode())
    assert any(find_markers(s) for s in snapshots)

    store = SqlStore(url)
    with TestClient(create_app(store, close_store=True)) as client:
        bodies = [client.get(f"/api/runs/{run_id}").content]
        listed = client.get(f"/api/runs/{run_id}/snapshots").json()
        for snap in listed["snapshots"] if isinstance(listed, dict) else listed:
            sid = snap["id"]
            bodies.append(client.get(f"/api/runs/{run_id}/snapshots/{sid}").content)
            bodies.append(client.get(f"/api/runs/{run_id}/agents/cashier/history").content)
        bodies.extend(
            client.get(f"/api/runs/{run_id}/{path}").content
            for path in ("messages", "events", "tools", "model-calls")
        )
        bodies.append(client.get(f"/api/runs/{run_id}/messages/environment/cashier/1").content)
        for body in bodies:
            assert not leaks(body), body[:300]
        assert any(b"[redacted" in body for body in bodies)

    finished = spans.get_finished_spans()
    assert finished
    for span in finished:
        blob = json.dumps(
            {
                "name": span.name,
                "attributes": dict(span.attributes or {}),
                "events": [dict(e.attributes or {}) for e in span.events],
            },
            default=str,
        ).encode()
        assert not leaks(blob), span.name
    provider.shutdown()


def test_markers_keep_a_stable_keyed_hash_and_the_fingerprint_holds_no_secret() -> None:
    one, other = policy(), Redaction(tool_arguments=["card"], key="another key")
    assert one.mark(CARD) == one.mark(CARD)
    assert one.mark(CARD) != other.mark(CARD)
    assert one.mark(CARD).startswith("[redacted str hmac:")
    assert one.mark(1234).startswith("[redacted int hmac:")
    arguments = one.tool_arguments("charge", {"card": CARD, "amount": 5})
    assert arguments["amount"] == 5
    assert arguments["card"] == one.mark(CARD)
    assert fingerprint(arguments) != fingerprint({"card": CARD, "amount": 5})
    changed = one.tool_arguments("charge", {"card": "5500 0000 0000 0004", "amount": 5})
    assert fingerprint(arguments) != fingerprint(changed)


def test_paths_match_by_their_end_and_patterns_mask_text() -> None:
    redaction = Redaction(
        state=["customer.email", "payer.pin"], patterns=[r"\d{4} \d{4} \d{4} \d{4}"], key=KEY
    )
    state: dict[str, Any] = {
        "customer": {"email": "a@b.c"},
        "email": "kept",
        "pin": 1,
        "note": f"card {CARD}",
    }
    redacted = redaction.value("state", "payer", state)
    assert redacted["customer"]["email"].startswith("[redacted str")
    assert redacted["email"] == "kept"
    assert redacted["pin"].startswith("[redacted int")
    assert CARD not in redacted["note"]
    assert redacted["note"].startswith("card [redacted str")
    assert state["customer"]["email"] == "a@b.c"  # the value given is never changed
    assert redaction.value("state", "other", {"pin": 1}) == {"pin": 1}
    with pytest.raises(ConfigurationError):
        Redaction(state="card")


def test_a_restore_asks_the_secret_provider_and_checks_its_answer() -> None:
    asked: list[Where] = []

    def vault(where: Where) -> str:
        asked.append(where)
        return CARD

    redaction = policy(secret=vault)
    stored = redaction.value("state", "cashier", {"card": CARD, "done": 1})
    assert unredact(stored, "state", "cashier", redaction, doing="resume") == {
        "card": CARD,
        "done": 1,
    }
    assert asked[0].path == ("card",)
    assert asked[0].owner == "cashier"
    with pytest.raises(RedactedValueNeeded, match=r"agent 'cashier', field card .*secret="):
        unredact(stored, "state", "cashier", policy(), doing="resume")
    wrong = policy(secret=lambda where: "5500 0000 0000 0004")
    with pytest.raises(RedactedValueNeeded, match="does not hash to the marker"):
        unredact(stored, "state", "cashier", wrong, doing="resume")


class Doubter(Agent[Till]):
    async def handle(self, message: Message, ctx: Context[Till]) -> None:
        payload = message.payload_as(dict[str, Any])
        ctx.state.card = payload["card"]
        ctx.state.done += 1
        if ctx.state.done == 1 and payload.get("doubt"):
            raise OutputRejected("doubter", "try again", "self-evaluation")


def test_an_automatic_rollback_uses_the_cut_in_memory(tmp_path: Path) -> None:
    async def main() -> str:
        store = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
        async with Runtime(store=store, redact=policy()) as rt:
            agent = rt.add(Doubter("doubter", Till()))
            rt.send("doubter", {"card": CARD})
            await rt.run_until_idle()
            await rt.snapshot()
            rt.send("doubter", {"card": CARD, "doubt": True})
            await rt.run_until_idle()
        await store.close()
        return agent.state.card

    assert asyncio.run(main()) == CARD


def test_redaction_off_leaves_the_records_alone(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqlStore(f"sqlite:///{tmp_path / 'plain.db'}")
        async with Runtime(store=store) as rt:
            rt.add(Cashier())
            rt.add(Clerk("clerk", AgentState()))
            rt.send("cashier", {"card": CARD, "amount": 5})
            await rt.run_until_idle()
            await rt.snapshot()
        await store.close()

    asyncio.run(main())
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert CARD.encode() in data
