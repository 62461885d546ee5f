"""An agent SDK's model calls as agentsnap records them, whatever the SDK.

Each integration's model wrapper keeps the SDK's own JSON of a call (``native``), which is
what a replay gives back to the SDK, and a plain view of it for ``agentsnap model-calls`` and
the inspector. The view is built the same way for every SDK from what it reads off the SDK's
objects: the answer's text, its tool calls and its token counts; the tools offered with their
schemas. The wrappers share these helpers so that the view is the same whichever SDK made it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_core import to_jsonable_python

from agentsnap.messages import JsonValue
from agentsnap.models import ModelResponse, ModelToolCall, ToolSpec, Usage

__all__ = ["json_of", "offered", "recorded_answer", "tool_call"]


def json_of(value: Any) -> Any:
    """``value`` as JSON data: pydantic models and dataclasses by their fields, the rest by
    ``repr`` (for display and messages; never read back).
    """  # noqa: D205
    return to_jsonable_python(value, fallback=repr)


def tool_call(name: str, arguments: Any, call_id: str | None) -> ModelToolCall:
    """A tool call the model asked for, its arguments as JSON (``call_id`` ``None``: none)."""
    return ModelToolCall(name=name, arguments=json_of(arguments), id=call_id or "")


def offered(name: str, description: str | None, parameters: Any) -> ToolSpec:
    """A tool offered to the model, with the JSON schema of its parameters."""
    return ToolSpec(name=name, description=description or "", parameters=json_of(parameters))


def recorded_answer(  # noqa: PLR0917 - the view's fields, in their order
    text: str,
    tool_calls: Iterable[ModelToolCall],
    model: str | None,
    input_tokens: int,
    output_tokens: int,
    native: dict[str, JsonValue],
    *,
    output: JsonValue = None,
) -> ModelResponse:
    """The record of a model's answer: the view's fields, and the SDK's own JSON."""
    return ModelResponse(
        text=text,
        tool_calls=tuple(tool_calls),
        output=output,
        model=model,
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
        native=native,
    )
