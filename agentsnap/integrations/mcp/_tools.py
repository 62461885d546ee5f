"""An MCP server's tools as agentsnap tools: which have side effects, and how each is called."""

from __future__ import annotations

import asyncio
import logging
import typing
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import mcp.types as mt
from mcp import Client, ClientSession

from agentsnap.exceptions import ConfigurationError, ToolOutcomeUnknown
from agentsnap.integrations.mcp._results import McpToolError, result_json
from agentsnap.tools import OnDivergence, OnRedo, Tool, ToolCall

if TYPE_CHECKING:
    from agentsnap.messages import JsonValue

__all__ = ["ATTEMPT", "IDEMPOTENCY_KEY", "SideEffect", "by_annotations", "mcp_tools"]

logger = logging.getLogger("agentsnap")

IDEMPOTENCY_KEY = "io.agentsnap/idempotency-key"
"""The ``_meta`` entry of a ``tools/call`` request that holds the call's idempotency key.

Sent with every call of a ledger-backed tool. A server that keeps the effects it made by
this key, and answers a key it already holds with the recorded outcome, makes a repeated
request harmless; a tool of such a server can be listed in ``rerun_if_unknown``."""

ATTEMPT = "io.agentsnap/attempt"
"""The ``_meta`` entry holding the attempt under the key: 1, then 2 for a call run again
after its outcome was unknown."""

TASK_NOTE = "mcp_task"
"""The entry of a ledger claim's progress note that holds the MCP task's id while it runs."""

TERMINAL = frozenset({"completed", "failed", "cancelled"})
POLL_DEFAULT = 0.5
POLL_MAX = 5.0

SideEffect: TypeAlias = Literal["annotations"] | bool | Collection[str] | Callable[[mt.Tool], bool]
"""Which of a server's tools touch the outside world, and so go through the ledger.

- ``"annotations"`` (the default): by the server's annotations, as
  [`by_annotations`][agentsnap.integrations.mcp.by_annotations] reads them: every tool
  except those marked ``readOnlyHint``. A tool without annotations is ledger-backed.
- ``True`` or ``False``: every tool, or none.
- a set (or list, tuple) of tool names: those, and no other; a name the server does not
  have is a ``ConfigurationError``.
- a function of the MCP ``Tool`` (name, description, schemas, annotations): ``True`` for a
  side-effecting tool.
"""


def by_annotations(tool: mt.Tool) -> bool:
    """Whether a tool has side effects, as its server's annotations say.

    Only ``readOnlyHint: true`` makes a tool read-only. Annotations are hints, and a server
    that gives none says nothing, so the safe choice stands: without ``readOnlyHint`` a
    tool is ledger-backed, ``destructiveHint`` or not.
    """
    annotations = tool.annotations
    return not (annotations is not None and annotations.read_only_hint is True)


async def mcp_tools(
    source: ClientSession | Client,
    side_effect: SideEffect = "annotations",
    *,
    prefix: str = "",
    rerun_if_unknown: bool | Collection[str] = False,
    tasks: bool = True,
    task_ttl: float | None = None,
    on_redo: OnRedo = "recorded",
    on_divergence: OnDivergence = "raise",
    lease: float = 60.0,
    wait: float = 10.0,
) -> list[Tool[Any]]:
    """Make an MCP server's tools agentsnap tools.

    Each tool takes the server's arguments (its input schema becomes the tool's
    [`arguments_schema`][agentsnap.Tool.arguments_schema], so a model is offered it as the
    server describes it), calls the server through ``source``, and returns the result as
    JSON ([`result_json`][agentsnap.integrations.mcp.result_json]; an ``isError`` result is
    a [`ToolFailed`][agentsnap.ToolFailed]). A side-effecting tool (``side_effect``) goes
    through the ledger like any ``side_effect=True`` agentsnap tool: its key is bound to the
    call (run, agent, message, place), so a handler redone after a rollback or re-executed
    after a resume gets the recorded result instead of asking the server again. The key
    goes to the server in the request's ``_meta`` under
    [`IDEMPOTENCY_KEY`][agentsnap.integrations.mcp.IDEMPOTENCY_KEY].

    A tool the server offers as an MCP task (``execution.taskSupport`` ``"optional"`` or
    ``"required"``, protocol 2025-11-25) is started as a task; for a ledger-backed tool the
    task's id is kept as the claim's progress note
    ([`ToolCall.note`][agentsnap.ToolCall.note]) before the call waits for the task. A run
    resumed after a crash that finds the claim's owner gone polls that task for its result
    instead of calling the tool again.

    Args:
        source: An initialized MCP ``ClientSession`` (from
            [`mcp_server`][agentsnap.integrations.mcp.mcp_server], say) or an entered MCP
            ``Client``. The tools call the server through it while it is open.
        side_effect: Which tools are ledger-backed; see
            [`SideEffect`][agentsnap.integrations.mcp.SideEffect].
        prefix: Put before every tool's name in agentsnap (``"bank_"``), to keep two
            servers' tools apart; the server is still called by its own name.
        rerun_if_unknown: The tools (``True``: all) whose server deduplicates by the key it
            is handed, so that a call whose outcome is unknown (the process died while the
            server worked) may be sent again. Tools annotated ``idempotentHint`` are run
            again too; any other unknown outcome raises
            [`ToolOutcomeUnknown`][agentsnap.ToolOutcomeUnknown].
        tasks: Run the tools that support MCP tasks as tasks (a tool that requires one is
            always run as one).
        task_ttl: Seconds the server is asked to keep a task and its result.
        on_redo: As for [`tool`][agentsnap.tool], for every side-effecting tool.
        on_divergence: As for [`tool`][agentsnap.tool], for every side-effecting tool.
        lease: As for [`tool`][agentsnap.tool].
        wait: As for [`tool`][agentsnap.tool].

    Returns:
        One tool per server tool, in the server's order.

    Raises:
        ConfigurationError: ``source`` is not an initialized session, ``side_effect`` or
            ``rerun_if_unknown`` names a tool the server does not have or is of the wrong
            kind, or a name with ``prefix`` cannot be a tool's name.
    """
    session = _session_of(source)
    listed = await _list_tools(session)
    names = [tool.name for tool in listed]
    chooses = _chooser(side_effect, names, "side_effect")
    if isinstance(rerun_if_unknown, bool):
        reruns: Callable[[mt.Tool], bool] = lambda _tool: rerun_if_unknown  # noqa: E731
    else:
        reruns = _chooser(rerun_if_unknown, names, "rerun_if_unknown")
    if not isinstance(prefix, str):
        raise ConfigurationError(f"mcp_tools(prefix=...) takes a string, got {prefix!r}")
    capable = _server_runs_tasks(session)
    made: list[Tool[Any]] = []
    for listing in listed:
        effect = chooses(listing)
        if not isinstance(effect, bool):
            raise ConfigurationError(
                f"the side_effect= function of mcp_tools() returned {effect!r} for tool "
                f"{listing.name!r}; it must return True or False"
            )
        support = listing.execution.task_support if listing.execution is not None else None
        as_task = support == "required" or (tasks and capable and support == "optional")
        idempotent = listing.annotations is not None and listing.annotations.idempotent_hint
        rerun = bool(reruns(listing) or idempotent)
        options: dict[str, Any] = {}
        if effect:
            options = {"on_redo": on_redo, "on_divergence": on_divergence}
        made.append(
            Tool.from_schema(
                prefix + listing.name,
                listing.input_schema,
                _McpCall(
                    prefix + listing.name,
                    listing,
                    session,
                    as_task=as_task,
                    task_ttl=task_ttl,
                    rerun=rerun,
                ),
                description=listing.description or "",
                side_effect=effect,
                # A task's claim notes the task's id: the call taken over polls it.
                rerun_if_unknown=effect and (rerun or as_task),
                lease=lease,
                wait=wait,
                **options,
            )
        )
    return made


class _McpCall:
    """Calls one tool of an MCP server: the function of its agentsnap ``Tool``.

    For a ledger-backed tool run as an MCP task, the task's id is kept as the claim's
    progress note ([`ToolCall.note`][agentsnap.ToolCall.note]) before the call waits: a call
    taken over after its owner stopped polls that task instead of calling the tool again.
    """

    def __init__(
        self,
        name: str,
        listing: mt.Tool,
        session: ClientSession,
        *,
        as_task: bool,
        task_ttl: float | None,
        rerun: bool,
    ) -> None:
        self.name = name
        self.remote = listing.name
        self.session = session
        self.as_task = as_task
        self._ttl = None if task_ttl is None else round(task_ttl * 1000)
        self._rerun = rerun

    async def __call__(self, call: ToolCall, arguments: dict[str, Any]) -> JsonValue:
        key = call.key
        meta: mt.RequestParamsMeta | None = None
        if key is not None:
            meta = typing.cast(
                "mt.RequestParamsMeta", {IDEMPOTENCY_KEY: key, ATTEMPT: call.attempt}
            )
        if self.as_task:
            return await self._run_task(call, arguments, meta)
        result = await self.session.call_tool(self.remote, arguments, meta=meta)
        return result_json(self.remote, result)

    async def _run_task(
        self, call: ToolCall, arguments: dict[str, Any], meta: mt.RequestParamsMeta | None
    ) -> JsonValue:
        durable = call.key is not None
        task_id: str | None = None
        if durable and call.attempt > 1:
            # Taken over after the claim's owner stopped: its task, if it had started one.
            task_id = _recorded_task(await call.noted())
            if task_id is None and not self._rerun:
                raise ToolOutcomeUnknown(str(call.key), self.name, None)
            if task_id is not None:
                logger.info("tool %r: key %s polls its MCP task %s", self.name, call.key, task_id)
        poll = POLL_DEFAULT
        if task_id is None:
            started = await self._start_task(arguments, meta)
            if isinstance(started, mt.CallToolResult):  # the server ran it at once
                return result_json(self.remote, started)
            task_id = started.task.task_id
            poll = _interval(started.task.poll_interval)
            # Durable before the wait: a call taken over polls this task, not the tool.
            if durable and not await call.note({TASK_NOTE: {"taskId": task_id}}):
                logger.warning(
                    "tool %r: the MCP task %s of key %s could not be noted in its claim "
                    "(taken over meanwhile)",
                    self.name,
                    task_id,
                    call.key,
                )
        return result_json(self.remote, await self._await_task(task_id, poll))

    async def _start_task(
        self, arguments: dict[str, Any], meta: mt.RequestParamsMeta | None
    ) -> mt.CreateTaskResult | mt.CallToolResult:
        params = mt.CallToolRequestParams(
            name=self.remote,
            arguments=arguments,
            task=mt.TaskMetadata(ttl=self._ttl),
            _meta=meta,
        )
        # The SDK's ClientSession.call_tool only accepts a CallToolResult back; a
        # task-augmented call is answered with a CreateTaskResult, so it goes one layer down.
        dispatcher = getattr(self.session, "_dispatcher", None)
        send = getattr(dispatcher, "send_raw_request", None)
        if send is None:
            raise ConfigurationError(
                f"tool {self.name!r} runs as an MCP task, and this version of the MCP SDK "
                "gives no way to send a task-augmented call; pass mcp_tools(tasks=False)"
            )
        raw: dict[str, Any] = await send(
            "tools/call", params.model_dump(by_alias=True, mode="json", exclude_none=True), {}
        )
        if "task" in raw:
            return mt.CreateTaskResult.model_validate(raw, by_name=False)
        return mt.CallToolResult.model_validate(raw, by_name=False)

    async def _await_task(self, task_id: str, poll: float) -> mt.CallToolResult:
        session = self.session
        while True:
            state = await session.send_request(
                mt.GetTaskRequest(params=mt.GetTaskRequestParams(task_id=task_id)),
                mt.GetTaskResult,
            )
            if state.status in TERMINAL:
                break
            if state.status == "input_required":
                raise McpToolError(
                    self.remote,
                    [_text(f"task {task_id} asks for input, which agentsnap cannot give")],
                )
            await asyncio.sleep(_interval(state.poll_interval, poll))
        if state.status == "cancelled":
            raise McpToolError(self.remote, [_text(f"task {task_id} was cancelled")])
        return await session.send_request(
            mt.GetTaskPayloadRequest(params=mt.GetTaskPayloadRequestParams(task_id=task_id)),
            mt.CallToolResult,
        )


def _recorded_task(note: JsonValue) -> str | None:
    if isinstance(note, dict):
        task = note.get(TASK_NOTE)
        if isinstance(task, dict) and isinstance(task.get("taskId"), str):
            return str(task["taskId"])
    return None


def _interval(milliseconds: int | None, default: float = POLL_DEFAULT) -> float:
    if milliseconds is None or milliseconds <= 0:
        return default
    return min(milliseconds / 1000, POLL_MAX)


def _text(text: str) -> JsonValue:
    return {"type": "text", "text": text}


def _session_of(source: object) -> ClientSession:
    if isinstance(source, Client):
        source = source.session
    if not isinstance(source, ClientSession):
        if isinstance(source, mt.Tool | str | Mapping) or hasattr(source, "command"):
            hint = "; to start a server from a command, use `async with mcp_server(...)`"
        else:
            hint = ""
        raise ConfigurationError(
            f"mcp_tools() takes an MCP ClientSession or Client, got {type(source).__name__}" + hint
        )
    if session_unready(source):
        raise ConfigurationError(
            "mcp_tools() needs an initialized session: call `await session.initialize()` "
            "first (mcp_server() does)"
        )
    return source


def session_unready(session: ClientSession) -> bool:
    """Whether the session has not been through the MCP handshake yet."""
    return session.server_capabilities is None


async def _list_tools(session: ClientSession) -> list[mt.Tool]:
    listed: list[mt.Tool] = []
    cursor: str | None = None
    while True:
        params = None if cursor is None else mt.PaginatedRequestParams(cursor=cursor)
        page = await session.list_tools(params=params)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return listed


def _server_runs_tasks(session: ClientSession) -> bool:
    capabilities = session.server_capabilities
    tasks = capabilities.tasks if capabilities is not None else None
    requests = tasks.requests if tasks is not None else None
    tools = requests.tools if requests is not None else None
    return tools is not None and tools.call is not None


def _chooser(choice: object, names: list[str], option: str) -> Callable[[mt.Tool], bool]:
    """A function telling the tools ``choice`` selects, checked against the server's."""
    if choice == "annotations" and option == "side_effect":
        return by_annotations
    if isinstance(choice, bool):
        return lambda _tool: choice
    if isinstance(choice, str):
        hint = (
            f" (to choose the one tool {choice!r}, pass {{{choice!r}}})" if choice in names else ""
        )
        raise ConfigurationError(
            f"mcp_tools({option}=...) takes 'annotations', True/False, a set of tool names or a "
            f"function of the tool, got the string {choice!r}{hint}"
        )
    if callable(choice):
        return choice
    if isinstance(choice, Collection):
        chosen = set(choice)
        strange = [n for n in chosen if not isinstance(n, str)]
        if strange:
            raise ConfigurationError(f"mcp_tools({option}=...) takes tool names, got {strange!r}")
        unknown = sorted(str(n) for n in chosen if n not in names)
        if unknown:
            raise ConfigurationError(
                f"mcp_tools({option}=...) names {unknown!r}, which the server does not have; "
                f"its tools are {sorted(names)!r}"
            )
        return lambda tool: tool.name in chosen
    raise ConfigurationError(
        f"mcp_tools({option}=...) takes 'annotations', True/False, a set of tool names or a "
        f"function of the tool, got {type(choice).__name__}"
    )
