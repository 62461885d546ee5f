"""The SDK's session protocol, its items kept in an agentsnap agent's state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentsnap.integrations.openai_agents._model import as_json

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings

    from agentsnap.agents import Agent

__all__ = ["AgentsnapSession"]


class AgentsnapSession:
    """An SDK ``Session`` whose items are the ``items`` of an agentsnap agent's state.

    The conversation the SDK keeps in a session (the user's inputs, the model's messages and
    tool calls, the tools' outputs) is then part of the agent's state: in every consistent
    cut, shown by ``agentsnap show``, and sent back with the rest of the team by a rollback
    or a resume. [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent] runs its
    SDK agent with one; the items are read from the agent's state as it is now, so a
    restored state is the session's too.

    Args:
        agent: The agent whose state holds the items: an ``OpenAIAgentState``, or any
            state with an ``items`` list.

    Attributes:
        session_id: The agent's name.
        session_settings: The SDK's session settings (none: the SDK's defaults).
    """

    def __init__(self, agent: Agent[Any]) -> None:
        self._agent = agent
        self.session_id = agent.name
        self.session_settings: SessionSettings | None = None

    def _kept(self) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = self._agent.state.items
        return kept

    def _changed(self) -> None:
        # An assignment marks the state changed for the next snapshot, wherever it happens.
        self._agent.state = self._agent.state

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first; the latest ``limit`` items when given."""
        items = self._kept()
        chosen = items if limit is None else items[-limit:] if limit > 0 else []
        return [dict(item) for item in chosen]  # type: ignore[misc]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Add items at the end of the conversation."""
        self._kept().extend(as_json(dict(item)) for item in items)
        self._changed()

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item, or ``None`` when there is none."""
        items = self._kept()
        if not items:
            return None
        item = items.pop()
        self._changed()
        return item  # type: ignore[return-value]

    async def clear_session(self) -> None:
        """Forget the conversation."""
        self._kept().clear()
        self._changed()
