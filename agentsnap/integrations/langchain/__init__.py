"""LangChain integration: ``create_agent`` agents with recorded model calls and ledger tools.

Install it with ``pip install 'agentsnap[langchain]'``. Importing ``agentsnap`` alone never
imports LangChain; importing this module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] when LangChain is missing.

- [`AgentsnapMiddleware`][agentsnap.integrations.langchain.AgentsnapMiddleware], a
  LangChain ``AgentMiddleware``: every model call of the agent is a recorded step of the
  agentsnap handler running it, and every tool call goes through an agentsnap tool, the
  side-effecting ones through the ledger.
- [`SideEffect`][agentsnap.integrations.langchain.SideEffect] holds a side-effecting tool's
  ledger options, and
  [`idempotency_key`][agentsnap.integrations.langchain.idempotency_key] gives a tool's body
  the key of its call, for a service that deduplicates.
- [`LangChainAgent`][agentsnap.integrations.langchain.LangChainAgent] runs such an agent
  as an agentsnap agent, its conversation in its state
  ([`ConversationState`][agentsnap.integrations.langchain.ConversationState]).

Example:
    ```python
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from agentsnap.integrations.langchain import AgentsnapMiddleware, LangChainAgent

    model = GenericFakeChatModel(messages=iter([AIMessage(content="hello")]))
    agent = create_agent(model, tools=[], middleware=[AgentsnapMiddleware()])
    greeter = LangChainAgent("greeter", agent)
    print(greeter.state.messages)  # []: the conversation starts with the first message
    ```
"""

from __future__ import annotations

from agentsnap.integrations import needs_extra

with needs_extra("langchain", "langchain"):
    import langchain.agents  # noqa: F401
    import langchain_core  # noqa: F401

from agentsnap.integrations.langchain._agent import ConversationState, LangChainAgent
from agentsnap.integrations.langchain._middleware import (
    AgentsnapMiddleware,
    SideEffect,
    idempotency_key,
)
from agentsnap.integrations.langgraph._agent import Outgoing

__all__ = [
    "AgentsnapMiddleware",
    "ConversationState",
    "LangChainAgent",
    "Outgoing",
    "SideEffect",
    "idempotency_key",
]
