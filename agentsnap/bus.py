"""The bus: FIFO channels, sequence numbers, schedulers, and the seams around them.

Every ordered pair of processes that has talked has one [`Channel`][agentsnap.bus.Channel],
created on first send. Messages and snapshot markers travel on the channel in FIFO order; each
message takes the channel's next sequence number, starting at 1.

The bus owns its channels. Everyone else reaches a channel's items through the
[`Channel`][agentsnap.bus.Channel] protocol (append, take the next, length, iterate in order,
counters and epochs) and puts the whole bus back on a recorded cut with
[`Bus.restore`][agentsnap.bus.Bus.restore]. A [`Transport`][agentsnap.bus.Transport] makes the
channels: [`LocalTransport`][agentsnap.bus.LocalTransport] keeps them in this process; another
one may carry them between processes. Whoever wants to see the traffic (the journal, tracing)
implements [`BusObserver`][agentsnap.bus.BusObserver]; the bus imports none of them.

A scheduler decides *which* deliverable item goes next. The
[`AsyncioScheduler`][agentsnap.AsyncioScheduler] runs one task per agent, so an agent awaiting
I/O never holds the others up; `agentsnap.testing` has deterministic ones. Whatever the
scheduler, each agent handles one item at a time and each channel is delivered in order.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from agentsnap.exceptions import (
    ConfigurationError,
    InvalidAgentName,
    PayloadNotSerializable,
    UnknownAgentError,
)
from agentsnap.limits import MAX_AGENT_NAME, MAX_MESSAGE_KIND, check_text
from agentsnap.messages import (
    EMPTY_HEADERS,
    ENVIRONMENT,
    JSON_SCALAR_TYPES,
    Marker,
    Message,
    dumps_json,
    is_json,
    json_problem,
)

if TYPE_CHECKING:
    from agentsnap.messages import JsonInput

__all__ = [
    "AsyncioScheduler",
    "Bus",
    "BusObserver",
    "Channel",
    "Deliver",
    "Endpoint",
    "LocalChannel",
    "LocalTransport",
    "Scheduler",
    "Transport",
    "check_agent_name",
    "check_kind",
]

_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_AGENT_NAME - 1}}}")
_new_message = tuple.__new__
_now_ns = time.time_ns
_KNOWN_KINDS_MAX = 4096
"""How many distinct message kinds a bus remembers as checked (beyond, each is checked again)."""


def check_agent_name(name: object) -> str:
    """Return ``name`` if it is a valid agent name, else raise.

    Raises:
        InvalidAgentName: The name is not 1 to 128 characters of ``[A-Za-z0-9_.-]``
            starting with a letter, digit or underscore.
    """
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        length = len(name) if isinstance(name, str) else 0
        raise InvalidAgentName(
            f"{name!r} is not a valid agent name"
            + (f" (it is {length} characters long)" if length > MAX_AGENT_NAME else "")
            + f": use 1 to {MAX_AGENT_NAME} characters of letters, digits, '_', '.' or '-', "
            "starting with a letter, digit or '_' (the longest name every store can hold)"
        )
    return name


def check_kind(kind: object) -> str:
    """Return ``kind`` if every store can hold it as a message kind, else raise.

    Raises:
        ConfigurationError: ``kind`` is not a string of at most 128 characters without the
            NUL character.
    """
    return check_text(
        kind,
        "message kind",
        MAX_MESSAGE_KIND,
        "use a shorter kind (put the details in the payload or the headers)",
        empty=True,
    )


Item = Message | Marker
"""What travels on a channel: a message, or a snapshot marker."""


class Channel(Protocol):
    """The FIFO channel from ``src`` to ``dst``: its items in flight, counters and epochs.

    The bus makes channels through its [`Transport`][agentsnap.bus.Transport] and is their only
    writer of items; the rest of the package reads them through this protocol.

    Attributes:
        src: Sending process.
        dst: Receiving process.
        receiver: The receiving endpoint.
        sent: Messages sent so far (the last sequence number used).
        delivered: Messages taken off the channel by the receiver so far.
        closed: Highest snapshot number for which nothing more on this channel can be
            in flight (raised by markers and by messages from a sender that had recorded).
        in_process: Whether the channel's items and both its ends are in this process, a
            class attribute: its sender sees everything it holds, and its receiver may be
            made to record at any moment between two handlers. The snapshot protocol relies
            on it to close such a channel without a marker when nothing sent before a
            recording is on it, and to have its receiver record at once instead of at a
            marker. A channel whose other end (or items) are elsewhere says ``False``: it
            always takes its marker, in band.
    """

    src: str
    dst: str
    receiver: Endpoint
    sent: int
    delivered: int
    closed: int
    in_process: ClassVar[bool]

    def append(self, item: Item, /) -> None:
        """Put ``item`` at the end of the channel."""

    def take(self) -> Item:
        """Remove and return the oldest item (the channel is not empty)."""

    def clear(self) -> None:
        """Drop every item."""

    def __len__(self) -> int:
        """Items sent and not yet delivered."""

    def __iter__(self) -> Iterator[Item]:
        """The items in flight, oldest first."""

    def __getitem__(self, index: int, /) -> Item:
        """The item at ``index`` (0 is the next to be delivered)."""


class LocalChannel:
    """A [`Channel`][agentsnap.bus.Channel] kept in this process, on a ``deque``.

    ``append`` and ``take`` are the deque's own methods, so the send and delivery paths pay
    no call of their own.
    """

    __slots__ = (
        "_items",
        "append",
        "clear",
        "closed",
        "delivered",
        "dst",
        "receiver",
        "sent",
        "src",
        "take",
    )

    in_process: ClassVar[bool] = True
    """Its items and both its ends are in this process (see [`Channel`][agentsnap.bus.Channel])."""

    def __init__(self, src: str, dst: str, receiver: Endpoint, closed: int) -> None:
        self.src = src
        self.dst = dst
        self.sent = 0
        self.delivered = 0
        self.closed = closed
        self.receiver = receiver
        items: deque[Item] = deque()
        self._items = items
        self.append: Callable[[Item], None] = items.append
        self.take: Callable[[], Item] = items.popleft
        self.clear: Callable[[], None] = items.clear

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def __getitem__(self, index: int) -> Item:
        return self._items[index]

    def __repr__(self) -> str:
        return (
            f"<Channel {self.src}>{self.dst} sent={self.sent} delivered={self.delivered} "
            f"queued={len(self._items)}>"
        )


class Transport(Protocol):
    """Makes the channels of a bus: where their items are kept and how they travel."""

    def channel(self, src: str, dst: str, receiver: Endpoint, closed: int) -> Channel:
        """A new, empty channel from ``src`` to ``dst``, closed up to snapshot ``closed``."""

    def bind(self, bus: Bus) -> Callable[[Channel], None] | None:
        """Called once by ``bus`` as it is created; ``None`` for a transport of one process.

        A transport whose channels are fed from elsewhere (another process) creates the
        channels whose items arrive and tells the bus's scheduler of them; a callable it
        returns replaces the scheduler's ``notify`` on the send path (to keep the channels
        whose receiver is elsewhere from the scheduler).
        """


class LocalTransport:
    """The default transport: every channel is a [`LocalChannel`][agentsnap.bus.LocalChannel]."""

    def bind(self, bus: Bus) -> None:
        """Nothing to do: every channel's items are sent in this process."""

    def channel(self, src: str, dst: str, receiver: Endpoint, closed: int) -> Channel:  # noqa: D102
        return LocalChannel(src, dst, receiver, closed)


class BusObserver:
    """Sees the messages sent and delivered on a bus.

    Add one with [`Bus.observe`][agentsnap.bus.Bus.observe].

    Subclass it and override the hooks you need: the bus calls only the hooks an observer
    overrides, so a journal that logs deliveries costs nothing on the send path. The hooks run
    on the hot path, in the sending or receiving process, between the bus's own steps: keep
    them short, and never raise.
    """

    def on_send(self, channel: Channel, message: Message) -> Message:
        """``message`` took its sequence number on ``channel``: return it, or a copy of it.

        Tracing returns a copy whose headers carry its context. Checks may still hold the
        message back after this.
        """
        return message

    def on_enqueue(self, channel: Channel, message: Message) -> None:
        """``message`` was appended to ``channel``: its receiver can take it now."""

    def on_deliver(self, channel: Channel, message: Message) -> None:
        """``message`` was taken off ``channel`` and is about to be handled."""


def _send_hook(observers: list[BusObserver]) -> Callable[[Channel, Message], Message] | None:
    """The observers' ``on_send`` as one callable, or ``None`` when none overrides it."""
    hooks = _overridden(observers, "on_send")
    if len(hooks) <= 1:
        return hooks[0] if hooks else None

    def chained(channel: Channel, message: Message) -> Message:
        for hook in hooks:
            message = hook(channel, message)
        return message

    return chained


def _event_hook(
    observers: list[BusObserver], name: str
) -> Callable[[Channel, Message], None] | None:
    """The observers' hook ``name`` as one callable, or ``None`` when none overrides it."""
    hooks = _overridden(observers, name)
    if len(hooks) <= 1:
        return hooks[0] if hooks else None

    def each(channel: Channel, message: Message) -> None:
        for hook in hooks:
            hook(channel, message)

    return each


def _overridden(observers: list[BusObserver], name: str) -> list[Any]:
    default = getattr(BusObserver, name)
    return [
        getattr(observer, name)
        for observer in observers
        if getattr(type(observer), name, default) is not default
    ]


class Endpoint:
    """A process on the bus: an agent, or the environment.

    Attributes:
        name: Process name.
        epoch: Highest snapshot number this process has recorded (or skipped past).
        outgoing: Channels this process sends on, by receiver.
        incoming: Channels this process receives from, by sender.
        busy: Whether a handler of this process is running.
        replay: While a resumed run re-executes what it did before a crash: the messages
            this process must take next, as ``(src, seq)``, in the order it took them then.
            Schedulers deliver nothing else to it until the plan is done (markers excepted).
        mailbox: What the default [`AsyncioScheduler`][agentsnap.AsyncioScheduler] keeps
            for this process (set by its ``added``), or ``None``: the slot lets it reach its
            own state from a channel's receiver without a lookup on every message. Other
            schedulers keep their state themselves.
        context: What the process's handlers are given (the runtime's handler context), or
            ``None`` for the environment. The bus never reads it: it is the runtime's,
            reached from a channel's receiver on every delivery, and typed ``object`` here
            because the bus sits below the agents that define it.
    """

    __slots__ = ("busy", "context", "epoch", "incoming", "mailbox", "name", "outgoing", "replay")

    def __init__(self, name: str, epoch: int = 0) -> None:
        self.name = name
        self.epoch = epoch
        self.outgoing: dict[str, Channel] = {}
        self.incoming: dict[str, Channel] = {}
        self.busy = False
        self.replay: deque[tuple[str, int]] | None = None
        self.mailbox: _Mailbox | None = None
        self.context: object = None

    def __repr__(self) -> str:
        return f"<Endpoint {self.name} epoch={self.epoch}>"


Deliver = Callable[[Channel], Awaitable[None]]
"""Takes the next item off a channel and has its receiver handle it."""


class Scheduler(Protocol):
    """Decides which deliverable item is delivered next."""

    def bind(self, bus: Bus, deliver: Deliver) -> None:
        """Attach to ``bus``; ``deliver`` handles the next item of a channel."""

    def notify(self, channel: Channel) -> None:
        """An item was appended to ``channel``."""

    def start(self) -> None:
        """Begin delivering (called from a running event loop)."""

    def added(self, endpoint: Endpoint) -> None:
        """A process joined the bus."""

    async def run_until_idle(self) -> None:
        """Deliver until no item is left and no handler is running."""

    async def close(self) -> None:
        """Stop delivering; queued items stay on their channels."""

    def pause(self) -> None:
        """Start no new delivery until ``resume`` (deliveries under way finish)."""

    def resume(self) -> None:
        """Deliver again after ``pause``."""

    def at_rest(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` waits for work, with nothing queued or being delivered to it.

        A snapshot records such a process as it starts, without a marker. ``False`` when
        this scheduler cannot tell (the snapshot then sends markers as usual).
        """

    def interrupt(self, endpoint: Endpoint) -> bool:
        """Cancel the handler ``endpoint`` is running, whose work a rollback throws away.

        The handler gets ``asyncio.CancelledError`` where it awaits; the scheduler goes on
        delivering to ``endpoint`` afterwards. Returns ``False`` when this scheduler cannot
        (the rollback then waits for the handler to return).
        """

    def reset(self) -> None:
        """Forget every queued item: the runtime has emptied the channels (a rollback).

        Items appended afterwards are announced through ``notify`` as usual.
        """


def planned_channel(endpoint: Endpoint) -> Channel | None:
    """The channel ``endpoint`` must take its next item from, while it replays a plan.

    ``None`` when it has no plan, or when the channel the plan names does not exist yet (its
    sender has not sent anything since the cut): the process then waits for it.
    """
    plan = endpoint.replay
    if not plan:
        return None
    return endpoint.incoming.get(plan[0][0])


class Bus:
    """Processes, their channels, and the send and delivery paths.

    Args:
        scheduler: Decides which deliverable item goes next.
        transport: Makes the channels; [`LocalTransport`][agentsnap.bus.LocalTransport] when
            omitted.

    Attributes:
        endpoints: Every process on the bus, by name (the environment first).
        channels: Every channel, by ``(src, dst)``, in creation order.
        environment: The environment process.
        scheduler: The scheduler delivering items.
        transport: Where the channels come from.
    """

    def __init__(self, scheduler: Scheduler, transport: Transport | None = None) -> None:
        self.environment = Endpoint(ENVIRONMENT)
        self.endpoints: dict[str, Endpoint] = {ENVIRONMENT: self.environment}
        self.channels: dict[tuple[str, str], Channel] = {}
        self.scheduler = scheduler
        self.transport: Transport = transport if transport is not None else LocalTransport()
        self._notify: Callable[[Channel], None] = scheduler.notify
        self._observers: list[BusObserver] = []
        # The observers' hooks, each one callable or None: a hot path checks a single None.
        self._on_send: Callable[[Channel, Message], Message] | None = None
        self._on_enqueue: Callable[[Channel, Message], None] | None = None
        # Whether either of the two above is set: the send path checks this one flag.
        self._watched = False
        self.on_deliver: Callable[[Channel, Message], None] | None = None
        """The observers' ``on_deliver`` hooks as one callable, or ``None``: whoever hands a
        message to its receiver calls it (see [`delivered`][agentsnap.bus.Bus.delivered])."""
        self.replay_stalled: Callable[[], None] = self.abandon_replay
        # Message kinds already checked (check_kind): a send pays one set lookup.
        self._kinds: set[str] = {"message"}
        notify = self.transport.bind(self)
        if notify is not None:
            self._notify = notify
        # The default scheduler, when the send path may do what its notify() does itself.
        self._asyncio: AsyncioScheduler | None = (
            scheduler
            if type(scheduler) is AsyncioScheduler and self._notify == scheduler.notify
            else None
        )

    def observe(self, observer: BusObserver) -> None:
        """Have ``observer`` see every message sent and delivered from now on."""
        self._observers.append(observer)
        self._hooks()

    def unobserve(self, observer: BusObserver) -> None:
        """Stop showing the traffic to ``observer``."""
        if observer in self._observers:
            self._observers.remove(observer)
        self._hooks()

    def _hooks(self) -> None:
        self._on_send = _send_hook(self._observers)
        self._on_enqueue = _event_hook(self._observers, "on_enqueue")
        self._watched = self._on_send is not None or self._on_enqueue is not None
        self.on_deliver = _event_hook(self._observers, "on_deliver")

    def replaying(self) -> bool:
        """Whether some process still follows a replay plan."""
        return any(endpoint.replay for endpoint in self.endpoints.values())

    def abandon_replay(self) -> None:
        """Drop every replay plan: the processes take their messages in any order again."""
        for endpoint in self.endpoints.values():
            endpoint.replay = None

    def add(self, name: str, epoch: int) -> Endpoint:
        """Add a process; the environment gets a channel to it at once."""
        endpoint = Endpoint(name, epoch)
        self.endpoints[name] = endpoint
        self.channel(self.environment, name)
        self.scheduler.added(endpoint)
        return endpoint

    def channel(self, sender: Endpoint, dst: str) -> Channel:
        """The channel from ``sender`` to ``dst``, created on first use.

        Raises:
            UnknownAgentError: ``dst`` is not a process on the bus.
        """
        channel = sender.outgoing.get(dst)
        if channel is not None:
            return channel
        receiver = self.endpoints.get(dst)
        if receiver is None or dst == ENVIRONMENT:
            known = [n for n in self.endpoints if n != ENVIRONMENT]
            raise UnknownAgentError(sender.name, dst, known)
        # Everything sent on a new channel comes after its sender's last recording, so no
        # snapshot up to the sender's epoch can have anything in flight on it.
        channel = self.transport.channel(sender.name, dst, receiver, sender.epoch)
        sender.outgoing[dst] = channel
        receiver.incoming[sender.name] = channel
        self.channels[sender.name, dst] = channel
        return channel

    def send(  # noqa: PLR0917
        self,
        sender: Endpoint,
        dst: str,
        payload: JsonInput | BaseModel,
        kind: str,
        headers: Mapping[str, str] | None,
        post: bool = True,
    ) -> Message:
        """Append a message to the channel ``sender -> dst`` and return it.

        With ``post=False`` the message takes its sequence number but is not appended yet:
        [`post`][agentsnap.bus.Bus.post] makes it visible, or
        [`unsend`][agentsnap.bus.Bus.unsend] takes the number back (a rejected output).

        Raises:
            UnknownAgentError: ``dst`` is not a registered agent.
            PayloadNotSerializable: ``payload`` is not JSON.
            ConfigurationError: ``kind`` is longer than 128 characters, or is not a string
                every store can hold (see ``check_kind``).
        """
        try:
            known = kind in self._kinds
        except TypeError:  # unhashable: not a string, check_kind says so
            known = False
        if not known:
            self._new_kind(kind)
        try:  # a subscript costs less than a call of .get()
            channel = sender.outgoing[dst]
        except KeyError:
            channel = self.channel(sender, dst)
        # Scalars need no check, a plain dict one walk (its scalar items checked here, without
        # a call); the rest takes the long way.
        shape = type(payload)
        if shape is dict:
            for key, item in payload.items():  # type: ignore[union-attr]
                if type(key) is not str or (
                    type(item) not in JSON_SCALAR_TYPES and not is_json(item)
                ):
                    _refuse(sender.name, dst, payload)
                    break  # JSON after all (a subclass of a JSON type)
        elif shape not in JSON_SCALAR_TYPES:
            payload = _json_payload(sender.name, dst, payload)
        headers = _freeze_headers(sender.name, dst, headers) if headers else EMPTY_HEADERS
        channel.sent = seq = channel.sent + 1
        message: Message = _new_message(
            Message, (sender.name, dst, seq, kind, payload, headers, sender.epoch)
        )
        # What post() does, written out: this is the hot path of every send. Unwatched, it
        # pays one check for both observer hooks; watched, no call more than the hooks'.
        if self._watched:
            on_send = self._on_send
            if on_send is not None:
                message = on_send(channel, message)
            if post:
                channel.append(message)
                on_enqueue = self._on_enqueue
                if on_enqueue is not None:
                    on_enqueue(channel, message)
                self._notify(channel)
        elif post:
            channel.append(message)
            scheduler = self._asyncio
            if scheduler is None:
                self._notify(channel)
            else:  # AsyncioScheduler.notify(), written out
                box = channel.receiver.mailbox
                assert box is not None  # the scheduler's added() gave every receiver one
                box.inbox.append(channel)
                scheduler._work += 1
                if box.waiter is not None:
                    box.wake()
        return message

    def _new_kind(self, kind: object) -> None:
        """Check a message kind seen for the first time, and remember it."""
        check_kind(kind)
        assert isinstance(kind, str)
        if len(self._kinds) < _KNOWN_KINDS_MAX:
            self._kinds.add(kind)

    def post(self, sender: Endpoint, message: Message) -> None:
        """Make a message built with ``send(..., post=False)`` visible to its receiver."""
        channel = sender.outgoing[message.dst]
        if message.epoch != sender.epoch:
            # Held back while its sender recorded (inside the handler that sent it): it is
            # sent after that cut, and says so.
            message = message._replace(epoch=sender.epoch)
        channel.append(message)
        on_enqueue = self._on_enqueue
        if on_enqueue is not None:
            on_enqueue(channel, message)
        self._notify(channel)

    def unsend(self, sender: Endpoint, message: Message) -> None:
        """Take back the sequence number of the newest message built with ``post=False``."""
        channel = sender.outgoing[message.dst]
        if channel.sent == message.seq:
            channel.sent -= 1

    def post_marker(self, channel: Channel, snapshot: int) -> None:
        """Append a marker for ``snapshot`` to ``channel``."""
        channel.append(Marker(channel.src, channel.dst, snapshot))
        self._notify(channel)

    def delivered(self, channel: Channel, message: Message) -> None:
        """``message``, taken off ``channel``, is handed to its receiver now: count it.

        The receiver takes the item with ``channel.take()``; a message counts as received
        only from here, so that a snapshot it records in between does not count it.
        """
        channel.delivered += 1
        on_deliver = self.on_deliver
        if on_deliver is not None:
            on_deliver(channel, message)

    def restore(
        self,
        epoch: int,
        counters: Mapping[str, tuple[Mapping[str, int], Mapping[str, int]]],
        in_flight: Iterable[Sequence[Message]],
    ) -> int:
        """Put every channel back on a recorded cut.

        Every channel is emptied, then given the cut's counters and its messages in flight;
        the scheduler hears of each item as usual. Call the scheduler's ``reset`` first.

        Args:
            epoch: The snapshot number every process and channel now stands at; no message
                put back carries a higher one.
            counters: Per process, the messages it had sent (by receiver) and received (by
                sender) at the cut; channels the cut does not name start from zero.
            in_flight: The messages to put back, one sequence per channel, in order. A
                message beyond a channel's recorded ``sent`` raises it (the environment's
                inputs replayed after the cut).

        Returns:
            How many messages queued before were not put back (discarded by the restore).
        """
        dropped: set[tuple[str, str, int]] = set()
        for channel in self.channels.values():
            dropped.update(
                (item.src, item.dst, item.seq) for item in channel if type(item) is Message
            )
            channel.clear()
            channel.sent = channel.delivered = 0
            channel.closed = epoch
        endpoints = self.endpoints
        for endpoint in endpoints.values():
            endpoint.epoch = epoch
        for name, (sent, received) in counters.items():
            endpoint = endpoints[name]
            for dst, count in sent.items():
                self.channel(endpoint, dst).sent = count
            for src, count in received.items():
                self.channel(endpoints[src], name).delivered = count
        notify = self._notify
        for messages in in_flight:
            if not messages:
                continue
            src, dst = messages[0].src, messages[0].dst
            channel = self.channel(endpoints[src], dst)
            append = channel.append
            for message in messages:
                append(message._replace(epoch=epoch) if message.epoch > epoch else message)
                notify(channel)
            if dropped:
                dropped.difference_update((src, dst, message.seq) for message in messages)
            channel.sent = max(channel.sent, messages[-1].seq)
        return len(dropped)


def _json_payload(src: str, dst: str, payload: object) -> JsonInput:
    """``payload`` as JSON, when it is neither a plain dict nor a scalar; or raise.

    A pydantic model becomes its JSON form, checked only when its class does not rule out
    what pydantic's JSON mode lets through (see ``dumps_json``); anything else must be a JSON
    value already.
    """
    if isinstance(payload, BaseModel):
        try:
            if dumps_json(type(payload)):
                try:
                    # A value that does not fit its field is an error here, not a warning:
                    # only then is the dump not known to be JSON.
                    return payload.model_dump(mode="json", warnings="error")
                except PydanticSerializationError:
                    pass  # dumped again below, with pydantic's warning, and checked
            payload = payload.model_dump(mode="json")
        except PydanticSerializationError as exc:
            raise PayloadNotSerializable(src, dst, str(exc)) from exc
    if not is_json(payload):
        _refuse(src, dst, payload)
    return payload  # type: ignore[return-value]


def _refuse(src: str, dst: str, payload: object) -> None:
    """Raise ``PayloadNotSerializable`` unless ``payload`` is JSON after all.

    ``is_json`` refused it; ``json_problem`` also accepts subclasses of the JSON types.
    """
    problem = json_problem(payload)
    if problem is not None:
        raise PayloadNotSerializable(src, dst, problem)


def _freeze_headers(src: str, dst: str, headers: Mapping[str, str]) -> Mapping[str, str]:
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PayloadNotSerializable(
                src, dst, f"header {key!r}: {value!r} is not a pair of strings"
            )
    return MappingProxyType(dict(headers))


class AsyncioScheduler:
    """The default scheduler: one asyncio task per agent.

    Each agent takes its items in the order they arrived (so every channel stays FIFO), one at
    a time; an agent awaiting I/O in its handler lets every other agent go on.

    Args:
        fairness: Items an agent handles in a row before it yields to the event loop, so that
            a busy agent whose handlers never await cannot starve the rest.
    """

    def __init__(self, fairness: int = 64) -> None:
        if fairness < 1:
            raise ConfigurationError(
                f"AsyncioScheduler(fairness={fairness}) must be at least 1 message in a row"
            )
        self._fairness = fairness
        self._deliver: Deliver | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Items waiting in inboxes plus deliveries under way: idle at zero. One counter, so
        # that a delivery updates one number; the deliveries under way are this less the
        # items in the inboxes, counted only when a replay plan may be stuck.
        self._work = 0
        # Whether nothing is delivered: asked for by pause(), or by a hold still in place.
        self._paused = False
        self._pause_asked = False
        self._holds: set[str] = set()
        self._idle: asyncio.Future[None] | None = None
        self._started = False
        self._endpoints: list[Endpoint] = []
        # Per process: the channels with an item waiting, and the serve task's wake-up. Each
        # is in the process's ``mailbox`` slot too, where notify() and _serve() find it.
        self._boxes: dict[Endpoint, _Mailbox] = {}
        self._error: BaseException | None = None
        self._bus: Bus | None = None
        # Processes waiting for the channel their replay plan names, with items elsewhere.
        self._blocked = 0

    def bind(self, bus: Bus, deliver: Deliver) -> None:  # noqa: D102
        self._bus = bus
        self._deliver = deliver

    def notify(self, channel: Channel) -> None:  # noqa: D102
        # Bus.send() does the same, written out.
        box = channel.receiver.mailbox
        assert box is not None  # added() gave every receiver one
        box.inbox.append(channel)
        self._work += 1
        if box.waiter is not None:
            box.wake()

    def added(self, endpoint: Endpoint) -> None:  # noqa: D102
        self._endpoints.append(endpoint)
        self._boxes[endpoint] = endpoint.mailbox = _Mailbox()
        if self._started:
            self._spawn(endpoint)

    def start(self) -> None:  # noqa: D102
        if self._started:
            return
        self._started = True
        for endpoint in self._endpoints:
            self._spawn(endpoint)

    def _spawn(self, endpoint: Endpoint) -> None:
        task = asyncio.get_running_loop().create_task(
            self._serve(endpoint), name=f"agentsnap:{endpoint.name}"
        )
        self._tasks[endpoint.name] = task

    async def _serve(self, endpoint: Endpoint) -> None:
        deliver = self._deliver
        assert deliver is not None, "scheduler used before bind()"
        box = self._boxes[endpoint]
        inbox = box.inbox
        loop = asyncio.get_running_loop()
        fairness = self._fairness
        streak = 0
        try:
            while True:
                if inbox and not self._paused:
                    if endpoint.replay:
                        channel = self._planned(endpoint)
                        if channel is None:
                            await self._wait_blocked(endpoint)
                            continue
                    else:
                        channel = inbox.popleft()
                    try:
                        await deliver(channel)
                    except asyncio.CancelledError:
                        if not box.interrupted:
                            raise  # the scheduler is closing
                    finally:
                        self._work -= 1
                    if box.interrupted:  # cancelled by interrupt(), or the handler ignored it
                        box.interrupted = False
                        me = asyncio.current_task()
                        if me is not None and me.uncancel() > 0:
                            # close() cancelled the task too, and one CancelledError stood
                            # for both (a handler finishing a tool call first): stop here.
                            raise asyncio.CancelledError
                    if not self._work:
                        self._wake_idle()
                    elif self._blocked:
                        self._check_stalled()
                    streak += 1
                    if streak >= fairness:
                        streak = 0
                        await asyncio.sleep(0)
                else:
                    streak = 0
                    box.waiter = waiter = loop.create_future()
                    await waiter
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # deliver() reports handler errors itself; anything here is a bug in agentsnap
            # and must not leave run_until_idle() waiting forever.
            self._error = exc
            self._wake_idle()
            raise

    def at_rest(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint``'s task waits for work, with nothing queued for it.

        Nothing is being delivered to it either, and the scheduler is not paused. A snapshot
        records such a process as it starts, without a marker.
        """
        box = self._boxes.get(endpoint)
        return box is not None and box.waiter is not None and not box.inbox and not self._paused

    def _planned(self, endpoint: Endpoint) -> Channel | None:
        """Take the channel the replay plan names off the inbox, if it has an item."""
        channel = planned_channel(endpoint)
        if channel is None or not channel:
            return None
        self._boxes[endpoint].inbox.remove(channel)
        return channel

    async def _wait_blocked(self, endpoint: Endpoint) -> None:
        self._blocked += 1
        try:
            self._check_stalled()
            if endpoint.replay and self._planned_empty(endpoint):
                box = self._boxes[endpoint]
                box.waiter = waiter = asyncio.get_running_loop().create_future()
                await waiter
        finally:
            self._blocked -= 1

    @staticmethod
    def _planned_empty(endpoint: Endpoint) -> bool:
        channel = planned_channel(endpoint)
        return channel is None or not channel

    def _check_stalled(self) -> None:
        """No handler runs and every process with items waits for its plan: give the plans up.

        A plan that cannot go on means the run did not repeat what it did before the crash
        (a handler that is not deterministic): the processes then take any message again.
        """
        if self._paused or self._bus is None:
            return
        if self._work > sum(len(box.inbox) for box in self._boxes.values()):
            return  # a delivery is under way: its handler may send what a plan waits for
        for endpoint, box in self._boxes.items():
            if box.inbox and not (endpoint.replay and self._planned_empty(endpoint)):
                return
        self._bus.replay_stalled()
        if not self._bus.replaying():  # given up: everyone takes any item again
            self._wake_all()

    def wake(self) -> None:
        """Have every process look at its items again (replay plans were given up)."""
        if not self._paused:
            self._wake_all()

    def _wake_all(self) -> None:
        for box in self._boxes.values():
            box.wake()

    def _wake_idle(self) -> None:
        idle = self._idle
        if idle is not None:
            self._idle = None
            if not idle.done():
                idle.set_result(None)

    async def run_until_idle(self) -> None:  # noqa: D102
        self.start()
        while self._work and self._error is None:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            await self._idle
        if self._error is not None:
            raise self._error

    def pause(self) -> None:  # noqa: D102
        self._pause_asked = self._paused = True

    def resume(self) -> None:  # noqa: D102
        self._pause_asked = False
        self._go_on()

    def hold(self, reason: str) -> None:
        """Start no new delivery while the hold named ``reason`` is in place.

        Holds stand apart from ``pause``: ``resume`` delivers again only once every hold
        was released, and ``release`` only once ``resume`` was called after a ``pause``.
        A distributed worker holds delivery while its claim on its agents is not renewed.
        """
        self._holds.add(reason)
        self._paused = True

    def release(self, reason: str) -> None:
        """Take back the hold named ``reason`` (nothing happens if there is none)."""
        self._holds.discard(reason)
        self._go_on()

    def held(self) -> frozenset[str]:
        """The holds in place."""
        return frozenset(self._holds)

    def _go_on(self) -> None:
        if self._pause_asked or self._holds:
            return
        self._paused = False
        self._wake_all()
        if not self._work:
            self._wake_idle()

    def reset(self) -> None:  # noqa: D102
        for box in self._boxes.values():
            self._work -= len(box.inbox)
            box.inbox.clear()

    def interrupt(self, endpoint: Endpoint) -> bool:  # noqa: D102
        task = self._tasks.get(endpoint.name)
        if task is None or task.done() or task is asyncio.current_task() or not endpoint.busy:
            return False
        box = self._boxes[endpoint]
        if not box.interrupted:
            box.interrupted = True
            task.cancel()
        return True

    async def close(self) -> None:  # noqa: D102
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        # Errors of the serve tasks were already raised by run_until_idle().
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._started = False
        self._wake_idle()


class _Mailbox:
    """What the asyncio scheduler keeps per process."""

    __slots__ = ("inbox", "interrupted", "waiter")

    def __init__(self) -> None:
        # Channels with an item waiting, one entry per item, in arrival order.
        self.inbox: deque[Channel] = deque()
        self.waiter: asyncio.Future[None] | None = None
        # Whether interrupt() cancelled the running delivery (not the serve task).
        self.interrupted = False

    def wake(self) -> None:
        """Wake the serve task if it waits for an item."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
