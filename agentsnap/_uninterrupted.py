"""A step a handler's cancellation waits for: its outcome is recorded before the handler stops.

A rollback throws a handler's work away by cancelling it where it awaits. Most of what a
handler awaits can stop at once; a few steps must not stop half way, because what they
leave behind decides what a redo of the handler does: a side-effecting tool call through
the ledger (its outcome), and the write of a model's answer (once written, a redo gets that
answer instead of asking again). Such a step runs through `uninterrupted`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Uninterrupted(asyncio.Task[T]):
    """A handler's step, run as a task the handler's cancellation defers.

    The handler awaits the task itself. Cancelling the handler cancels what it awaits; this
    task refuses that, so the handler's cancellation waits (asyncio delivers it when the task
    is done) and the step goes on to its end. Refusing starts the lease: a step still running
    when it ends is cancelled for real. A cancellation aimed at the task itself (the event
    loop ending) is not the handler's and goes through at once.

    Args:
        step: What to run.
        lease: Seconds the step may go on after the handler was cancelled.
    """

    def __init__(self, step: Coroutine[Any, Any, T], lease: float) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(step, loop=loop)
        self._lease = lease
        self._handler = asyncio.current_task(loop)
        # The handler's cancellations seen so far: a new one is what cancels this task.
        self._seen = 0 if self._handler is None else self._handler.cancelling()
        self._expiry: asyncio.TimerHandle | None = None

    def cancel(self, msg: Any = None) -> bool:
        handler = self._handler
        if handler is None or self.done():
            return super().cancel(msg)
        requested = handler.cancelling()
        if requested <= self._seen:  # not the handler's: the loop ending cancels its tasks
            return super().cancel(msg)
        self._seen = requested
        if self._expiry is None:
            self._expiry = self.get_loop().call_later(self._lease, self._expire)
        return False

    def _expire(self) -> None:
        self._expiry = None
        super().cancel()

    def disarm(self) -> None:
        """Forget the lease's timer, the step having ended or been abandoned."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None


async def uninterrupted(step: Coroutine[Any, Any, T], lease: float) -> T:
    """Run ``step`` to its end even when the awaiting handler is cancelled meanwhile.

    The cancellation reaches the handler once the step is done (or its ``lease`` ran out).
    """
    work = Uninterrupted(step, lease)
    try:
        return await work
    except asyncio.CancelledError:
        if work.done() and not work.cancelled():
            work.exception()  # raised to nobody: the handler goes on being cancelled
        raise
    finally:
        work.disarm()
