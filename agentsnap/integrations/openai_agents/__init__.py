"""OpenAI Agents SDK integration: the SDK's agents as agentsnap agents.

Install it with ``pip install 'agentsnap[openai-agents]'``. Importing ``agentsnap`` alone
never imports the SDK; importing this module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] when it is missing.

- [`AgentsnapRunner`][agentsnap.integrations.openai_agents.AgentsnapRunner] runs an SDK agent
  and the agents it hands off to as a run (``run``, ``run_streamed``, and ``resume`` after
  a crash).
- [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent] runs one SDK agent as an
  agentsnap agent: every model call a recorded step
  ([`RecordedModel`][agentsnap.integrations.openai_agents.RecordedModel]), its session in
  its state ([`AgentsnapSession`][agentsnap.integrations.openai_agents.AgentsnapSession]),
  its handoffs as messages to the agents wrapping their targets
  ([`team`][agentsnap.integrations.openai_agents.team] registers them all).
- [`function_tool`][agentsnap.integrations.openai_agents.function_tool],
  [`as_sdk_tool`][agentsnap.integrations.openai_agents.as_sdk_tool] and
  [`ledgered`][agentsnap.integrations.openai_agents.ledgered] make SDK tools whose calls go
  through agentsnap's tools, and so, for side effects, through the ledger; an
  ``OpenAIAgent`` puts every function tool not declared ``read_only`` through it.
- An output guardrail that trips is a rejection: the team rolls back and the agent retries,
  told the guardrail's reason
  ([`guardrail_verdict`][agentsnap.integrations.openai_agents.guardrail_verdict]).

Example:
    ```python
    from agentsnap.integrations.openai_agents import agent_name

    print(agent_name("Billing agent"))  # Billing_agent
    ```
"""

from __future__ import annotations

from agentsnap.integrations import needs_extra

with needs_extra("openai-agents", "openai-agents"):
    import agents  # noqa: F401

from agentsnap.integrations.openai_agents._agent import (
    OnEvent,
    OpenAIAgent,
    OpenAIAgentState,
    Outgoing,
    agent_name,
    guardrail_verdict,
)
from agentsnap.integrations.openai_agents._model import RecordedModel, as_json
from agentsnap.integrations.openai_agents._runner import (
    OUTPUTS,
    AgentsnapRunner,
    TeamResult,
    TeamStream,
    team,
)
from agentsnap.integrations.openai_agents._session import AgentsnapSession
from agentsnap.integrations.openai_agents._tools import as_sdk_tool, function_tool, ledgered

__all__ = [
    "OUTPUTS",
    "AgentsnapRunner",
    "AgentsnapSession",
    "OnEvent",
    "OpenAIAgent",
    "OpenAIAgentState",
    "Outgoing",
    "RecordedModel",
    "TeamResult",
    "TeamStream",
    "agent_name",
    "as_json",
    "as_sdk_tool",
    "function_tool",
    "guardrail_verdict",
    "ledgered",
    "team",
]
