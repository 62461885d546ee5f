"""An SDK ``Model`` for tests: its answers computed from the conversation, no network.

As the SDK's own tests script their models: the answer is a list of the SDK's output items
(``assistant_message``, ``function_call`` from ``agents.testing``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents.items import ModelResponse, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage

Answer = Callable[[list[dict[str, Any]]], list[TResponseOutputItem] | Awaitable[list[Any]]]


class FunctionSDKModel(Model):
    """Answers with what ``answer`` makes of the conversation; counts its calls."""

    def __init__(self, answer: Answer, name: str = "function-model") -> None:
        self.answer = answer
        self.model = name
        self.inputs: list[list[dict[str, Any]]] = []

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

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("not streamed in these tests")


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
