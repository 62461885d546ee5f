"""The one thing agentsnap asks of a language model: text in, text out.

Agents call models however they like; the demo and the test doubles use this small protocol
so that a scripted model (no network, same answers every run) and a real one are
interchangeable:

```python
from agentsnap.models import ChatModel
from agentsnap.testing import ScriptedModel

model: ChatModel = ScriptedModel([("capital of France", "Paris")])
```

Any LangChain chat model fits through [`LangChainModel`][agentsnap.models.LangChainModel], and
[`load_model`][agentsnap.models.load_model] builds one from a ``provider:model`` string when
``langchain`` is installed.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from agentsnap.exceptions import ConfigurationError

__all__ = ["ChatModel", "LangChainModel", "load_model"]


@runtime_checkable
class ChatModel(Protocol):
    """A model that answers a prompt with text."""

    async def complete(self, prompt: str) -> str:
        """The model's answer to ``prompt``."""
        ...


class LangChainModel:
    """A LangChain chat model seen as a [`ChatModel`][agentsnap.models.ChatModel].

    Args:
        model: Anything with LangChain's ``ainvoke``, returning a message with ``content``.
    """

    def __init__(self, model: Any) -> None:
        if not callable(getattr(model, "ainvoke", None)):
            raise ConfigurationError(
                f"{type(model).__name__} has no ainvoke(); pass a LangChain chat model"
            )
        self.model = model

    async def complete(self, prompt: str) -> str:  # noqa: D102
        answer = await self.model.ainvoke(prompt)
        content = getattr(answer, "content", answer)
        if isinstance(content, list):  # content blocks: keep the text ones
            content = "".join(
                block if isinstance(block, str) else str(block.get("text", "")) for block in content
            )
        return str(content)


def load_model(spec: str) -> ChatModel:
    """A LangChain chat model from ``"provider:model"`` (for example ``openai:gpt-4o-mini``).

    Raises:
        ConfigurationError: ``langchain`` is not installed, or the spec is not understood;
            the message says what to install or write.
    """
    if ":" not in spec:
        raise ConfigurationError(
            f"model {spec!r} is not of the form provider:model (for example openai:gpt-4o-mini)"
        )
    try:
        chat_models = importlib.import_module("langchain.chat_models")
    except ImportError:
        raise ConfigurationError(
            f"using model {spec!r} needs LangChain: pip install langchain and the provider's "
            "package (for example langchain-openai)"
        ) from None
    try:
        model = chat_models.init_chat_model(spec)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"cannot load model {spec!r}: {exc}") from exc
    return LangChainModel(model)
