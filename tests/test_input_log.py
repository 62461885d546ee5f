"""The environment's input log: what a rollback replays, however much input there was."""

from __future__ import annotations

from types import MappingProxyType

from pydantic import Field

from agentsnap import ENVIRONMENT, Agent, AgentState, Context, JsonValue, Message, Runtime
from agentsnap.messages import EMPTY_HEADERS
from agentsnap.replay import InputLog
from agentsnap.testing import ScriptedScheduler


def sent_by_env(count: int) -> list[Message]:
    """``count`` environment messages to three agents, numbered per channel like the bus."""
    seqs = {"a": 0, "b": 0, "c": 0}
    messages = []
    for i in range(count):
        dst = "abc"[i % 3] if i % 7 else "a"
        seqs[dst] += 1
        headers = MappingProxyType({"n": str(i)}) if i % 5 == 0 else EMPTY_HEADERS
        payload: JsonValue = {"i": i, "big": 2**70 + i, "text": "ü"} if i % 11 == 0 else i
        messages.append(Message(ENVIRONMENT, dst, seqs[dst], "kind", payload, headers, i // 100))
    return messages


def counters(messages: list[Message]) -> dict[str, int]:
    """What the environment had sent to each agent after ``messages``."""
    sent: dict[str, int] = {}
    for message in messages:
        sent[message.dst] = message.seq
    return sent


def test_replays_exactly_what_followed_a_cut_across_sealed_and_buffered_input() -> None:
    messages = sent_by_env(1000)
    log = InputLog()
    for i, message in enumerate(messages):
        log.buffer.append(message)
        if i % 256 == 255:
            log.seal()
    assert len(log) == 1000
    for cut in (0, 1, 255, 256, 300, 767, 768, 999, 1000):
        assert list(log.after(counters(messages[:cut]))) == messages[cut:], cut


def test_forgetting_keeps_what_later_cuts_need() -> None:
    messages = sent_by_env(900)
    log = InputLog()
    for message in messages[:600]:
        log.buffer.append(message)
    log.seal()
    for message in messages[600:]:
        log.buffer.append(message)
    log.forget(counters(messages[:250]))  # a cut inside the sealed batch
    assert len(log) == 650
    assert list(log.after(counters(messages[:250]))) == messages[250:]
    assert list(log.after(counters(messages[:700]))) == messages[700:]
    log.forget(counters(messages[:800]))  # past every sealed message, into the buffer
    assert len(log) == 100
    assert list(log.after(counters(messages[:800]))) == messages[800:]
    log.forget(None)
    assert len(log) == 0
    assert list(log.after(counters(messages))) == []


class RecorderState(AgentState):
    seen: list[int] = Field(default_factory=list)


class Recorder(Agent[RecorderState]):
    async def handle(self, message: Message, ctx: Context[RecorderState]) -> None:
        self.state.seen.append(message.payload_as(int))


async def test_a_rollback_replays_hundreds_of_inputs_in_order() -> None:
    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler) as runtime:
        recorder = runtime.add(Recorder("recorder", RecorderState()))
        for i in range(300):
            runtime.send("recorder", i)
        await runtime.run_until_idle()
        cut = runtime.snapshot()
        await runtime.run_until_idle()
        snapshot = await cut
        for i in range(300, 1000):
            runtime.send("recorder", i)
        await runtime.run_until_idle()
        assert recorder.state.seen == list(range(1000))

        info = await runtime.rollback(snapshot.id)
        assert recorder.state.seen == list(range(300))
        await runtime.run_until_idle()

    assert info.discarded == 0
    assert recorder.state.seen == list(range(1000))
