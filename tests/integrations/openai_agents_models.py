"""An SDK ``Model`` for tests: its answers computed from the conversation, no network.

Streamed (``stream_response``), it sends the events a provider sends: the response created,
each output item added, a message's text word by word, the item done, the response
completed.

As the SDK's own tests script their models: the answer is a list of the SDK's output items
(``assistant_message``, ``function_call`` from ``agents.testing``).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents.items import ModelResponse, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

Answer = Callable[[list[dict[str, Any]]], list[TResponseOutputItem] | Awaitable[list[Any]]]


class FunctionSDKModel(Model):
    """Answers with what ``answer`` makes of the conversation; counts its calls."""

    def __init__(self, answer: Answer, name: str = "function-model") -> None:
        self.answer = answer
        self.model = name
        self.inputs: list[list[dict[str, Any]]] = []
        self.streamed = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        made = self.answer(items)
        output = await made if inspect.isawaitable(made) else made
        words = sum(len(str(item).split()) for item in items)
        return ModelResponse(
            output=list(output),
            usage=Usage(
                requests=1,
                input_tokens=words,
                output_tokens=len(output),
                total_tokens=words + len(output),
            ),
            response_id=None,
        )

    async def stream_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        """Streams the answer as a provider does: each message's text word by word."""
        self.streamed += 1
        answer = await self.get_response(system_instructions, input, *args, **kwargs)
        response = Response(
            id=f"resp_{uuid.uuid4().hex[:16]}",
            created_at=0,
            model=self.model,
            object="response",
            output=[],
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
            status="in_progress",
        )
        number = 0

        def numbered() -> int:
            nonlocal number
            number += 1
            return number - 1

        yield ResponseCreatedEvent(
            type="response.created", response=response, sequence_number=numbered()
        )
        for index, item in enumerate(answer.output):
            yield ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=item,
                output_index=index,
                sequence_number=numbered(),
            )
            if isinstance(item, ResponseOutputMessage):
                for part_index, part in enumerate(item.content):
                    text = getattr(part, "text", "")
                    for word in re.findall(r"\S+\s*", text):
                        await asyncio.sleep(0)  # as tokens arrive
                        yield ResponseTextDeltaEvent(
                            type="response.output_text.delta",
                            item_id=item.id,
                            output_index=index,
                            content_index=part_index,
                            delta=word,
                            logprobs=[],
                            sequence_number=numbered(),
                        )
            yield ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=item,
                output_index=index,
                sequence_number=numbered(),
            )
        usage = answer.usage
        yield ResponseCompletedEvent(
            type="response.completed",
            response=response.model_copy(
                update={
                    "output": list(answer.output),
                    "status": "completed",
                    "usage": ResponseUsage(
                        input_tokens=usage.input_tokens,
                        output_tokens=usage.output_tokens,
                        total_tokens=usage.total_tokens,
                        input_tokens_details=InputTokensDetails(
                            cached_tokens=0, cache_write_tokens=0
                        ),
                        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
                    ),
                }
            ),
            sequence_number=numbered(),
        )


def text_of(items: list[dict[str, Any]]) -> str:
    """Every text of the conversation, one line each."""
    lines = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            lines.append(content)
        elif isinstance(content, list):
            lines.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        elif item.get("type") == "function_call_output":
            lines.append(str(item.get("output")))
    return "\n".join(lines)


def answered_tool(items: list[dict[str, Any]]) -> bool:
    """Whether the conversation ends with a tool's output."""
    return bool(items) and items[-1].get("type") == "function_call_output"
