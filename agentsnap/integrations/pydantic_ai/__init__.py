"""pydantic-ai integration: pydantic-ai agents as agentsnap agents, durable the agentsnap way.

Install it with ``pip install 'agentsnap[pydantic-ai]'``. Importing ``agentsnap`` alone never
imports pydantic-ai; importing this module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] when pydantic-ai is missing.

- [`PydanticAIAgent`][agentsnap.integrations.pydantic_ai.PydanticAIAgent] runs a pydantic-ai
  agent on each message: its conversation is in the agent's state, so it is part of every
  consistent cut, a rollback takes it back, and the rejection's reason goes into the next
  prompt.
- [`AgentsnapDurability`][agentsnap.integrations.pydantic_ai.AgentsnapDurability] is
  pydantic-ai's durable-execution capability for agentsnap (on pydantic-ai's
  ``BaseDurabilityCapability``): each model request, streamed or not, a recorded step, each
  tool call that changes the world a call through the ledger, each approval or deferred
  call a request to a person;
  [`ToolOptions`][agentsnap.integrations.pydantic_ai.ToolOptions] sets a tool's key and redo
  rules; [`idempotency_key`][agentsnap.integrations.pydantic_ai.idempotency_key] hands a
  tool the key of its call, for the service it calls.
- [`agentsnap_toolset`][agentsnap.integrations.pydantic_ai.agentsnap_toolset] gives agentsnap
  ``@tool`` functions to a pydantic-ai agent.
- ``handling(ctx)`` runs a pydantic-ai agent durably from a handler of your own:
  ``with handling(ctx): await agent.run(...)``.

Example:
    ```python
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from agentsnap import Runtime
    from agentsnap.integrations.pydantic_ai import AgentsnapDurability, PydanticAIAgent

    assistant = Agent(TestModel(custom_output_text="hello"), capabilities=[AgentsnapDurability()])


    async def main() -> None:
        async with Runtime() as runtime:
            agent = runtime.add(PydanticAIAgent("assistant", assistant))
            runtime.send("assistant", "Say hello.")
            await runtime.run_until_idle()
        print(agent.state.output)  # hello


    asyncio.run(main())
    ```
"""

from __future__ import annotations

from agentsnap.integrations import needs_extra

with needs_extra("pydantic-ai", "pydantic-ai-slim"):
    import pydantic_ai  # noqa: F401

from agentsnap.integrations._running import handling
from agentsnap.integrations.pydantic_ai._agent import Outgoing, PydanticAIAgent, PydanticAIState
from agentsnap.integrations.pydantic_ai._durability import (
    AgentsnapDurability,
    ToolOptions,
    idempotency_key,
)
from agentsnap.integrations.pydantic_ai._toolset import agentsnap_toolset

__all__ = [
    "AgentsnapDurability",
    "Outgoing",
    "PydanticAIAgent",
    "PydanticAIState",
    "ToolOptions",
    "agentsnap_toolset",
    "handling",
    "idempotency_key",
]
